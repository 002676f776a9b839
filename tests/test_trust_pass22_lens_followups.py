"""Trust pass 22, TransformerLens and sae-lens follow-ups (helper-147): a dynamic rotary embedding grown by an earlier
call on a bridge, a NaN / inf weight named on the lens paths, and sae_error_share's own keywords. Each test failed
before its fix."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T
from test_conformance import B, _stock
from test_sae_lens_adapter import _bcos_sae_model

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ a dynamic rotary embedding grown by an earlier call


def _dynamic_rope_llama() -> torch.nn.Module:
    config = T.LlamaConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=8, pad_token_id=0,
                           bos_token_id=2, eos_token_id=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(0)
    return bcosify(T.LlamaForCausalLM(config).eval(), b=1.25, verbose=False)


def test_a_bridge_computes_a_row_with_its_own_lengths_rotary_frequencies_whatever_ran_before():
    """The bridge runs its transformers model's rotary embedding, which keeps the frequencies an earlier, longer call
    grew until a call shorter than max_position_embeddings comes: a 15-token row explained after a 20-token one got
    the 20-token frequencies (0.09351 against 0.09338 on a fresh bridge), silently, and so did bridge(row) and
    run_with_cache. The bridge's own forward now puts them back first, as the transformers path does."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf

    hf = _dynamic_rope_llama()
    bridge, fresh = transformer_bridge_from_hf(hf), transformer_bridge_from_hf(copy.deepcopy(hf))
    row = torch.randint(3, 60, (1, 15), generator=torch.Generator().manual_seed(2))
    longer = torch.randint(3, 60, (1, 20), generator=torch.Generator().manual_seed(3))
    expected = explain_logits(fresh, row, target=1)
    with torch.no_grad():
        fresh_logits = fresh(row)
        torch.testing.assert_close(fresh_logits[:, -1], hf(row).logits[:, -1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(expected.explained, fresh_logits[:, -1, 1], rtol=1e-5, atol=1e-6)
    explain_logits(bridge, longer, target=1)
    again = explain_logits(bridge, row, target=1)
    torch.testing.assert_close(again.explained, expected.explained, rtol=0, atol=0)
    torch.testing.assert_close(again.contributions, expected.contributions, rtol=0, atol=0)
    with torch.no_grad():
        bridge(longer)  # the host's own calls grow them too
        torch.testing.assert_close(bridge(row), fresh_logits, rtol=0, atol=0)
        bridge.run_with_cache(longer)
        logits, _ = bridge.run_with_cache(row)
    torch.testing.assert_close(logits, fresh_logits, rtol=0, atol=0)
    # and the longer row itself is still computed with its own, grown frequencies (as the HF model computes it)
    with torch.no_grad():
        torch.testing.assert_close(bridge(longer)[:, -1], hf(longer).logits[:, -1], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a NaN / inf weight on the lens paths


def _poisoned(model: torch.nn.Module, name: str, value: float) -> torch.nn.Module:
    with torch.no_grad():
        model.get_parameter(name).view(-1)[3] = value
    return model


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_explain_logits_names_a_hooked_transformers_non_finite_weight(value):
    """The refusal said only "... and the weights" among the causes; it now names the parameter."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, hooked_transformer_from_hf

    model = _poisoned(hooked_transformer_from_hf(bcosify(_stock("LlamaForCausalLM"), b=B, verbose=False).eval()),
                      "blocks.1.mlp.W_in", value)
    tokens = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(BcosValueError, match=r"^model: has NaN or infinite values in 1 parameter\(s\) "
                                             r"\(blocks\.1\.mlp\.W_in\): the values explained .* Reload the weights"):
        explain_logits(model, tokens, target=3)


def test_the_bridges_lens_paths_name_a_non_finite_weight():
    """explain_logits on a bridge said only "and the weights"; token_component_decomposition returned a table of NaN
    without a word. Both now name the parameter (the bridge's own path to it)."""
    from bcos_plugins.adapters.transformer_lens import (
        explain_logits,
        token_component_decomposition,
        transformer_bridge_from_hf,
    )

    bridge = transformer_bridge_from_hf(bcosify(_stock("LlamaForCausalLM"), b=B, verbose=False).eval())
    name = next(n for n, _ in bridge.named_parameters() if "layers.0" in n and "gate_proj" in n)
    _poisoned(bridge, name, float("nan"))
    tokens = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    for call in (explain_logits, token_component_decomposition):
        with pytest.raises(BcosValueError, match=rf"^model: has NaN or infinite values in 1 parameter\(s\) "
                                                 rf"\({name.replace('.', '[.]')}\)"):
            call(bridge, tokens, target=3)


def test_the_training_helpers_keep_their_own_words_for_a_non_finite_weight():
    """One check, two callers: the training wording stays the default."""
    from bcos_plugins._checks import require_finite_parameters

    model = _poisoned(torch.nn.Linear(4, 2), "weight", float("nan"))
    with pytest.raises(BcosValueError, match=r"^model: has NaN or infinite values in 1 parameter\(s\) \(weight\): "
                                             r"its loss would be NaN from the first step"):
        require_finite_parameters(model)


# ------------------------------------------------------------------ sae_error_share's keywords


def test_sae_error_share_names_itself_and_a_misspelt_keyword():
    """sae_error_share(**explain_kwargs) passed them on, so a misspelt keyword failed as "explain_logits() got an
    unexpected keyword argument", naming a function the caller never called."""
    from bcos_plugins.adapters.sae_lens import sae_error_share

    model = _bcos_sae_model(True)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"^sae_error_share\(\) got an unexpected keyword argument 'targt'"):
        sae_error_share(model, tokens, targt=4)
    result = sae_error_share(model, tokens, target=4, position=-2)  # the spelt-out keywords reach explain_logits
    assert result.explanation.target.tolist() == [4, 4]
    assert result.explanation.position.tolist() == [4, 4]


def test_hooked_transformer_from_hf_refuses_a_dynamic_rotary_model_naming_the_bridge():
    """TransformerLens' own rotary has no dynamic scaling, so hooked_transformer_from_hf refuses such a model (it
    would be another model past max_position_embeddings); the refusal now names the path that takes it, the bridge,
    which computes the HF model's logits (the test above)."""
    from conftest import hooked_transformer_from_hf_or_none

    from_hf = hooked_transformer_from_hf_or_none()
    if from_hf is None:  # TransformerLens 4: no HookedTransformer (its refusal is checked there)
        return
    with pytest.raises(BcosValueError, match=r"^rope_type='dynamic' is not expressed by TransformerLens' Llama config "
                                             r"\(default and llama3 are\).*transformer_bridge_from_hf\(hf_model\)"):
        from_hf(_dynamic_rope_llama())
