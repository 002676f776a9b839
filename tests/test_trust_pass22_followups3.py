"""Trust pass 22, follow-ups 3 (helper-153): small mends noticed by this session's helpers. Each test fails on the
behaviour before its fix."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch, tiny_bcos_model, with_nan_embedding_row

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosValueError

# ------------------------------------------------ EmbeddingForward.embed of a padding token whose embedding is NaN


def test_embedding_forward_embed_names_the_padding_tokens_nan_embedding():
    """embed() of ids padded with a token whose embedding row is NaN returned NaN at the padded positions, and the
    refusal of those embeddings said "check the baseline or the noise added to them", which the caller never added:
    embed() has the ids and names the padding's row (attribution.text.non_finite_embedding_cause)."""
    from bcos_plugins.adapters.captum import EmbeddingForward

    ids, mask = padded_batch()  # rows 1 and 2 padded with id 0
    fwd = EmbeddingForward(with_nan_embedding_row(tiny_bcos_model(), 0))
    with pytest.raises(BcosValueError, match=r"^input_ids: rows \[1, 2\] embed to NaN or infinite entries.*The "
                                             r"padding token's input embedding \(model\.get_input_embeddings\(\)"
                                             r"\.weight\[0\]\) is NaN or infinite.*weight\.data\[0\] = 0") as caught:
        fwd.embed(ids, mask)
    assert "baseline" not in str(caught.value)
    # finite rows: embed() returns the attribution-point tensor as before
    assert torch.isfinite(EmbeddingForward(tiny_bcos_model()).embed(ids, mask)).all()


# ------------------------------------------------ predict names the padding id the model was actually fed


def test_predict_names_the_rewritten_padding_ids_nan_embedding():
    """A decoder classifier's padding is rewritten as config.pad_token_id before the model call (model_call_kwargs);
    predict looked for a NaN embedding row among the tokenizer's ids (here padded with 0, a finite row), so the NaN
    row of the id the model was fed (config.pad_token_id = 5) went unnamed."""
    import transformers as T

    from bcos_plugins.prediction import predict
    from bcos_plugins.pretrained import minilm_path

    tokenizer = T.AutoTokenizer.from_pretrained(minilm_path())
    assert tokenizer.pad_token_id == 0 and tokenizer.padding_side == "right"
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64,
                          num_labels=2, pad_token_id=5, bos_token_id=101, eos_token_id=102)
    model = with_nan_embedding_row(bcosify(T.GPT2ForSequenceClassification(config).eval(), b=1.5, verbose=False).eval(), 5)
    texts = ["a gorgeous, witty and moving film", "dull"]
    assert 5 not in tokenizer(texts)["input_ids"][0] + tokenizer(texts)["input_ids"][1]
    with pytest.raises(BcosValueError, match=r"^predict: .*texts \[1\].*The padding token's input embedding "
                                             r"\(model\.get_input_embeddings\(\)\.weight\[5\]\) is NaN or infinite"):
        predict(model, tokenizer, texts, batch_size=2)


# ------------------------------------------------ inseq's "bcos" refuses other methods' keywords


@pytest.mark.parametrize("given", [{"n_steps": 10}, {"baselines": None}, {"internal_batch_size": 2},
                                   {"attribution_args": {"n_steps": 10}}])
