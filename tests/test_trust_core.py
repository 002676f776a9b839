"""Issue 29, core library: inputs that used to give a silently wrong number or an opaque traceback now give the
right answer or a package error naming the argument, the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from conftest import padded_batch, tiny_model

from bcos_plugins.data import corrupt_ioi, make_ioi_prompts
from bcos_plugins.errors import BcosTypeError, BcosValueError
from bcos_plugins.guided import attention_supervision_loss, attention_token_scores, guide_attention

# ---------------------------------------------------------------- IOI prompts: IO and S are two different names


def test_ioi_names_with_a_repeat_are_refused_before_a_prompt_has_io_equal_to_s():
    # before: rng.sample drew ('Tom', 'Tom') for some prompts: target == foil, logit difference always 0
    with pytest.raises(BcosValueError, match=r"^names: repeats \['Tom'\].*Pass each name once"):
        make_ioi_prompts(6, names=["Tom", "Tom", "Amy"])
    with pytest.raises(BcosTypeError, match="^names: every name must be a non-empty str"):
        make_ioi_prompts(2, names=["Tom", ""])
    prompts = make_ioi_prompts(40, names=["Tom", "Amy", "Ben"])
    assert all(p.io != p.s and p.target_id != p.foil_id for p in prompts)


def test_ioi_template_with_a_literal_name_is_refused():
    # before: "Then, Amy and Tom met Tom. Tom waved to" had the S three times, and with IO = Tom the evidence
    # marked one of the IO's two mentions
    template = "Then, {A} and {B} met Tom. {S} waved to"
    with pytest.raises(BcosValueError, match=r"^templates: .*contains the name\(s\) \['Tom'\]"):
        make_ioi_prompts(4, names=["Tom", "Amy"], templates=[template])
    # the same template with names that do not occur in it is an IOI template
    prompts = make_ioi_prompts(4, names=["Ben", "Amy"], templates=[template])
    for p in prompts:
        assert [p.input_ids.count(p.target_id), p.input_ids.count(p.foil_id)] == [1, 2]
        assert p.input_ids[p.evidence_positions[0]] == p.target_id


def test_ioi_every_generated_prompt_mentions_io_once_and_s_twice():
    # names that are also the shipped objects / places (lower case) would repeat through {OBJECT} / {PLACE}
    with pytest.raises(BcosValueError, match=r"^templates: .*\['ball'\]"):
        make_ioi_prompts(4, names=["ball", "Amy", "Tom"], templates=["Then, {A} and {B} got a {OBJECT}. {S} gave "
                                                                     "it to"])
    for p in make_ioi_prompts(60, split="heldout", seed=3) + make_ioi_prompts(60, seed=5):
        ids = list(p.input_ids)
        assert [i for i, t in enumerate(ids) if t == p.target_id] == list(p.evidence_positions)
        assert [i for i, t in enumerate(ids) if t == p.foil_id] == list(p.s_positions)


def test_ioi_corruption_never_repeats_a_name():
    template = "Then, {A} and {B} met Kim. {S} waved to"
    clean = make_ioi_prompts(6, names=["Ben", "Amy"], templates=[template])
    with pytest.raises(BcosValueError, match="^names: the corrupted text .* mentions one of"):
        corrupt_ioi(clean, names=["Kim", "Joe", "Tim"])
    for p in corrupt_ioi(clean, names=["Lily", "Joe", "Tim", "Max"]):
        assert len({p.input_ids[i] for i in (*p.evidence_positions, *p.s_positions)}) == 3


# ---------------------------------------------------------------- attention supervision: softmax weights only


def _softmax_attentions(n_layers: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, 4, 4, generator=g).softmax(-1) for _ in range(n_layers))


def test_supervision_refuses_nan_attention_instead_of_a_nan_loss():
    attentions = _softmax_attentions()
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    assert torch.isfinite(attention_supervision_loss(attentions, gold))
    broken = (attentions[0], attentions[1].clone())
    broken[1][1, 0, 0, 2] = float("nan")
    # before: the loss was NaN and the next optimiser step wrote NaN into every weight
    with pytest.raises(BcosValueError, match=r"^attentions: layer 1 holds NaN or inf in batch row \[1\]"):
        attention_supervision_loss(broken, gold)
    with pytest.raises(BcosValueError, match="^attentions: layer 1 holds NaN"):
        attention_token_scores(broken, layers=-1)


def test_supervision_refuses_scores_before_the_softmax():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 2, 4, 4, generator=g)
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    with pytest.raises(BcosValueError, match="^attentions: layer 0 has negative values .* before the softmax"):
        attention_supervision_loss((scores,), gold)
    # non-negative, but rows summing to 4 (e.g. exp of the scores without normalisation)
    with pytest.raises(BcosValueError, match=r"^attentions: layer 0's rows sum to .* on average, not 1"):
        attention_supervision_loss((scores.exp(),), gold)


def test_supervision_accepts_training_attention_after_dropout():
    # rows of a training forward are dropped out (sum 1 in expectation only): not a reason to refuse
    model = tiny_model("BertForSequenceClassification")
    model.set_attn_implementation("eager")
    ids, mask = padded_batch()
    out = model.train()(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert not torch.allclose(out.attentions[-1].sum(-1), torch.ones(()))  # dropout is on
    gold = torch.zeros(ids.shape)
    gold[:, 2] = 1.0
    assert torch.isfinite(attention_supervision_loss(out.attentions, gold, mask, layers=[-2, -1]))


def test_supervision_refuses_a_layer_listed_twice():
    attentions = _softmax_attentions()
    gold = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    # before: [0, 1, -1] on two layers averaged layer 1 twice
    with pytest.raises(BcosValueError, match=r"^layers: repeats a layer: \[0, 1, -1\] is \[0, 1, 1\] on 2 layers"):
        attention_supervision_loss(attentions, gold, layers=[0, 1, -1])
    with pytest.raises(BcosValueError, match="^layers: repeats a layer"):
        attention_token_scores(attentions, layers=[-2, 0])
    assert torch.allclose(attention_token_scores(attentions, layers=[0, -1]),
                          attention_token_scores(attentions, layers=[0, 1]))


def test_guided_training_refuses_labels_outside_the_classes():
    model = tiny_model("BertForSequenceClassification")  # 3 labels
    model.set_attn_implementation("eager")
    guide_attention(model, last_layers=1)
    ids, mask = padded_batch()
    gold = torch.zeros(ids.shape)
    gold[:, 1] = 1.0
    model.train()
    # before: torch's "IndexError: Target 3 is out of bounds" from inside the loss
    with pytest.raises(BcosValueError, match=r"^labels: must be class ids in \[0, 3\) \(or -100 to skip\), got \[3\] "
                                             r"in row \[1\].*config.num_labels = 3"):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 3, 1]), rationale_mask=gold)
    with pytest.raises(BcosValueError, match=r"^labels: .*got \[-1\]"):
        model(input_ids=ids, attention_mask=mask, labels=torch.tensor([-1, 0, 1]), rationale_mask=gold)
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([2, -100, 1]), rationale_mask=gold)
    assert torch.isfinite(out.loss)


# ---------------------------------------------------------------- Space Model over a base encoder only


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForMaskedLM",
                                  "RobertaForSequenceClassification"])
def test_space_model_refuses_a_task_model_as_encoder_naming_its_base_model(name):
    from bcos_plugins.space import SpaceModelForSequenceClassification

    task_model = tiny_model(name)
    prefix = task_model.base_model_prefix
    # before: accepted, then "'SequenceClassifierOutput' object has no attribute 'last_hidden_state'" at forward
    with pytest.raises(BcosTypeError, match=rf"^encoder: {name} is a task model .* Pass its base model, "
                                            rf"encoder\.{prefix} \(encoder\.base_model\)"):
        SpaceModelForSequenceClassification.from_encoder(task_model, num_labels=2, n_latent=4)
    model = SpaceModelForSequenceClassification.from_encoder(task_model.base_model, num_labels=2, n_latent=4)
    ids, mask = padded_batch(pad_id=1 if name.startswith("Roberta") else 0)
    assert model(input_ids=ids, attention_mask=mask).logits.shape == (3, 2)


# ---------------------------------------------------------------- perplexity: causal LMs only


def test_perplexity_refuses_a_masked_lm_whose_outputs_are_not_next_token_predictions():
    from bcos_plugins.metrics.decoder import perplexity

    texts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    # before: BertForMaskedLM got a perplexity (3.05e4 on real text) from outputs that see the next token
    with pytest.raises(BcosTypeError, match="^model: BertForMaskedLM is a masked LM: its prediction at a position "
                                            "changes when a later token changes.*Pass a causal LM"):
        perplexity(tiny_model("BertForMaskedLM"), texts)
    # the same weights with a causal mask (BertLMHeadModel, is_decoder=True) are a causal LM
    import transformers as T
    from conftest import tiny_config

    config = tiny_config("bert")
    config.is_decoder = True
    decoder = T.BertLMHeadModel(config).eval()
    assert perplexity(decoder, texts).n_tokens == 7
    not_causal = T.BertLMHeadModel(tiny_config("bert")).eval()  # is_decoder False: attends both ways
    with pytest.raises(BcosTypeError, match="^model: BertLMHeadModel is a model without a causal mask"):
        perplexity(not_causal, texts)
    assert perplexity(tiny_model("GPT2LMHeadModel"), texts, bos_token_id=0).n_tokens == 9


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification"])
def test_perplexity_refuses_a_classifier(name):
    from bcos_plugins.metrics.decoder import perplexity

    # before: an opaque index error from gather on (batch, classes) logits
    with pytest.raises(BcosTypeError, match=rf"^model: {name} returns \(1, 3\) for one window of 4 tokens, not "
                                            r"next-token logits \(1, 4, vocab\)"):
        perplexity(tiny_model(name), [[5, 6, 7, 8]])


def test_perplexity_refuses_a_bos_token_outside_the_vocabulary():
    from bcos_plugins.metrics.decoder import perplexity

    model = tiny_model("GPT2LMHeadModel")  # 60 ids
    # before: "IndexError: index out of range in self" from the embedding
    with pytest.raises(BcosValueError, match=r"^bos_token_id: must be in \[0, 59\], got 50256"):
        perplexity(model, [[5, 6, 7]], bos_token_id=50256)
    assert perplexity(model, [[5, 6, 7]], bos_token_id=59).n_tokens == 3
