"""Every explanation path gives the same answer (issue 14), property-based over small random models and inputs.

For tiny B-cos GPT-2 / Llama (causal LMs) and BERT (classifiers) with random sizes and B, random batches with left
or right padding (BERT: right; every path refuses its left-padded batches), targets, foils and positions, these
paths must give the same per-token contributions and the same explained value as :func:`bcos_plugins.explain` (within 1e-5 of the largest contribution / explained
value of the batch; float32):

- Captum ``BcosAttribution`` with ``EmbeddingForward`` as the module, and with a plain function around it;
- Captum ``LayerBcos`` at its default layer (the embedding point) around a plain function of the ids;
- inseq's "bcos" method (decoders; forced decoding of the target after each row's prefix);
- the TransformerLens explanation ``explain_logits`` of the model converted by ``hooked_transformer_from_hf``
  (decoders).

A foil is explained as ``target - foil``: by the paths that take a foil (explain, TransformerLens, inseq's
``contrast_logits_diff``, a plain function returning the difference), and as the difference of two target
attributions where Captum selects one output (input x gradient is linear in the explained output).
"""

from __future__ import annotations

import warnings
from functools import cache

import inseq
import pytest
import torch
import transformers as T
from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward, LayerBcos
from bcos_plugins.adapters.inseq import METHOD_NAME
from bcos_plugins.adapters.transformer_lens import explain_logits, hooked_transformer_from_hf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcos_plugins import bcosify, explain
from bcos_plugins.attribution import model_call_kwargs, resolve_positions
from bcos_plugins.convert.architectures import spec_for
from bcos_plugins.errors import BcosValueError

VOCAB = 40
PAD = 0
CROSS = settings(max_examples=6, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@cache
def bcos_model(family: str, heads: int, b: float):
    """A tiny random B-cos model: 2 layers, d 32, ``heads`` heads, B = ``b``."""
    torch.manual_seed(heads * 10 + int(b * 4))
    if family == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=heads, n_positions=16,
                                               n_ctx=16, bos_token_id=2, eos_token_id=2, pad_token_id=PAD))
    elif family == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=heads, num_key_value_heads=heads // 2,
                                                 intermediate_size=48, max_position_embeddings=16, bos_token_id=2,
                                                 eos_token_id=2, pad_token_id=PAD))
    else:
        model = T.BertForSequenceClassification(T.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=heads, intermediate_size=48,
            max_position_embeddings=16, num_labels=4, pad_token_id=PAD))
    return bcosify(model.eval(), b=b, verbose=False)


@cache
def lens_model(family: str, heads: int, b: float):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return hooked_transformer_from_hf(bcos_model(family, heads, b)).eval()


@cache
def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(3, VOCAB)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>",
                                     bos_token="<eos>")


@cache
def inseq_model(family: str, heads: int, b: float):
    return inseq.load_model(bcos_model(family, heads, b), METHOD_NAME, tokenizer=word_tokenizer())


@st.composite
def cases(draw, family: str):
    batch = draw(st.integers(1, 3))
    length = draw(st.integers(2, 7))
    lengths = [length] + [draw(st.integers(1, length)) for _ in range(batch - 1)]
    # BERT classifies from the first column, a padding token's on a left-padded row: left padding is refused there
    # (test_encoder_classifier_paths_agree checks the refusal on each batch moved to the left)
    side = "right" if family == "bert" else draw(st.sampled_from(["left", "right"]))
    ids = torch.tensor([draw(st.lists(st.integers(3, VOCAB - 1), min_size=length, max_size=length))
                        for _ in range(batch)])
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, length - n:] = 1
    ids = ids.masked_fill(mask == 0, PAD)
    # decoders: no special tokens as targets (inseq's forced decoding goes through text)
    low, high = (0, 3) if family == "bert" else (3, VOCAB - 1)
    target = torch.tensor(draw(st.lists(st.integers(low, high), min_size=batch, max_size=batch)))
    foil = None
    if draw(st.booleans()):
        foil = torch.tensor([draw(st.integers(low, high).filter(lambda f, t=int(t): f != t)) for t in target])
    # decoders: a position per row, counted back from its last real token
    back = draw(st.integers(1, min(lengths)))
    position = None if family == "bert" or draw(st.booleans()) else -back
    config = (draw(st.sampled_from([2, 4])), draw(st.sampled_from([1.25, 2.0])))
    return config, ids, mask, target, foil, position


def scale_of(ref) -> float:
    return max(ref.contributions.abs().max().item(), ref.explained.abs().max().item())


def assert_complete(ref):
    # against the batch's scale: a target - foil of nearly equal logits has a tiny explained value whose
    # relative error is float32 rounding of the two logits
    assert ref.delta.abs().max().item() <= 1e-5 * scale_of(ref)


def assert_same(name, contributions, explained, ref):
    """Per-token contributions and explained values within 1e-5 of the batch's scale."""
    scale = scale_of(ref)
    diff = (contributions - ref.contributions).abs().max().item()
    assert diff <= 1e-5 * scale, f"{name}: contributions differ by {diff:.2e} (scale {scale:.2e})"
    diff = (explained - ref.explained).abs().max().item()
    assert diff <= 1e-5 * scale, f"{name}: explained values differ by {diff:.2e} (scale {scale:.2e})"


