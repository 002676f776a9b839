"""Closing note 22's leftovers B (session 23, helper-141), each pinned here."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as T
from conftest import tiny_config

from bcos_plugins import bcosify
from bcos_plugins.errors import BcosKeywordError

# ------------------------------------------------------------------ 1. one TrainingArguments builder


def test_train_causal_lm_logs_a_nan_loss_as_nan_and_takes_the_filter_back_by_keyword(tmp_path):
    """train_causal_lm repeated fine_tuning's keyword check and its logging_nan_inf_filter default; both come from
    one function now: a diverging run logs NaN (not transformers' 0.0), a keyword overrides the default, and a
    misspelt keyword is refused naming train_causal_lm."""
    from bcos_plugins.train_decoder import train_causal_lm

    rows = [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [9, 10, 11]}]
    torch.manual_seed(0)
    model = bcosify(T.GPT2LMHeadModel(tiny_config("gpt2")), b=1.1, verbose=False)
    fresh = {name: value.clone() for name, value in model.state_dict().items()}
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=3, logging_steps=1,
                              learning_rate=1e38, max_grad_norm=0, per_device_train_batch_size=2, disable_tqdm=True)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.args.logging_nan_inf_filter is False
    assert math.isnan(losses[-1])
    model.load_state_dict(fresh)
    trainer = train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, max_steps=1, disable_tqdm=True,
                              logging_nan_inf_filter=True)
    assert trainer.args.logging_nan_inf_filter is True
    with pytest.raises(BcosKeywordError, match=r"^logging_nan_inf_filtr: is neither an argument of train_causal_lm "
                                               r".*Pass logging_nan_inf_filter= if"):
        train_causal_lm(model, rows, str(tmp_path), pad_token_id=0, logging_nan_inf_filtr=True)


# ------------------------------------------------------------------ 3. AlignmentPressure reads a stored B in one place


def _bert(b: float = 1.1, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return bcosify(T.BertForSequenceClassification(config).eval(), b=b, verbose=False)


def _buffers(model) -> set[float]:
    return {v.item() for k, v in model.state_dict().items() if k.endswith("bcos_b")}


@pytest.mark.parametrize("assign", [False, True])
def test_a_float32_b_loaded_and_compiled_without_an_eager_call_runs_at_the_recorded_b(assign):
    """A compiled graph reads each layer's bcos_b buffer itself (a float would be baked in), and cannot run the
    reading that maps a float32-stored B (a save on MPS) to the B it records: the buffer must hold B = 1.1, not
    1.100000023841858, as soon as the load returns, before any eager forward."""
    model, fresh = _bert(seed=0), _bert(seed=1)
    state = {k: v.float() if k.endswith("bcos_b") else v for k, v in model.state_dict().items()}
    fresh.load_state_dict(state, assign=assign)
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fresh, backend="eager", fullgraph=True)
        with torch.no_grad():
            assert torch.equal(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    finally:
        torch._dynamo.reset()
    assert _buffers(fresh) == {1.1}
    # the caller's state dict is not written to (assign=True hands its tensors to the model)
    assert {v.item() for k, v in state.items() if k.endswith("bcos_b")} == {torch.tensor(1.1).float().item()}


def test_a_b_written_in_place_under_no_grad_is_read_at_the_next_forward_and_saved():
    """The buffer's version counter tells a write; the value is read, checked and saved as written."""
    model = _bert(b=1.1)
    with torch.no_grad():
        for layer in model.modules():
            if hasattr(layer, "bcos_b"):
                layer.bcos_b.fill_(1.5)
    assert {layer.b for layer in model.modules() if hasattr(layer, "bcos_b")} == {1.5}
    assert _buffers(model) == {1.5}
    with torch.no_grad():
        next(layer for layer in model.modules() if hasattr(layer, "bcos_b")).bcos_b.fill_(0.5)
    from bcos_plugins.errors import BcosValueError
    with pytest.raises(BcosValueError, match=r"bcos_b: the stored alignment pressure is 0\.5, outside \[1, "):
        model(input_ids=torch.tensor([[2, 7, 3]]))


# ------------------------------------------------------------------ 4. the overflow mapping, built once per encoding


def _segment_word_reach_per_row(encoding, row: int, last: int) -> tuple[int, int | None]:
    """guided/masks._segment_word_reach as it was (session 22), read per row: the reference."""
    encodings = getattr(encoding, "encodings", None)
    if not encodings or row >= len(encodings):
        return last, None
    parts = [encodings[row]]
    if "overflow_to_sample_mapping" in encoding:
        sample = [int(s) for s in encoding["overflow_to_sample_mapping"]]
        parts = [encodings[r] for r in range(len(encodings)) if sample[r] == sample[row]]

    def first_segment_words(part) -> list[int]:
        return [w for w, seg in zip(part.word_ids, part.sequence_ids, strict=True) if w is not None and seg == 0]

    reach = max([last] + [w for part in parts for w in first_segment_words(part)])
    overflow = [w for e in parts for o in (getattr(e, "overflowing", None) or ()) for w in first_segment_words(o)]
    return reach, max([reach] + overflow) + 1


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


@pytest.mark.parametrize("overflowing", [True, False])
def test_segment_word_reach_built_once_equals_the_per_row_reading(minilm_tokenizer, overflowing):
    """Each row read every row of its text (rows squared with return_overflowing_tokens); built once per encoding,
    it gives the per-row reading's (reach, count) on every row, for texts spread over several rows with a stride,
    a pair encoding (only the first segment counts) and a text that fits one row."""
    from bcos_plugins.guided.masks import _segment_word_reach

    words = [("one two three four five six seven eight nine ten eleven twelve").split(), ["ok", "fine"],
             ("a b c d e f g").split()]
    pairs = [["p", "q"], ["r"], ["s", "t", "u"]]
    for second in (None, pairs):
        encoding = minilm_tokenizer(words, second, is_split_into_words=True, padding=True, max_length=9,
                                    truncation="only_first" if second else True, stride=1 if second else 2,
                                    return_overflowing_tokens=overflowing)
        rows = len(encoding["input_ids"])
        if overflowing:
            assert rows > len(words)  # several rows per text
        reach = _segment_word_reach(encoding)
        for row in range(rows + 1):  # and a row past the encoding's
            encoded = ([w for w, seg in zip(encoding.word_ids(row), encoding.sequence_ids(row), strict=True)
                        if w is not None and seg == 0] if row < rows else [])
            last = max(encoded, default=-1)
            assert reach(row, last) == _segment_word_reach_per_row(encoding, row, last), row
    # an encoding without fast-tokenizer encodings: no count
    assert _segment_word_reach({"input_ids": [[1, 2]]})(0, 3) == (3, None)
    assert _segment_word_reach({"input_ids": [[1, 2]], "overflow_to_sample_mapping": [0]})(0, 3) == (3, None)


# ------------------------------------------------------------------ 5. guided_esnli's gate, fed once per optimiser step


def _supervised_rows(n: int = 8) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        words = torch.randint(5, 50, (3,), generator=generator).tolist()
        rows.append({"input_ids": [2, words[0], words[1], 3, words[2], 3], "token_type_ids": [0, 0, 0, 0, 1, 1],
                     "gold": torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
                     "valid": torch.tensor([False, True, True, False, True, False]), "label": i % 2})
    return rows


def _supervised_trainer(tmp_path, guided_esnli, accumulation: int, **kwargs):
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=16, num_labels=2)
    model = T.BertForSequenceClassification._from_config(config, attn_implementation="eager")
    args = T.TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                               gradient_accumulation_steps=accumulation, learning_rate=1e-3, report_to=[],
                               save_strategy="no", use_cpu=True, logging_steps=100, disable_tqdm=True,
                               remove_unused_columns=False)
    return guided_esnli.AttentionSupervisedTrainer(
        model=model, args=args, train_dataset=_supervised_rows(),
        data_collator=lambda items: guided_esnli.collate(items, 0, supervise="gold")[0], supervision_weight=0.5,
        supervised_layers=[-1], keys="text", supervised_heads=0, supervision_warmup=0.0, **kwargs)


