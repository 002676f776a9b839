"""Trust pass 24, conversion, persistence and the registry families on their unusual but real configurations (Gemma 2
without soft-caps, with every layer windowed or bidirectional, ``query_pre_attn_scalar`` unlike ``head_dim``; Mistral
with no window and a window of 1; Qwen2 / Qwen3 with ``use_sliding_window`` and ``max_window_layers``; rope scaling;
ModernBERT with every layer global or local, mean / cls pooling and other head activations), each checked through
``explain`` (complete, the model's own output, a padded row explained as alone, tokens out of the windows' reach with
no share, eager and sdpa attention alike) and a sharded save reloaded bit for bit.

Silently wrong before:

- ``load_bcos_model(folder, variant="fp16")`` loaded the weights of ``model.fp16.safetensors`` and each B-cos layer's
  B from ``model.safetensors``: a folder holding two saves (``save_pretrained(folder)`` and
  ``save_pretrained(folder, variant="fp16")``) gave a model that was neither (logits 0.28 off), without a word.

Unhelpful before: a folder with the variant alone was refused as having "no model.safetensors"; a keyword value
transformers refuses (``dtype=torch.int8``, ``device_map="bogus"``, ``attn_implementation="sdpa"`` for a class without
it) was reported as ``path: transformers could not load ...``, naming the one argument that was right and saying to
re-save the model; ``attn_implementation=3`` failed with ``'int' object has no attribute 'startswith'``.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T
from conftest import MAX_POS, VOCAB, padded_rows
from torch import nn

from bcos_plugins import bcosify, explain, load_bcos_model
from bcos_plugins.convert.architectures import SPECS, stock_class
from bcos_plugins.errors import BcosFileError, BcosKeywordError
from bcos_plugins.nn.linear import AlignmentPressure

warnings.filterwarnings("ignore", category=DeprecationWarning)

B = 1.25


def _rotary(config_class, **fields):
    return config_class(**{**dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=MAX_POS,
                                  num_labels=3, pad_token_id=0, bos_token_id=2, eos_token_id=2), **fields})


def _modernbert(**fields):
    return T.ModernBertConfig(**{**dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=MAX_POS, local_attention=4,
                                        global_attn_every_n_layers=2, num_labels=3, pad_token_id=0, bos_token_id=2,
                                        eos_token_id=2, cls_token_id=2, sep_token_id=2, classifier_pooling="mean"),
                                 **fields})


def _build(name: str, config, seed: int = 0):
    """The stock model ``name`` built from ``config`` itself (fields a config derives at construction, such as
    ``layer_types`` from ``max_window_layers`` or ``global_attn_every_n_layers``, are not set after it), random
    non-zero biases and norm gains off their initial value (Gemma's ``1 + weight`` starts at ``weight = 0``, where a
    gain read as ``weight`` or ``1 + c * weight`` computes the same), in eval mode."""
    torch.manual_seed(seed)
    model = stock_class(name)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias"):
                param.normal_(0, 0.2)
            elif param.ndim == 1:  # a norm's gain
                param.add_(torch.randn_like(param), alpha=0.2)
    return model


# (class, config, reach): reach = how many tokens back (and, for an encoder or a bidirectional decoder, ahead) the
# explained position's output can see through the two layers' windows; None: every token (a global layer)
UNUSUAL = {
    "gemma2-no-soft-caps": ("Gemma2ForCausalLM", lambda: _rotary(
        T.Gemma2Config, head_dim=8, sliding_window=4, final_logit_softcapping=None, attn_logit_softcapping=None,
        query_pre_attn_scalar=8), None),
    "gemma2-all-windowed-scalar-3": ("Gemma2ForCausalLM", lambda: _rotary(
        T.Gemma2Config, head_dim=8, sliding_window=3, final_logit_softcapping=0.5, attn_logit_softcapping=0.5,
        query_pre_attn_scalar=3, layer_types=["sliding_attention"] * 2), 4),
    "gemma2-bidirectional-classifier": ("Gemma2ForSequenceClassification", lambda: _rotary(
        T.Gemma2Config, head_dim=8, sliding_window=3, query_pre_attn_scalar=100, use_bidirectional_attention=True,
        layer_types=["sliding_attention"] * 2), None),
    "mistral-no-window": ("MistralForCausalLM", lambda: _rotary(T.MistralConfig, sliding_window=None), None),
    "mistral-window-1": ("MistralForSequenceClassification", lambda: _rotary(T.MistralConfig, sliding_window=1), 0),
    "qwen2-max-window-layers-0": ("Qwen2ForSequenceClassification", lambda: _rotary(
        T.Qwen2Config, use_sliding_window=True, sliding_window=2, max_window_layers=0), 2),
    "qwen3-bias-window-from-layer-1": ("Qwen3ForCausalLM", lambda: _rotary(
        T.Qwen3Config, head_dim=8, attention_bias=True, use_sliding_window=True, sliding_window=2,
        max_window_layers=1), None),
    "llama-linear-rope": ("LlamaForCausalLM", lambda: _rotary(
        T.LlamaConfig, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}), None),
    "mistral-yarn-rope": ("MistralForCausalLM", lambda: _rotary(
        T.MistralConfig, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                          "original_max_position_embeddings": 8}), None),
    # global_attn_every_n_layers makes layer 0 global whatever its value: every layer local needs layer_types
    "modernbert-local-2-silu-head": ("ModernBertForSequenceClassification", lambda: _modernbert(
        global_attn_every_n_layers=100, local_attention=2, classifier_activation="silu"), None),
    "modernbert-all-local-base": ("ModernBertModel", lambda: _modernbert(layer_types=["sliding_attention"] * 2), 4),
    "modernbert-all-global-cls": ("ModernBertForSequenceClassification", lambda: _modernbert(
        global_attn_every_n_layers=1, classifier_pooling="cls", classifier_activation="gelu_new"), None),
}
# the attention kind of each layer the ModernBERT cases claim (layer 0 is global whatever global_attn_every_n_layers
# says; layer_types, derived when the config is built, is what the layers read)
MODERNBERT_LAYOUTS = {"modernbert-local-2-silu-head": ["full_attention", "sliding_attention"],
                      "modernbert-all-local-base": ["sliding_attention"] * 2,
                      "modernbert-all-global-cls": ["full_attention"] * 2}


def _asked(spec) -> dict:
    return {"target": 1} if spec.is_classifier else {"target": 7, "position": -1}


def _outputs(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.mark.parametrize("case", sorted(UNUSUAL))
def test_an_unusual_family_configuration_explains_exactly_alike_under_eager_and_sdpa_and_reloads_sharded(
        tmp_path, case):
    name, make, reach = UNUSUAL[case]
    spec = SPECS[name]
    config = make()
    side = "right" if spec.classifies_from_first_column(config) else "left"
    stock = _build(name, config)
    if name.startswith("ModernBert"):
        assert [layer.attention_type for layer in stock.base_model.layers] == MODERNBERT_LAYOUTS[case]
    model = bcosify(stock, b=B, verbose=False)
    ids, mask = padded_rows([12, 8, 3], 12, side, seed=7)
    expl = explain(model, ids, mask, **_asked(spec))
    assert (expl.delta.abs() <= 1e-5 * expl.explained.abs().clamp_min(1e-2)).all()
    own = _outputs(model, ids, mask)
    last = mask.sum(1) - 1 if side == "right" else torch.full((3,), 11)
    rows = torch.arange(3)
    wanted = own[:, 1] if spec.is_classifier else own[rows, last, 7]
    torch.testing.assert_close(expl.explained, wanted, rtol=1e-5, atol=1e-7)  # soft-caps: explaining rounds otherwise
    for row in range(3):  # each row as it is explained alone
        alone = explain(model, ids[row:row + 1, mask[row].bool()], **_asked(spec))
        torch.testing.assert_close(expl.contributions[row, mask[row].bool()], alone.contributions[0],
                                   rtol=1e-4, atol=1e-6)
    if reach is not None:  # row 0 (unpadded) at its last token: the tokens the windows do not reach have no share
        ahead = reach if spec.kind == "encoder" else 0
        columns = torch.arange(12)
        beyond = (columns < 11 - reach) | (columns > 11 + ahead)
        assert (expl.contributions[0, beyond] == 0).all() and (expl.contributions[0, 11 - reach] != 0).all()
    implementation = "sdpa" if model.config._attn_implementation != "sdpa" else "eager"
    if not (name.startswith("Gemma2") and config.attn_logit_softcapping is not None):  # sdpa takes no soft-cap
        other = copy.deepcopy(model)
        other.config._attn_implementation = implementation
        again = explain(other, ids, mask, **_asked(spec))
        torch.testing.assert_close(again.contributions, expl.contributions, rtol=1e-4, atol=1e-6)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    loaded = load_bcos_model(tmp_path)
    assert torch.equal(_outputs(loaded, ids, mask), own)


def stock_on_the_bcos_weights(stock: nn.Module, model: nn.Module) -> set[str]:
    """Set ``stock`` (the model ``model`` was bcosified from) to the weights a B-cos layer uses at B = 1: every bias the
    report drops at 0, each unit of a converted linear layer at unit norm. Returns the dropped biases' names."""
    from transformers.pytorch_utils import Conv1D

    from bcos_plugins.nn import BcosLinear

    dropped = set(model.bcos_report.dropped_biases)
    with torch.no_grad():
        for param_name, param in stock.named_parameters():
            if param_name in dropped:
                param.zero_()
        for path, layer in model.named_modules():
            if isinstance(layer, BcosLinear):
                source = stock.get_submodule(path)
                units = 0 if isinstance(source, Conv1D) else 1  # GPT-2's Conv1D stores (in, out): a unit is a column
                source.weight.copy_(source.weight / source.weight.norm(dim=units, keepdim=True))
    return dropped


