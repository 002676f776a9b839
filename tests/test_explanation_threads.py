"""Explanation mode holds for the thread that entered it, and only that thread.

``explanation_mode(model)`` used to set a flag on the model's own modules, which every thread running the same model
object saw: a thread training the model while another explained it trained in explanation mode (BERT's query / key
and Llama's gate weights got no gradient, other Llama gradients were off by up to 5.8x), silently, and two threads
explaining it at once switched each other's modules back (a completeness refusal). ``explain``'s capture of the
attribution point, a hook on the model, also acted in every thread's forward. The overlaps are forced with events at
a forward pre-hook on the input embeddings (inside ``explain``'s explanation mode, before the attribution point), not
with sleeps; every result is compared with the same call made alone in one thread.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import padded_batch, tiny_model

from bcos_plugins import bcosify, explain
from bcos_plugins.nn import explanation_mode

WAIT_S = 60  # a missing signal fails the test instead of hanging it

FAMILIES = ["BertForSequenceClassification", "LlamaForSequenceClassification"]


def _bcos(name: str):
    return bcosify(tiny_model(name), verbose=False)


def _wait(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT_S), f"the other thread never {what}"


def _pause_in_thread(model, reached: threading.Event, resume: threading.Event, *, what: str):
    """A pre-hook on the input embeddings that, at its first call in the calling thread, sets ``reached`` and waits
    for ``resume``: that thread's forward stops there (inside explain's explanation mode, before the attribution
    point) while other threads run. Other threads' forwards pass through it."""
    owner = threading.current_thread()
    paused = []

    def hook(module, args):
        if threading.current_thread() is owner and not paused:
            paused.append(True)
            reached.set()
            _wait(resume, what)

    return model.get_input_embeddings().register_forward_pre_hook(hook)


def _in_threads(*functions):
    """Run each function in its own thread; return their results in order, raising the first exception."""
    results: list = [None] * len(functions)
    errors: list = []

    def run(i, f):
        try:
            results[i] = f()
        except BaseException as error:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(functions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT_S)
        assert not t.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


def _training_gradients(model, ids, mask) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    (logits * torch.linspace(-1.0, 1.0, logits.shape[-1])).sum().backward()
    return {name: torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for name, p in model.named_parameters()}


def _assert_same_explanation(got, expected) -> None:
    torch.testing.assert_close(got.explained, expected.explained, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.input_contributions, expected.input_contributions, rtol=1e-5, atol=1e-6)
    assert got.completeness_error.max() < 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_a_thread_training_the_model_while_another_explains_it_gets_the_single_threaded_gradients(name):
    model = _bcos(name)
    ids, mask = padded_batch()
    train_ids, train_mask = padded_batch(seed=1, batch=2, length=7)  # another shape: the capture must leave it alone
    alone_gradients = _training_gradients(model, train_ids, train_mask)
    alone_explanation = explain(model, ids, mask)
    inside, trained = threading.Event(), threading.Event()

    def explaining():
        handle = _pause_in_thread(model, inside, trained, what="finished its training step")
        try:
            return explain(model, ids, mask)
        finally:
            handle.remove()

    def training():
        _wait(inside, "entered explanation mode")
        try:  # runs while the other thread is inside explain's explanation mode, before its attribution point
            return _training_gradients(model, train_ids, train_mask)
        finally:
            trained.set()

    explanation, gradients = _in_threads(explaining, training)
    assert gradients.keys() == alone_gradients.keys()
    for parameter, gradient in alone_gradients.items():
        torch.testing.assert_close(gradients[parameter], gradient, rtol=1e-5, atol=1e-7, msg=parameter)
    _assert_same_explanation(explanation, alone_explanation)


@pytest.mark.parametrize("name", FAMILIES)
def test_two_threads_explaining_one_model_at_once_both_get_the_single_threaded_explanation(name):
    # A enters explain's explanation mode, then B; A finishes (leaving the mode) while B is still before its
    # attribution point; then B runs. The old module flags were switched back by A's exit, and each thread's
    # capture hook acted in the other's forward.
    model = _bcos(name)
    ids_a, mask_a = padded_batch(seed=2)
    ids_b, mask_b = padded_batch(seed=3, batch=2, length=6)
    alone_a, alone_b = explain(model, ids_a, mask_a), explain(model, ids_b, mask_b)
    a_inside, b_inside, a_done = (threading.Event() for _ in range(3))

    def first():
        handle = _pause_in_thread(model, a_inside, b_inside, what="entered explanation mode")
        try:
            return explain(model, ids_a, mask_a)
        finally:
            handle.remove()
            a_done.set()

    def second():
        _wait(a_inside, "entered explanation mode")
        handle = _pause_in_thread(model, b_inside, a_done, what="finished its explanation")
        try:
            return explain(model, ids_b, mask_b)
        finally:
            handle.remove()

    explained_a, explained_b = _in_threads(first, second)
    _assert_same_explanation(explained_a, alone_a)
    _assert_same_explanation(explained_b, alone_b)


