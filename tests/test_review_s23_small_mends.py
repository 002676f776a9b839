"""Small mends from the review of session 23 (helper-150): behaviour-preserving, pinned where the change is observable."""

from __future__ import annotations

import importlib

import pytest
import torch

from bcos_plugins._checks import require_row_ids


class _CountingList(list):
    """A list that counts how often it is iterated (``list(value)`` and generator scans iterate a subclass)."""

    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_require_row_ids_copies_the_ids_only_for_arguments_that_take_class_or_token_names():
    # "positions" is never checked for names: its ids are scanned once (for booleans), not copied into a list too
    _CountingList.iterations = 0
    ids = require_row_ids("positions", _CountingList([0, 1]), 2)
    unchecked = _CountingList.iterations
    _CountingList.iterations = 0
    assert require_row_ids("target", _CountingList([0, 1]), 2).tolist() == ids.tolist() == [0, 1]
    checked = _CountingList.iterations
    assert unchecked < checked, (unchecked, checked)
    # the refusal of a class name where its id is meant is unchanged, and reaches only the checked arguments
    with pytest.raises(TypeError, match="label2id"):
        require_row_ids("target", ["positive", "negative"], 2)
    with pytest.raises(TypeError, match="cannot read"):
        require_row_ids("positions", ["positive", "negative"], 2)


@pytest.mark.parametrize(("module", "old", "new"), [
    ("bcos_plugins._checks", "_warn_unmasked_padding", "_emit_unmasked_padding_warning"),
    ("bcos_plugins.adapters._lens.bridge", "_warn_about_unmasked_padding", "_check_bridge_input_for_unmasked_padding"),
])
def test_the_two_unmasked_padding_helpers_have_names_that_say_how_they_differ(module, old, new):
    # one emits the warning (its callers detected the padding), the other checks a bridge forward's input: the old
    # names (_warn_unmasked_padding, _warn_about_unmasked_padding) said the same thing twice
    mod = importlib.import_module(module)
    assert callable(getattr(mod, new))
    assert not hasattr(mod, old)


def _sae_of_kind(kind: str, d_in: int, apply_b_dec_to_input: bool, dtype: str, hook_name: str, seed: int = 0):
    from sae_lens import (
        JumpReLUSAE,
        JumpReLUSAEConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
        Transcoder,
        TranscoderConfig,
    )
    from sae_lens.saes.sae import SAEMetadata

    common = dict(d_in=d_in, d_sae=3 * d_in, dtype=dtype, apply_b_dec_to_input=apply_b_dec_to_input,
                  metadata=SAEMetadata(hook_name=hook_name))
    sae = {"standard": lambda: StandardSAE(StandardSAEConfig(**common)),
           "topk": lambda: TopKSAE(TopKSAEConfig(**common, k=4, rescale_acts_by_decoder_norm=True)),
           "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(**common)),
           "transcoder": lambda: Transcoder(TranscoderConfig(**common, d_out=d_in))}[kind]()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-zero biases everywhere (a transcoder's b_dec too, which it must not subtract)
        for param in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            param.copy_(torch.randn(param.shape, generator=g).to(param.dtype))
    return sae


SAE_KINDS = [("standard", True), ("standard", False), ("topk", True), ("topk", False), ("jumprelu", True),
             ("transcoder", False)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize(("kind", "apply_b_dec_to_input"), SAE_KINDS)
def test_the_feature_bias_terms_are_the_encodes_bit_for_bit(kind, apply_b_dec_to_input, dtype):
    # explain_sae_feature's bias terms came from sae.encode of a zero row (all of W_enc read for one entry); now from
    # one column of the same product: the same bits, on every affine kind, with and without b_dec subtracted
    from bcos_plugins.adapters.sae_lens import _pre_activations, _zero_input_pre_activation

    for d_in in (16, 64, 768):
        sae = _sae_of_kind(kind, d_in, apply_b_dec_to_input, dtype, "blocks.0.hook_resid_pre", seed=d_in)
        with torch.no_grad():
            want = _pre_activations(sae, torch.zeros(1, d_in, dtype=sae.dtype))[0]
            for feature in range(0, 3 * d_in, max(1, d_in // 16)):
                got = _zero_input_pre_activation(sae, feature)
                assert got.dtype == want.dtype and torch.equal(got, want[feature]), (d_in, feature, got, want[feature])


def _encode_counting(sae) -> list[int]:
    calls = [0]
    encode = sae.encode

    def counted(x):
        calls[0] += 1
        return encode(x)

    sae.encode = counted
    return calls


@pytest.mark.parametrize(("kind", "apply_b_dec_to_input"), SAE_KINDS[:3])
def test_explain_sae_feature_encodes_only_the_activation_and_keeps_its_bias_terms(kind, apply_b_dec_to_input):
    from bcos_plugins.adapters.sae_lens import _pre_activations, explain_sae_feature
    from bcos_plugins.adapters.transformer_lens import hooked_transformer_from_hf
    from conftest import tiny_model

    from bcos_plugins import bcosify

    model = hooked_transformer_from_hf(bcosify(tiny_model("GPT2LMHeadModel"), b=1.5, verbose=False))
    d = model.cfg.d_model
    sae = _sae_of_kind(kind, d, apply_b_dec_to_input, "float32", "blocks.1.hook_resid_pre")
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = _pre_activations(sae, torch.zeros(1, d))[0, 7]
    calls = _encode_counting(sae)
    expl = explain_sae_feature(model, tokens, sae, 7)
    assert calls[0] == 1  # the activation's; the zero row's encode is gone
    assert torch.equal(expl.bias_terms, want.expand(2))
    # a hook on hook_sae_acts_pre changes the encode's value: the bias terms keep following the encode
    sae.hook_sae_acts_pre.add_hook(lambda value, hook: value + 1.0, is_permanent=True)
    with torch.no_grad():
        hooked = _pre_activations(sae, torch.zeros(1, d))[0, 7]
    assert torch.equal(explain_sae_feature(model, tokens, sae, 7).bias_terms, hooked.expand(2))
    assert not torch.equal(hooked, want)
