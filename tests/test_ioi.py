"""IOI prompts: determinism, both name orders, evidence on the IO's earlier mention, a disjoint held-out split,
the public-format loader, the ABC corruption, MRR on IOI-shaped batches, and the IOI training pieces of
benchmarks/common/ioi_recipe.py (name redrawing and swapping, best-weights selection)."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bcos_plugins.data import (
    ContrastiveBatch,
    IOIPrompt,
    corrupt_ioi,
    encode_ioi,
    ioi_name_pool,
    load_ioi,
    make_ioi_prompts,
)
from bcos_plugins.data.ioi import (
    IOI_HELDOUT_NAMES,
    IOI_HELDOUT_TEMPLATES,
    IOI_OBJECTS,
    IOI_PLACES,
    IOI_TRAIN_NAMES,
    IOI_TRAIN_TEMPLATES,
    _gpt2_tokenizer,
)
from bcos_plugins.errors import BcosError, BcosFileError, BcosTypeError, BcosValueError
from bcos_plugins.metrics.decoder import mean_reciprocal_rank, next_token_contrast, perplexity


@pytest.fixture(scope="module")
def tok():
    return _gpt2_tokenizer()


def check_prompt(p: IOIPrompt, tok) -> None:
    ids = list(p.input_ids)
    assert tok(p.text, add_special_tokens=False)["input_ids"] == ids
    assert p.target_id == tok(" " + p.io)["input_ids"][0] and p.foil_id == tok(" " + p.s)["input_ids"][0]
    assert p.target_id != p.foil_id
    # the evidence is the IO's one earlier mention; the S occurs exactly twice; nothing else is a name token
    assert [i for i, t in enumerate(ids) if t == p.target_id] == list(p.evidence_positions)
    assert len(p.evidence_positions) == 1
    assert [i for i, t in enumerate(ids) if t == p.foil_id] == list(p.s_positions)
    assert len(p.s_positions) == 2
    io, (s1, s2) = p.evidence_positions[0], p.s_positions
    assert (io < s1) == (p.order == "ABBA") and s1 < s2 and io < s2
    assert p.text.endswith(" to") and p.completion == f"{p.text} {p.io}."


def test_shipped_names_are_single_gpt2_tokens(tok):
    for name in IOI_TRAIN_NAMES + IOI_HELDOUT_NAMES:
        assert len(tok(" " + name)["input_ids"]) == 1, name
    assert len(set(IOI_TRAIN_NAMES + IOI_HELDOUT_NAMES)) == len(IOI_TRAIN_NAMES) + len(IOI_HELDOUT_NAMES)
    assert len(IOI_OBJECTS) >= 10 and len(IOI_PLACES) >= 10


def test_paper_table7_example(tok):
    # the paper's "Juana" and "Kristi" are two GPT-2 tokens each, so two single-token names stand in
    (p,) = make_ioi_prompts(1, split="heldout", templates=[IOI_HELDOUT_TEMPLATES[0]], names=["Mary", "John"],
                            seed=3, tokenizer=tok)
    assert p.text.startswith("Friends ") and p.text.endswith(" gave it to")
    assert tok.decode([p.input_ids[p.evidence_positions[0]]]) == " " + p.io
    check_prompt(p, tok)


def test_deterministic_and_seeded(tok):
    a = make_ioi_prompts(40, seed=7)
    assert a == make_ioi_prompts(40, seed=7)
    assert [p.text for p in a] != [p.text for p in make_ioi_prompts(40, seed=8)]
    # a prefix of a longer run: n does not reshuffle the first prompts
    assert make_ioi_prompts(60, seed=7)[:40] == a


def test_both_orders_balanced_and_every_prompt_well_formed(tok):
    prompts = make_ioi_prompts(64, seed=0) + make_ioi_prompts(64, split="heldout", seed=0)
    for split in (prompts[:64], prompts[64:]):
        assert sum(p.order == "ABBA" for p in split) == 32 and sum(p.order == "BABA" for p in split) == 32
    for p in prompts:
        check_prompt(p, tok)


def test_heldout_split_shares_no_template_or_name_with_training(tok):
    assert not set(IOI_TRAIN_TEMPLATES) & set(IOI_HELDOUT_TEMPLATES)
    assert not set(IOI_TRAIN_NAMES) & set(IOI_HELDOUT_NAMES)
    train, held = make_ioi_prompts(300, seed=0), make_ioi_prompts(300, split="heldout", seed=0)
    train_names = {n for p in train for n in (p.io, p.s)}
    held_names = {n for p in held for n in (p.io, p.s)}
    assert train_names <= set(IOI_TRAIN_NAMES) and held_names <= set(IOI_HELDOUT_NAMES)
    assert {p.template for p in train} == set(IOI_TRAIN_TEMPLATES)
    assert {p.template for p in held} == set(IOI_HELDOUT_TEMPLATES)
    train_ids = {t for p in train for t in (p.target_id, p.foil_id)}
    assert not train_ids & {t for p in held for t in (p.target_id, p.foil_id)}


def test_name_pool_is_single_token_words_never_a_heldout_name_or_template_word(tok):
    pool = ioi_name_pool(3000, seed=1, tokenizer=tok)
    assert len(pool) == len(set(pool)) == 3000 and list(pool) == sorted(pool)
    assert pool == ioi_name_pool(3000, seed=1) and pool != ioi_name_pool(3000, seed=2)
    for word in pool:
        assert word[0].isupper() and word[1:].islower() and len(tok(" " + word)["input_ids"]) == 1, word
    template_words = {w.strip(",.") for t in IOI_TRAIN_TEMPLATES + IOI_HELDOUT_TEMPLATES for w in t.split()}
    assert not set(pool) & set(IOI_HELDOUT_NAMES) and not set(pool) & template_words
    # prompts filled from the pool are well formed and share no name token with the held-out split
    train = make_ioi_prompts(200, seed=0, names=pool, tokenizer=tok)
    for p in train:
        check_prompt(p, tok)
    held_ids = {t for p in make_ioi_prompts(200, split="heldout", seed=0) for t in (p.target_id, p.foil_id)}
    assert not {t for p in train for t in (p.target_id, p.foil_id)} & held_ids
    with pytest.raises(BcosValueError, match=r"n: the tokenizer has \d+ capitalised single-token words"):
        ioi_name_pool(10**6)
    with pytest.raises(BcosValueError, match="n: must be >= 2"):
        ioi_name_pool(1)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), split=st.sampled_from(["train", "heldout"]))
def test_generated_prompts_are_well_formed(seed, n, split):
    tok = _gpt2_tokenizer()
    for p in make_ioi_prompts(n, split=split, seed=seed):
        check_prompt(p, tok)


def test_encode_places_evidence_and_left_pads(tok):
    prompts = make_ioi_prompts(8, split="heldout", seed=2)
    batch = encode_ioi(prompts, bos_token_id=tok.eos_token_id, pad_token_id=0)
    assert len(batch) == 8 and batch.attention_mask[:, -1].all() and isinstance(batch, ContrastiveBatch)
    for i, p in enumerate(prompts):
        real = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        assert real == [tok.eos_token_id, *p.input_ids]
        assert batch.evidence[i].sum() == 1
        assert batch.input_ids[i, batch.evidence[i]].item() == p.target_id == batch.target_ids[i]
        assert batch.input_ids[i, batch.io_positions[i]] == p.target_id
        assert (batch.input_ids[i, batch.s_positions[i]] == p.foil_id).all() and batch.foil_ids[i] == p.foil_id
        # candidates: the prompt's tokens, not the BOS or padding
        assert batch.candidates[i].sum() == len(p.input_ids)
        assert not batch.candidates[i][~batch.attention_mask[i].bool()].any()
    no_bos = encode_ioi(prompts)
    assert no_bos.candidates.equal(no_bos.attention_mask.bool())


def test_mrr_on_ioi_batches_with_a_known_ranking():
    batch = encode_ioi(make_ioi_prompts(6, seed=4), bos_token_id=50256)
    n = batch.candidates.sum(1)
    # scores that put the IO mention at rank r_i among the candidates (decreasing scores elsewhere)
    ranks = torch.tensor([1, 2, 3, 1, 4, 2])
    scores = torch.zeros(batch.input_ids.shape)
    for i in range(len(batch)):
        cols = batch.candidates[i].nonzero().flatten().tolist()
        others = [c for c in cols if not batch.evidence[i, c]]
        order = others[: ranks[i] - 1] + [int(batch.io_positions[i])] + others[ranks[i] - 1:]
        for rank, c in enumerate(order):
            scores[i, c] = len(cols) - rank
    result = mean_reciprocal_rank(scores, batch.evidence, batch.candidates)
    assert result.mrr == pytest.approx(float((1 / ranks.double()).mean()))
    # one evidence token among m candidates: E[1 / rank] = (1 + 1/2 + ... + 1/m) / m
    harmonic = [sum(1 / r for r in range(1, int(m) + 1)) / int(m) for m in n]
    assert result.random == pytest.approx(sum(harmonic) / len(harmonic))
    # the contrastive explanation that points at the S instead ranks the IO last or near it
    at_s = torch.zeros(batch.input_ids.shape)
    at_s.scatter_(1, batch.s_positions, 1.0)
    assert mean_reciprocal_rank(at_s, batch.evidence, batch.candidates).mrr < 1 / 3


def test_corrupted_prompts_align_and_repeat_no_name(tok):
    clean = make_ioi_prompts(20, seed=5)
    corrupted = corrupt_ioi(clean, seed=1)
    assert corrupted == corrupt_ioi(clean, seed=1)
    for c, p in zip(corrupted, clean, strict=True):
        assert len(c.input_ids) == len(p.input_ids) and c.template == p.template and c.order == p.order
        assert tok(c.text, add_special_tokens=False)["input_ids"] == list(c.input_ids)
        slots = [c.evidence_positions[0], *c.s_positions]
        names = [c.input_ids[s] for s in slots]
        assert len(set(names)) == 3 and not set(names) & {p.target_id, p.foil_id}
        differ = [i for i, (x, y) in enumerate(zip(c.input_ids, p.input_ids, strict=True)) if x != y]
        assert differ == sorted(slots)


def test_load_public_format_round_trips_the_generator(tmp_path, tok):
    prompts = make_ioi_prompts(10, seed=6)
    jsonl = tmp_path / "ioi.jsonl"
    jsonl.write_text("".join(json.dumps({"ioi_sentences": p.completion}) + "\n" for p in prompts)
                     + json.dumps({"ioi_sentences": "Not an IOI sentence at all."}) + "\n")
    loaded = load_ioi(jsonl)
    assert len(loaded) == 10
    for a, b in zip(loaded, prompts, strict=True):
        assert (a.text, a.io, a.s, a.order, a.input_ids) == (b.text, b.io, b.s, b.order, b.input_ids)
        assert (a.evidence_positions, a.s_positions) == (b.evidence_positions, b.s_positions)
    txt = tmp_path / "ioi.txt"
    txt.write_text("\n".join(p.completion for p in prompts))
    assert [p.text for p in load_ioi(txt, n=3)] == [p.text for p in prompts[:3]]


def test_errors_name_the_argument(tmp_path, tok):
    with pytest.raises(BcosValueError, match="names: 'Juana' is 2 tokens"):
        make_ioi_prompts(2, names=["Juana", "Tom"])
    with pytest.raises(BcosValueError, match="split"):
        make_ioi_prompts(2, split="test")
    with pytest.raises(BcosValueError, match="n: must be >= 1"):
        make_ioi_prompts(0)
    with pytest.raises(BcosValueError, match="templates"):
        make_ioi_prompts(2, templates=["{A} and {B} went home. {S} waved to"])  # starts with a name
    with pytest.raises(BcosValueError, match="templates"):
        make_ioi_prompts(2, templates=["Then, {A} went home. {S} waved to"])
    with pytest.raises(BcosValueError, match="names: need at least two"):
        make_ioi_prompts(2, names=["Tom", "Tom"])
    with pytest.raises(BcosTypeError, match="fast tokenizer"):
        make_ioi_prompts(2, tokenizer=object())
    with pytest.raises(BcosTypeError, match="prompts"):
        encode_ioi([])
    with pytest.raises(BcosTypeError, match="prompts: item 1"):
        encode_ioi([make_ioi_prompts(1)[0], "text"])
    with pytest.raises(BcosFileError, match="path"):
        load_ioi(tmp_path / "missing.jsonl")
    empty = tmp_path / "none.txt"
    empty.write_text("Nothing here.\n")
    with pytest.raises(BcosError, match="no row is a complete IOI sentence"):
        load_ioi(empty)
    with pytest.raises(BcosValueError, match="names: need 3 names"):
        corrupt_ioi(make_ioi_prompts(1, names=["Tom", "Ben", "Max"]), names=["Tom", "Ben", "Max"])


# ---------------------------------------------------------------- perplexity and next-token contrast


def tiny_gpt2(vocab: int = 11, n_positions: int = 16, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_embd=8, n_layer=1, n_head=2, n_positions=n_positions,
                        n_ctx=n_positions, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    import math

    model = tiny_gpt2(vocab=13)
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # tied LM head: every logit is 0, p = 1/13 for every token
    result = perplexity(model, [[1, 2, 3, 4], [5, 6]], bos_token_id=0)
    assert result.perplexity == pytest.approx(13.0, rel=1e-12)
    assert result.nll == pytest.approx(math.log(13), rel=1e-12)
    assert (result.n_tokens, result.n_windows, result.n_texts) == (6, 2, 2)


def hand_nll(model, window: list[int]) -> tuple[float, int]:
    """Sum of -log p(x_t | x_<t) of one unpadded window, from the softmax written out in Python floats."""
    import math

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([window])).logits[0].double().tolist()
    total = 0.0
    for t in range(1, len(window)):
        row = logits[t - 1]
        total -= row[window[t]] - math.log(sum(math.exp(v) for v in row))
    return total, len(window) - 1


def test_perplexity_matches_a_hand_computed_value_with_windows_and_padding():
    import math

    model = tiny_gpt2(n_positions=4)
    texts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [3, 3, 1], [4, 5]]
    # float32 model: batched and padded forwards differ from single rows in the last bits (rel ~1e-9)
    # no BOS: windows of 4 tokens; the one-token tail [10] of the first text predicts nothing
    windows = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10], [3, 3, 1], [4, 5]]
    nll, n = map(sum, zip(*(hand_nll(model, w) for w in windows), strict=True))
    result = perplexity(model, texts, batch_size=2)  # batches mix lengths: padding must not count
    assert (result.n_tokens, result.n_windows) == (n, len(windows)) == (3 + 3 + 1 + 2 + 1, 5)
    assert result.perplexity == pytest.approx(math.exp(nll / n), rel=1e-6)
    # with a BOS each window holds 3 text tokens, and every text token is scored
    bos_windows = [[0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 8, 9], [0, 10], [0, 3, 3, 1], [0, 4, 5]]
    nll, n = map(sum, zip(*(hand_nll(model, w) for w in bos_windows), strict=True))
    result = perplexity(model, [torch.tensor(t) for t in texts], bos_token_id=0, batch_size=4)
    assert result.n_tokens == n == 15 and result.perplexity == pytest.approx(math.exp(nll / n), rel=1e-6)


def test_perplexity_tokenises_strings_and_keeps_the_training_mode(tok):
    model = tiny_gpt2(vocab=tok.vocab_size, n_positions=32).train()
    text = "Once upon a time, there was a cat."
    a = perplexity(model, [text], tok, bos_token_id=tok.eos_token_id)
    b = perplexity(model, [[tok.eos_token_id, *tok(text)["input_ids"]]], max_length=32)
    assert a.perplexity == pytest.approx(b.perplexity, rel=1e-6) and a.n_tokens == len(tok(text)["input_ids"])
    assert model.training


def test_perplexity_errors_name_the_argument(tok):
    model = tiny_gpt2(n_positions=8)
    with pytest.raises(BcosTypeError, match="tokenizer: texts\\[0\\] is a string"):
        perplexity(model, ["a story"])
    with pytest.raises(BcosValueError, match="texts: texts\\[1\\] has token ids outside"):
        perplexity(model, [[1, 2], [3, 99]])
    with pytest.raises(BcosValueError, match="texts: texts\\[0\\] has 1 token"):
        perplexity(model, [[1]])
    with pytest.raises(BcosValueError, match="max_length: must be in \\[2, 8\\]"):
        perplexity(model, [[1, 2]], max_length=9)
    with pytest.raises(BcosTypeError, match="texts: must be a non-empty list"):
        perplexity(model, [])
    with pytest.raises(BcosTypeError, match="texts: texts\\[0\\] must be a string or a 1-d"):
        perplexity(model, [torch.ones(2, 2, dtype=torch.long)])


def test_next_token_contrast_matches_unpadded_rows_on_either_padding_side():
    model = tiny_gpt2(n_positions=8)
    rows = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    target, foil = torch.tensor([1, 2, 3]), torch.tensor([4, 4, 10])
    expected_diff, expected_gap = [], []
    for row, t, f in zip(rows, target, foil, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([row])).logits[0, -1]
        expected_diff.append(float(logits[t] - logits[f]))
        p = logits.softmax(-1)
        expected_gap.append(float(p[t] - p[f]))
    for side in ("left", "right"):
        ids = torch.zeros(3, 5, dtype=torch.long)
        mask = torch.zeros(3, 5, dtype=torch.long)
        for i, row in enumerate(rows):
            cols = slice(5 - len(row), 5) if side == "left" else slice(0, len(row))
            ids[i, cols], mask[i, cols] = torch.tensor(row), 1
        result = next_token_contrast(model, ids, mask, target=target, foil=foil)
        assert result.logit_difference.tolist() == pytest.approx(expected_diff, abs=1e-5)
        assert result.probability_gap.tolist() == pytest.approx(expected_gap, abs=1e-6)
        assert result.accuracy == sum(d > 0 for d in expected_diff) / 3


def test_next_token_contrast_on_an_ioi_batch_and_its_errors(tok):
    model = tiny_gpt2(vocab=tok.vocab_size, n_positions=32)
    batch = encode_ioi(make_ioi_prompts(4, seed=1), bos_token_id=tok.eos_token_id)
    result = next_token_contrast(model, batch.input_ids, batch.attention_mask, target=batch.target_ids,
                                 foil=batch.foil_ids, batch_size=3)
    swapped = next_token_contrast(model, batch.input_ids, batch.attention_mask, target=batch.foil_ids,
                                  foil=batch.target_ids)
    assert torch.allclose(result.logit_difference, -swapped.logit_difference)
    assert result.accuracy + swapped.accuracy == pytest.approx(1.0)
    with pytest.raises(BcosValueError, match=rf"foil: ids must lie in \[0, {tok.vocab_size}\), got .* at rows "
                                             rf"\[0, 1, 2, 3\]\. .*there are {tok.vocab_size} vocabulary tokens"):
        next_token_contrast(model, batch.input_ids, batch.attention_mask, target=batch.target_ids,
                            foil=torch.full((4,), tok.vocab_size))
    with pytest.raises(BcosValueError, match=r"target: expected an int or one id per row, shape \(4,\); got "
                                             r"shape \(2,\)"):
        next_token_contrast(model, batch.input_ids, batch.attention_mask, target=batch.target_ids[:2],
                            foil=batch.foil_ids)
    # target and foil are keywords, as in explain: the 0.1 positional call is refused by name
    with pytest.raises(BcosTypeError, match="target: next_token_contrast takes target and foil by keyword"):
        next_token_contrast(model, batch.input_ids, batch.attention_mask, batch.target_ids, batch.foil_ids)
    with pytest.raises(BcosTypeError, match="foil: is required"):
        next_token_contrast(model, batch.input_ids, batch.attention_mask, target=batch.target_ids)


# ---------------------------------------------------------------- the IOI recipe of bench-decoders


def _ioi_recipe():
    """The IOI recipe that bench-decoders trains (benchmarks/common/ioi_recipe.py)."""
    from benchmarks.common import ioi_recipe

    return ioi_recipe


def test_collator_swaps_story_names_consistently_and_never_touches_other_tokens():
    bench = _ioi_recipe()
    names = torch.tensor([10, 11, 12, 13, 14, 15])
    heldout = 50  # a held-out name's id: not among the training names, so it must stay
    story = torch.tensor([1, 10, 2, 11, 10, heldout, 3, 11])
    collator = bench.IOICollator(0, (names, torch.zeros(0, dtype=torch.long)), 0.0, seed=0, swap_stories=True)
    seen = set()
    for _ in range(20):
        ids = collator([{"input_ids": story, "story": torch.tensor(True)}])["input_ids"][0]
        assert ids[[0, 2, 5, 6]].tolist() == [1, 2, heldout, 3]
        assert ids[1] == ids[4] and ids[3] == ids[7] and ids[1] != ids[3]  # one name per name, two names stay two
        assert set(ids[[1, 3]].tolist()) <= set(names.tolist())
        seen.add(int(ids[1]))
    assert len(seen) > 2  # redrawn each batch
    plain = bench.IOICollator(0, (names, torch.zeros(0, dtype=torch.long)), 0.0, seed=0)
    assert torch.equal(plain([{"input_ids": story, "story": torch.tensor(True)}])["input_ids"][0], story)
    # BLiMP rows (no "story") keep their names even when stories are swapped
    assert torch.equal(collator([{"input_ids": story}])["input_ids"][0], story)


def test_collator_fills_ioi_rows_with_two_distinct_training_names():
    bench = _ioi_recipe()
    names = torch.tensor([10, 11, 12])
    row = torch.tensor([0, 5, 99, 6, 98, 7, 98, 8, 99])  # IO at 2 and at the end, S at 4 and 6
    collator = bench.IOICollator(0, (names, torch.zeros(0, dtype=torch.long)), 0.0, seed=1, swap_stories=True)
    for _ in range(10):
        batch = collator([{"input_ids": row, "io_slots": torch.tensor([2, 4, 6])}])
        ids = batch["input_ids"][0]
        assert ids[2] == ids[8] and ids[4] == ids[6] and ids[2] != ids[4]
        assert {int(ids[2]), int(ids[4])} <= set(names.tolist())
        assert ids[[0, 1, 3, 5, 7]].tolist() == [0, 5, 6, 7, 8]
        assert batch["ioi_rows"].tolist() == [True]


def test_collator_fills_word_share_of_ioi_rows_with_story_words():
    bench = _ioi_recipe()
    names, pool, words = torch.tensor([10, 11, 12]), torch.tensor([20, 21]), torch.tensor([30, 31, 32, 33])
    row = torch.tensor([0, 5, 99, 6, 98, 7, 98, 8, 99])
    feature = {"input_ids": row, "io_slots": torch.tensor([2, 4, 6])}

    def drawn(collator, n=200):
        out = []
        for _ in range(n):
            ids = collator([feature])["input_ids"][0]
            assert ids[2] == ids[8] and ids[4] == ids[6] and ids[2] != ids[4]
            out.append({int(ids[2]), int(ids[4])})
        return out

    only_words = bench.IOICollator(0, (names, pool), 0.0, seed=0, words=words, word_share=1.0)
    assert all(pair <= set(words.tolist()) for pair in drawn(only_words))
    mixed = bench.IOICollator(0, (names, pool), 0.25, seed=0, words=words, word_share=0.5)
    groups = [next(g for g, ids in (("names", names), ("pool", pool), ("words", words)) if pair <= set(ids.tolist()))
              for pair in drawn(mixed, 400)]  # both names of a row come from one group
    shares = {g: groups.count(g) / len(groups) for g in ("names", "pool", "words")}
    assert shares["words"] == pytest.approx(0.5, abs=0.08) and shares["pool"] == pytest.approx(0.25, abs=0.08)
    with pytest.raises(ValueError, match="word_share=0.5 needs words"):
        bench.IOICollator(0, (names, pool), 0.0, seed=0, word_share=0.5)
    with pytest.raises(ValueError, match="BENCH_WORD_SHARE=0.8 and BENCH_POOL_SHARE=0.5"):
        bench.Settings(word_share=0.8, pool_share=0.5)


def test_story_word_pool_keeps_frequent_words_and_leaves_out_held_out_names_and_prompt_words(tok):
    bench = _ioi_recipe()
    stories = [tok(text)["input_ids"] for text in (
        "Daisy saw a dog. The dog and Daisy ran to the park with a happy cat.",
        "Kitty was happy. Kitty and the dog went to the park and Daisy sat.")]
    words = {tok.decode([t]) for t in bench.story_word_pool(stories, tok, min_count=2)}
    # " Daisy" (held out), " the" and " and" (template words), " park" (a place) occur twice or more but stay out;
    # " ran", " cat" and " Kitty" occur once; " a" and " to" are too short
    assert words == {" dog", " happy"}
    with pytest.raises(ValueError, match="BENCH_MIN_NAME_COUNT=4 leaves 0 story words"):
        bench.story_word_pool(stories, tok, min_count=4)


def test_settings_stop_at_the_rule_plus_the_margin_and_refuse_impossible_values():
    bench = _ioi_recipe()
    cfg = bench.Settings(ioi_stop=0.9, stop_margin=0.03, word_share=0.5)
    assert cfg.stop_threshold == 0.93 and "-words0.5-stop0.93-" in cfg.tag and cfg.bcos_tag.startswith(cfg.tag)
    # without the margin and the story words, the tag is that of the models cached before either existed
    assert "-stop0.9-" in bench.Settings(ioi_stop=0.9, stop_margin=0.0, word_share=0.0).tag
    with pytest.raises(ValueError, match="BENCH_IOI_STOP=0.9 and BENCH_STOP_MARGIN=0.2"):
        bench.Settings(ioi_stop=0.9, stop_margin=0.2)
    with pytest.raises(ValueError, match="BENCH_IOI_STOP=0 and BENCH_STOP_MARGIN"):
        bench.Settings(ioi_stop=0.0)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("BENCH_RETRAIN", "yes", "BENCH_RETRAIN='yes': not a switch"),
    ("BENCH_STEPS", "2k", "BENCH_STEPS='2k': not a whole number"),
    ("BENCH_BLIMP_EVAL", "150", "BENCH_BLIMP_EVAL='150': out of range"),
    ("BENCH_SCHEDULE", "cosin", "BENCH_SCHEDULE='cosin': not one of"),
    ("BENCH_LR", "0", "BENCH_LR='0': out of range"),
    ("BENCH_DETACH", "3", "BENCH_DETACH='3': out of range"),
    ("BENCH_SWAP_NAMES", "true", "BENCH_SWAP_NAMES='true': not a switch"),
])
def test_settings_from_env_stop_on_a_bad_value_naming_the_variable(monkeypatch, variable, value, message):
    bench = _ioi_recipe()
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit, match=re.escape(message)):
        bench.Settings.from_env()


def test_settings_from_env_defaults_and_values_reach_the_settings(monkeypatch):
    bench = _ioi_recipe()
    for name in [n for n in os.environ if n.startswith("BENCH_")]:
        monkeypatch.delenv(name)
    assert bench.Settings.from_env() == bench.Settings()
    monkeypatch.setenv("BENCH_RETRAIN", "1")
    monkeypatch.setenv("BENCH_WORD_SHARE", "0.5")
    monkeypatch.setenv("BENCH_SCHEDULE", "linear")
    monkeypatch.setenv("BENCH_SWAP_NAMES", "1")
    cfg = bench.Settings.from_env()
    assert (cfg.retrain, cfg.word_share, cfg.schedule, cfg.swap_names) == (True, 0.5, "linear", 1)


def test_ioi_trainer_loss_is_text_cross_entropy_plus_the_io_cross_entropy_and_spares_the_embeddings(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    bench = _ioi_recipe()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                       bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0))
    collator = bench.IOICollator(0, (torch.tensor([10, 11, 12]), torch.zeros(0, dtype=torch.long)), 0.0, seed=0,
                                 words=torch.tensor([30, 31, 32]), word_share=0.5)
    ioi = {"input_ids": torch.tensor([0, 5, 99, 6, 98, 7, 98, 8, 99]), "io_slots": torch.tensor([2, 4, 6])}
    text = {"input_ids": torch.tensor([0, 1, 2, 3, 4, 1, 2]), "story": torch.tensor(True)}
    batch = collator([ioi, text, ioi])
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    for detach in (0, 1):
        trainer = bench.IOITrainer(model=model, args=args, detach=detach)
        model.zero_grad()
        loss = trainer.compute_loss(model, batch)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        labels = batch["labels"][1, 1:]
        assert int((labels != -100).sum()) == 6  # every next token of the 7-token text row
        expected = torch.nn.functional.cross_entropy(logits[1, :-1][labels != -100], labels[labels != -100])
        last = int(batch["attention_mask"][0].sum()) - 2  # the IO is predicted from the token before it
        io_rows = torch.tensor([0, 2])
        expected = expected + torch.nn.functional.cross_entropy(logits[io_rows, last],
                                                                batch["input_ids"][io_rows, last + 1])
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        # the IOI rows alone: with detach=1 their loss reaches no (tied) embedding row
        model.zero_grad()
        trainer.compute_loss(model, {k: v[io_rows] for k, v in batch.items()}).backward()
        grad = model.get_input_embeddings().weight.grad
        assert (grad is None or not grad.any()) == (detach == 1)


def test_solve_ioi_keeps_the_best_smoothed_weights_and_stops_at_the_threshold(monkeypatch):
    bench = _ioi_recipe()
    model = torch.nn.Linear(1, 1, bias=False)
    accuracies = iter([0.5, 0.9, 0.6, 0.8, 0.7, 0.95, 0.95, 0.95])

    def fake_accuracy(m, batch):
        return next(accuracies)

    monkeypatch.setattr(bench, "ioi_accuracy", fake_accuracy)

    class State:
        global_step = 0

    class Control:
        should_training_stop = False

    def run(threshold, keep_best):
        callback, state, control = bench.SolveIOI(None, threshold, every=1, keep_best=keep_best), State(), Control()
        callback.on_train_begin(None, state, control, model=model)
        for step in range(1, 9):
            with torch.no_grad():
                model.weight.fill_(step)  # the weight records the step, so a restore is visible
            state.global_step = step
            callback.on_step_end(None, state, control)
            if control.should_training_stop:
                break
        callback.on_train_end(None, state, control)
        return callback, state

    callback, state = run(threshold=1.0, keep_best=True)  # never stops: keeps the best 3-check average
    # averages from step 3: 0.667, 0.767, 0.7, 0.817, 0.867, 0.95 -> step 8
    assert callback.best[1] == 8 and callback.best[0] == pytest.approx(0.95)
    assert model.weight.item() == 8
    accuracies = iter([0.5, 0.9, 0.6, 0.8, 0.7, 0.95, 0.95, 0.95])
    callback, state = run(threshold=0.85, keep_best=True)  # stops at the first average >= 0.85 (step 7)
    assert state.global_step == 7 and callback.best == (pytest.approx((0.7 + 0.95 + 0.95) / 3), 7)
    assert model.weight.item() == 7
    accuracies = iter([0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1])
    callback, state = run(threshold=1.0, keep_best=False)  # the constant phase keeps its last weights
    assert callback.best[1] == 3 and model.weight.item() == 8
    accuracies = iter([0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1])
    callback, state = run(threshold=1.0, keep_best=True)
    assert model.weight.item() == 3