@pytest.fixture(scope="module")
def guided_esnli():
    from examples import guided_esnli

    return guided_esnli


def test_guided_esnli_feeds_the_supervision_gate_once_per_optimiser_step_under_accumulation(guided_esnli, tmp_path,
                                                                                           monkeypatch):
    """The gate was fed each micro-batch's task loss (its running mean moved twice per step under accumulation 2, so
    it could open steps before the watch); it is fed the step's row-weighted mean when the step ends, as the watch
    is, and every micro-batch of a step takes the factor of the gate as the steps before it left it."""
    from bcos_plugins.guided import PlateauGate

    factors = []  # (step, start) of each micro-batch whose supervision the gate let through

    def recording_factor(step, total, warmup, start=0):
        factors.append((step, start))
        return 1.0

    monkeypatch.setattr(guided_esnli, "supervision_warmup_factor", recording_factor)
    trainer = _supervised_trainer(tmp_path, guided_esnli, accumulation=2, gate=0.5)
    # a threshold every loss is below: the gate opens with the first step's loss, at the end of step 0
    trainer.gate = gate = PlateauGate(100.0)
    fed, update = [], gate.update
    gate.update = lambda step, task_loss: fed.append((step, task_loss)) or update(step, task_loss)
    task_losses = []
    compute_loss = guided_esnli.PlateauWatchedTrainer.compute_loss

    def spy(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = compute_loss(self, model, inputs, True, num_items_in_batch)
        if model.training:
            task_losses.append((self.state.global_step, loss.item()))
        return (loss, outputs) if return_outputs else loss

    monkeypatch.setattr(guided_esnli.PlateauWatchedTrainer, "compute_loss", spy)
    trainer.train()
    assert trainer.state.global_step == 3
    assert [step for step, _ in fed] == [0, 1, 2]
    for step, mean in fed:  # the mean of the step's two micro-batches (equal rows)
        micro = [loss for s, loss in task_losses if s == step]
        assert len(micro) == 2 and mean == pytest.approx(sum(micro) / 2, rel=1e-12)
    assert trainer.gate.start == 0
    # step 0 ran unsupervised (the gate was closed when it began); steps 1 and 2 both micro-batches, from start 0
    assert factors == [(1, 0), (1, 0), (2, 0), (2, 0)]


def test_guided_esnli_refuses_a_loss_function_with_the_gate_under_accumulation(guided_esnli, tmp_path):
    """bcos_loss gives each micro-batch a share of the step's loss, which the gate would read as a task loss k times
    smaller (a plateau left at once); as with the restart rule, refused."""
    from bcos_plugins.train import bcos_loss

    with pytest.raises(ValueError, match="^gate: with gradient accumulation the gate needs each micro-batch's mean"):
        _supervised_trainer(tmp_path, guided_esnli, accumulation=2, gate=0.9, compute_loss_func=bcos_loss)
    # without accumulation each micro-batch is a step: taken
    assert _supervised_trainer(tmp_path, guided_esnli, accumulation=1, gate=0.9,
                               compute_loss_func=bcos_loss).reads_step_losses


# ------------------------------------------------------------------ 6. the bridge flag and the cache-method table


def test_the_explainable_bridge_flag_is_spelt_once_and_read_by_one_function():
    """boot_guard spelt the flag make_bridge_explainable sets by hand twice (and _lens/model.py once) beside
    bridge._EXPLAINABLE_FLAG, and read it with a second copy of is_explainable_bridge: a renamed flag would have
    left the guard reading a flag no bridge carries, without a word."""
    from pathlib import Path

    from bcos_plugins.adapters import transformer_lens
    from bcos_plugins.adapters._lens import boot_guard, bridge, explain

    root = Path(boot_guard.__file__).parents[1]
    spelt = [path.name for path in root.rglob("*.py")
             if f'"{boot_guard.EXPLAINABLE_BRIDGE_MARKER}"' in path.read_text(encoding="utf-8")]
    assert spelt == ["boot_guard.py"]
    assert bridge.is_explainable_bridge is boot_guard.is_explainable_bridge is explain.is_explainable_bridge \
        is transformer_lens.is_explainable_bridge
    # the cache methods' table: the head-result methods and the weight readers are its keys
    assert boot_guard.CACHE_WEIGHT_READERS == ("compute_head_results", "stack_head_results", "get_neuron_results",
                                               "stack_neuron_results")
    assert boot_guard._HEAD_RESULT_METHODS == ("compute_head_results", "stack_head_results")


# ------------------------------------------------------------------ 7. the bridge's soft-cap classes, from the spec


def test_the_bridge_moves_a_soft_cap_into_the_head_with_the_classes_of_the_spec(monkeypatch):
    """_move_soft_cap_into_head imported Gemma's uncapped LM class and soft-capped head itself: another soft-capped
    family would have needed an edit there. It reads them from the architecture's spec; the copy's logits are the
    plain model's."""
    import dataclasses

    from bcos_plugins.adapters._lens.bridge import _move_soft_cap_into_head

    from bcos_plugins.convert.architectures import SPECS
    from bcos_plugins.convert.gemma import BcosSoftCappedLMHead, BcosUncappedCausalLM

    class SpecHead(BcosSoftCappedLMHead):
        pass

    class SpecLM(BcosUncappedCausalLM):
        pass

    spec = SPECS["Gemma2ForCausalLM"]
    monkeypatch.setitem(SPECS, "Gemma2ForCausalLM", dataclasses.replace(
        spec, class_swaps={"": (lambda: SpecLM, "uncapped")},
        module_swaps={**spec.module_swaps, "lm_head": (lambda: SpecHead, "capped")}))
    config = T.Gemma2Config(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64,
                            sliding_window=4, query_pre_attn_scalar=8, pad_token_id=0, final_logit_softcapping=0.5)
    torch.manual_seed(0)
    model = T.Gemma2ForCausalLM(config).eval()
    ids = torch.tensor([[2, 7, 9, 11, 3]])
    with torch.no_grad():
        capped = model(input_ids=ids).logits
    _move_soft_cap_into_head(model)
    assert isinstance(model, SpecLM) and isinstance(model.lm_head, SpecHead)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, capped, rtol=1e-6, atol=1e-7)
    _move_soft_cap_into_head(model)  # once only
    assert type(model).__mro__.count(SpecLM) == 1
