"""The TransformerLens host page's limits say what the adapter refuses: QK-norm is not among them (Qwen3's per-head
query/key RMSNorm converts to TransformerLens' ``use_qk_norm``; before, the page listed it as not expressible), and
what only B-cos models refuse is listed as such."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import hooked_transformer_from_hf_or_none

from bcos_plugins import bcosify

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _not_expressible_lists() -> dict[str, str]:
    """Each page's "Not expressible in TransformerLens ..." list, up to its paragraph's end (in-depth.md: up to the
    sentence on what is expressed)."""
    lists = {}
    for page in ("hosts/transformer-lens.md", "in-depth.md"):
        text = (DOCS / page).read_text()
        found = re.search(r"Not expressible in TransformerLens.*?(?=\n\n|QK-norm \(Qwen3|\Z)", text, flags=re.S)
        assert found, f"{page} lost its TransformerLens limits"
        lists[page] = found.group(0)
    return lists


def test_the_limits_do_not_list_qk_norm_as_not_expressible():
    for page, limits in _not_expressible_lists().items():
        assert "QK-norm" not in limits, f"{page} still lists QK-norm as not expressible"
    host_page = (DOCS / "hosts/transformer-lens.md").read_text()
    assert "QK-norm is expressed: Qwen3's per-head RMSNorm of queries and keys converts to TransformerLens' " \
           "`use_qk_norm`" in host_page


def test_qwen3_with_qk_norm_converts_plain_and_bcos_and_the_bcos_one_explains_exactly():
    """What the page says: the per-head query/key norm is expressed, in plain and B-cos models, and explanations of
    the B-cos one are exact."""
    from bcos_plugins.adapters import transformer_lens as lens

    hooked_transformer_from_hf = hooked_transformer_from_hf_or_none()
    if hooked_transformer_from_hf is None:  # refused under TransformerLens 4 (test_lens_bridge.py tests the bridge)
        return
    torch.manual_seed(0)
    config = T.Qwen3Config(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=40, head_dim=8,
                           pad_token_id=0, bos_token_id=2, eos_token_id=2)
    plain = T.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # trained-like gains, so that dropping the norms would change the logits
        for layer in plain.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    tokens = torch.tensor([[3, 7, 11, 19, 23]])

    def converted_matches(model):
        hooked = hooked_transformer_from_hf(model)
        assert hooked.cfg.use_qk_norm
        with torch.no_grad():
            torch.testing.assert_close(hooked(tokens)[0], model(input_ids=tokens).logits[0], rtol=1e-4, atol=1e-5)
        return hooked

    converted_matches(plain)  # before bcosify, which converts in place
    hooked = converted_matches(bcosify(plain, b=1.5, verbose=False))
    explanation = lens.explain_logits(hooked, tokens, target=5)
    assert float(explanation.completeness_error.abs().max()) < 1e-4


# Each option BcosTransformerConfig refuses (and a plain config does not), as both pages name it.
BCOS_ONLY_REFUSALS = {
    "positional_embedding_type": ({"positional_embedding_type": "alibi"}, "ALiBi"),
    "use_attention_sinks": ({"use_attention_sinks": True}, "attention sinks"),
    "use_logn_attn": ({"use_logn_attn": True}, "`use_logn_attn`"),
    "load_in_4bit": ({"load_in_4bit": True}, "`load_in_4bit`"),
    "original_architecture": ({"original_architecture": "Olmo2ForCausalLM"}, "OLMo's post-norm attention"),
}
TINY = dict(d_model=16, n_layers=1, n_heads=4, d_head=4, d_mlp=24, d_vocab=40, n_ctx=16, device="cpu",
            act_fn="gelu_new", normalization_type="LN")


def test_the_limits_name_the_bcos_only_refusals_as_bcos_only():
    """ALiBi and attention sinks were listed as refused for every model, and use_logn_attn, load_in_4bit and OLMo's
    post-norm attention not at all, though BcosTransformerConfig refuses all five and a plain config none."""
    from bcos_plugins.adapters._lens.config import _BCOS_REFUSED, BcosTransformerConfig, check_explainable
    from transformer_lens import HookedTransformerConfig

    from bcos_plugins.errors import BcosValueError

    assert set(_BCOS_REFUSED) == set(BCOS_ONLY_REFUSALS), "a B-cos-only refusal is missing from the pages' test"
    for option, (setting, _) in BCOS_ONLY_REFUSALS.items():
        check_explainable(HookedTransformerConfig(**TINY, **setting))  # a plain model is not refused
        with pytest.raises(BcosValueError, match=rf"^{option}=.* cannot be expressed by a B-cos TransformerLens model"):
            BcosTransformerConfig(**TINY, **setting)
    for page, limits in _not_expressible_lists().items():
        one_line = " ".join(limits.split())
        every_model, marker, bcos_only = one_line.partition("B-cos models only (`BcosTransformerConfig`")
        assert marker, f"{page}'s limits do not say what only B-cos models refuse"
        for _, named in BCOS_ONLY_REFUSALS.values():
            assert named in bcos_only, f"{page} does not list {named} among the B-cos-only refusals"
            assert named not in every_model, f"{page} lists {named} as refused for every model"
