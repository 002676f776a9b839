"""What session 26's helper-198 left about the TransformerLens bridge (helper-206): a list of texts given to a bridge
with ``prepend_bos=False`` over a tokenizer that pads on the left with its BOS id (GPT-2: pad = eos = bos) ran each
padded row attending one padding token (TransformerLens' bridge derives the mask with ``cfg.default_prepend_bos``,
not the call's ``prepend_bos``), silently; it is refused by the HookedTransformer's check, naming the fixes, which
work. And ``logit_attrs`` with a ``batch_slice`` naming rows a stack already cut lacks failed with a bare IndexError.
Each refusal failed before its change; the controls pass before and after."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T

from bcos_plugins import bcosify
from bcos_plugins.data.shipped import shipped_data
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)

TEXTS = ["the cat sat on the mat", "hello", "a b c"]  # rows 1 and 2 are padded on the left
TARGET = 7


def _gpt2(bcos: bool):
    tokenizer = T.AutoTokenizer.from_pretrained(shipped_data("gpt2_tokenizer"), padding_side="left")
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.bos_token_id
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = T.GPT2LMHeadModel(config).eval()
    return (bcosify(model, b=1.5, verbose=False) if bcos else model), tokenizer


@pytest.fixture(scope="module", params=[True, False], ids=["bcos", "stock"])
def left_padded_bridge(request):
    """A tiny GPT-2 bridge (B-cos, and stock: TransformerLens' own mask is at fault) whose tokenizer pads on the left
    with its BOS id, and the transformers model it was built from."""
    from bcos_plugins.adapters.transformer_lens import transformer_bridge_from_hf

    hf_model, tokenizer = _gpt2(request.param)
    bridge = transformer_bridge_from_hf(hf_model, tokenizer=tokenizer)
    assert bridge.cfg.default_prepend_bos and bridge.tokenizer.padding_side == "left"
    return bridge, hf_model, tokenizer


def _each_text_alone(hf_model, tokenizer, bos: bool) -> torch.Tensor:
    """Each text's last logit at TARGET, run alone through the transformers model (no padding)."""
    out = []
    for text in TEXTS:
        ids = tokenizer(text, return_tensors="pt").input_ids
        if bos:
            ids = torch.cat([torch.tensor([[tokenizer.bos_token_id]]), ids], 1)
        with torch.no_grad():
            out.append(hf_model(ids).logits[0, -1, TARGET])
    return torch.stack(out)


@pytest.mark.parametrize("call", ["forward", "forward_positional", "run_with_cache", "run_with_hooks"])
def test_a_text_batch_without_a_bos_left_padded_with_the_bos_id_is_refused_naming_the_fixes(left_padded_bridge, call):
    """bridge(texts, prepend_bos=False): rows 1 and 2 were 0.2 (B-cos) / 0.06-0.08 (stock) off each text alone at the
    last logit, without a word. Refused as the HookedTransformer refuses its batch, through the same check; the
    call's prepend_bos=False is not named as a fix (it made the batch: the bridge's mask does not read it)."""
    bridge, _, _ = left_padded_bridge
    calls = {"forward": lambda: bridge(TEXTS, prepend_bos=False),
             "forward_positional": lambda: bridge(TEXTS, "logits", False, False),  # input, return_type, loss_per_token
             "run_with_cache": lambda: bridge.run_with_cache(TEXTS, prepend_bos=False),
             "run_with_hooks": lambda: bridge.run_with_hooks(TEXTS, prepend_bos=False)}
    with pytest.raises(BcosValueError) as caught:
        calls[call]()
    message = " ".join(str(caught.value).split())
    assert message.startswith("input: row 0 begins with token")
    for fix in ("Pass attention_mask=", "model.cfg.default_prepend_bos = False", "whatever the call's prepend_bos",
                "make the tokens with a BOS"):
        assert fix in message
    assert "prepend_bos=False also works" not in message


def test_a_batch_with_a_bos_on_every_row_passes_and_is_each_text_alone(left_padded_bridge):
    """The control: the same texts with a BOS on every row (the default, or prepend_bos=True) are not refused, and
    each row's last logit is its text's alone with a BOS."""
    bridge, hf_model, tokenizer = left_padded_bridge
    alone = _each_text_alone(hf_model, tokenizer, bos=True)
    with torch.no_grad():
        for logits in (bridge(TEXTS), bridge(TEXTS, prepend_bos=True), bridge.run_with_cache(TEXTS)[0]):
            torch.testing.assert_close(logits[:, -1, TARGET], alone, atol=1e-5, rtol=1e-5)


def test_the_fixes_named_give_each_text_alone(left_padded_bridge, monkeypatch):
    """The refusal's fixes work: the tokenizer's own attention_mask with the same call, and
    cfg.default_prepend_bos = False, each give every row its text's last logit alone (no BOS)."""
    bridge, hf_model, tokenizer = left_padded_bridge
    alone = _each_text_alone(hf_model, tokenizer, bos=False)
    mask = tokenizer(TEXTS, padding=True, return_tensors="pt").attention_mask
    with torch.no_grad():
        masked = bridge(TEXTS, prepend_bos=False, attention_mask=mask)
        monkeypatch.setattr(bridge.cfg, "default_prepend_bos", False)
        default_off = bridge(TEXTS, prepend_bos=False)
    for logits in (masked, default_off):
        torch.testing.assert_close(logits[:, -1, TARGET], alone, atol=1e-5, rtol=1e-5)


def test_a_single_text_and_a_right_padding_tokenizer_pass_unchanged(left_padded_bridge, monkeypatch):
    """Not refused: one text without a BOS (no padding; the bridge derives no mask), and the same batch when the
    tokenizer pads on the right (the bridge leaves right padding unmasked, HookedTransformer's behaviour)."""
    bridge, hf_model, tokenizer = left_padded_bridge
    alone = _each_text_alone(hf_model, tokenizer, bos=False)
    with torch.no_grad():
        torch.testing.assert_close(bridge([TEXTS[1]], prepend_bos=False)[0, -1, TARGET], alone[1], atol=1e-5,
                                   rtol=1e-5)
        monkeypatch.setattr(bridge.tokenizer, "padding_side", "right")
        assert bridge(TEXTS, prepend_bos=False).shape[0] == len(TEXTS)


@pytest.mark.parametrize("target", [torch.tensor([4]), 4], ids=["one_per_row", "int"])
@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_logit_attrs_batch_slice_past_the_stacks_rows_names_batch_slice(kind, target):
    """cache.logit_attrs(stack[:, 1:], ..., batch_slice=[1]) (a stack already cut to row 1, and TransformerLens cuts
    it again by batch_slice) failed with a bare IndexError; it names batch_slice and the stack's row count. The
    uncut stack with the same batch_slice is row 1's logit."""
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf, transformer_bridge_from_hf

    hf_model, _ = _gpt2(True)
    model = (hooked_transformer_from_hf if kind == "hooked" else transformer_bridge_from_hf)(hf_model)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        stack = cache.decompose_resid(pos_slice=-1)
        with pytest.raises(BcosValueError) as caught:
            cache.logit_attrs(stack[:, 1:], tokens=target, pos_slice=-1, batch_slice=[1])
        message = " ".join(str(caught.value).split())
        assert message.startswith("batch_slice: [1] names rows the residual stack does not have")
        assert "has 1 row(s)" in message and "Pass the stack of the whole cached batch" in message
        whole = cache.logit_attrs(stack, tokens=target, pos_slice=-1, batch_slice=[1]).sum(0)
    torch.testing.assert_close(whole, logits[1:, -1, 4], atol=1e-4, rtol=1e-4)


GENERATE = dict(max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)


def _generated_alone(bridge) -> list[list[int]]:
    return [bridge.generate(text, prepend_bos=False, return_type="tokens", **GENERATE)[0, -4:].tolist()
            for text in TEXTS]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("method", ["generate", "generate_stream"])
def test_generate_refuses_a_text_batch_without_a_bos_and_its_fixes_generate_each_text_alone(left_padded_bridge, method,
                                                                                              side, monkeypatch):
    """bridge.generate(texts, prepend_bos=False): rows 1 and 2 generated other tokens than each text alone (tiny B-cos
    GPT-2: [41315, 41315, 41873, 41873] for [49261, 48273, 3020, 3020]), without a word; the bridge pads a list on the
    left whatever the tokenizer's side and derives each step's mask with cfg.default_prepend_bos. Refused (at the
    call, for the stream too); the fixes named (attention_mask=, cfg.default_prepend_bos = False) generate each text's
    own tokens."""
    bridge, _, tokenizer = left_padded_bridge
    monkeypatch.setattr(bridge.tokenizer, "padding_side", side)
    with pytest.raises(BcosValueError, match=r"^input: row 0 begins with token .*Pass attention_mask="):
        getattr(bridge, method)(TEXTS, prepend_bos=False, **GENERATE)
    if method == "generate_stream":
        return
    alone = _generated_alone(bridge)
    mask = tokenizer(TEXTS, padding=True, padding_side="left", return_tensors="pt").attention_mask
    masked = bridge.generate(TEXTS, prepend_bos=False, attention_mask=mask, return_type="tokens", **GENERATE)
    monkeypatch.setattr(bridge.cfg, "default_prepend_bos", False)
    default_off = bridge.generate(TEXTS, prepend_bos=False, return_type="tokens", **GENERATE)
    assert masked[:, -4:].tolist() == alone and default_off[:, -4:].tolist() == alone


@pytest.mark.parametrize("method", ["forward", "generate"])
def test_a_bos_on_every_row_under_a_default_of_no_bos_is_refused(left_padded_bridge, method, monkeypatch):
    """The mirror case: cfg.default_prepend_bos = False and bridge(texts, prepend_bos=True): the bridge derived the
    list's mask as if no BOS, which masked every row's BOS (the pad id) as padding, so every row was 0.11-0.24 off its
    text alone with a BOS (tiny B-cos GPT-2), silently. Refused naming prepend_bos; the fix named (the default back
    to True, prepend_bos left out) gives each text alone, as does the tokenizer's mask with the same call."""
    bridge, hf_model, tokenizer = left_padded_bridge
    monkeypatch.setattr(bridge.cfg, "default_prepend_bos", False)
    call = (lambda: bridge(TEXTS, prepend_bos=True)) if method == "forward" else (
        lambda: bridge.generate(TEXTS, prepend_bos=True, **GENERATE))
    with pytest.raises(BcosValueError, match=r"^prepend_bos: True puts a BOS on every row.*default_prepend_bos = True"):
        call()
    if method == "generate":
        return
    alone = _each_text_alone(hf_model, tokenizer, bos=True)
    tokens = bridge.to_tokens(TEXTS, prepend_bos=True)
    mask = (torch.arange(tokens.shape[1]) >= (tokens.shape[1] - tokenizer(TEXTS, padding=True, return_tensors="pt")
                                             .attention_mask.sum(1, keepdim=True) - 1)).long()  # each row's BOS on
    with torch.no_grad():
        masked = bridge(TEXTS, prepend_bos=True, attention_mask=mask)
        monkeypatch.setattr(bridge.cfg, "default_prepend_bos", True)
        default_on = bridge(TEXTS)
    for logits in (masked, default_on):
        torch.testing.assert_close(logits[:, -1, TARGET], alone, atol=1e-5, rtol=1e-5)
