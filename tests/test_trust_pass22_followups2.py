"""Trust pass 22 follow-ups, second round (helper-149): small defects noticed by helpers 143 and 145. Each test fails
on the behaviour before its fix: a set of texts predicted in its hash order, a wrong block count that guided the wrong
blocks, NaN refusals that did not name a padding token's NaN embedding."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from conftest import with_nan_embedding_row

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosTypeError, BcosValueError

# ------------------------------------------------ a set of texts has no order


def test_require_texts_refuses_a_set_as_unordered():
    """predict({"a", "b"}) returned its rows in the set's hash order, which the caller could not match to its texts."""
    from bcos_plugins._checks import require_texts

    for texts in ({"a text", "another"}, frozenset({"a text", "another"})):
        with pytest.raises(BcosTypeError, match=rf"^texts: is a {type(texts).__name__}, which has no order.*"
                                                r"Pass a list of the texts"):
            require_texts(texts)
    # a dict's keys keep its insertion order (a Set type all the same): they pass, in that order
    assert require_texts({"b text": 0, "a text": 1}.keys()) == ["b text", "a text"]
    # the tokenizer's output is named once ("a BatchEncoding", not "a a BatchEncoding")
    with pytest.raises(BcosTypeError, match=r"^texts: is the tokenizer's output, a BatchEncoding \(keys"):
        require_texts(T.BatchEncoding({"input_ids": [[1, 2]]}))


def test_predict_refuses_a_set_of_texts():
    from bcos_plugins.prediction import predict
    from bcos_plugins.pretrained import minilm_path

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    with pytest.raises(BcosTypeError, match=r"^texts: is a set, which has no order"):
        predict(_tiny_bcos_bert(len(tokenizer)), tokenizer, {"a gorgeous, witty film", "dull"})


# ------------------------------------------------ guidance_hooks reads the count from the model


def _tiny_lens(n_layers: int = 3):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=32, n_ctx=12, d_head=8, n_heads=4, d_vocab=40,
                                  act_fn="gelu", initializer_range=0.2, seed=0, device="cpu")
    return HookedTransformer(cfg).eval()


def test_guidance_hooks_takes_the_model_and_guides_its_last_blocks():
    """guidance_hooks(2, ...) on a 3-block model guided blocks 0 and 1, not the last two, without a word: the model
    itself can be passed, and its cfg.n_layers is read."""
    from bcos_plugins.guided import guidance_hooks

    model = _tiny_lens(3)
    gold = torch.zeros(2, 8)
    gold[:, 2] = 1.0
    hooks = guidance_hooks(model, gold, "add", 1.0, last_layers=2)
    assert [name for name, _ in hooks] == ["blocks.1.attn.hook_attn_scores", "blocks.2.attn.hook_attn_scores"]
    tokens = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(0))
    guided = model.run_with_hooks(tokens, fwd_hooks=hooks)
    assert torch.equal(guided, model.run_with_hooks(tokens, fwd_hooks=guidance_hooks(3, gold, "add", 1.0,
                                                                                      last_layers=2)))
    with pytest.raises(BcosValueError, match=r"last_layers must be an int in \[1, n_layers=3\]"):
        guidance_hooks(model, gold, last_layers=4)
    # a module that is no TransformerLens model is refused by name, pointing at the transformers path
    with pytest.raises(BcosTypeError, match=r"^n_layers: is a Linear without cfg\.n_layers.*guide_attention"):
        guidance_hooks(torch.nn.Linear(2, 2), gold)


# ------------------------------------------------ a padding token's NaN embedding, named by every NaN refusal


def _tiny_bcos_bert(vocab_size: int = 100):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, num_labels=2, pad_token_id=0)
    return bcosify(T.BertForSequenceClassification(config), b=1.5, verbose=False).eval()


def _tiny_bcos_gpt2(vocab_size: int = 50, **config):
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=1, n_head=4, n_positions=32,
                          tie_word_embeddings=False, bos_token_id=2, eos_token_id=2, **config)  # (a tied head would make every row's logits NaN)
    return bcosify(T.GPT2LMHeadModel(config), b=1.5, verbose=False).eval()


def _names_padding_row(token: int) -> str:
    return rf"The padding token's input embedding \(model\.get_input_embeddings\(\)\.weight\[{token}\]\)"


def test_perturbation_curves_names_the_padding_tokens_nan_embedding():
    from bcos_plugins.metrics import perturbation_curves

    model = with_nan_embedding_row(_tiny_bcos_bert(), 0)
    ids, mask = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9]]), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(BcosValueError, match=r"perturbation_curves: .*examples \[0\].*" + _names_padding_row(0)):
        perturbation_curves(model, ids, mask, torch.rand(2, 4), special_tokens=mask == 0, target=0, fractions=[0.5])


def test_perplexity_names_the_padding_tokens_nan_embedding():
    """perplexity pads with id 0: a NaN row 0 was first read by the causality probe (which wrote id 0 over the first
    window's last token) as "a model without a causal mask", and the padded windows' refusal did not name it."""
    from bcos_plugins.metrics.decoder import perplexity

    model = with_nan_embedding_row(_tiny_bcos_gpt2(), 0)
    with pytest.raises(BcosValueError, match=r"perplexity: .*windows \[0\].*" + _names_padding_row(0)):
        perplexity(model, [[5, 6, 7], [5, 6, 8, 9]], batch_size=2)
    # a first window whose own logits are NaN failed in the probe with "atol must be greater than or equal to zero,
    # but got -nan": refused where the windows are scored (id 0 is the config's padding id here)
    model = with_nan_embedding_row(_tiny_bcos_gpt2(pad_token_id=0), 0)
    with pytest.raises(BcosValueError, match=r"perplexity: .*windows \[0\].*" + _names_padding_row(0)):
        perplexity(model, [[5, 6, 0], [5, 6, 8, 9]], batch_size=2)
    # the probe still tells a model without a causal mask
    with pytest.raises(BcosTypeError, match=r"^model: BertForMaskedLM is a masked LM"):
        torch.manual_seed(0)
        config = T.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=64)
        perplexity(T.BertForMaskedLM(config).eval(), [[5, 6, 7], [5, 6, 8, 9]], batch_size=2)


def test_next_token_contrast_names_the_padding_tokens_nan_embedding():
    from bcos_plugins.metrics.decoder import next_token_contrast

    model = with_nan_embedding_row(_tiny_bcos_gpt2(), 0)
    ids, mask = torch.tensor([[5, 6, 7, 0], [5, 6, 8, 9]]), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(BcosValueError, match=r"next_token_contrast: .*rows \[0\].*" + _names_padding_row(0)):
        next_token_contrast(model, ids, mask, target=torch.tensor([1, 1]), foil=torch.tensor([2, 2]))


def test_predict_labels_names_the_padding_tokens_nan_embedding():
    from bcos_plugins.pretrained import minilm_path
    from bcos_plugins.space.zero_shot import predict_labels

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    model = with_nan_embedding_row(_tiny_bcos_bert(len(tokenizer)), tokenizer.pad_token_id)
    with pytest.raises(BcosValueError, match=r"predict_labels: .*texts \[1\].*"
                                             + _names_padding_row(tokenizer.pad_token_id)):
        predict_labels(model, tokenizer, ["a gorgeous, witty film", "dull"], batch_size=2)
