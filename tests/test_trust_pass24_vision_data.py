"""Trust pass 24, vision, data, the corpus and the renderings (helper-178): unusual inputs that earlier passes did not
try, each pinned where it was silently wrong or an unhelpful crash (every test here failed before its fix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.vision.visualize import save_explanation_figure


def _figure_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.rand(2, 1, 8, 8, dtype=dtype), {"W(x)x": torch.randn(2, 8, 8, dtype=dtype)}


def test_save_explanation_figure_returns_the_file_it_wrote_for_a_path_without_a_suffix(tmp_path):
    # matplotlib writes "figure.png" for the path "figure": the returned path named a file that does not exist
    images, columns = _figure_inputs()
    written = save_explanation_figure(tmp_path / "figure", images, columns)
    assert written == tmp_path / "figure.png"
    assert written.is_file() and not (tmp_path / "figure").exists()


def test_save_explanation_figure_refuses_a_folder_an_unknown_format_or_a_path_of_another_type(tmp_path):
    images, columns = _figure_inputs()
    # an existing folder: matplotlib wrote "<folder>.png" beside it and the folder's own path was returned
    with pytest.raises(BcosValueError, match=r"path: .*is a folder.*Pass a file path"):
        save_explanation_figure(tmp_path, images, columns)
    assert not tmp_path.with_name(tmp_path.name + ".png").exists()
    # refused before the figure is drawn, naming the argument (was matplotlib's ValueError after drawing it)
    with pytest.raises(BcosValueError, match=r"path: .*'\.txt'.*png"):
        save_explanation_figure(tmp_path / "figure.txt", images, columns)
    # was TypeError "expected str, bytes or os.PathLike object, not int" from pathlib, after drawing
    with pytest.raises(BcosTypeError, match=r"path: must be a file path"):
        save_explanation_figure(3, images, columns)
    assert list(tmp_path.iterdir()) == []


def test_save_explanation_figure_draws_half_precision_images_and_maps_as_their_float32_values(tmp_path):
    # bfloat16 images and maps failed inside NumPy ("Got unsupported ScalarType BFloat16"); float16 ones drew
    for dtype in (torch.bfloat16, torch.float16):
        images, columns = _figure_inputs(dtype)
        unsigned = {"rollout": torch.rand(2, 8, 8, dtype=dtype)}
        for cols in (columns, unsigned):
            written = save_explanation_figure(tmp_path / f"{dtype}.png", images, cols)
            reference = save_explanation_figure(tmp_path / "float32.png", images.float(),
                                                {k: v.float() for k, v in cols.items()})
            assert written.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("value", [float("nan"), 2.0, -0.5])
def test_save_explanation_figure_refuses_colour_rows_outside_0_1(tmp_path, value):
    # a NaN colour row drew as a blank (transparent) panel, values beyond [0, 1] were clipped by imshow (a log line);
    # weight_colour_image's rows lie in [0, 1]
    images, columns = _figure_inputs()
    rows = [np.full((8, 8, 4), 0.5), np.full((8, 8, 4), 0.5)]
    rows[1][3, 4, 0] = value
    with pytest.raises(BcosValueError, match=r"colour_rows\[1\]: .*\[0, 1\].*weight_colour_image"):
        save_explanation_figure(tmp_path / "f.png", images, columns, colour_rows=rows)


@pytest.fixture(scope="module")
def byte_level_classifier():
    """A tiny B-cos GPT-2 classifier over the shipped GPT-2 (byte-level BPE) tokenizer."""
    import transformers as T

    from bcos_plugins import bcosify
    from bcos_plugins.data import shipped_data

    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=64, num_labels=2,
                          pad_token_id=tokenizer.eos_token_id)
    return bcosify(T.GPT2ForSequenceClassification(config).eval(), b=1.5, verbose=False), tokenizer


def test_pages_show_byte_level_tokens_as_the_text_they_stand_for(byte_level_classifier):
    # GPT-2's byte-level tokens were drawn as their byte alphabet: " café" as "ĠcafÃ©", the Hebrew "שלום" as
    # "×©×ľ×ķ×Ŀ", an emoji as "ĠðŁ" + "į" + "ķ": text that is not in the input, beside each token's (right) score
    from bcos_plugins import explain
    from bcos_plugins.visualize import explanations_to_html

    model, tokenizer = byte_level_classifier
    batch = tokenizer(["naïve café", "שלום hello", "I love 🍕"], padding=True, return_tensors="pt")
    explanation = explain(model, **batch)
    page = explanations_to_html(explanation, tokenizer)
    for text in ("café", "na", "ïve", "ש", "ל", "ו", "hello", "love"):
        assert f">{text}<" in page or f"> {text}<" in page, text
    for alphabet in ("Ã", "×", "ðŁ", "Ġ"):
        assert alphabet not in page, alphabet
    # a character split across tokens is each token's bytes, escaped (the pizza emoji is F0 9F 8D 95)
    assert r"> \xf0\x9f<" in page and r">\x8d<" in page and r">\x95<" in page
    # the scores beside them are the explanation's, one per token, as before
    assert page.count('class="tok"') == int(batch["attention_mask"].sum())


def test_pages_keep_wordpiece_tokens_as_the_tokenizer_gives_them(minilm_bcos_bert):
    from bcos_plugins import explain
    from bcos_plugins.visualize import explanations_to_html

    model, tokenizer, _ = minilm_bcos_bert
    batch = tokenizer(["unbelievably naïve"], return_tensors="pt")
    page = explanations_to_html(explain(model, **batch), tokenizer)
    for token in tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist()):
        assert f">{token}<" in page, token


def _tiny_vit(kind: str = "bcos"):
    from bcos_plugins.vision import BcosViT, BcosViTConfig, ConventionalViT

    torch.manual_seed(0)
    config = BcosViTConfig(image_size=8, num_channels=1, patch_size=4, hidden_size=8, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=16, tokenizer="linear", num_labels=3)
    return (BcosViT if kind == "bcos" else ConventionalViT)(config).eval()


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_a_vit_on_the_meta_device_is_named_as_the_text_paths_name_it(kind):
    # failed with "unknown device type for autocast" (explain_image) or "Tensor on device meta is not on the expected
    # device cpu!" (forward), naming neither the model nor the fix
    from bcos_plugins.vision import explain_image

    model = _tiny_vit(kind).to("meta")
    images = torch.rand(2, 1, 8, 8)
    calls = [lambda: model(images)] + ([lambda: explain_image(model, images),
                                         lambda: model(encoded_pixel_values=torch.cat([images, 1 - images], 1))]
                                        if kind == "bcos" else [])
    for call in calls:
        with pytest.raises(BcosValueError, match=r"model: its parameters are on the meta device.*Load the weights"):
            call()


@pytest.mark.parametrize("kind", ["bcos", "conventional"])
def test_vit_output_attentions_that_is_not_true_or_false_is_refused(kind):
    # output_attentions="no" (truthy) returned the attention matrices
    model = _tiny_vit(kind)
    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(BcosTypeError, match=r"output_attentions: .*'no'"):
        model(images, output_attentions="no")
    assert model(images, output_attentions=False).attentions is None
    assert len(model(images, output_attentions=True).attentions) == 1


def _sentencepiece_like_tokenizer(texts, vocab_size: int = 600):
    """A fast tokenizer that marks a word's leading space as Llama 2's (legacy) SentencePiece conversion does: the
    text gets a "▁" in front and every space becomes "▁", so " sketch" alone is ["▁", "▁sketch"] while the prefix
    "... this sketch" ends in "▁sketch". Trained here on the texts (no download)."""
    import transformers as T
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"]))
    backend.pre_tokenizer = None
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    return T.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_encode_blimp_takes_the_target_and_foil_ids_a_sentencepiece_tokenizer_gives_after_the_prefix():
    # " sketch" alone is ["▁", "▁sketch"] for such a tokenizer: every target and foil "shared their first token" (the
    # bare "▁"), every pair was dropped and encode_blimp failed with a ValueError naming no argument; the model reads
    # "▁sketch" after the prefix
    from bcos_plugins.data import encode_blimp, load_blimp

    pairs = load_blimp("dna", n=60)
    tokenizer = _sentencepiece_like_tokenizer([f"{p.prefix} {w}" for p in pairs for w in (p.target, p.foil)])
    assert tokenizer.tokenize(" " + pairs[0].target)[0] == "▁"
    batch = encode_blimp(pairs, tokenizer)
    assert len(batch) > 0
    for i, pair in enumerate(batch.pairs):
        for word, ids in ((pair.target, batch.target_ids), (pair.foil, batch.foil_ids)):
            prefix = tokenizer(pair.prefix, add_special_tokens=False)["input_ids"]
            whole = tokenizer(f"{pair.prefix} {word}", add_special_tokens=False)["input_ids"]
            assert whole[:len(prefix)] == prefix and int(ids[i]) == whole[len(prefix)]
            assert tokenizer.convert_ids_to_tokens(int(ids[i])) != "▁"


def test_encode_blimp_gives_gpt2_the_ids_of_each_word_with_its_leading_space_as_before():
    # the paper's convention for GPT-2, whose byte-level tokens of a word after the prefix are those of " word" alone
    import transformers as T

    from bcos_plugins.data import BLIMP_SUBSETS, encode_blimp, load_blimp, shipped_data

    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    for subset in BLIMP_SUBSETS:
        batch = encode_blimp(load_blimp(subset, n=40), tokenizer)
        for i, pair in enumerate(batch.pairs):
            assert int(batch.target_ids[i]) == tokenizer(" " + pair.target)["input_ids"][0]
            assert int(batch.foil_ids[i]) == tokenizer(" " + pair.foil)["input_ids"][0]


def test_ioi_prompts_take_a_sentencepiece_tokenizers_name_tokens_as_the_prompt_reads_them():
    # " Steve" alone is ["▁", "▁Steve"] for such a tokenizer: every name was refused as "2 tokens with its leading
    # space", though the prompts read it as one token; the names now are the tokens the prompt holds
    from bcos_plugins.data import corrupt_ioi, encode_ioi, make_ioi_prompts
    from bcos_plugins.data.ioi import IOI_TRAIN_NAMES

    reference = make_ioi_prompts(400, seed=0)
    tokenizer = _sentencepiece_like_tokenizer([p.completion for p in reference] + [f"and {n}" for n in IOI_TRAIN_NAMES],
                                              vocab_size=5000)
    assert tokenizer.tokenize(" Steve")[0] == "▁"
    prompts = make_ioi_prompts(20, seed=0, tokenizer=tokenizer)
    for p in prompts:
        assert p.input_ids == tuple(tokenizer(p.text, add_special_tokens=False)["input_ids"])
        assert tokenizer.convert_ids_to_tokens(p.target_id) == "▁" + p.io
        assert tokenizer.convert_ids_to_tokens(p.foil_id) == "▁" + p.s
        assert [p.input_ids[i] for i in p.evidence_positions] == [p.target_id]
        assert [p.input_ids[i] for i in p.s_positions] == [p.foil_id] * 2
    corrupted = corrupt_ioi(prompts, seed=1, tokenizer=tokenizer)
    assert all(tokenizer.convert_ids_to_tokens(c.target_id) == "▁" + c.io for c in corrupted)
    batch = encode_ioi(prompts)
    assert batch.input_ids.gather(1, batch.io_positions[:, None]).squeeze(1).tolist() == batch.target_ids.tolist()


def test_gpt2_ioi_names_are_the_tokens_of_each_name_with_its_leading_space_as_before():
    import transformers as T

    from bcos_plugins.data import ioi_name_pool, make_ioi_prompts, shipped_data
    from bcos_plugins.data.ioi import IOI_HELDOUT_NAMES, IOI_TRAIN_NAMES

    tokenizer = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    for prompt in make_ioi_prompts(50, seed=3) + make_ioi_prompts(50, seed=3, split="heldout"):
        assert prompt.target_id == tokenizer(" " + prompt.io)["input_ids"][0]
        assert prompt.foil_id == tokenizer(" " + prompt.s)["input_ids"][0]
    from bcos_plugins.data.contrastive import word_tokens_after

    for name in (*IOI_TRAIN_NAMES, *IOI_HELDOUT_NAMES, *ioi_name_pool(500, seed=0)):
        assert word_tokens_after(tokenizer, "and", name) == tokenizer(" " + name)["input_ids"]


@pytest.mark.parametrize("tokenizer", ["linear", "conv"])
def test_a_pixel_maps_to_its_own_patchs_token_and_rollout_spreads_a_token_over_that_patch(tokenizer):
    # checked in pass 24 (right answer, pinned): a pixel at row 7, column 2 of a 12x12 image with 3x3 patches is in patch
    # row 2, column 0, token 8 of the row-major grid; attention_rollout's map of token 8 covers exactly that patch
    from bcos_plugins.vision import BcosViT, BcosViTConfig, attention_rollout

    torch.manual_seed(0)
    model = BcosViT(BcosViTConfig(image_size=12, num_channels=1, patch_size=3, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=16, tokenizer=tokenizer, conv_channels=[],
                                  num_labels=2)).eval()
    images = torch.rand(1, 1, 12, 12)
    changed = images.clone()
    changed[0, 0, 7, 2] = 1 - changed[0, 0, 7, 2]
    with torch.no_grad():
        moved = (model.tokenizer(model.encode(images)) - model.tokenizer(model.encode(changed))).abs().sum(-1)[0]
    assert moved.nonzero().flatten().tolist() == [8]
    attention = torch.zeros(1, 2, 16, 16)
    attention[..., 8] = 1  # every query attends to token 8 alone
    pixels = attention_rollout([attention], patch_size=3, residual_weight=0.0)[0]
    expected = torch.zeros(12, 12)
    expected[6:9, 0:3] = 1
    assert torch.equal(pixels, expected)


def test_ioi_name_pool_draws_a_sentencepiece_tokenizers_word_pieces():
    # a SentencePiece piece "▁Mary" decodes to "Mary" alone (Llama's decoder drops a first token's space; this one
    # keeps the marker): the pool read only pieces that decode to " Mary" and refused "the tokenizer has 0 capitalised
    # single-token words"; GPT-2's pool is the same draw as before (pieces that decode to a space and the word)
    import random
    import re

    import transformers as T

    from bcos_plugins.data import ioi_name_pool, make_ioi_prompts, shipped_data
    from bcos_plugins.data.contrastive import word_tokens_after
    from bcos_plugins.data.ioi import (
        IOI_HELDOUT_NAMES,
        IOI_HELDOUT_TEMPLATES,
        IOI_TRAIN_NAMES,
        IOI_TRAIN_TEMPLATES,
    )

    tokenizer = _sentencepiece_like_tokenizer([p.completion for p in make_ioi_prompts(400, seed=0)]
                                              + [f"and {n}" for n in IOI_TRAIN_NAMES], vocab_size=5000)
    pool = ioi_name_pool(20, seed=0, tokenizer=tokenizer)
    assert len(pool) == 20
    for name in pool:
        assert tokenizer.convert_ids_to_tokens(word_tokens_after(tokenizer, "and", name)) == ["▁" + name]
    gpt2 = T.GPT2TokenizerFast.from_pretrained(shipped_data("gpt2_tokenizer"))
    excluded = set(re.findall(r"[A-Z][a-z]+", " ".join(IOI_TRAIN_TEMPLATES + IOI_HELDOUT_TEMPLATES))) | set(IOI_HELDOUT_NAMES)
    before = sorted({w[1:] for p in gpt2.get_vocab() if re.fullmatch(r".[A-Z][a-z]{2,}", p)
                     for w in [gpt2.convert_tokens_to_string([p])]
                     if re.fullmatch(r" [A-Z][a-z]{2,}", w) and w[1:] not in excluded})
    assert ioi_name_pool(300, seed=4) == tuple(sorted(random.Random("ioi-pool-4").sample(before, 300)))
