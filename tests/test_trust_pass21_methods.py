"""Trust pass 21, methods (helper-116): bilinear analyses, the Space head and rationale-guided attention.

Each test pins one fix: before it, the case gave a silently wrong answer or an unhelpful crash.
"""

import pytest
import torch
import transformers as T
from test_space import _WordTokenizer
from torch import nn

from bcos_plugins.bilinear import bilinear_tensor, bilinear_weights, hosvd, top_eigen_indices
from bcos_plugins.bilinear.swish_beta import SwishBeta, finalize_bilinear, set_swish_beta
from bcos_plugins.errors import BcosTypeError, BcosValueError


class _GatedMLP(nn.Module):
    """A transformers-layout gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, act_fn: nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate_proj, self.up_proj = nn.Linear(4, 6, bias=False), nn.Linear(4, 6, bias=False)
        self.down_proj, self.act_fn = nn.Linear(6, 4, bias=False), act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_bilinear_weights_refuse_a_clamp_that_is_the_identity_only_near_zero():
    # Hardtanh(-3, 3) equalled the identity on the old probe, linspace(-3, 3): read as bilinear, its weights' output
    # was 84 off the layer's at inputs of size 10
    with pytest.raises(BcosValueError, match="^source: this gated MLP .* is not bilinear"):
        bilinear_weights(_GatedMLP(nn.Hardtanh(-3.0, 3.0)))
    identity = _GatedMLP(nn.Identity())
    x = 10 * torch.randn(5, 4)
    torch.testing.assert_close(bilinear_weights(identity).forward(x), identity(x))


@pytest.mark.parametrize("shapes", [((3, 2), (3, 2), (0, 3)), ((0, 2), (0, 2), (2, 0)), ((3, 0), (3, 0), (2, 3))])
def test_bilinear_weights_with_an_empty_dimension_are_refused_naming_the_sizes(shapes):
    # hosvd of a layer with no output failed on an IndexError (sigma[0] of nothing)
    W, V, P = (torch.randn(s) for s in shapes)
    with pytest.raises(BcosValueError, match=r"^source: the bilinear weights have an empty dimension \(d_hidden="):
        hosvd((W, V, P))


def test_bilinear_tensor_and_top_eigen_indices_refuse_arguments_of_the_wrong_type_by_name():
    torch.manual_seed(0)
    weights = (torch.randn(3, 2), torch.randn(3, 2), torch.randn(2, 3))
    raw = bilinear_tensor(weights, symmetric=False)
    assert not torch.allclose(raw, raw.mT)
    # symmetric="no" is a truthy string: the symmetric tensor came back
    with pytest.raises(BcosTypeError, match=r"^symmetric: must be True or False, got str 'no'\. Pass symmetric=True for the "
                                            r"symmetrised tensor, symmetric=False for the tensor as the weights give it\.$"):
        bilinear_tensor(weights, symmetric="no")
    # by=["positive"] failed on "unhashable type: 'list'"
    with pytest.raises(BcosValueError, match=r"^by: must be one of \('magnitude', 'positive', 'negative'\)"):
        top_eigen_indices(torch.randn(4), 2, by=["positive"])


def _tiny_llama(layers: int = 2):
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=50, hidden_size=8, intermediate_size=16,
                                            num_hidden_layers=layers, num_attention_heads=2))


def test_finalize_bilinear_refuses_a_model_without_gated_mlps_and_leaves_its_config():
    # it set a BERT's config.hidden_act to "linear" without a word: saved and reloaded, the model had no activation
    bert = T.BertModel(T.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=16))
    with pytest.raises(BcosValueError, match="^model: BertModel has no gated MLP"):
        finalize_bilinear(bert)
    assert bert.config.hidden_act == "gelu"


def test_finalize_bilinear_changes_nothing_when_a_later_mlp_is_not_annealed():
    # the first MLP's down_proj was halved and its gate replaced before the second one was refused
    llama = _tiny_llama()
    set_swish_beta(llama, 0.0)
    llama.model.layers[1].mlp.act_fn.beta = 0.5
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    # the config records the annealing gates (set_swish_beta, helper-203): the refusal leaves it as it was too
    config_before = llama.config.to_dict()
    with pytest.raises(ValueError, match="not a SwishBeta annealed to beta=0"):
        finalize_bilinear(llama)
    assert all(torch.equal(before[k], v) for k, v in llama.state_dict().items())
    assert all(isinstance(layer.mlp.act_fn, SwishBeta) for layer in llama.model.layers)
    assert llama.config.to_dict() == config_before and config_before["swish_beta"]["activations"] == {
        "hidden_act": "silu"}


def _space_model(num_labels: int = 2):
    from conftest import tiny_config

    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(0)
    encoder = T.AutoModel.from_config(tiny_config("bert")).eval()
    return SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=num_labels, n_latent=4).eval()


def test_zero_shot_evaluation_refuses_a_label_map_whose_keys_or_values_are_not_class_ids():
    from bcos_plugins.space import predict_labels, zero_shot_evaluation

    model, tokenizer = _space_model(), _WordTokenizer()
    texts = ["a bb ccc", "dddd e", "ff gg hhh iiii", "j", "kk ll mm nn oo"]
    predicted = predict_labels(model, tokenizer, texts)
    assert zero_shot_evaluation(model, tokenizer, texts, predicted, label_map={0: 0, 1: 1})["accuracy"] == 1.0
    # a map read from JSON has string keys: no prediction matched, and accuracy 0.0 came back without a word
    with pytest.raises(BcosTypeError, match=r"^label_map: maps '0' to 0, but its keys .* must be int class ids"):
        zero_shot_evaluation(model, tokenizer, texts, predicted, label_map={"0": 0, "1": 1})
    # tensor keys are hashed by identity: the same silent 0.0
    with pytest.raises(BcosTypeError, match=r"^label_map: maps tensor\(0\) to 0"):
        zero_shot_evaluation(model, tokenizer, texts, predicted, label_map={torch.tensor(0): 0, torch.tensor(1): 1})
    # string values failed inside sorted(): "'<' not supported between instances of 'str' and 'int'"
    with pytest.raises(BcosTypeError, match="^label_map: maps 0 to 'neg'"):
        zero_shot_evaluation(model, tokenizer, texts, predicted, label_map={0: "neg", 1: "pos"})


def test_context_attribution_of_nan_head_weights_names_the_nan_not_a_hook():
    from bcos_plugins.errors import BcosRuntimeError
    from bcos_plugins.space import context_attribution

    model = _space_model(num_labels=3)
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.head.classifier.weight[0, 0] = float("nan")
    # it blamed "a hook or an adapter on head.classifier, or a replaced head"
    with pytest.raises(BcosRuntimeError, match=r"^context_attribution: the logits or token shares of rows \[0, 1\] "
                                               r"are NaN or inf") as refused:
        context_attribution(model, ids, target=0)
    assert "hook" not in str(refused.value)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from bcos_plugins.pretrained import minilm_path

    return T.AutoTokenizer.from_pretrained(minilm_path())


PREMISES = ["A man plays a guitar on stage.", "Two dogs run."]
HYPOTHESES = ["A person makes music.", "Animals move."]


def test_gold_mask_from_spans_refuses_reversed_or_malformed_spans_naming_the_row(minilm_tokenizer):
    from bcos_plugins.guided import gold_mask_from_spans

    encoding = minilm_tokenizer(PREMISES, HYPOTHESES, padding=True, return_offsets_mapping=True)
    good = gold_mask_from_spans(encoding, [[(6, 20)], [(4, 8)]])
    assert good.sum(1).tolist() == [3.0, 1.0]
    # a reversed span overlapped no token: row 0's mask came back empty ("no rationale") without a word
    with pytest.raises(BcosValueError, match=r"^spans: row 0 holds the span \(20, 6\), which is reversed"):
        gold_mask_from_spans(encoding, [[(20, 6)], [(4, 8)]])
    # one pair per row instead of a list of pairs failed on "cannot unpack non-iterable int object"
    with pytest.raises(BcosTypeError, match=r"^spans: row 0 holds 6, not a \(start, end\) pair"):
        gold_mask_from_spans(encoding, [(6, 20), (4, 8)])


def test_gold_mask_from_spans_names_a_segment_the_encoding_does_not_have(minilm_tokenizer):
    from bcos_plugins.guided import gold_mask_from_spans

    single = minilm_tokenizer(PREMISES, padding=True, return_offsets_mapping=True)
    # both were refused as rationales "cut off by truncation" of an encoding that truncated nothing
    with pytest.raises(BcosValueError, match=r"^segment: is 1, but row 0 of the encoding has no text of segment 1"):
        gold_mask_from_spans(single, [[(6, 20)], [(4, 8)]], segment=1)
    with pytest.raises(BcosValueError, match=r"^segment: must be in \[0, 1\], got 2"):
        gold_mask_from_spans(single, [[(6, 20)], [(4, 8)]], segment=2)


def test_gold_mask_from_words_refuses_a_threshold_or_highlight_outside_0_1(minilm_tokenizer):
    from bcos_plugins.guided import gold_mask_from_words, hatexplain_word_rationale

    words = [["I", "hate", "this", "thing"], ["ok", "fine"]]
    encoding = minilm_tokenizer(words, is_split_into_words=True, padding=True)
    highlights = [[0, 1, 0, 0.6], [0, 0]]
    assert gold_mask_from_words(encoding, highlights).sum(1).tolist() == [2.0, 0.0]
    # threshold 0 made every word a rationale (the 0s too): an all-text mask without a word
    with pytest.raises(BcosValueError, match=r"^threshold: must be > 0.0 and <= 1.0, got 0.0"):
        gold_mask_from_words(encoding, highlights, threshold=0)
    # inf passed the NaN check and counted as a highlight
    with pytest.raises(BcosValueError, match=r"^word_rationales: row 0: word 1 has the rationale inf, outside \[0, 1\]"):
        gold_mask_from_words(encoding, [[0, float("inf"), 0, 0], [0, 0]])
    # a record without post_tokens failed on KeyError: 'post_tokens'
    with pytest.raises(BcosValueError, match="^record: post p7 has no post_tokens list"):
        hatexplain_word_rationale({"post_id": "p7", "rationales": [[0, 1]]})


def test_eigendecompose_of_a_layer_whose_interaction_matrix_overflows_is_refused_naming_the_scale():
    from bcos_plugins.bilinear import eigendecompose, interaction_spectra

    torch.manual_seed(0)
    W, V, P = torch.randn(7, 5), torch.randn(7, 5), torch.randn(3, 7)
    u = torch.tensor([1.0, 0.0, 0.0])
    # Q(u) of float32 weights at 1e15 is past float32's range: torch.linalg.eigh failed to converge on the infs
    with pytest.raises(BcosValueError, match=r"^source: the interaction matrices overflow torch.float32 \(the weights "
                                             r"reach \d.\d+e\+15.*Analyse the layer in float64"):
        eigendecompose((W * 1e15, V * 1e15, P * 1e15), u)
    with pytest.raises(BcosValueError, match="^source: the interaction matrices overflow torch.float64"):
        interaction_spectra(tuple(t.double() * 1e120 for t in (W, V, P)), u[None].double())
    # in float64 the same layer decomposes, its eigenvalues the float32 layer's scaled by 1e45
    big = eigendecompose(tuple(t.double() * 1e15 for t in (W, V, P)), u.double()).eigenvalues
    torch.testing.assert_close(big / 1e45, eigendecompose((W.double(), V.double(), P.double()), u.double()).eigenvalues)


def test_bilinear_weights_forward_and_augment_input_name_inputs_of_the_wrong_width_or_type():
    from bcos_plugins.bilinear import BilinearWeights, augment_input

    torch.manual_seed(0)
    weights = BilinearWeights(torch.randn(7, 5), torch.randn(7, 5), torch.randn(3, 7), w_bias=torch.randn(7))
    x = torch.randn(2, 5)
    torch.testing.assert_close(weights.augmented().forward(augment_input(x)), weights.forward(x))
    # torch said only "mat1 and mat2 shapes cannot be multiplied (2x4 and 5x7)"
    with pytest.raises(BcosValueError, match=r"^x: has shape \(2, 4\), the layer reads vectors of width d_in=5"):
        weights.forward(torch.randn(2, 4))
    # a list failed on "'list' object has no attribute 'new_ones'"
    torch.testing.assert_close(augment_input([[1.0, 2.0]]), torch.tensor([[1.0, 2.0, 1.0]]))


@pytest.mark.filterwarnings("ignore:attention_supervision_loss. the attentions carry no gradient:UserWarning")  # by hand, on plain tensors
def test_attention_supervision_loss_refuses_an_eps_floor_at_or_above_1():
    from bcos_plugins.guided import attention_supervision_loss

    torch.manual_seed(0)
    attention = torch.softmax(torch.randn(2, 2, 5, 5), -1)
    gold = torch.tensor([[0.0, 1, 1, 0, 0], [0, 0, 1, 0, 0]])
    assert attention_supervision_loss([attention], gold, eps=0.5) > 0
    # eps=10 floored every probability (all <= 1) to 10: the loss was 0.0 for any attention, so nothing was supervised
    with pytest.raises(BcosValueError, match=r"^eps: must be below 1 \(it floors the probabilities before their log\)"):
        attention_supervision_loss([attention], gold, eps=10.0)


def test_read_sst2_tsv_reads_a_byte_order_mark_and_names_a_malformed_line(tmp_path):
    from bcos_plugins.space import read_sst2_tsv

    marked = tmp_path / "marked.tsv"
    marked.write_text("\ufeffsentence\tlabel\ngood film\t1\n", encoding="utf-8")
    # the mark made the header "\ufeffsentence", refused as a file without a sentence column
    assert read_sst2_tsv(marked) == (["good film"], [1])
    short = tmp_path / "short.tsv"
    short.write_text("sentence\tlabel\ngood film\t1\nbad\n", encoding="utf-8")
    # "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'"
    with pytest.raises(BcosValueError, match=r"^path: .*short.tsv line 3: expected a sentence and an integer label"):
        read_sst2_tsv(short)
    worded = tmp_path / "worded.tsv"
    worded.write_text("sentence\tlabel\ngood film\tpositive\n", encoding="utf-8")
    with pytest.raises(BcosValueError, match=r"^path: .*worded.tsv line 2: .*label='positive'"):
        read_sst2_tsv(worded)


def test_read_rt_polarity_reads_cornells_latin_1_files(tmp_path):
    from bcos_plugins.space import read_rt_polarity

    # rt-polaritydata v1.0 is Latin-1: the UTF-8 read failed with a UnicodeDecodeError
    (tmp_path / "rt-polarity.neg").write_bytes("a caf\xe9 of a film\n".encode("latin-1"))
    (tmp_path / "rt-polarity.pos").write_text("na\u00efve and good\n", encoding="utf-8")
    assert read_rt_polarity(tmp_path) == (["a caf\u00e9 of a film", "na\u00efve and good"], [0, 1])


def test_a_plateau_gate_fed_a_second_run_is_refused_instead_of_starting_it_at_the_first_runs_start():
    from bcos_plugins.guided import PlateauGate

    gate = PlateauGate(0.6)
    losses = [0.7, 0.69, 0.5, 0.4, 0.3, 0.3]
    assert [gate.factor(step, 6, 0.0, loss) for step, loss in enumerate(losses)][-1] == 1.0
    assert gate.update(5, 0.3) == gate.start  # micro-batches of one step share it
    # a second run on the same gate started supervising at step 4, the first run's start, while still on its plateau
    with pytest.raises(BcosValueError, match=r"^step: is 0, after step 5: this PlateauGate already tracked a run"):
        gate.factor(0, 6, 0.0, 0.7)


def test_concept_contributions_of_a_model_without_a_space_head_is_refused_by_name():
    from bcos_plugins.space import concept_contributions

    model = _space_model()
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    concepts = model(ids).concepts
    shares = concept_contributions(model, concepts, None)
    torch.testing.assert_close(shares.sum((1, 3, 4)) + model.head.classifier.bias, model(ids).logits)
    # "'BertModel' object has no attribute 'head'"
    with pytest.raises(BcosTypeError, match="^model: concept_contributions explains a SpaceModelForSequence"):
        concept_contributions(model.encoder, concepts, None)


def test_classification_scores_refuses_nested_labels_instead_of_scoring_them_as_one_multi_label_row():
    from bcos_plugins.space import classification_scores

    assert classification_scores(torch.tensor([0, 1, 1]), [0, 1, 0])["n"] == 3
    # [[0, 1, 1]] was one multi-label row for scikit-learn: n = 1 and a macro F1 over its columns, without a word
    with pytest.raises(BcosTypeError, match=r"^labels: must hold one int class id per example, got list \[0, 1, 1\]"):
        classification_scores([[0, 1, 1]], [[0, 1, 0]])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hosvd_with_rtol_0_leaves_out_singular_values_that_are_rounding_of_zero(dtype):
    torch.manual_seed(0)
    # rank 2 (two hidden units) with six outputs: the other four singular values are 0
    W, V, P = (torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64),
               torch.randn(6, 2, dtype=torch.float64))
    reference = hosvd((W, V, P))
    assert reference.singular_values.numel() == 2
    # rtol=0 kept two or three more "terms" of 1e-7 (rounding of the Gram matrix's zero eigenvalues), their q_i of
    # norm 2.6e-08 or 10.8 instead of 1
    terms = hosvd(tuple(t.to(dtype) for t in (W, V, P)), rtol=0.0)
    torch.testing.assert_close(terms.singular_values.double(), reference.singular_values)
    torch.testing.assert_close(terms.interaction_matrices.flatten(1).norm(dim=1),
                               torch.ones(2, dtype=dtype))


def test_a_space_explanations_logits_are_the_models_logits_with_the_classifier_bias():
    from bcos_plugins.space import context_attribution

    model = _space_model(num_labels=3)
    with torch.no_grad():
        model.head.classifier.bias.copy_(torch.tensor([2.0, -3.0, 0.5]))
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    logits = model(ids).logits
    explanation = context_attribution(model, ids, target=1)
    # .logits, the inherited alias of .explained, read the logit minus the bias: -3.0 off here
    torch.testing.assert_close(explanation.logits, logits[:, 1])
    torch.testing.assert_close(explanation.explained - 3.0, logits[:, 1])
    contrast = context_attribution(model, ids, target=1, foil=0)
    torch.testing.assert_close(contrast.logits, logits[:, 1] - logits[:, 0])


def test_find_span_takes_a_whole_word_in_another_case_before_a_substring():
    from bcos_plugins.guided import find_span

    text = "A woman talks to a Man outside."
    # the exact substring came second, before the whole word in another case: "man" was the "man" of "woman"
    assert find_span(text, "man") == (19, 22)
    assert find_span("scatter", "cat") == (1, 4)  # a substring is still the last resort
    assert find_span("sCATter", "cat") == (1, 4)


def test_a_space_model_reads_its_encoders_output_object_and_names_return_dict_false():
    from conftest import tiny_config

    from bcos_plugins.space import SpaceModelForSequenceClassification, context_attribution

    torch.manual_seed(0)
    config = tiny_config("bert")
    config.return_dict = False  # an encoder saved with return_dict=False returns tuples
    model = SpaceModelForSequenceClassification.from_encoder(T.AutoModel.from_config(config).eval(), num_labels=2,
                                                             n_latent=4).eval()
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    # both failed on "'tuple' object has no attribute 'last_hidden_state'"
    logits = model(ids).logits
    torch.testing.assert_close(context_attribution(model, ids, target=1).logits, logits[:, 1])
    with pytest.raises(BcosValueError, match="^return_dict: got False; the Space model returns a SpaceModelOutput"):
        model(ids, return_dict=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pseudo_inverse_masks_of_half_precision_vectors_are_the_float32_keys(dtype):
    from bcos_plugins.bilinear import pseudo_inverse_masks

    vectors = torch.randn(2, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    # torch's matrix_rank failed: "This function doesn't handle types other than float and double"
    masks = pseudo_inverse_masks(vectors)
    assert masks.dtype == torch.float32
    torch.testing.assert_close(masks @ vectors.float().T, torch.eye(2))
