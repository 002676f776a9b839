"""Fourth trust pass: the architecture registry's newest families (Qwen2, Qwen3, Mistral, Gemma 2, ModernBERT) and
``explain``'s speed paths (``logits_to_keep``, no cache, ModernBERT's gate units) under unusual inputs, each checked
against a number computed another way (the row explained alone, the model's plain forward). Tiny random models from
test_conformance's configs (sliding and local windows shorter than the sequences).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import padded_rows
from test_conformance import _converted

from bcos_plugins import explain
from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


def _mixed_padding(lengths: list[int], width: int, sides: list[str], seed: int = 0):
    """Rows of ``lengths`` real tokens, each padded on its own side of ``sides``: one batch mixing left and right."""
    rows = [padded_rows([n], width, side, seed + i) for i, (n, side) in enumerate(zip(lengths, sides, strict=True))]
    return torch.cat([ids for ids, _ in rows]), torch.cat([mask for _, mask in rows])


# ------------------------------------------------------------------ Gemma 2 in float64 with padding


@pytest.mark.parametrize("name", ["Gemma2ForCausalLM", "Gemma2Model", "Gemma2ForSequenceClassification"])
@pytest.mark.parametrize("sides", [["left", "left"], ["right", "right"]])
def test_a_padded_float64_gemma2_is_refused_naming_the_cause_and_the_fix(name, sides):
    """transformers' Gemma 2 attention (eager, for its soft-caps) computes its softmax in float32, where the float64 mask
    value is -inf: a padding position whose keys are all masked (left padding; right padding beyond the sliding
    window) gets NaN, which the next layer spreads to the real tokens. explain refused it with the generic "output is
    NaN ... check the embedding rows" message, which points at the inputs. The message now names the float64 +
    padding cause and the fixes, and both fixes it names work: the same batch in float32, and each row alone."""
    model = copy.deepcopy(_converted(name)).double()
    ids, mask = _mixed_padding([9, 3], 9, sides)
    target = {"position": -1} if name != "Gemma2ForSequenceClassification" else {}
    with pytest.raises(BcosValueError, match=r"float64 and the batch is padded.*softmax in float32.*Explain in float32 "
                                             r"\(model.float\(\)\), or explain the padded rows one at a time"):
        explain(model, ids, mask, target=1, **target)
    explain(_converted(name), ids, mask, target=1, **target)  # float32: finite
    for row in range(2):  # float64 without padding: finite
        explain(model, ids[row, mask[row].bool()][None], target=1, **target)


def test_an_unpadded_float64_nan_keeps_the_generic_message():
    """The float64 + padding cause is named only where it applies: a NaN embedding row of an unpadded float64 batch
    still gets the message that points at the inputs and the embedding rows."""
    model = copy.deepcopy(_converted("Gemma2ForCausalLM")).double()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        model.get_input_embeddings().weight[7] = float("nan")
    with pytest.raises(BcosValueError, match=r"nothing finite to explain \(an input or an embedding row") as caught:
        explain(model, ids, target=1)
    assert "float64" not in str(caught.value)