@pytest.mark.parametrize("case", sorted(UNUSUAL))
def test_at_b_1_the_bcos_model_is_the_stock_model_with_unit_rows_and_no_dropped_bias(case):
    """An independent reading of the conversion: the stock forward, run on the weights a B-cos layer uses at B = 1
    (each row of a converted linear layer at unit norm, every bias the report drops at 0), gives the B-cos model's
    output: the swapped-in forwards (gated MLPs, Gemma's norms and soft-capped head, ModernBERT's attention) compute the
    stock maths under every one of these configurations, and the report names every bias that is gone."""
    name, make, _ = UNUSUAL[case]
    stock = _build(name, make())
    model = bcosify(copy.deepcopy(stock), b=1.0, verbose=False)
    dropped = stock_on_the_bcos_weights(stock, model)
    assert dropped == ({n for n, _ in stock.named_parameters() if n.endswith("bias")}
                       - {n for n, _ in model.named_parameters() if n.endswith("bias")})
    ids, mask = padded_rows([12, 8, 3], 12, "right", seed=7)
    real = mask.bool()
    got, want = _outputs(model, ids, mask), _outputs(stock, ids, mask)
    if got.dim() == 3:
        got, want = got[real], want[real]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ load_bcos_model of a variant


@pytest.fixture(scope="module")
def llama_at_b125_and_llama_at_b2():
    """Two B-cos Llamas of one configuration: seed 0 at B 1.25, and seed 1 (other weights) with each layer's B set to
    2 (its config.bcos still says 1.25): the two saves of a variant's folder and of a hub cache's two revisions."""
    config = lambda: _rotary(T.LlamaConfig)  # noqa: E731
    first = bcosify(_build("LlamaForCausalLM", config()), b=B, verbose=False)
    second = bcosify(_build("LlamaForCausalLM", config(), seed=1), b=B, verbose=False)
    for layer in second.modules():
        if isinstance(layer, AlignmentPressure):
            layer.b = 2.0
    return first, second


