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


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
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


# ---------------------------------------------------------------- explain: what the model would ignore, and overflow


def _bcos(name: str):
    from bcos_plugins import bcosify

    return bcosify(tiny_model(name), b=2.0, verbose=False)


def test_explain_refuses_a_misspelt_forward_argument_naming_the_close_match():
    from bcos_plugins import explain

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    types = torch.zeros_like(ids)
    # before: token_type_id= went down to the attention functions and was dropped without a word
    with pytest.raises(BcosTypeError, match="^token_type_id: is not an argument of BertForSequenceClassification."
                                            "forward, which would silently ignore it. Pass token_type_ids= if"):
        explain(model, ids, mask, token_type_id=types)
    with pytest.raises(BcosTypeError, match="^atention_mask: .*Pass attention_mask= if"):
        explain(model, ids, atention_mask=mask)
    with pytest.raises(BcosTypeError, match="^zzz: is not an argument .* It reads .*token_type_ids"):
        explain(model, ids, mask, zzz=1)
    # what the forward reads (named, or transformers' own keywords) is passed on
    types[:, 4:] = 1
    with_types = explain(model, ids, mask, token_type_ids=types)
    assert not torch.allclose(with_types.explained, explain(model, ids, mask).explained)
    assert explain(model, ids, mask, output_attentions=True).completeness_error.max() < 1e-4


def test_every_did_you_mean_hint_comes_from_the_one_closest_name_helper():
    # before: check_forward_kwargs had its own copy of _checks.closest_name_fix's difflib lookup, so the two
    # "Pass <name>= if that is what you meant" hints could drift apart
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    users = []
    for folder in ("bcos_plugins", "adapters"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) else []
                if "difflib" in imported:
                    users.append(path.relative_to(root).as_posix())
    assert users == ["bcos_plugins/_checks.py"], "suggest close names with _checks.closest_name_fix: " \
        + ", ".join(users)


def test_explain_refuses_a_gold_mask_for_a_never_guided_model():
    from bcos_plugins import explain, guide_attention
    from bcos_plugins.guided import GoldMaskAtEvaluationError

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    gold = torch.zeros(ids.shape)
    # before: accepted and ignored by a model in eval mode that was never guided
    with pytest.raises(BcosTypeError, match="^rationale_mask: BertForSequenceClassification has no guided layer, "
                                            "so the gold mask would be silently ignored"):
        explain(model, ids, mask, rationale_mask=gold)
    model.set_attn_implementation("eager")
    guide_attention(model, last_layers=1)
    with pytest.raises(GoldMaskAtEvaluationError, match="^rationale_mask: was passed to a model in eval mode"):
        explain(model, ids, mask, rationale_mask=gold)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "RobertaForSequenceClassification",
                                  "GPT2ForSequenceClassification"])
def test_explain_raises_on_an_overflowed_computation_instead_of_returning_noise(name):
    from bcos_plugins import explain
    from bcos_plugins.errors import BcosRuntimeError

    model = _bcos(name)
    ids, mask = padded_batch(pad_id=1 if name.startswith("Roberta") else 0)
    ids[0, 2] = 2  # an id no other row uses (padded_batch draws from 3 on)
    healthy = explain(model, ids, mask)
    assert healthy.completeness_error.max() < 1e-4
    with torch.no_grad():
        model.get_input_embeddings().weight[2] = 1e15  # one embedding row of huge norm
    # before: BERT returned token scores of 1e3-1e4 for a logit of 7e-7 (completeness error 5e9), no error
    with pytest.raises(BcosRuntimeError, match=r"^explain: the contributions of row \[0\] do not sum to the "
                                               r"explained value .*overflowed or cancelled.*model\.double\(\)"):
        explain(model, ids, mask)
    # the rows without the huge token are explained as before
    rows = explain(model, ids[1:], mask[1:])
    assert torch.allclose(rows.contributions, healthy.contributions[1:], atol=1e-6)


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "GPT2ForSequenceClassification"])
def test_explain_refuses_an_output_that_overflowed_to_inf_naming_the_rows(name):
    from bcos_plugins import explain

    model = _bcos(name)
    ids, mask = padded_batch()
    ids[0, 2] = 2  # an id no other row uses
    healthy = explain(model, ids, mask)
    with torch.no_grad():
        model.get_input_embeddings().weight[2] = 1e30  # the embedding row: finite, but overflows inside
    # before: contributions of 1e26 with a completeness error of 7e26, and no error
    with pytest.raises(BcosValueError, match=r"^model: its output is NaN or infinite for row\(s\) \[0\], so there "
                                             r"is nothing finite to explain .*embedding rows of their tokens"):
        explain(model, ids, mask)
    rows = explain(model, ids[1:], mask[1:])
    assert torch.allclose(rows.contributions, healthy.contributions[1:], atol=1e-6)


def test_explain_completeness_check_has_no_false_alarm_on_explained_values_near_zero():
    from bcos_plugins import explain

    # every next-token target of a B-cos Llama: some logits are near 0, where float rounding is a large share
    # of the value (relative completeness error up to 6e-4 here) though every score is exact to rounding
    model = _bcos("LlamaForCausalLM")
    ids, mask = padded_batch(batch=4, length=12)
    errors = torch.cat([explain(model, ids, mask, target=t).completeness_error for t in range(60)])
    assert errors.max() < 1e-2
    contrastive = explain(model, ids, mask, target=5, foil=5)  # explained value exactly 0
    assert (contrastive.explained == 0).all() and (contrastive.contributions == 0).all()


