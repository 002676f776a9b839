"""Trust pass 21, metrics leftovers (helper-127): a decoder classifier's pad id as perturbation_curves' mask token, and
make_seqpg_examples given a function around a model in training mode. Each case is checked against an independent
computation written here (the row alone, the eval-mode model)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from bcos_plugins.errors import BcosValueError

warnings.filterwarnings("ignore", category=DeprecationWarning)


# ------------------------------------------------------------------ perturbation_curves: the mask token is the pad id


def _curves_by_hand(model, ids, mask, k, mask_token_id):
    """Comprehensiveness and sufficiency of each row alone (unpadded, right padding), its top-k tokens being its last
    k (the scores rise along the row), replaced by ``mask_token_id``; the class the full row predicts."""
    comprehensiveness, sufficiency = [], []
    for row, n, ks in zip(ids, mask.sum(-1).tolist(), k, strict=True):
        alone = row[:n][None]
        full = model(input_ids=alone).logits.double().softmax(-1)[0]
        target = int(full.argmax())
        comp, suff = [], []
        for kk in ks.tolist():
            removed = alone.clone()
            removed[0, n - kk:] = mask_token_id
            kept = alone.clone()
            kept[0, : n - kk] = mask_token_id
            comp.append(full[target] - model(input_ids=removed).logits.double().softmax(-1)[0, target])
            suff.append(full[target] - model(input_ids=kept).logits.double().softmax(-1)[0, target])
        comprehensiveness.append(torch.stack(comp))
        sufficiency.append(torch.stack(suff))
    return torch.stack(comprehensiveness), torch.stack(sufficiency)


@pytest.mark.parametrize("class_name", ["GPT2ForSequenceClassification", "LlamaForSequenceClassification"])
def test_perturbation_curves_refuse_a_decoder_classifiers_pad_id_as_the_mask_token(class_name):
    from conftest import padded_rows, tiny_model

    from bcos_plugins.metrics import perturbation_curves

    model = tiny_model(class_name)  # config.pad_token_id = 0
    ids, mask = padded_rows([6, 4], 6, "right", 0)
    scores = torch.arange(6.0).expand(2, 6).clone()  # the last real tokens rank first
    special = mask == 0
    fractions = (0.25, 0.5)
    with torch.no_grad():
        # the classifier reads the last token whose id is not the pad id: the last token written as the pad id moves
        # the read position one token back (the row cut before it gives the same logits), silently
        row = ids[:1, :6].clone()
        row[0, 5] = 0
        torch.testing.assert_close(model(input_ids=row).logits, model(input_ids=row[:, :5]).logits)
    with pytest.raises(BcosValueError, match=rf"^mask_token_id: is 0, {class_name}'s config\.pad_token_id: .* "
                                             r"moves the position .*Pass another token id as mask_token_id"):
        perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=fractions,
                            masking="mask_token", mask_token_id=0)
    # another id is scored at the unperturbed row's position, as the row alone
    got = perturbation_curves(model, ids, mask, scores, special_tokens=special, fractions=fractions,
                              masking="mask_token", mask_token_id=7)
    with torch.no_grad():
        comprehensiveness, sufficiency = _curves_by_hand(model, ids, mask, got.k, 7)
    torch.testing.assert_close(got.comprehensiveness.double(), comprehensiveness, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.sufficiency.double(), sufficiency, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ make_seqpg_examples: a function in training mode


class _NoisyKeywordModel(nn.Module):
    """The faithfulness tests' keyword classifier with dropout on its logits (a model left in training mode)."""

    def __init__(self, keyword_model):
        super().__init__()
        self.keyword_model = keyword_model
        self.dropout = nn.Dropout(0.5)

    def forward(self, input_ids, attention_mask):
        return self.dropout(self.keyword_model(input_ids=input_ids, attention_mask=attention_mask))


def test_make_seqpg_examples_refuse_a_function_that_scores_the_same_segments_differently():
    from test_metrics_faithfulness import KeywordModel, _word_tokenizer

    from bcos_plugins.metrics import make_seqpg_examples

    tok, vocab = _word_tokenizer([f"{c}{i}" for c in "abc" for i in range(10)] + ["x"])
    model = _NoisyKeywordModel(KeywordModel(vocab)).train()
    texts = ["a1 a2 x x", "a3 x x x", "b1 b2 b3 x", "b4 x x x", "c1 c2 x x", "c3 c4 c5 x"]
    labels = [0, 0, 1, 1, 2, 2]

    def function(**kw):
        return model(**kw)

    torch.manual_seed(0)
    # eval mode cannot reach a model inside a function: the segments were picked by confidences with dropout on
    with pytest.raises(BcosValueError, match=r"^model: scored the same segments differently.*model\.eval\(\)"):
        make_seqpg_examples(function, tok, texts, labels, segment_length=4, min_confidence=0.5, batch_size=4)
    model.eval()
    by_function = make_seqpg_examples(function, tok, texts, labels, segment_length=4, min_confidence=0.5,
                                      batch_size=4)
    by_module = make_seqpg_examples(model.train(), tok, texts, labels, segment_length=4, min_confidence=0.5,
                                    batch_size=4)
    for name in ("input_ids", "segment_labels", "confidence", "source_index"):
        torch.testing.assert_close(getattr(by_function, name), getattr(by_module, name))