def _two_saves_in_one_folder(folder, llamas):
    """model.safetensors from one model (B 1.25) and model.fp16.safetensors from another (other weights, B 2)."""
    plain, variant = llamas
    plain.save_pretrained(folder)
    variant.save_pretrained(folder, variant="fp16")
    return plain, variant


def test_a_variant_loads_with_the_b_its_own_files_stored_not_the_plain_saves(tmp_path, llama_at_b125_and_llama_at_b2):
    plain, variant = _two_saves_in_one_folder(tmp_path, llama_at_b125_and_llama_at_b2)
    assert {p.name for p in tmp_path.glob("*.safetensors")} == {"model.safetensors", "model.fp16.safetensors"}
    ids, mask = padded_rows([9, 5], 9, "left", seed=3)
    with pytest.warns(UserWarning, match=r"run at the B stored with them \(2\)"):  # config.bcos['b'] says 1.25
        loaded = load_bcos_model(tmp_path, variant="fp16")
    # the weights came from the variant and each layer's B from model.safetensors: 0.28 off the variant, silently
    assert {layer.b for layer in loaded.modules() if isinstance(layer, AlignmentPressure)} == {2.0}
    assert torch.equal(_outputs(loaded, ids, mask), _outputs(variant, ids, mask))
    assert torch.equal(_outputs(load_bcos_model(tmp_path), ids, mask), _outputs(plain, ids, mask))


def test_a_folder_with_the_variant_alone_loads_and_a_missing_variant_is_named(tmp_path, llama_at_b125_and_llama_at_b2):
    _, variant = _two_saves_in_one_folder(tmp_path / "both", llama_at_b125_and_llama_at_b2)
    only = tmp_path / "only"
    variant.save_pretrained(only, variant="fp16")
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.warns(UserWarning, match="run at the B stored"):
        loaded = load_bcos_model(only, variant="fp16")  # refused before: "has no model.safetensors"
    assert torch.equal(_outputs(loaded, ids, None), _outputs(variant, ids, None))
    with pytest.raises(BcosFileError, match=r"^variant: is 'bf16', but .* has no model\.bf16\.safetensors \(nor "
                                            r"model\.safetensors\.index\.bf16\.json\); it holds model\.fp16\.safetensors"
                                            r", model\.safetensors\. Pass the variant the model was saved with"):
        load_bcos_model(tmp_path / "both", variant="bf16")


