"""One mechanism per concern, outside the lens adapter (note 25's reviewer items and small checks, helper-192):
1. ``check_no_bias`` reads its flag by ``require_bool``'s rule (NumPy's bools refused, as for every flag);
2. ``measure_cost`` checks its device with ``require_available_device`` (a CUDA index past the GPUs too);
3. ``aopc``: the unreachable "area beyond the dtype" refusal is gone, and a float64 curve near its largest value no
   longer integrates to inf;
4. ``predict_labels`` is ``predict``'s batch loop (``prediction.batched_logits``);
5. one context variable for the truncation warning, the outermost entry point's name holding;
6. ``train_causal_lm`` sets a GPT-2's ``loss_type`` for the call only;
7. ``BilinearWeights.to`` refuses a device the machine lacks naming ``device``.
Each test failed before its change, except those named as controls."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from bcos_plugins.errors import BcosTypeError, BcosValueError


def _no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


# --------------------------------------------------------------- 1. bias: the package's one rule for flags


@pytest.mark.parametrize("kind", ["linear", "conv2d"])
def test_a_numpy_false_bias_is_refused_as_require_bool_refuses_every_numpy_flag(kind):
    """``check_no_bias`` took NumPy's ``False`` while ``require_bool`` (the rule of every other flag) refused it.
    Decided: refused here too, naming ``bias`` and the conversion: a NumPy flag in a config saved as JSON fails
    (np.bool_ is not JSON-serialisable), and the other twenty-odd flags refuse it."""
    from bcos_plugins.nn import BcosConv2d, BcosLinear

    build = (lambda bias: BcosLinear(4, 3, bias=bias)) if kind == "linear" else (
        lambda bias: BcosConv2d(3, 2, 3, bias=bias))
    with pytest.raises(BcosTypeError, match=r"^bias: must be True or False, got numpy\.bool np\.False_ \(pass "
                                            r"bool\(bias\)\)\. Pass bias=False or leave it out \(B-cos layers have "
                                            r"no bias\)\.$"):
        build(np.bool_(False))
    build(False)  # control: the Python bool is taken


def test_check_no_bias_and_require_bool_refuse_the_same_values():
    from bcos_plugins._checks import require_bool
    from bcos_plugins.nn.linear import check_no_bias

    for value in ("no", 0, None, np.bool_(True), np.bool_(False), torch.tensor(False)):
        with pytest.raises(BcosTypeError) as by_rule:
            require_bool("bias", value)
        with pytest.raises(BcosTypeError) as by_layer:
            check_no_bias(value)
        assert str(by_layer.value).split(". Pass")[0] == str(by_rule.value).split(". Pass")[0]
    check_no_bias(False)
    with pytest.raises(BcosValueError, match=r"^bias: B-cos layers have no bias, got bias=True"):
        check_no_bias(True)


# --------------------------------------------------------------- 2. measure_cost's device


def test_measure_cost_refuses_a_cuda_index_past_the_machines_gpus(monkeypatch):
    """``cuda:3`` on a one-GPU machine passed the hand-written check (CUDA available) and failed inside
    ``torch.cuda.synchronize``, naming no argument."""
    from bcos_plugins.metrics import measure_cost

    _one_gpu(monkeypatch)
    calls = []
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda:3', which this machine does not have \(available: "
                                             r"cpu, cuda:0\)\. Pass an available device, e.g. 'cpu'\.$"):
        measure_cost(lambda: calls.append(1), device="cuda:3")
    assert calls == []  # refused before the call ran


def test_measure_cost_refuses_cuda_without_it_with_the_packages_one_message(monkeypatch):
    from bcos_plugins.metrics import measure_cost

    _no_gpu(monkeypatch)
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda', which this machine does not have \(available: "
                                             r"cpu\)"):
        measure_cost(lambda: 1, device="cuda")
    with pytest.raises(BcosTypeError, match=r"^device: is 'gpu', not a device\. Pass one of \['cpu'\]"):
        measure_cost(lambda: 1, device="gpu")
    # control: measure_cost's own limit (it measures the CPU or CUDA) and an available device
    with pytest.raises(BcosValueError, match=r"^device: is 'meta'; measure_cost measures the CPU or a CUDA device"):
        measure_cost(lambda: 1, device="meta")
    assert measure_cost(lambda: 3, device=torch.device("cpu"))[0] == 3


# --------------------------------------------------------------- 3. aopc


def test_aopc_of_a_float64_curve_near_its_largest_value_is_finite():
    """The trapezoid summed neighbouring values first: 1.7e308 + 1.7e308 overflowed, so the area of a curve of 1.7e308
    over [0, 1] read inf (silently), while it is 1.7e308."""
    from bcos_plugins.metrics import aopc

    curve = torch.tensor([[1.7e308, 1.7e308, 1.7e308], [1.0, 2.0, 4.0], [-1.7e308, -1.7e308, -1.7e308]],
                         dtype=torch.float64)
    area = aopc(curve, [0.0, 0.5, 1.0])
    assert area.tolist() == [1.7e308, 0.25 * (1 + 2) + 0.25 * (2 + 4), -1.7e308]
    assert aopc(curve[:1], [0.0, 0.125, 0.25], normalise=True).item() == 1.7e308
    assert aopc(torch.tensor([[1.7e308, -1.7e308]], dtype=torch.float64), [0.0, 1.0]).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_aopc_s_area_fits_the_curve_s_dtype_over_any_fractions_it_takes(dtype):
    """Why the "area beyond the curve's dtype" refusal went: fractions lie in [0, 1], so the area is at most the
    largest value of the curve (its mean with normalise), and the narrowing to the returned dtype only rounds."""
    import inspect

    from bcos_plugins.metrics import aopc

    biggest = torch.finfo(dtype).max
    for fractions in ([0.0, 1.0], [0.0, 0.5, 1.0], [0.1, 0.2, 0.9], [1e-9, 1.0], [0.0, 1e-300]):
        curve = torch.full((2, len(fractions)), biggest, dtype=dtype)
        curve[1] = -biggest
        for normalise in (False, True):
            assert torch.isfinite(aopc(curve, fractions, normalise=normalise)).all()
    assert "beyond the range" not in inspect.getsource(aopc)


# --------------------------------------------------------------- 4. predict_labels is predict's loop


def _tiny_bcos_bert_classifier():
    import transformers as T
    from conftest import tiny_config

    from bcos_plugins import bcosify

    torch.manual_seed(0)
    return bcosify(T.BertForSequenceClassification(tiny_config("bert", num_labels=2)), b=1.5, verbose=False).eval()


def test_predict_labels_refuses_a_tokenizer_without_a_pad_token_as_predict_does():
    """``predict_labels`` padded every batch itself and failed in transformers ("Asking to pad but the tokenizer does
    not have a padding token"), where ``predict`` refuses it naming the fix."""
    from test_pretrain import word_tokenizer

    from bcos_plugins.space import predict_labels
    from bcos_plugins.train import predict

    model, tokenizer = _tiny_bcos_bert_classifier(), word_tokenizer()
    tokenizer.pad_token = None
    texts = ["w1 w2 w3", "w4"]
    for call in (lambda: predict(model, tokenizer, texts), lambda: predict_labels(model, tokenizer, texts)):
        with pytest.raises(BcosValueError, match=r"^tokenizer: has no pad token \(as GPT-2's\), so a batch of 2 texts "
                                                 r"cannot be padded.*batch_size=1"):
            call()
    # one text per batch needs no padding, in both
    assert predict_labels(model, tokenizer, texts, batch_size=1) == predict(model, tokenizer, texts,
                                                                            batch_size=1).argmax(-1).tolist()


def test_predict_labels_answers_and_warns_as_predict_through_its_loop(monkeypatch):
    from test_pretrain import corpus, word_tokenizer

    import bcos_plugins.prediction as prediction
    from bcos_plugins.space import predict_labels, zero_shot_evaluation
    from bcos_plugins.train import predict

    model, tokenizer = _tiny_bcos_bert_classifier(), word_tokenizer()
    texts = corpus(9)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = predict(model, tokenizer, texts, batch_size=4, max_length=12).argmax(-1).tolist()
    loops = []
    real = prediction.batched_logits
    monkeypatch.setattr("bcos_plugins.space.zero_shot.batched_logits",
                        lambda *a, **k: loops.append(k["caller"]) or real(*a, **k))
    assert predict_labels(model, tokenizer, texts, batch_size=4, max_length=12, progress=True) == expected
    assert loops == ["predict_labels"]
    # its truncation warning, named by the call the user made (the outermost), at the user's line
    long = [" ".join([t] * 3) for t in texts[:3]]
    with pytest.warns(UserWarning, match=r"^predict_labels: 3 text\(s\) \[0, 1, 2\] have more than max_length=12") as w:
        predict_labels(model, tokenizer, long, max_length=12)
    assert w[0].filename == __file__
    with pytest.warns(UserWarning, match=r"^zero_shot_evaluation: 3 text\(s\) \[0, 1, 2\] have more than "):
        zero_shot_evaluation(model, tokenizer, long, [0, 1, 0], max_length=12)
    assert predict_labels(model, tokenizer, []) == []  # control: no text, no prediction (as before)


def test_predict_names_a_batch_s_texts_in_ascending_order():
    """``predict`` fed each batch in order of length and named the NaN rows so: "texts [3, 1]"; ``predict_labels``
    (now the same loop) named them [1, 3] and pass 20's test pins that."""
    from test_pretrain import word_tokenizer
    from test_trust_pass20_core import _NaNRowClassifier

    from bcos_plugins.train import predict

    with pytest.raises(BcosValueError, match=r"^predict: the model's logits are NaN for texts \[1, 3\]"):
        predict(_NaNRowClassifier(), word_tokenizer(), ["w1 w2", "w0 w1", "w2", "w0"], batch_size=4)


# --------------------------------------------------------------- 5. one context variable for the truncation warning


def _warn(call="inner"):
    from bcos_plugins.corpus import warn_of_truncated_texts
    from bcos_plugins.nn import BcosLinear

    class _Tokenizer:
        truncation_side = "right"
        model_max_length = 8

    warn_of_truncated_texts(call, [None, 12], 8, BcosLinear(2, 2), _Tokenizer(), False, outcome="classified from")


def test_the_outermost_entry_points_name_holds():
    """Inner names replaced outer ones, so ``zero_shot_evaluation`` (which runs ``predict_labels``, which now runs
    ``predict``'s loop under its own name) would have warned as ``predict_labels``."""
    from bcos_plugins.corpus import truncation_named

    with truncation_named("outer"), truncation_named("middle"), pytest.warns(UserWarning, match=r"^outer: 1 text"):
        _warn()
    with truncation_named("middle"), pytest.warns(UserWarning, match=r"^middle: 1 text"):
        _warn()
    with pytest.warns(UserWarning, match=r"^inner: 1 text"):  # control: no entry point around it
        _warn()


def test_silence_holds_inside_and_around_a_name_and_ends_with_its_block():
    """Control (passed before too, with two context variables): the one variable keeps their combination."""
    from bcos_plugins.corpus import truncation_named, truncation_warned

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with truncation_named("outer"), truncation_warned():
            _warn()
        with truncation_warned(), truncation_named("inner"):
            _warn()
    with truncation_named("outer"):
        with truncation_warned():
            pass
        with pytest.warns(UserWarning, match=r"^outer: 1 text"):
            _warn()


def test_the_truncation_warning_has_one_context_variable():
    from contextvars import ContextVar

    import bcos_plugins.corpus as corpus

    assert [name for name, value in vars(corpus).items() if isinstance(value, ContextVar)] == ["_TRUNCATION_WARNING"]


# --------------------------------------------------------------- 6. train_causal_lm's loss_type, for the call only


def _train(model, tmp_path, **kwargs):
    from bcos_plugins.train_decoder import train_causal_lm

    rows = [{"input_ids": [3, 4, 5, 6]}, {"input_ids": [7, 8, 9]}, {"input_ids": [5, 9, 4, 3, 8]}]
    return train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=2, per_device_train_batch_size=2,
                           logging_steps=1, disable_tqdm=True, **kwargs)


