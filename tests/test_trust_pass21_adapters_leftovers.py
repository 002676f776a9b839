"""Trust pass 21, the adapters' leftovers: one check of ``label_names`` for the HTML pages, Captum's
``visualization_records`` and inseq's ``load_classifier`` (two of them had their own inline copy of it, which took
names that are not strings), and sae-lens' ``reset_saes`` at a hook point that carried a dynamic weight (the model was
then refused as if ``make_explainable`` had never been called, naming neither the hook nor the cause; at a B-cos
scale it was explained with that scale in the gradient, silently)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import padded_batch
from test_conformance import B, _stock
from test_trust_pass21_adapters import _hooked_sae_model, _sae

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------- one check of label_names


class _Tokens:
    def convert_ids_to_tokens(self, ids):
        return [f"w{i}" for i in ids]


def _refusal(where: str, label_names) -> str:
    from bcos_plugins.adapters.captum import visualization_records
    from bcos_plugins.adapters.inseq import load_classifier
    from test_conformance import _word_tokenizer

    from bcos_plugins import explain
    from bcos_plugins.visualize import explanations_to_html

    model = bcosify(_stock("Qwen2ForSequenceClassification", num_labels=3), b=B, verbose=False)
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosTypeError) as caught:
        if where == "load_classifier":
            load_classifier(model, _word_tokenizer(), label_names=label_names)
        else:
            explanation = explain(model, ids, attention_mask=mask)
            with torch.no_grad():
                logits = model(ids, attention_mask=mask).logits
            if where == "visualization_records":
                visualization_records(explanation, _Tokens(), logits=logits, label_names=label_names)
            else:
                explanations_to_html(explanation, _Tokens(), label_names=label_names)
    return str(caught.value)


@pytest.mark.parametrize(("label_names", "words"), [
    ("abc", r"^label_names: must be a list of class names; it is one string, 'abc', whose characters would name the "
            r"classes\. Pass one name per class, in class-id order"),
    ([0, 1, 2], r"^label_names: must be strings, got int 0\. Pass one name per class, in class-id order"),
])
def test_label_names_are_checked_by_one_check_in_the_pages_captum_and_inseq(label_names, words):
    """Captum's and inseq's inline copies took class ids as names (shown as the numbers, and inseq's targets were
    TokenWithId(0, 0)); the three entry points now give the same refusal, word for word."""
    import re

    messages = {where: _refusal(where, label_names)
                for where in ("load_classifier", "visualization_records", "explanations_to_html")}
    assert all(re.match(words, message) for message in messages.values()), messages
    assert len(set(messages.values())) == 1, messages


# ------------------------------------------------------- sae-lens' reset_saes at a dynamic-weight hook point


@pytest.mark.parametrize("hook", ["blocks.0.ln1.hook_scale", "blocks.1.attn.hook_pattern",
                                  "blocks.0.attn.hook_bcos_scale_o", "blocks.1.mlp.hook_bcos_scale_out"])
def test_a_dynamic_weight_hook_point_an_sae_reset_replaced_is_named_and_make_explainable_restores_it(hook):
    """reset_saes puts a plain HookPoint where the SAE was: the model was then refused with "call make_explainable
    first (before adding hooks)", naming neither the hook nor the reset; at a B-cos scale (which is_explainable did
    not check) the scale took part in the gradient: contributions off by 0.025 (the largest is 0.13) while the
    completeness error stayed 1e-6, silently, and make_explainable did not restore it."""
    from bcos_plugins.adapters.transformer_lens import explain_logits, make_explainable

    model = _hooked_sae_model("Qwen3ForCausalLM")
    ids, mask = padded_batch(side="left")
    before = explain_logits(model, ids, attention_mask=mask, target=[5, 6, 7])
    model.add_sae(_sae(4, hook))
    model.reset_saes()
    with pytest.raises(BcosTypeError, match=rf"^model: the hook points {hook} \(now a HookPoint\) carried dynamic "
                                            r"weights.*an SAE reset \(sae-lens' reset_saes\) put a plain HookPoint "
                                            r"where the SAE was.*make_explainable\(model\) again: it restores them"):
        explain_logits(model, ids, attention_mask=mask, target=[5, 6, 7])
    make_explainable(model)
    after = explain_logits(model, ids, attention_mask=mask, target=[5, 6, 7])
    torch.testing.assert_close(after.contributions, before.contributions)
    assert after.completeness_error.max() < 1e-4


def test_an_sae_still_attached_at_a_dynamic_weight_hook_point_is_named_with_its_fix():
    from bcos_plugins.adapters.transformer_lens import explain_logits

    model = _hooked_sae_model("Qwen3ForCausalLM")
    model.add_sae(_sae(4, "blocks.0.ln2.hook_scale"))
    ids, mask = padded_batch(side="left")
    with pytest.raises(BcosTypeError, match=r"^model: the hook points blocks\.0\.ln2\.hook_scale \(now a _SAEWrapper\)"
                                            r".*model\.reset_saes\(\).*make_explainable\(model\) again"):
        explain_logits(model, ids, attention_mask=mask, target=[5, 6, 7])