# ------------------------------------------------------------------ keyword values transformers refuses, named


@pytest.fixture(scope="module")
def gemma2_classifier_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma2_classifier")
    config = _rotary(T.Gemma2Config, head_dim=8, query_pre_attn_scalar=8)
    bcosify(_build("Gemma2ForSequenceClassification", config), b=B, verbose=False).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("key, value", [
    ("dtype", torch.int8),
    ("device_map", "bogus"),
    ("attn_implementation", "sdpa"),  # transformers' Gemma2ForSequenceClassification does not declare sdpa
    ("attn_implementation", "bogus"),
])
def test_a_keyword_value_transformers_refuses_is_named_not_the_path(gemma2_classifier_folder, key, value):
    # it said "path: transformers could not load ... Check the from_pretrained keyword arguments, or re-save the model"
    with pytest.raises(BcosKeywordError, match=rf"^{key}: is {value!r}, which transformers refused while loading "
                                               rf".*\. Pass another {key}, as transformers' message says, or leave "
                                               rf"{key} out\.$"):
        load_bcos_model(gemma2_classifier_folder, **{key: value})


@pytest.mark.parametrize("key", ["attn_implementation", "variant"])
def test_a_loading_option_that_is_no_name_is_refused_naming_it(gemma2_classifier_folder, key):
    # attn_implementation=3 failed inside transformers: "'int' object has no attribute 'startswith'"
    with pytest.raises(BcosKeywordError, match=rf"^{key}: must be .*, got int 3\. Pass {key} as a string, or leave "
                                               r"it out\.$"):
        load_bcos_model(gemma2_classifier_folder, **{key: 3})


# ------------------------------------------------------------------ the Space model over a B-cos encoder


def _space(seed: int, b: float):
    from conftest import tiny_config

    from bcos_plugins.space import SpaceModelForSequenceClassification

    torch.manual_seed(seed)
    encoder = bcosify(T.BertModel(tiny_config("bert")), b=B, verbose=False)
    model = SpaceModelForSequenceClassification.from_encoder(encoder, num_labels=2, n_latent=3).eval()
    for layer in model.modules():
        if isinstance(layer, AlignmentPressure):
            layer.b = b
    return model


@pytest.mark.parametrize("where", ["subfolder", "variant"])
def test_a_space_model_loads_the_save_from_pretrained_was_asked_for_not_the_top_folders(tmp_path, where):
    top, asked = _space(0, B), _space(1, 2.0)
    top.save_pretrained(tmp_path)
    if where == "subfolder":
        asked.save_pretrained(tmp_path / "checkpoint-5")
        keywords = {"subfolder": "checkpoint-5"}
    else:
        asked.save_pretrained(tmp_path, variant="fp16")
        keywords = {"variant": "fp16"}
    loaded = type(top).from_pretrained(str(tmp_path), **keywords).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        # the top folder's plain save was loaded over the one asked for (its weights and B): the other model, silently
        assert torch.equal(loaded(input_ids=ids).logits, asked(input_ids=ids).logits)
    assert {layer.b for layer in loaded.modules() if isinstance(layer, AlignmentPressure)} == {2.0}


def test_inseq_refuses_a_variant_it_would_convert_with_another_saves_b_and_the_fix_loads_it(tmp_path):
    import inseq
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    from bcos_plugins.errors import BcosValueError

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    variant = _tiny_lm("gpt2", len(tokenizer), seed=1)
    for layer in variant.modules():
        if isinstance(layer, AlignmentPressure):
            layer.b = 1.05
    _tiny_lm("gpt2", len(tokenizer), seed=2).save_pretrained(tmp_path)  # model.safetensors, B 1.1
    variant.save_pretrained(tmp_path, variant="fp16")
    tokenizer.save_pretrained(tmp_path)
    # it loaded the variant's weights with model.safetensors' B (1.1): logits 0.033 off, silently
    with pytest.raises(BcosValueError, match=r"^variant: is 'fp16' in model_kwargs, but inseq\.load_model\(folder, "
                                             r"\"bcos\"\) converts .* Load it with bcos_plugins\.load_bcos_model"):
        inseq.load_model(str(tmp_path), "bcos", model_kwargs={"variant": "fp16"})
    with pytest.warns(UserWarning, match="run at the B stored"):
        model = load_bcos_model(tmp_path, variant="fp16")
    loaded = inseq.load_model(model, "bcos", tokenizer=str(tmp_path))
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, variant(ids).logits)