def _gpt2():
    from conftest import tiny_model

    from bcos_plugins import bcosify

    return bcosify(tiny_model("GPT2LMHeadModel"), b=1.1, verbose=False)


def test_train_causal_lm_gives_a_gpt2_its_loss_type_back_with_the_same_losses(tmp_path):
    """The GPT-2's ``loss_type`` stayed ``"ForCausalLM"`` after the call: a lasting edit of the user's model. The
    losses are bit-identical to a run whose model was given that loss_type by its user (left as it is)."""
    model, preset = _gpt2(), _gpt2()
    assert model.loss_type is None
    preset.loss_type = "ForCausalLM"
    trainers = _train(model, tmp_path / "a"), _train(preset, tmp_path / "b")
    assert model.loss_type is None and preset.loss_type == "ForCausalLM"
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in trainers]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), preset.state_dict().values(),
                                                 strict=True))


def test_train_causal_lm_gives_the_loss_type_back_when_training_fails(tmp_path):
    from transformers import TrainerCallback

    class _Fails(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("stopped by the test")

    model = _gpt2()
    with pytest.raises(RuntimeError, match="stopped by the test"):
        _train(model, tmp_path, callbacks=[_Fails()])
    assert model.loss_type is None


# --------------------------------------------------------------- 7. BilinearWeights.to


def _weights():
    from bcos_plugins.bilinear import BilinearWeights

    g = torch.Generator().manual_seed(0)
    return BilinearWeights(*(torch.randn(*shape, generator=g) for shape in ((5, 3), (5, 3), (2, 5))),
                           out_bias=torch.randn(2, generator=g))


@pytest.mark.parametrize("args, kwargs", [(("cuda",), {}), ((torch.device("cuda", 0), torch.float64), {}),
                                          ((), {"device": "cuda"})], ids=["str", "device", "keyword"])
def test_bilinear_weights_to_refuses_cuda_on_a_machine_without_it_naming_device(monkeypatch, args, kwargs):
    """It raised torch's "Torch not compiled with CUDA enabled" (an AssertionError naming no argument)."""
    _no_gpu(monkeypatch)
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda(:0)?', which this machine does not have \(available: "
                                             r"cpu\)\. Pass an available device, e.g. 'cpu'\.$"):
        _weights().to(*args, **kwargs)


def test_bilinear_weights_to_refuses_a_cuda_index_past_the_gpus_and_a_name_that_is_no_device(monkeypatch):
    _one_gpu(monkeypatch)
    with pytest.raises(BcosValueError, match=r"^device: is 'cuda:3', which this machine does not have \(available: "
                                             r"cpu, cuda:0\)"):
        _weights().to("cuda:3")
    with pytest.raises(BcosTypeError, match=r"^device: is 'gpu', not a device"):
        _weights().to("gpu")


def test_bilinear_weights_to_still_moves_and_casts_as_tensor_to():
    """Control (passed before too): dtype alone, device and dtype, keywords, another tensor."""
    w = _weights()
    assert w.to(torch.float64).W.dtype == torch.float64 and w.to(torch.float64).w_bias is None
    assert w.to("cpu", torch.float64).out_bias.dtype == torch.float64
    assert w.to(device="cpu", dtype=torch.float16).P.dtype == torch.float16
    assert w.to(torch.zeros(1, dtype=torch.float64)).V.dtype == torch.float64
    assert torch.equal(w.to("cpu").W, w.W)
