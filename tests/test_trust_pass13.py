"""Trust pass 13: cross-path agreement. The same B-cos explanation reached through ``explain``, Captum
(``BcosAttribution`` over ``EmbeddingForward``, ``LayerBcos``), inseq (``"bcos"`` generation, step by step, contrast,
probability), TransformerLens (``hooked_transformer_from_hf``, ``transformer_bridge_from_hf``, ``explain_logits``,
``token_component_decomposition``) under less-travelled settings (foils, non-last positions, left / right padding,
batch of 1 vs 3, B = 1.25 / 2 / 2.5, float64 models), each compared with the others and with the model's own float64
logit. The paths agreed to rounding; the float64 differences are documented on the host pages (transformers' float32
rotary tables, inseq's float32 step outputs, the bridge's float32 softmax). The case that failed with a misleading
cause, one test.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf
from conftest import MAX_POS, VOCAB, padded_rows, tiny_config

from bcos_plugins import bcosify, explain
from bcos_plugins.errors import BcosValueError


def test_a_left_padded_float64_bridge_explanation_names_the_padded_float64_cause():
    # the bridge's attention computes its softmax in float32, so in float64 the all-masked padding queries of a
    # left-padded row give NaN; the message blamed the inputs and embeddings ("an input or an embedding row of
    # NaN, inf or a huge value"), which were fine, and did not name the fix (float32, or the rows alone)
    torch.manual_seed(0)
    model = bcosify(T.LlamaForCausalLM(tiny_config("llama")).eval(), b=1.25, verbose=False).double()
    bridge = transformer_bridge_from_hf(model)
    ids, mask = padded_rows([7, 5, 3], 7, "left", seed=1)
    with pytest.raises(BcosValueError, match=r"runs in float64 and the batch is padded.*Explain in float32"):
        explain_logits(bridge, ids, target=5, attention_mask=mask)
    # the same rows in float32 are explained (the fix the message names)
    expl = explain_logits(transformer_bridge_from_hf(model.float()), ids, target=5, attention_mask=mask)
    assert float(expl.completeness_error.max()) < 1e-4


def _word_tokenizer(eos: str = "<eos>"):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(3, VOCAB)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token=eos,
                                     bos_token="<eos>")


def test_inseq_contrast_logits_diff_on_gemma2_explains_target_minus_foil():
    # Gemma 2's token embedding (the attribution point) is a scaled nn.Embedding subclass, which the "bcos" method's
    # lookup without the module left out: inseq's contrast function embedded the contrast through the module, Captum
    # kept that activation instead of the forward's, and the call failed ("The differentiated Tensor at index 0
    # appears to not have been used in the graph")
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    torch.manual_seed(0)
    config = T.Gemma2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=MAX_POS, head_dim=8,
                            sliding_window=4, final_logit_softcapping=5.0, attn_logit_softcapping=5.0,
                            query_pre_attn_scalar=8, pad_token_id=0, bos_token_id=2, eos_token_id=2)
    model = bcosify(T.Gemma2ForCausalLM(config).eval(), b=1.25, verbose=False)
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer())
    out = attribution_model.attribute("w5 w9 w12 w7", "w5 w9 w12 w7 w11", attributed_fn="contrast_logits_diff",
                                      contrast_targets="w5 w9 w12 w7 w13", show_progress=False)
    scores = out.sequence_attributions[0].target_attributions[:4, 0].sum(-1)
    ref = explain(model, torch.tensor([[5, 9, 12, 7]]), target=11, foil=13)
    scale = max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())
    assert (scores - ref.contributions[0]).abs().max().item() <= 1e-5 * scale


def test_visualization_records_of_a_float64_explanation_keep_its_scores():
    # the records cast every score row to float32, so a float64 model's token scores and attr_score were 1e-8 of
    # themselves away from its explanation's (and from explain_dataset's, which keeps them)
    from bcos_plugins.adapters.captum import visualization_records

    torch.manual_seed(0)
    model = bcosify(T.BertForSequenceClassification(tiny_config("bert")).eval(), b=2.5, verbose=False).double()
    ids, mask = padded_rows([7, 5, 3], 7, "right", seed=1)
    expl = explain(model, ids, mask, target=torch.tensor([0, 2, 1]))
    records = visualization_records(expl, _word_tokenizer())
    for record, scores in zip(records, expl.scores(), strict=True):
        assert torch.equal(torch.as_tensor(record.word_attributions), scores)
        assert record.attr_score == float(scores.sum())
    # Python floats (explain_dataset's columns) are kept as they are
    listed = visualization_records(scores=[s.tolist() for s in expl.scores()], tokens=[["t"] * len(s) for s in
                                                                                        expl.scores()])
    assert [r.word_attributions.tolist() for r in listed] == [s.tolist() for s in expl.scores()]


def test_inseq_scores_of_a_float64_model_are_its_float64_explanation():
    # inseq's step output casts to float32 when made: a float64 model's scores were 1e-8 of themselves away from
    # explain's and from its logit, while the deltas step score, computed before the cast, read 0
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    torch.manual_seed(0)
    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")).eval(), b=2.5, verbose=False).double()
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer())
    out = attribution_model.attribute("w5 w9 w12 w7", generation_args={"max_new_tokens": 2, "do_sample": False},
                                      show_progress=False, step_scores=["logit"])
    seq = out.sequence_attributions[0]
    ids = [t.id for t in seq.target]
    assert seq.target_attributions.dtype == torch.float64
    for step in range(2):
        ref = explain(model, torch.tensor([ids[:4 + step]]), target=ids[4 + step])
        scores = seq.target_attributions[:4 + step, step].sum(-1)
        assert (scores - ref.contributions[0]).abs().max().item() <= 1e-12 * ref.explained.abs().item()
        assert abs(scores.sum().item() - seq.step_scores["logit"][step].item()) <= 1e-12 * ref.explained.abs().item()
    # aggregated (signed sum) columns too
    aggregated = seq.aggregate().target_attributions
    assert aggregated.dtype == torch.float64


def _gpt2_whose_second_prompt_ends_at_once(prompts: list[str]):
    """A tiny B-cos GPT-2 whose greedy continuation of ``prompts[1]`` is its end-of-sequence token at once and of
    ``prompts[0]`` is not: the model, that token's id (set as its eos), and row 0's three-token continuation."""
    tokenizer = _word_tokenizer()
    for seed in range(20):
        torch.manual_seed(seed)
        model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")).eval(), b=1.25, verbose=False)
        with torch.no_grad():
            first = [int(model(torch.tensor([tokenizer(p)["input_ids"]])).logits[0, -1].argmax()) for p in prompts]
        model.generation_config.eos_token_id = first[1]
        continued = model.generate(torch.tensor([tokenizer(prompts[0])["input_ids"]]), max_new_tokens=3,
                                   do_sample=False, pad_token_id=0)[0, 4:].tolist()
        if first[1] not in continued and first[1] > 2:
            model.config.eos_token_id = first[1]
            return model, first[1], continued
    raise AssertionError("no seed gives a row that ends at once beside one that does not")


def test_inseq_generation_where_one_row_ends_before_the_others_is_attributed():
    # inseq 0.7.1 remaps a step whose finished rows were filtered out through batch.sources, which a decoder-only
    # batch lacks: a batch whose rows stopped at different steps failed ("'DecoderOnlyBatch' object has no
    # attribute 'sources'"); the rows still generating are explained as explain explains their prefixes
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    prompts = ["w5 w9 w12 w7", "w3 w30"]
    model, end, continued = _gpt2_whose_second_prompt_ends_at_once(prompts)
    # inseq sees a row end where the tokenizer's end-of-sequence token is generated
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer(eos=f"w{end}"))
    out = attribution_model.attribute(prompts, generation_args={"max_new_tokens": 3, "do_sample": False},
                                      show_progress=False, step_scores=["logit"])
    seq = out.sequence_attributions[0]
    ids = [t.id for t in seq.target]
    assert ids[4:] == continued
    for step in range(3):
        ref = explain(model, torch.tensor([ids[:4 + step]]), target=ids[4 + step])
        scale = max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())
        assert (seq.target_attributions[:4 + step, step].sum(-1) - ref.contributions[0]).abs().max() <= 1e-5 * scale


def test_inseq_warns_when_a_generation_holds_a_special_token_its_labels_drop():
    # inseq 0.7.1 decodes the generation without special tokens and labels the steps with that text's tokens: a
    # tiny Qwen2 that generated <pad> then w3 got a column labelled w3 holding <pad>'s logit (0.2126 where w3's is
    # 0.1781), silently, for "bcos" and inseq's own methods alike
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    tokenizer = _word_tokenizer()
    config = T.Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=24, pad_token_id=0,
                           bos_token_id=2, eos_token_id=2)
    prompt = torch.tensor([[5, 9, 12, 7]])
    for seed in range(400):  # a model whose greedy continuation starts with the padding token, then goes on
        torch.manual_seed(seed)
        model = bcosify(T.Qwen2ForCausalLM(config).eval(), b=1.25, verbose=False)
        generated = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, 4:].tolist()
        if generated[0] == 0 and generated[1] > 2 and 2 not in generated:
            break
    else:
        raise AssertionError("no seed generates the padding token first")
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=tokenizer)
    with pytest.warns(UserWarning, match=r"row\(s\) \[0\] contains special token\(s\) \['<pad>'\].*suppress_tokens"):
        attribution_model.attribute("w5 w9 w12 w7", generation_args={"max_new_tokens": 3, "do_sample": False},
                                    show_progress=False)
    # kept from generating it, the generation is attributed without a warning
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="inseq: the generation")
        attribution_model.attribute("w5 w9 w12 w7", show_progress=False,
                                    generation_args={"max_new_tokens": 3, "do_sample": False, "suppress_tokens": [0]})


def test_inseq_row_that_generates_its_end_at_once_gets_no_columns_and_its_prompt_as_source():
    # a batch row whose first generated token is its end-of-sequence token generates nothing; inseq 0.7.1 re-encodes
    # its text (= its prompt) left-padded to the batch's longest and took the prompt for a generation: source [],
    # target its prompt tokens, and the column labelled w30 held w3's logit after padding only (its own "saliency"
    # does the same once its crash on such batches is patched), silently. Now: no columns, the prompt as source
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    prompts = ["w5 w9 w12 w7", "w3 w30"]
    model, end, continued = _gpt2_whose_second_prompt_ends_at_once(prompts)
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer(eos=f"w{end}"))
    out = attribution_model.attribute(prompts, generation_args={"max_new_tokens": 3, "do_sample": False},
                                      show_progress=False, step_scores=["logit", "probability"])
    ended = out.sequence_attributions[1]
    assert [(t.token, t.id) for t in ended.source] == [("w3", 3), ("w30", 30)]
    assert [(t.token, t.id) for t in ended.target] == [("w3", 3), ("w30", 30)]
    assert (ended.attr_pos_start, ended.attr_pos_end) == (2, 2)
    assert tuple(ended.target_attributions.shape) == (2, 0, 32)
    assert {name: tuple(score.shape) for name, score in ended.step_scores.items()} == {
        "deltas": (0,), "logit": (0,), "probability": (0,)}
    # the row still generating is explained as explain explains its prefixes
    seq = out.sequence_attributions[0]
    ids = [t.id for t in seq.target]
    assert ids[4:] == continued
    for step in range(3):
        ref = explain(model, torch.tensor([ids[:4 + step]]), target=ids[4 + step])
        scale = max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())
        assert (seq.target_attributions[:4 + step, step].sum(-1) - ref.contributions[0]).abs().max() <= 1e-5 * scale
        assert abs(seq.step_scores["logit"][step].item() - ref.explained.item()) <= 1e-5 * scale
    # inseq's show (which warns "Found empty attributions" for such a row), aggregate and save / load take it
    assert "w15" in out.show(display=False, return_html=True)
    assert tuple(out.aggregate().sequence_attributions[1].target_attributions.shape) == (2, 0)


def _gpt2_whose_row_1_generates_one_token_then_ends(prompts):
    """A tiny B-cos GPT-2 (and its end token) whose greedy continuation of prompts[1] is one token then the end token,
    while prompts[0] generates 3 tokens without it."""
    tokenizer = _word_tokenizer()
    for seed in range(60):
        torch.manual_seed(seed)
        model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")).eval(), b=1.25, verbose=False)
        row_1 = torch.tensor([tokenizer(prompts[1])["input_ids"]])
        ended = model.generate(row_1, max_new_tokens=2, do_sample=False, pad_token_id=0)[0, row_1.shape[1]:].tolist()
        row_0 = torch.tensor([tokenizer(prompts[0])["input_ids"]])
        continued = model.generate(row_0, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, 4:].tolist()
        used = set(row_0[0].tolist() + row_1[0].tolist() + [ended[0]] + continued)
        if ended[0] > 2 and ended[1] > 2 and ended[1] not in used:
            model.config.eos_token_id = model.generation_config.eos_token_id = ended[1]
            return model, ended, continued
    raise AssertionError("no seed gives a row that generates one token then ends")


def test_inseq_row_that_generates_fewer_tokens_gets_only_its_generated_columns():
    # inseq 0.7.1 attributes the same steps for every row of the batch: a row that generated one token (then its end
    # token) while another generated three got source [] and columns labelled with its two prompt tokens too (w3's
    # a logit after padding only). Now: its prompt as source and the one column of the token it generated
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    prompts = ["w5 w9 w12 w7", "w3 w30"]
    model, ended, continued = _gpt2_whose_row_1_generates_one_token_then_ends(prompts)
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer(eos=f"w{ended[1]}"))
    out = attribution_model.attribute(prompts, generation_args={"max_new_tokens": 3, "do_sample": False},
                                      show_progress=False, step_scores=["logit"])
    short = out.sequence_attributions[1]
    assert [t.id for t in short.source] == [3, 30]
    assert [t.id for t in short.target] == [3, 30, ended[0]]
    assert (short.attr_pos_start, short.attr_pos_end) == (2, 3)
    assert tuple(short.target_attributions.shape) == (3, 1, 32)
    ref = explain(model, torch.tensor([[3, 30]]), target=ended[0])
    scale = max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())
    assert (short.target_attributions[:2, 0].sum(-1) - ref.contributions[0]).abs().max() <= 1e-5 * scale
    assert abs(short.step_scores["logit"].item() - ref.explained.item()) <= 1e-5 * scale
    seq = out.sequence_attributions[0]
    ids = [t.id for t in seq.target]
    assert ids[4:] == continued and tuple(seq.target_attributions.shape) == (7, 3, 32)
    for step in range(3):
        ref = explain(model, torch.tensor([ids[:4 + step]]), target=ids[4 + step])
        scale = max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())
        assert (seq.target_attributions[:4 + step, step].sum(-1) - ref.contributions[0]).abs().max() <= 1e-5 * scale


def test_inseq_row_whose_columns_inseq_shifted_warns():
    # a one-token prompt that generates one token (then its end token) next to a four-token prompt that generates
    # three: inseq 0.7.1 attributes a padding step first for it and keeps its first two steps, so the column labelled
    # with its generated token held its prompt token's logit after padding only; that cannot be put right afterwards
    import inseq
    from bcos_plugins.adapters.inseq import METHOD_NAME

    prompts = ["w5 w9 w12 w7", "w3"]
    model, ended, _ = _gpt2_whose_row_1_generates_one_token_then_ends(prompts)
    attribution_model = inseq.load_model(model, METHOD_NAME, tokenizer=_word_tokenizer(eos=f"w{ended[1]}"))
    with pytest.warns(UserWarning, match=r"row\(s\) \[1\] generated fewer tokens.*one prompt at a time"):
        attribution_model.attribute(prompts, generation_args={"max_new_tokens": 3, "do_sample": False},
                                    show_progress=False)
    # one prompt at a time (the way out the warning names), without a warning
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="inseq: row")
        out = attribution_model.attribute(prompts, generation_args={"max_new_tokens": 3, "do_sample": False},
                                          show_progress=False, batch_size=1)
    assert [t.id for t in out.sequence_attributions[1].target] == [3, ended[0]]