# ------------------------------------------------------------------ a hub repository's revision and cache


def _hub_cache(cache, repo: str, revisions: dict[str, nn.Module]):
    """A Hugging Face cache folder (``cache_dir``) holding ``repo`` at each revision name -> model's save (as
    huggingface_hub lays out a download: ``snapshots/<commit>`` and ``refs/<name>``)."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    for index, (revision, model) in enumerate(revisions.items()):
        commit = f"{index + 1:x}" * 40
        model.save_pretrained(folder / "snapshots" / commit)
        (folder / "refs" / revision).write_text(commit)


def test_a_hub_revision_loads_with_its_own_record_and_b_not_the_default_revisions(tmp_path,
                                                                                  llama_at_b125_and_llama_at_b2):
    main, later = llama_at_b125_and_llama_at_b2
    _hub_cache(tmp_path, "user/bcos-llama", {"main": main, "v2": later})
    ids = torch.tensor([[5, 6, 7, 8]])
    hub = dict(cache_dir=str(tmp_path), local_files_only=True)
    # the config and each layer's B were read from the default cache's default revision whatever the keywords: v2's
    # weights ran at main's B (another model, silently), and a cache_dir was not looked into at all
    with pytest.warns(UserWarning, match=r"run at the B stored with them \(2\)"):
        loaded = load_bcos_model("user/bcos-llama", revision="v2", **hub)
    assert {layer.b for layer in loaded.modules() if isinstance(layer, AlignmentPressure)} == {2.0}
    assert torch.equal(_outputs(loaded, ids, None), _outputs(later, ids, None))
    assert torch.equal(_outputs(load_bcos_model("user/bcos-llama", **hub), ids, None), _outputs(main, ids, None))


@pytest.mark.parametrize("where", [{"subfolder": "checkpoint-500"}, {"variant": "fp16"}])
def test_inseq_refuses_a_stock_load_of_other_files_than_its_folders_own(tmp_path, where):
    """A B-cos save loaded by plain transformers from a subfolder or a variant names the top folder alone
    (``config._name_or_path``), from whose model.safetensors the inseq adapter read each layer's B: checkpoint-500 ran
    at the final save's B (logits 0.033 off), silently. Refused, naming the fix; a load of the folder's own files is
    still converted (in any dtype)."""
    import inseq
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    from bcos_plugins.errors import BcosValueError

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    checkpoint = _tiny_lm("gpt2", len(tokenizer), seed=1)
    for layer in checkpoint.modules():
        if isinstance(layer, AlignmentPressure):
            layer.b = 1.05
    _tiny_lm("gpt2", len(tokenizer), seed=2).save_pretrained(tmp_path)  # the top folder's save, B 1.1
    checkpoint.save_pretrained(tmp_path / "checkpoint-500")
    checkpoint.save_pretrained(tmp_path, variant="fp16")
    tokenizer.save_pretrained(tmp_path)
    stock = T.GPT2LMHeadModel.from_pretrained(str(tmp_path), **where)
    with pytest.raises(BcosValueError, match=r"^model: its weight '.*' is not the one saved in .*model\.safetensors, "
                                             r"the file of .* that each layer's B is read from.*load_bcos_model"):
        inseq.load_model(stock, "bcos", tokenizer=str(tmp_path))
    own = T.GPT2LMHeadModel.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    assert inseq.load_model(own, "bcos", tokenizer=str(tmp_path)).model is own


def test_inseq_names_device_map_for_an_offloaded_stock_load_not_the_weight_check(tmp_path):
    """The weight check reads no offloaded (meta) weight: the conversion's own refusal names the cause."""
    import inseq
    from test_inseq_adapter import TOKENIZER_DIR, _tiny_lm

    from bcos_plugins.errors import BcosValueError

    tokenizer = T.GPT2Tokenizer.from_pretrained(TOKENIZER_DIR)
    _tiny_lm("gpt2", len(tokenizer), seed=2).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    stock = T.GPT2LMHeadModel.from_pretrained(str(tmp_path), device_map="auto", max_memory={"cpu": 2000},
                                              offload_folder=str(tmp_path / "offload"))
    with pytest.raises(BcosValueError, match=r"^model: has \d+ module\(s\) offloaded by accelerate"):
        inseq.load_model(stock, "bcos", tokenizer=str(tmp_path))
