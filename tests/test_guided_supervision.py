"""Attention supervision: the loss by hand, and that it moves the unmasked [CLS] attention towards the gold
mask in a few steps while evaluation still refuses masks."""

import pytest
import torch
from test_guided import batch_and_gold, make

from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.guided import (
    GoldMaskAtEvaluationError,
    PlateauGate,
    PlateauRestart,
    attention_supervision_loss,
    attention_token_scores,
    guide_attention,
    supervision_warmup_factor,
)


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_loss_by_hand_and_rows_without_rationale_are_left_out():
    attn = torch.tensor([0.5, 0.25, 0.25]).view(1, 1, 1, 3).expand(2, 2, 3, 3).clone()
    gold = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    expected = 0.5 * torch.log(torch.tensor(0.5 / 0.5)) + 0.5 * torch.log(torch.tensor(0.5 / 0.25))
    loss = attention_supervision_loss((attn,), gold, weight=2.0)
    assert loss.item() == pytest.approx(2.0 * expected.item(), rel=1e-5)
    matched = torch.tensor([0.5, 0.5, 0.0]).view(1, 1, 1, 3).expand(2, 2, 3, 3)
    assert attention_supervision_loss((matched,), gold).item() == pytest.approx(0.0, abs=1e-6)
    assert attention_supervision_loss((attn,), torch.zeros(2, 3)).item() == 0.0
    with pytest.raises(BcosValueError, match="weight"):
        attention_supervision_loss((attn,), gold, weight=-1.0)
    with pytest.raises(BcosValueError, match="rationale_mask"):
        attention_supervision_loss((attn,), gold[:, :2])


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_valid_mask_renormalises_the_attention_over_text_tokens():
    # keys: [CLS], two text tokens, [SEP]; half the mass parked on [SEP] is not penalised once renormalised
    attn = torch.tensor([0.1, 0.3, 0.1, 0.5]).view(1, 1, 1, 4).expand(1, 2, 4, 4).clone()
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    valid = torch.tensor([[False, True, True, False]])
    # renormalised over the text tokens the attention is (0.75, 0.25): KL(one-hot || it) = -log 0.75
    loss = attention_supervision_loss((attn,), gold, valid_mask=valid)
    assert loss.item() == pytest.approx(-torch.log(torch.tensor(0.75)).item(), rel=1e-5)
    assert attention_supervision_loss((attn,), gold).item() == pytest.approx(-torch.log(torch.tensor(0.3)).item(),
                                                                             rel=1e-5)
    # a gold token outside the valid positions does not count (the row has no rationale left)
    assert attention_supervision_loss((attn,), torch.tensor([[1.0, 0.0, 0.0, 0.0]]), valid_mask=valid).item() == 0.0
    with pytest.raises(BcosValueError, match="valid_mask"):
        attention_supervision_loss((attn,), gold, valid_mask=valid[:, :3])


def _mass_on_gold(model, ids, mask, gold):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    scores = attention_token_scores(out.attentions, layers=[-2, -1])
    return (scores * gold).sum(1).mean().item()