def captum_paths(model, ids, mask, target, foil, position):
    """(name, per-token contributions, explained) of the three Captum paths."""
    spec = spec_for(model)
    batch = ids.shape[0]
    rows = torch.arange(batch)
    fwd = EmbeddingForward(model)
    emb = fwd.embed(ids, mask)
    extra = (mask,) if spec.is_classifier else (mask, position)
    results = []

    # the module, one target per call (a foil: the difference of two calls)
    attr, delta = BcosAttribution(fwd).attribute(emb, target=target, additional_forward_args=extra,
                                                 return_convergence_delta=True)
    if foil is not None:
        attr_f, delta_f = BcosAttribution(fwd).attribute(emb, target=foil, additional_forward_args=extra,
                                                         return_convergence_delta=True)
        attr, delta = attr - attr_f, delta - delta_f
    results.append(("BcosAttribution(EmbeddingForward)", attr.sum(-1), attr.sum(dim=(1, 2)) - delta))

    # a plain function returning the explained value itself
    def explained_value(e, m, *pos):
        out = fwd(e, m, *pos)
        return out[rows, target] - (out[rows, foil] if foil is not None else 0)

    attr, delta = BcosAttribution(explained_value).attribute(emb, additional_forward_args=extra,
                                                             return_convergence_delta=True)
    results.append(("BcosAttribution(plain function)", attr.sum(-1), attr.sum(dim=(1, 2)) - delta))

    # LayerBcos at the embedding point of a plain function of the ids
    def logits_of_ids(i, m):
        out = model(**model_call_kwargs(model, spec, i, m, {})).logits
        return out if spec.is_classifier else out[rows, resolve_positions(position, m)]

    layer = LayerBcos(logits_of_ids, model=model)
    attr, delta = layer.attribute(ids, target=target, additional_forward_args=(mask,), return_convergence_delta=True)
    if foil is not None:
        attr_f, delta_f = layer.attribute(ids, target=foil, additional_forward_args=(mask,),
                                          return_convergence_delta=True)
        attr, delta = attr - attr_f, delta - delta_f
    results.append(("LayerBcos(plain function)", attr.sum(-1), attr.sum(dim=(1, 2)) - delta))
    return results


def inseq_path(family, config, ids, mask, target, foil, ref):
    """inseq "bcos": each row's prefix up to the explained position as the prompt, the target forced after it."""
    model = inseq_model(family, *config)
    contributions = torch.zeros_like(ref.contributions)
    explained = torch.zeros_like(ref.explained)
    for row in range(ids.shape[0]):
        real = mask[row].nonzero().flatten()
        keep = real[real <= ref.position[row]]
        prompt = " ".join(f"w{i}" for i in ids[row, keep].tolist())
        kwargs = {}
        if foil is not None:
            kwargs = {"attributed_fn": "contrast_logits_diff", "contrast_targets": f"{prompt} w{int(foil[row])}"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # inseq's notes on batch size 1 and contrastive inputs
            seq = model.attribute(prompt, f"{prompt} w{int(target[row])}", show_progress=False,
                                  **kwargs).sequence_attributions[0]
        scores = seq.target_attributions[:len(keep), 0]  # (prefix tokens, d_model) for the one forced token
        contributions[row, keep] = scores.sum(-1)
        explained[row] = scores.sum() - seq.step_scores["deltas"][0]
    return contributions, explained


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@CROSS
@given(data=st.data())
def test_decoder_paths_agree(family, data):
    config, ids, mask, target, foil, position = data.draw(cases(family))
    model = bcos_model(family, *config)
    ref = explain(model, ids, mask, target=target, foil=foil, position=position)
    assert_complete(ref)
    for name, contributions, explained in captum_paths(model, ids, mask, target, foil, position):
        assert_same(name, contributions, explained, ref)
    lens = explain_logits(lens_model(family, *config), ids, target=target, foil=foil, position=position,
                          attention_mask=mask)
    assert_same("TransformerLens explain_logits", lens.contributions, lens.explained, ref)
    assert_same("inseq 'bcos'", *inseq_path(family, config, ids, mask, target, foil, ref), ref)


@settings(CROSS, max_examples=10)
@given(data=st.data())
def test_encoder_classifier_paths_agree(data):
    config, ids, mask, target, foil, _ = data.draw(cases("bert"))
    model = bcos_model("bert", *config)
    ref = explain(model, ids, mask, target=target, foil=foil)
    assert_complete(ref)
    for name, contributions, explained in captum_paths(model, ids, mask, target, foil, None):
        assert_same(name, contributions, explained, ref)
    # the same rows padded on the left: every path refuses them, naming the argument and the fix
    shifts = (mask == 0).sum(1)
    if shifts.any():
        left_ids = torch.stack([row.roll(int(n)) for row, n in zip(ids, shifts, strict=True)])
        left_mask = torch.stack([row.roll(int(n)) for row, n in zip(mask, shifts, strict=True)])
        refusal = r"^attention_mask: rows? \[.*\] starts? with padding.*first column.*padding_side = 'right'"
        with pytest.raises(BcosValueError, match=refusal):
            explain(model, left_ids, left_mask, target=target, foil=foil)
        with pytest.raises(BcosValueError, match=refusal):
            captum_paths(model, left_ids, left_mask, target, foil, None)
