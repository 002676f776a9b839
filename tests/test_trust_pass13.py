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

import pytest
import torch
import transformers as T
from bcos_plugins.adapters.transformer_lens import explain_logits, transformer_bridge_from_hf
from conftest import padded_rows, tiny_config

from bcos_plugins import bcosify
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