def test_supervised_attention_moves_toward_the_mask_and_evaluation_refuses_masks():
    torch.manual_seed(0)
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    guide_attention(model, mode="multiply", strength=1.0, last_layers=2)
    labels = torch.zeros(ids.shape[0], dtype=torch.long)
    before = _mass_on_gold(model.eval(), ids, mask, gold)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(15):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, rationale_mask=gold, output_attentions=True)
        loss = out.loss + attention_supervision_loss(out.attentions, gold, mask, layers=[-2, -1], weight=1.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    after = _mass_on_gold(model, ids, mask, gold)  # measured without masks
    assert after > before + 0.2, (before, after)
    with pytest.raises(GoldMaskAtEvaluationError):
        model(input_ids=ids, attention_mask=mask, rationale_mask=gold)


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_heads_pick_the_supervised_heads_and_bad_heads_are_refused():
    # head 0 attends to key 1 only, head 1 uniformly over the four keys
    head0 = torch.tensor([0.0, 1.0, 0.0, 0.0])
    head1 = torch.full((4,), 0.25)
    attn = torch.stack([head0, head1]).view(1, 2, 1, 4).expand(1, 2, 4, 4).clone()
    assert torch.allclose(attention_token_scores((attn,), heads=0), head0.view(1, 4))
    assert torch.allclose(attention_token_scores((attn,), heads=[-1]), head1.view(1, 4))
    assert torch.allclose(attention_token_scores((attn,), heads=[0, 1]), attention_token_scores((attn,)))
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    # KL(one-hot || head 0) = 0; against head 1 it is -log 0.25; the mean of both heads gives -log 0.625
    assert attention_supervision_loss((attn,), gold, heads=[0]).item() == pytest.approx(0.0, abs=1e-6)
    assert attention_supervision_loss((attn,), gold, heads=1).item() == pytest.approx(
        -torch.log(torch.tensor(0.25)).item(), rel=1e-5)
    assert attention_supervision_loss((attn,), gold).item() == pytest.approx(
        -torch.log(torch.tensor(0.625)).item(), rel=1e-5)
    for bad, message in ((2, "heads: must be in"), ([], "heads: is empty"), ([0, -2], "heads: repeats a head"),
                         (1.0, "heads: must be a head index")):
        with pytest.raises((BcosValueError, BcosTypeError), match=message):
            attention_supervision_loss((attn,), gold, heads=bad)


def test_supervision_warmup_factor_ramps_linearly_and_checks_its_arguments():
    assert supervision_warmup_factor(0, 100, 0.0) == 1.0
    assert [supervision_warmup_factor(s, 100, 0.5) for s in (0, 25, 50, 99)] == [0.0, 0.5, 1.0, 1.0]
    for kwargs, name in (({"step": -1}, "step"), ({"total_steps": 0}, "total_steps"), ({"warmup": 1.5}, "warmup"),
                         ({"warmup": float("nan")}, "warmup"), ({"step": 1.0}, "step")):
        with pytest.raises((BcosValueError, BcosTypeError), match=f"^{name}:"):
            supervision_warmup_factor(**{"step": 0, "total_steps": 10, "warmup": 0.5, **kwargs})


def test_one_supervised_head_with_warmup_moves_toward_the_mask_and_the_others_stay_free():
    torch.manual_seed(0)
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    labels = torch.zeros(ids.shape[0], dtype=torch.long)

    def mass(heads):
        with torch.no_grad():
            out = model.eval()(input_ids=ids, attention_mask=mask, output_attentions=True)
        return (attention_token_scores(out.attentions, layers=-1, heads=heads) * gold).sum(1).mean().item()

    before, before_free = mass([0]), mass([1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    factors = []
    for step in range(20):
        out = model.train()(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
        factors.append(supervision_warmup_factor(step, 20, 0.25))
        supervision = attention_supervision_loss(out.attentions, gold, mask, layers=-1, heads=[0])
        optimizer.zero_grad()
        (out.loss + factors[-1] * supervision).backward()
        optimizer.step()
    assert factors[:6] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0] and factors[-1] == 1.0
    after, after_free = mass([0]), mass([1])  # measured without masks
    assert after > before + 0.3, (before, after)
    # the unsupervised head is not pulled along
    assert after_free < before_free + 0.1, (before_free, after_free)


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_rank_objective_by_hand_and_it_stops_pulling_once_the_rationale_leads():
    # keys: [CLS], two text tokens, [SEP]; the rationale is key 1
    attn = torch.tensor([0.1, 0.3, 0.1, 0.5]).view(1, 1, 1, 4).expand(1, 2, 4, 4).clone()
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    valid = torch.tensor([[False, True, True, False]])
    # among the text tokens key 1 leads key 2 by log 3 > margin 1: nothing to pull
    assert attention_supervision_loss((attn,), gold, valid_mask=valid, objective="rank").item() == 0.0
    # a larger margin: relu(1.5 - log 3) for the one pair
    assert attention_supervision_loss((attn,), gold, valid_mask=valid, objective="rank", margin=1.5).item() == \
        pytest.approx(1.5 - torch.log(torch.tensor(3.0)).item(), rel=1e-5)
    # over all keys [SEP] (0.5) outranks the rationale: pairs (1, 0), (1, 2), (1, 3) -> (0 + 0 + (1 - log 0.6)) / 3
    expected = (1.0 - torch.log(torch.tensor(0.3 / 0.5)).item()) / 3
    loss = attention_supervision_loss((attn,), gold, objective="rank", weight=2.0)
    assert loss.item() == pytest.approx(2.0 * expected, rel=1e-5)
    # the renormalisation over valid_mask shifts every log attention of a row: the ranking term is unchanged
    scaled = attn.clone()
    scaled[..., 1:3] *= 2.5
    scaled[..., 0::3] = 0.0  # [CLS] and [SEP] give up the mass, so the rows stay softmax weights (sum 1)
    assert attention_supervision_loss((scaled,), gold, valid_mask=valid, objective="rank", margin=1.5).item() == \
        pytest.approx(1.5 - torch.log(torch.tensor(3.0)).item(), rel=1e-5)
    # a row whose every compared token is rationale has no pair and is left out
    assert attention_supervision_loss((attn,), torch.tensor([[0.0, 1.0, 1.0, 0.0]]), valid_mask=valid,
                                      objective="rank").item() == 0.0
    with pytest.raises(BcosValueError, match="objective"):
        attention_supervision_loss((attn,), gold, objective="mse")
    with pytest.raises(BcosValueError, match="margin"):
        attention_supervision_loss((attn,), gold, objective="rank", margin=-1.0)


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_rank_objective_ranks_the_rationale_first_without_masks():
    torch.manual_seed(0)
    ids, mask, gold = batch_and_gold()
    model = make("BertForSequenceClassification", sharpen=4.0)
    labels = torch.zeros(ids.shape[0], dtype=torch.long)

    def ranking_loss():
        with torch.no_grad():
            out = model.eval()(input_ids=ids, attention_mask=mask, output_attentions=True)
        return attention_supervision_loss(out.attentions, gold, mask, layers=-1, objective="rank").item()

    before = ranking_loss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        out = model.train()(input_ids=ids, attention_mask=mask, labels=labels, output_attentions=True)
        loss = out.loss + attention_supervision_loss(out.attentions, gold, mask, layers=-1, objective="rank")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = ranking_loss()  # measured without masks
    assert before > 0.5 and after < 0.25 * before, (before, after)


def test_warmup_starts_at_start_and_the_plateau_gate_picks_start_from_the_task_loss():
    assert [supervision_warmup_factor(s, 100, 0.5, start=40) for s in (0, 39, 40, 65, 90, 99)] == \
        [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    assert [supervision_warmup_factor(s, 100, 0.0, start=10) for s in (9, 10)] == [0.0, 1.0]
    with pytest.raises(BcosValueError, match="^start:"):
        supervision_warmup_factor(0, 10, 0.5, start=-1)
    gate = PlateauGate(threshold=0.6, smoothing=0.5)
    # the running mean: 0.69, 0.69, 0.59 (< 0.6 from step 2 on), then fixed whatever the loss does
    assert [gate.update(step, loss) for step, loss in enumerate([0.69, 0.69, 0.49, 0.69, 0.69])] == \
        [None, None, 2, 2, 2]
    assert gate.running == pytest.approx(0.69 * 0.75 + 0.59 * 0.25)
    # a run that never leaves the plateau is never supervised
    stuck = PlateauGate(threshold=0.9 * 0.6931)
    assert all(stuck.update(step, 0.693) is None for step in range(200))
    for kwargs, name in (({"threshold": 0.0}, "threshold"), ({"threshold": 0.6, "smoothing": 1.0}, "smoothing"),
                         ({"threshold": float("nan")}, "threshold")):
        with pytest.raises(BcosValueError, match=f"^{name}:"):
            PlateauGate(**kwargs)
    with pytest.raises(BcosValueError, match="^task_loss:"):
        PlateauGate(0.6).update(0, float("nan"))
    # factor: 0 on the plateau, then the warm-up ramp from the step the gate opened
    gate = PlateauGate(threshold=0.6, smoothing=0.0)
    factors = [gate.factor(step, 100, 0.5, loss) for step, loss in enumerate([0.69] * 10 + [0.3] * 90)]
    assert factors[:11] == [0.0] * 11 and gate.start == 10
    assert factors[35] == pytest.approx(0.5) and factors[60:] == [1.0] * 40
    assert factors == [supervision_warmup_factor(s, 100, 0.5, start=10) for s in range(100)]


def test_plateau_restart_stops_a_stuck_attempt_at_the_check_step_and_lets_the_last_one_run():
    rule = PlateauRestart(threshold=0.6, check_fraction=0.4, max_restarts=2, smoothing=0.0)
    assert rule.check_step(100) == 40 and rule.check_step(1) == 1
    # stuck: the loss stays at ln 2, so the attempt is stopped after its 40th step (step 39), and only then
    stuck = rule.watch(0, 100)
    assert [stuck.update(step, 0.693) for step in range(39)] == [False] * 39
    assert stuck.update(39, 0.693) and stuck.stopped_at == 39 and stuck.left_at is None
    assert stuck.update(40, 0.1) and stuck.stopped_at == 39  # once stopped, stopped
    # leaves the plateau at step 30: never stopped, whatever the loss does later
    leaves = rule.watch(0, 100)
    assert not any(leaves.update(step, 0.693 if step < 30 else 0.4 + (step > 50)) for step in range(100))
    assert leaves.left_at == 30 and leaves.stopped_at is None
    # the last attempt allowed (restart == max_restarts) runs to the end and reports that it never left
    last = rule.watch(2, 100)
    assert not any(last.update(step, 0.693) for step in range(100)) and last.left_at is None
    # the running mean decides, as PlateauGate's: one low loss in a noisy plateau does not count as leaving
    smooth = PlateauRestart(threshold=0.6, check_fraction=0.1, smoothing=0.8).watch(0, 100)
    assert [smooth.update(step, loss) for step, loss in enumerate([0.69] * 5 + [0.3] + [0.69] * 4)][-1]
    # seeds: attempt 0 is the seed itself (a run that never stalls is unchanged); restarts are deterministic,
    # distinct, and not the first attempt of a neighbouring seed
    seeds = [rule.attempt_seed(32, restart) for restart in range(3)]
    assert seeds[0] == 32 and seeds == [PlateauRestart(0.6, max_restarts=2).attempt_seed(32, r) for r in range(3)]
    assert len(set(seeds)) == 3 and not set(seeds[1:]) & set(range(100)) and all(0 <= s < 2**32 for s in seeds)
    assert rule.attempt_seed(33, 1) != seeds[1]


def test_plateau_restart_refuses_bad_settings_by_name():
    for kwargs, name in (({"threshold": 0.0}, "threshold"), ({"threshold": 0.6, "check_fraction": 0.0}, "check_fraction"),
                         ({"threshold": 0.6, "check_fraction": 1.5}, "check_fraction"),
                         ({"threshold": 0.6, "max_restarts": -1}, "max_restarts"),
                         ({"threshold": 0.6, "smoothing": 1.0}, "smoothing")):
        with pytest.raises(BcosValueError, match=f"^{name}:"):
            PlateauRestart(**kwargs)
    rule = PlateauRestart(0.6, max_restarts=1)
    with pytest.raises(BcosValueError, match="^restart:"):
        rule.attempt_seed(0, 2)
    with pytest.raises(BcosValueError, match="^seed:"):
        rule.attempt_seed(-1, 0)
    with pytest.raises(BcosValueError, match="^total_steps:"):
        rule.watch(0, 0)
    with pytest.raises(BcosValueError, match="^task_loss:"):
        rule.watch(0, 10).update(0, float("nan"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("objective", ["kl", "rank"])
@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_half_precision_attention_gives_the_float32_loss_not_nan(dtype, objective):
    # a gold token with no attention: in half precision the eps floor rounded to 0 and log(0) made the loss NaN
    attn = torch.tensor([0.0, 0.5, 0.5, 0.0]).view(1, 1, 1, 4).expand(1, 2, 4, 4)
    gold = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    loss = attention_supervision_loss((attn.to(dtype),), gold, objective=objective)
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert loss.item() == pytest.approx(attention_supervision_loss((attn,), gold, objective=objective).item(), rel=1e-3)