def test_the_model_stays_in_eval_mode_until_the_last_thread_explaining_it_is_done():
    # a model in training mode, with dropout: A's explanation switched it to eval mode, and A's exit switched it back
    # to training while B still explained (B's explanation ran with dropout: another, random function, silently)
    model = _bcos("BertForSequenceClassification")
    ids_a, mask_a = padded_batch(seed=2)
    ids_b, mask_b = padded_batch(seed=3, batch=2, length=6)
    alone_b = explain(model, ids_b, mask_b)
    model.train()
    a_inside, b_inside, a_done = (threading.Event() for _ in range(3))
    training_while_b_runs = []

    def first():
        with explanation_mode(model):
            a_inside.set()
            _wait(b_inside, "entered explanation mode")
            explanation = explain(model, ids_a, mask_a)
        a_done.set()
        return explanation

    def second():
        _wait(a_inside, "entered explanation mode")
        with explanation_mode(model):
            b_inside.set()
            _wait(a_done, "finished its explanation")
            training_while_b_runs.append(any(m.training for m in model.modules()))
            return explain(model, ids_b, mask_b)

    _, explained_b = _in_threads(first, second)
    assert training_while_b_runs == [False]
    _assert_same_explanation(explained_b, alone_b)
    assert all(m.training for m in model.modules())  # restored by the last block to end


def test_explanation_mode_and_the_thread_wide_form_switch_only_the_calling_thread():
    model = _bcos("BertForSequenceClassification")
    query = model.bert.encoder.layer[0].attention.self.query
    inside, checked = threading.Event(), threading.Event()
    seen = []

    def explaining(form):
        with form():
            inside.set()
            _wait(checked, "looked at the module")
            seen.append(("owner", query.explaining))

    def looking():
        _wait(inside, "entered explanation mode")
        seen.append(("other", query.explaining))
        checked.set()

    for form in (lambda: explanation_mode(model), explanation_mode):
        inside.clear(), checked.clear(), seen.clear()
        _in_threads(lambda form=form: explaining(form), looking)
        assert sorted(seen) == [("other", False), ("owner", True)]
        assert not query.explaining
        with explanation_mode(model), explanation_mode(model):  # nested in one thread: still explaining inside
            with explanation_mode():
                assert query.explaining
            assert query.explaining
        assert not query.explaining


def test_a_compiled_model_trained_in_one_thread_while_another_explains_it():
    # torch.compile (fullgraph) guards the thread's explanation state per calling thread: the training thread runs
    # the training graph while the explaining thread is in explanation mode, and no call breaks the graph
    torch._dynamo.reset()
    model = _bcos("LlamaForSequenceClassification")
    ids, mask = padded_batch()
    train_ids, train_mask = padded_batch(seed=1, batch=2, length=7)
    alone_gradients = _training_gradients(model, train_ids, train_mask)
    alone_explanation = explain(model, ids, mask)
    model.compile(fullgraph=True, backend="eager")
    try:
        compiled_alone = _training_gradients(model, train_ids, train_mask)  # the graph's rounding differs from eager's
        for parameter, gradient in alone_gradients.items():
            torch.testing.assert_close(compiled_alone[parameter], gradient, rtol=1e-4,
                                       atol=1e-5 * float(gradient.abs().max()), msg=parameter)
        inside, trained = threading.Event(), threading.Event()

        def explaining():
            with explanation_mode(model):
                inside.set()
                _wait(trained, "finished its training step")
                return explain(model, ids, mask)

        def training():
            _wait(inside, "entered explanation mode")
            try:
                return _training_gradients(model, train_ids, train_mask)
            finally:
                trained.set()

        for _ in range(2):  # the second round runs the graphs the first one compiled
            inside.clear(), trained.clear()
            explanation, gradients = _in_threads(explaining, training)
            for parameter, gradient in compiled_alone.items():
                torch.testing.assert_close(gradients[parameter], gradient, rtol=1e-6, atol=1e-8, msg=parameter)
            _assert_same_explanation(explanation, alone_explanation)
        # and in one thread, a graph compiled outside explanation mode is not run inside it, nor the other way round
        _assert_same_explanation(explain(model, ids, mask), alone_explanation)
        gradients = _training_gradients(model, train_ids, train_mask)
        for parameter, gradient in compiled_alone.items():
            torch.testing.assert_close(gradients[parameter], gradient, rtol=1e-6, atol=1e-8, msg=parameter)
    finally:
        model._compiled_call_impl = None
        torch._dynamo.reset()


def test_captum_attribution_in_one_thread_leaves_another_threads_training_forward_alone():
    # EmbeddingForward swaps its tensor in at the attribution point with a hook on the model: the training thread's
    # forward through the same model had its embeddings replaced by the explained ones (or failed on their shape)
    from bcos_plugins.adapters.captum import BcosAttribution, EmbeddingForward

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    train_ids, train_mask = padded_batch(seed=1, batch=2, length=7)
    forward = EmbeddingForward(model)
    embeddings = forward.embed(ids, mask)
    alone_gradients = _training_gradients(model, train_ids, train_mask)
    alone = BcosAttribution(forward).attribute(embeddings, target=1, additional_forward_args=(mask,))
    inside, trained = threading.Event(), threading.Event()

    def explaining():
        handle = _pause_in_thread(model, inside, trained, what="finished its training step")
        try:
            return BcosAttribution(forward).attribute(embeddings, target=1, additional_forward_args=(mask,))
        finally:
            handle.remove()

    def training():
        _wait(inside, "entered the attribution")
        try:
            return _training_gradients(model, train_ids, train_mask)
        finally:
            trained.set()

    attributions, gradients = _in_threads(explaining, training)
    for parameter, gradient in alone_gradients.items():
        torch.testing.assert_close(gradients[parameter], gradient, rtol=1e-5, atol=1e-7, msg=parameter)
    torch.testing.assert_close(attributions, alone, rtol=1e-5, atol=1e-7)