# ---------------------------------------------------------------- token ids of any integer width


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_narrow_integer_token_ids_are_converted_exactly(dtype):
    from bcos_plugins import explain
    from bcos_plugins.metrics.decoder import next_token_contrast

    model = _bcos("BertForSequenceClassification")
    ids, mask = padded_batch()
    # before: uint8 / int8 / int16 ids failed inside the embedding ("Expected tensor for argument #1
    # 'indices' to have one of the following scalar types: Long, Int")
    narrow = explain(model, ids.to(dtype), mask.to(dtype))
    wide = explain(model, ids, mask)
    assert narrow.input_ids.dtype == torch.long
    assert torch.equal(narrow.contributions, wide.contributions)
    lm = tiny_model("GPT2LMHeadModel")
    target, foil = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    a = next_token_contrast(lm, ids.to(dtype), mask, target=target, foil=foil)
    b = next_token_contrast(lm, ids, mask, target=target, foil=foil)
    assert torch.equal(a.logit_difference, b.logit_difference)


# ---------------------------------------------------------------- explain_dataset with another model's tokenizer


@pytest.fixture(scope="module")
def bert_tokenizer():
    import transformers as T

    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


def test_explain_dataset_refuses_a_tokenizer_that_is_not_the_models(bert_tokenizer):
    import datasets
    import transformers as T

    from bcos_plugins import bcosify
    from bcos_plugins.corpus import explain_dataset

    pairs = datasets.Dataset.from_dict({"premise": ["a man sleeps", "two dogs run"],
                                        "hypothesis": ["nobody sleeps", "animals move"]})
    torch.manual_seed(0)
    roberta = bcosify(T.RobertaForSequenceClassification(T.RobertaConfig(
        vocab_size=bert_tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=66, num_labels=2, pad_token_id=1,
        type_vocab_size=1)).eval(), verbose=False)  # as roberta-base: no segment embedding to speak of
    # before: "IndexError: index out of range in self" from RoBERTa's one-row token type embedding
    with pytest.raises(BcosValueError, match=r"^tokenizer: BertTokenizer\w*\('.*'\) gives token type ids up to 1 "
                                             r".*but RobertaForSequenceClassification.* has type_vocab_size 1: the "
                                             "tokenizer is not the model's. Pass the tokenizer saved with the model"):
        explain_dataset(roberta, bert_tokenizer, pairs, text_column="premise", text_pair_column="hypothesis",
                        progress=False)
    small = tiny_model("BertForSequenceClassification")  # 60 ids
    with pytest.raises(BcosValueError, match=r"^tokenizer: BertTokenizer\w*\('.*'\) gives token ids up to \d+, "
                                             r"but BertForSequenceClassification.* has 60 embedding rows"):
        explain_dataset(small, bert_tokenizer, ["a gorgeous film"], progress=False)
    # a BERT tokenizer on DistilBERT (same vocabulary): the token type ids DistilBERT has no use for are left out
    distil = tiny_model("DistilBertForSequenceClassification")
    distil.resize_token_embeddings(bert_tokenizer.vocab_size)
    out = explain_dataset(distil, bert_tokenizer, pairs, text_column="premise", text_pair_column="hypothesis",
                          progress=False)
    assert len(out) == 2


def test_space_model_refuses_a_misspelt_forward_argument():
    from bcos_plugins.space import SpaceModelForSequenceClassification

    model = SpaceModelForSequenceClassification.from_encoder(tiny_model("BertModel"), num_labels=2, n_latent=4)
    ids, mask = padded_batch()
    # before: token_type_id= went through the Space forward's **kwargs into the encoder, which dropped it
    with pytest.raises(BcosTypeError, match="^token_type_id: is not an argument of BertModel.forward.*"
                                            "Pass token_type_ids= if"):
        model(input_ids=ids, attention_mask=mask, token_type_id=torch.zeros_like(ids))
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert out.logits.shape == (3, 2) and len(out.hidden_states) == model.encoder.config.num_hidden_layers + 1
    # an sdpa encoder returns no attention weights: asking for them is refused by name (2336ff1), not an empty tuple
    with pytest.raises(BcosValueError, match="^output_attentions: .* attn_implementation='eager'"):
        model(input_ids=ids, attention_mask=mask, output_attentions=True)


def test_space_model_from_encoder_refuses_a_misspelt_setting_naming_the_close_match():
    from bcos_plugins.space import SpaceModelForSequenceClassification

    # before: n_latant=4 was kept as an unused config attribute and the head was built with n_latent = 128
    with pytest.raises(BcosTypeError, match="^n_latant: is not a setting of SpaceModelConfig, which would keep it "
                                            "as an unused attribute .* Pass n_latent= if that is what you meant"):
        SpaceModelForSequenceClassification.from_encoder(tiny_model("BertModel"), num_labels=2, n_latant=4)
    with pytest.raises(BcosTypeError, match="^zzz: .*own settings are n_latent, train_encoder"):
        SpaceModelForSequenceClassification.from_encoder(tiny_model("BertModel"), num_labels=2, zzz=1)
    # the Space Model's settings and transformers' common configuration keywords are taken
    model = SpaceModelForSequenceClassification.from_encoder(
        tiny_model("BertModel"), num_labels=2, n_latent=4, train_encoder=True, intra_space_eps=0.1,
        output_attentions=True, attn_implementation="eager", id2label={0: "no", 1: "yes"})
    assert model.config.n_latent == 4 and model.head.projections.shape[-1] == 4
    assert model.config.output_attentions and model.config.id2label[1] == "yes"