def test_inseq_bcos_refuses_other_methods_keywords_as_layer_bcos_does(given):
    """inseq logged "Unused arguments during attribution" for n_steps=, baselines= and internal_batch_size= and
    attributed without them, where LayerBcos called directly refuses them: refused by name with the reason and the
    fix, from the one table LayerBcos uses (_checks.refuse_other_methods_keywords)."""
    import bcos_plugins.adapters.inseq  # noqa: F401  (registers "bcos")
    import inseq
    import transformers as T
    from bcos_plugins.adapters.captum import LayerBcos

    from bcos_plugins.data import SHIPPED_DATA
    from bcos_plugins.errors import BcosTypeError

    tokenizer = T.GPT2Tokenizer.from_pretrained(SHIPPED_DATA / "gpt2_tokenizer")
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64)
    model = bcosify(T.GPT2LMHeadModel(config).eval(), b=1.1, verbose=False)
    name = next(iter(given.get("attribution_args", given)))
    with pytest.raises(BcosTypeError, match=rf'^{name}: the inseq method "bcos" takes no {name}: .*\. Leave '):
        inseq.load_model(model, "bcos", tokenizer=tokenizer).attribute("The cat", "The cat sat", show_progress=False,
                                                                       **given)
    # LayerBcos's own refusal is unchanged
    ids = torch.tensor([tokenizer("The cat")["input_ids"]])
    with pytest.raises(BcosTypeError, match=rf"^{name}: LayerBcos\.attribute takes no {name}: "):
        LayerBcos(model).attribute(ids, target=1, **{name: given.get("attribution_args", given)[name]})


# ------------------------------------------------ BWarmupCallback: its model argument, eval_delay in epochs


def test_bwarmup_callback_names_a_model_that_is_not_a_module():
    """BWarmupCallback(None) said "model: has no config.bcos", as if a model had been passed."""
    from bcos_plugins.errors import BcosTypeError
    from bcos_plugins.train import BWarmupCallback

    for given, name in ((None, "NoneType"), ("gpt2", "str")):
        with pytest.raises(BcosTypeError, match=rf"^model: expected the B-cos model \(a torch\.nn\.Module\), got "
                                                rf"{name}\. pass the model bcosify returned: BWarmupCallback\(model\)"):
            BWarmupCallback(given)


def test_bwarmup_accepts_load_best_model_at_end_when_eval_delay_in_epochs_covers_the_warmup(tmp_path):
    """eval_strategy="epoch" counts eval_delay in epochs: a delay whose first evaluation comes after the warm-up was
    refused as if no delay could cover it. 7 rows in batches of 2 are 4 steps an epoch, 3 epochs 12 steps, the warm-up
    (fraction 0.5) ends at the beginning of step 7: eval_delay=2 (first evaluation after step 8) is accepted, and the
    best checkpoint's metric is the returned model's; eval_delay=1 (after step 4) is still refused, naming the epochs
    that would do."""
    from conftest import tiny_bcos_gpt2_and_rows

    from bcos_plugins.nn.linear import AlignmentPressure
    from bcos_plugins.train import BWarmupCallback
    from bcos_plugins.train_decoder import train_causal_lm

    model, rows = tiny_bcos_gpt2_and_rows()
    settings = {"num_train_epochs": 3, "per_device_train_batch_size": 2, "eval_strategy": "epoch",
                "save_strategy": "epoch", "load_best_model_at_end": True, "metric_for_best_model": "eval_loss",
                "save_only_model": True, "disable_tqdm": True, "logging_steps": 100}
    with pytest.raises(BcosValueError, match=r"^load_best_model_at_end: is True with a B warm-up to step 7: .* "
                                             r"\(eval_strategy='steps', eval_delay=7; or eval_strategy='epoch', "
                                             r"eval_delay=2\), or leave load_best_model_at_end out\.$"):
        train_causal_lm(model, rows, str(tmp_path / "a"), pad_token_id=0, eval_dataset=rows, eval_delay=1,
                        callbacks=[BWarmupCallback(model, fraction=0.5)], **settings)
    assert {m.b for m in model.modules() if isinstance(m, AlignmentPressure)} == {1.5}
    trainer = train_causal_lm(model, rows, str(tmp_path / "b"), pad_token_id=0, eval_dataset=rows, eval_delay=2,
                              callbacks=[BWarmupCallback(model, fraction=0.5)], **settings)
    assert trainer.state.max_steps == 12
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [8, 12]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.state.best_metric, rel=1e-6, abs=0)
