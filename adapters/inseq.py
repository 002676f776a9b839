"""inseq adapter: the attribution method ``"bcos"`` and B-cos sequence classifiers with inseq's output objects.

``import bcos_plugins.adapters.inseq`` registers the method through inseq's own registry (a subclass of inseq's
``GradientAttributionRegistry`` with ``method_name = "bcos"``; importing again registers nothing new), so that
it works with inseq's ``attribute``, ``show``, ``aggregate``, ``save``/``load`` and step functions unchanged.

Examples:
    >>> import inseq, bcos_plugins.adapters.inseq
    >>> model = inseq.load_model(bcos_gpt2, "bcos", tokenizer=tokenizer)   # or a saved B-cos model folder
    >>> out = model.attribute("The cat sat on the", generation_args={"max_new_tokens": 5}, show_progress=False)
    >>> out.show()                                   # signed token scores, columns = generated tokens
    Target Saliency Heatmap
    ...

What "bcos" computes (decoder-only B-cos LMs: the registry's causal LMs, GPT2LMHeadModel, LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and Gemma2ForCausalLM, converted with ``bcosify``):

- Like inseq's own layer methods, the method holds a Captum attribution: the Captum adapter's
  :class:`~bcos_plugins.adapters.captum.LayerBcos` at the core's attribution point
  (:func:`~bcos_plugins.attribution.text_attribution_point`: GPT-2's combined word + position embedding, the
  input of ``transformer.drop``; Llama's token embeddings, positions enter through rotary q/k only), in
  explanation mode: contributions ``W(x) x`` per prefix token and embedding dimension. Attributing at inseq's
  usual point (the word embeddings) would miss GPT-2's position-embedding share.
- Completeness: the contributions of all prefix tokens (the prompt and the tokens generated so far) sum to the
  attributed value. ``sum(contributions) - attributed value`` (the core's ``delta``) is stored per step as
  inseq's convergence-delta step score ``step_scores["deltas"]`` (~1e-6 of the logit for B-cos models), always:
  ``attribute(..., step_scores=["deltas"])`` returns the same (inseq has no step function of that name), and
  the output's ``info["step_scores"]`` then lists "deltas" as asked, as it lists every other requested score.
- Attributed function: ``"logit"`` by default (B-cos decomposes logits exactly, not probabilities):
  ``load_model(..., "bcos")`` sets the model's default attributed function to ``"logit"``. Any inseq step
  function works as ``attributed_fn``: ``"contrast_logits_diff"`` (with ``contrast_targets=``) is exact as well
  (a difference of two logits of one forward pass; inseq's *step score* of the same name instead takes the
  contrast logit after the contrast prefix, so it can differ from the attributed value). For a non-linear
  function of the logits ``f(z)`` such as ``"probability"`` the contributions sum to ``sum_j z_j df/dz_j`` (for
  the probability of token t: ``p_t (z_t - sum_k p_k z_k)``), the first-order share of every logit, not to
  ``f`` itself; ``deltas`` then holds that gap (a property of softmax, not an approximation error). With
  ``contrast_force_inputs=True`` the contrastive logit comes from a second forward pass on other tokens, whose
  share is not attributed, so ``deltas`` equals minus that logit.
- Aggregation: outputs keep the per-dimension contributions and aggregate by a *signed sum* over the embedding
  dimension, without inseq's default normalisation (the aggregator ``"signed_sum"``, registered here), so the
  aggregated token scores still sum to the explained logit and keep their sign (inseq's default for gradient
  methods, a vector norm, drops the sign). Merging subwords or spans also sums. Ask for anything else as usual:
  ``out.aggregate("vnorm")``, ``out.show(aggregator="vnorm")``. Merged spans sum the entries that exist (the
  aggregation function ``"present_sum"``, registered here): a word that starts in the prompt and ends in the
  generation keeps its prompt subwords' share in the columns of the steps that generate its later subwords.
- Batches: a prompt attributed in a batch (inseq left-pads) gets the same scores as alone, and with
  ``generation_args`` generates the same tokens as alone: a model loaded with "bcos" generates with the prompts'
  attention mask, which inseq 0.7.1 drops (see :class:`_Inseq071`).

Models "bcos" refuses, with an :class:`UnsupportedModelError` naming what is supported: encoder-decoder models
(bcosify has no encoder-decoder architecture: use another inseq method), architectures bcosify does not know,
base models without an LM head, sequence classifiers (use :func:`load_classifier`), and models without B-cos
modules (a stock model's input x gradient is not an exact ``W(x) x``: convert it with ``bcosify`` and fine-tune
it, or use inseq's ``"input_x_gradient"``). (BERT-family models stop earlier, inside inseq 0.7.1's own loader,
which needs a ``bos_token_id``.) A folder saved from a B-cos model (``config.bcos`` present) that
``AutoModelForCausalLM`` loaded as a stock model is converted again with the saved B, as
:func:`bcos_plugins.load_bcos_model` does.

Sequence classifiers (inseq itself only handles generation models): :func:`load_classifier` returns a
:class:`BcosClassifier` whose ``attribute(texts)`` returns an inseq ``FeatureAttributionOutput`` with one
sequence per text, computed by :func:`bcos_plugins.explain` (so with the core's input checks and padding
handling): source = the input tokens, columns = the classes, ``source_attributions`` = per-class contributions
(summing to each class logit), step scores ``logit``, ``probability`` and ``deltas``; ``show()``,
``aggregate()``, ``save()``/``FeatureAttributionOutput.load()`` work on it.

Everything inseq 0.7.1 still forces (private fields, a misnamed setter, positions of left-padded prompts,
``pkg_resources``) is in :class:`_Inseq071`; tests/test_inseq_adapter.py checks that each quirk is still there
and fails when inseq changes.
"""

from __future__ import annotations

import base64
import functools
import inspect
import logging
import numbers
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import safetensors.torch
import torch
from bcos_plugins.adapters.captum import LayerBcos
from inseq.attr.feat import FeatureAttribution
from inseq.attr.feat.attribution_utils import get_source_target_attributions
from inseq.attr.feat.gradient_attribution import GradientAttributionRegistry
from inseq.data import (
    FeatureAttributionOutput,
    FeatureAttributionSequenceOutput,
    FeatureAttributionStepOutput,
)
from inseq.data.aggregation_functions import AggregationFunction, SumAggregationFunction
from inseq.data.aggregator import (
    Aggregator,
    AggregatorPipeline,
    ContiguousSpanAggregator,
    SequenceAttributionAggregator,
)
from inseq.models import AttributionModel
from inseq.utils import Registry
from inseq.utils.typing import TokenWithId
from jaxtyping import Int
from torch import Tensor, nn

from bcos_plugins._checks import (
    refuse_a_model_as_the_tokenizer,
    refuse_container_of_names,
    refuse_other_methods_keywords,
    refuse_renamed_keywords,
    require_count,
    require_int,
    require_label_names,
    require_model_object,
    require_row_ids,
)
from bcos_plugins.attribution import has_dynamic_weights, real_token_positions, text_attribution_point
from bcos_plugins.attribution.text import (
    padding_named_as_tokenizers,
    require_head_output_object,
    rows_as_alone_call,
)
from bcos_plugins.convert.architectures import (
    ArchitectureSpec,
    position_limit,
    require_max_length_fits,
    spec_for,
    specs_where,
    supported_architectures,
)
from bcos_plugins.convert.bcosify import BCOS_CONFIG_KEY
from bcos_plugins.corpus import (
    mask_keywords,
    require_tokenizer_fits,
    truncated_token_counts,
    warn_of_truncated_texts,
)
from bcos_plugins.errors import BcosTypeError, BcosValueError, argument_error
from bcos_plugins.explain import explain
from bcos_plugins.nn.dynamic import evaluating, thread_token
from bcos_plugins.persistence import (
    reconvert_stock_load,
    refuse_weights_from_elsewhere,
    subfolder_path,
    weight_files,
)

__all__ = [
    "METHOD_NAME",
    "PRESENT_SUM",
    "SIGNED_SUM",
    "BcosClassifier",
    "BcosInseqAttribution",
    "BcosSequenceAttribution",
    "BcosStepAttribution",
    "PresentSumAggregationFunction",
    "SignedSumAggregator",
    "UnsupportedModelError",
    "load_classifier",
]

logger = logging.getLogger("bcos_plugins")

METHOD_NAME = "bcos"
SIGNED_SUM = "signed_sum"
PRESENT_SUM = "present_sum"
# from the architecture registry: inseq generates with causal LMs; load_classifier takes sequence classifiers
_CAUSAL_LMS = specs_where(lambda spec: spec.head == "causal_lm")
_CLASSIFIERS = specs_where(lambda spec: spec.is_classifier)


class UnsupportedModelError(BcosTypeError):
    """A model the "bcos" method cannot explain exactly (the message says which models it supports)."""


# ------------------------------------------------------------------------------------- inseq 0.7.1 quirks


class _Inseq071:
    """Everything inseq 0.7.1 forces on a method of its own, in one place.

    Each quirk has a check in :meth:`quirks_present` that tests/test_inseq_adapter.py asserts, so a new inseq
    release that fixes (or changes) one fails that test instead of silently running a workaround that is no
    longer right.

    1. ``AttributionModel.default_attributed_fn_id`` is read-only: its setter was defined under the name
       ``set_attributed_fn`` (so that name is the settable property).
    2. ``FeatureAttributionSequenceOutput.__post_init__`` merges an output's aggregation settings into inseq's
       module-level default dicts (``DEFAULT_ATTRIBUTION_AGGREGATE_DICT``, ``DEFAULT_ATTRIBUTION_DIM_NAMES``),
       which every output of every method shares: our outputs hand it empty dicts and keep private copies.
    3. Batched decoder prompts are left-padded and the model is called without ``position_ids``; transformers 5
       then counts positions from the first (padding) column, so a padded row runs at other positions than in
       ``generate``. While "bcos" attributes, positions are filled in from the attention mask, as ``generate``
       and :func:`bcos_plugins.explain` count them.
    4. ``inseq.get_version()`` imports ``pkg_resources`` (gone from recent setuptools): nothing here calls it.
    5. ``embed_ids`` calls the model's embedding layer outside the model's forward (e.g. to embed contrastive
       targets inside the attributed function); where that layer is the attribution point (Llama's token
       embeddings, Gemma 2's scaled ones), Captum's layer hook would keep that activation instead of the forward's (Captum keeps the
       last one). While "bcos" attributes, ``embed_ids`` looks the ids up without calling the module.
    6. ``generate`` calls the model's ``generate`` with the input ids alone, dropping the padding mask, so a
       left-padded prompt generates from its padding: other tokens in a batch than alone; and with ``batch_size``
       a slice of one prompt is decoded with the batch's padding, which ``attribute`` then refuses. A model loaded
       with "bcos" generates with the prompts' attention mask and decodes every slice as the whole batch (for
       every method it then runs); on any other model a padded batch warns (:meth:`warn_on_padded_generation`).
    7. ``FeatureAttributionSequenceOutput.weight_attributions`` casts the aggregated scores to float32 (``.float()``)
       before multiplying them by the step score, so a float64 output's weighted scores came back in float64 but
       rounded to float32 (1e-8 of them), silently: a float64 output is weighted at float64
       (:meth:`weight_at_float64`, inseq's steps otherwise).
    """

    @staticmethod
    def set_default_attributed_fn(attribution_model: AttributionModel, fn: str) -> None:
        attribution_model.set_attributed_fn = fn  # quirk 1

    @staticmethod
    def isolated_post_init(output: FeatureAttributionSequenceOutput) -> tuple[dict, dict]:
        """Run inseq's ``__post_init__`` on empty settings (quirk 2); returns the settings the object had."""
        carried = (output._dict_aggregate_fn, output._attribution_dim_names)
        output._dict_aggregate_fn, output._attribution_dim_names = {}, {}
        FeatureAttributionSequenceOutput.__post_init__(output)
        output._dict_aggregate_fn = deepcopy(output._dict_aggregate_fn)
        return carried

    @staticmethod
    @contextmanager
    def positions_from_mask(model: nn.Module, spec: ArchitectureSpec) -> Iterator[None]:
        """Decoders: fill in ``position_ids`` from the attention mask when a call leaves them out (quirk 3)."""
        if spec.kind != "decoder":
            yield
            return

        owner = thread_token()  # the hook is on the model: another thread's call of it is left as it is

        def fill(module, args, kwargs):
            if thread_token() != owner:
                return None
            mask = kwargs.get("attention_mask")
            if kwargs.get("position_ids") is None and kwargs.get("past_key_values") is None \
                    and mask is not None and mask.ndim == 2:
                kwargs["position_ids"] = real_token_positions(mask.long())
                return args, kwargs
            return None

        handle = model.register_forward_pre_hook(fill, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    @staticmethod
    @contextmanager
    def embeddings_without_hooks(attribution_model: AttributionModel) -> Iterator[None]:
        """``attribution_model.embed_ids`` without calling the embedding module (quirk 5): same values."""
        layer = attribution_model.get_embedding_layer()
        # Gemma 2's token embedding (Gemma2TextScaledWordEmbedding) is an nn.Embedding times its buffer embed_scale;
        # it was left out, so on Gemma 2 "contrast_logits_diff" kept the contrast's embedding activation and failed
        # ("The differentiated Tensor at index 0 appears to not have been used in the graph")
        scaled = (isinstance(layer, nn.Embedding) and type(layer).__name__.endswith("ScaledWordEmbedding")
                  and isinstance(getattr(layer, "embed_scale", None), torch.Tensor))
        if not (type(layer) is nn.Embedding or scaled) or layer.max_norm is not None \
                or getattr(attribution_model, "encoder_int_embeds", None) is not None:
            yield
            return

        def embed_ids(ids, as_targets: bool = False):
            looked_up = nn.functional.embedding(ids, layer.weight, layer.padding_idx)
            if scaled:  # as the module's forward computes it
                looked_up = looked_up * layer.embed_scale.to(layer.weight.dtype)
            return looked_up * attribution_model.embed_scale

        attribution_model.embed_ids = embed_ids
        try:
            yield
        finally:
            del attribution_model.embed_ids

    @staticmethod
    def generate_with_padding_mask(attribution_model: AttributionModel) -> None:
        """``attribution_model.generate`` passing each prompt's attention mask to the model (quirk 6; idempotent)."""
        if getattr(attribution_model.generate, "_passes_padding_mask", False):
            return
        unpatched = attribution_model.generate  # inseq's bound method (batched, unhooked)
        hf_model = attribution_model.model

        def generate(inputs, *args, **kwargs):
            if isinstance(inputs, str) or (isinstance(inputs, list) and inputs
                                           and all(isinstance(x, str) for x in inputs)):
                # as inseq's generate encodes text, so that the mask is known here
                inputs = attribution_model.encode(inputs, add_special_tokens=not kwargs.get("skip_special_tokens"))
            ids, mask = getattr(inputs, "input_ids", None), getattr(inputs, "attention_mask", None)
            if ids is None or mask is None or "attention_mask" in kwargs:
                return unpatched(inputs, *args, **kwargs)
            if kwargs.get("skip_special_tokens") is None and len(ids) > 1:
                # inseq decides per batch_size slice; a one-prompt slice of a padded batch would keep its padding
                kwargs["skip_special_tokens"] = True
            done = [0]  # inseq's batch_size splits the prompts into consecutive slices, one generate call each
            hf_generate = hf_model.generate

            def generate_rows(*call_args, **call_kwargs):
                rows = call_kwargs.get("inputs", call_args[0] if call_args else None)
                start, done[0] = done[0], done[0] + len(rows)
                expected = ids[start:done[0]].to(rows.device)
                if "attention_mask" not in call_kwargs and torch.equal(rows, expected):
                    call_kwargs["attention_mask"] = mask[start:done[0]].to(rows.device)
                generated = hf_generate(*call_args, **call_kwargs)
                sequences = generated.sequences if hasattr(generated, "sequences") else generated  # inseq's dict
                _warn_on_special_tokens_generated(attribution_model.tokenizer, sequences[:, rows.shape[1]:], start)
                return generated

            hf_model.generate = generate_rows
            try:
                return unpatched(inputs, *args, **kwargs)
            finally:
                del hf_model.generate

        generate._passes_padding_mask = True
        attribution_model.generate = generate

    @staticmethod
    def warn_on_padded_generation() -> None:
        """inseq's own ``generate`` (a model not loaded with "bcos") keeps quirk 6: a left-padded prompt of a batch
        generates other tokens than alone. Left as inseq has it, but never silently: a padded batch warns, naming
        the rows and the ways out (idempotent; wraps ``HuggingfaceModel.generate``, which inseq calls for every
        method)."""
        from inseq.models.huggingface_model import HuggingfaceModel

        original = HuggingfaceModel.generate
        if getattr(original, "_warns_on_padding", False):
            return

        @functools.wraps(original)
        def generate(self, inputs, *args, **kwargs):
            if not getattr(self.generate, "_passes_padding_mask", False) and "attention_mask" not in kwargs:
                padded = _padded_prompt_rows(self, inputs, kwargs.get("skip_special_tokens"))
                if padded:
                    warnings.warn(
                        f"inseq 0.7.1 generates without the padding mask: in this batch, the padded prompt(s) at "
                        f"rows {padded} generate other tokens than they would alone (inseq's own generate drops "
                        "the mask; its attributions then explain those tokens). Attribute one "
                        "prompt at a time, pass the generated texts (attribute(input_texts, generated_texts)), or "
                        "load a B-cos model with inseq.load_model(model, \"bcos\"), which generates with the mask",
                        UserWarning, stacklevel=2)
            return original(self, inputs, *args, **kwargs)

        generate._warns_on_padding = True
        HuggingfaceModel.generate = generate

    @staticmethod
    def refuse_before_loading() -> None:
        """``inseq.load_model(model, "bcos")`` checks the model before inseq wraps it (idempotent; wraps
        ``HuggingfaceModel.load``, which ``load_model`` calls): inseq's wrapper reads the tokenizer's BOS token first,
        so a BERT-family classifier (no BOS token) failed there with "'NoneType' object is not iterable" before
        the "bcos" method could say that classifiers go through :func:`load_classifier`."""
        from inseq.models.huggingface_model import HuggingfaceModel

        original = inspect.getattr_static(HuggingfaceModel, "load").__func__
        if getattr(original, "_checks_bcos_models", False):
            return

        signature = inspect.signature(original)

        @functools.wraps(original)
        def load(model, attribution_method=None, *args, **kwargs):
            if attribution_method == METHOD_NAME and isinstance(model, nn.Module):
                _explainable_model(model, classifier=False)
            if attribution_method == METHOD_NAME and isinstance(model, str | os.PathLike):
                model, args, kwargs = _folder_with_subfolder(signature, model, attribution_method, args, kwargs)
            return original(model, attribution_method, *args, **kwargs)

        load._checks_bcos_models = True
        HuggingfaceModel.load = staticmethod(load)

    @staticmethod
    def weight_at_float64(output: FeatureAttributionSequenceOutput, step_fn_id: str) -> FeatureAttributionSequenceOutput:
        """inseq's ``weight_attributions`` (in place: each column of the aggregated scores times its step score
        ``step_fn_id``; no aggregation afterwards) without its cast to float32 (quirk 7), for a float64 output."""
        aggregated = output.aggregate()
        weights = output.step_scores[step_fn_id]
        for field in ("source_attributions", "target_attributions"):
            if getattr(output, field) is not None:
                setattr(output, field, getattr(aggregated, field) * weights)
        output._aggregator = []
        return output

    @staticmethod
    def quirks_present() -> dict[str, bool]:
        """Whether each quirk above is still in the installed inseq."""
        import inseq
        from inseq.models.decoder_only import DecoderOnlyAttributionModel
        from inseq.models.huggingface_model import HuggingfaceModel

        prop = inspect.getattr_static(AttributionModel, "default_attributed_fn_id")
        misnamed = inspect.getattr_static(AttributionModel, "set_attributed_fn", None)
        post_init = inspect.getsource(FeatureAttributionSequenceOutput.__post_init__)
        decoder_source = inspect.getsource(DecoderOnlyAttributionModel)
        return {
            "misnamed setter": prop.fset is None and isinstance(misnamed, property) and misnamed.fset is not None,
            "shared default dicts": "default_aggregate_fn.update(" in post_init,
            "no position_ids": "position_ids" not in decoder_source,
            "pkg_resources": "pkg_resources" in inspect.getsource(inseq.get_version),
            "embed_ids calls the layer": "self.get_embedding_layer()(ids)" in inspect.getsource(
                HuggingfaceModel.embed_ids),
            "generate drops the padding mask": "inputs=inputs.input_ids," in (generate := inspect.getsource(
                HuggingfaceModel.generate)) and "attention_mask" not in generate,
            "weight_attributions rounds to float32": ".float().T" in inspect.getsource(
                FeatureAttributionSequenceOutput.weight_attributions),
        }


def _folder_with_subfolder(signature: inspect.Signature, model, attribution_method, args: tuple, kwargs: dict
                           ) -> tuple[str, tuple, dict]:
    """``inseq.load_model(folder, "bcos", model_kwargs={"subfolder": ...})`` loads the model from ``folder/subfolder``
    itself (the tokenizer still from ``folder``, as inseq reads it): given to from_pretrained, ``subfolder`` took the
    weights from there while the model's name (``config._name_or_path``), from which the B-cos layers are converted
    again as saved, stayed ``folder``: a Trainer run's checkpoint-500 ran at the final save's B per layer (a tiny
    GPT-2's logits 0.033 off), silently. The subfolder is read as :func:`bcos_plugins.load_bcos_model` reads it."""
    bound = signature.bind(model, attribution_method, *args, **kwargs)
    model_kwargs = bound.arguments.get("model_kwargs") or {}
    if isinstance(model_kwargs, dict) and model_kwargs.get("variant") is not None:
        # transformers loaded the weights of model.<variant>.safetensors and the conversion each layer's B from
        # model.safetensors, another save's (a tiny GPT-2's logits 0.033 off), silently: the loaded stock model does not
        # say which files it came from, so the conversion cannot follow it
        raise argument_error(
            "variant", f"is {model_kwargs['variant']!r} in model_kwargs, but inseq.load_model(folder, \"bcos\") "
            "converts the loaded model again with each layer's B read from model.safetensors, which may be another "
            "save's", "Load it with bcos_plugins.load_bcos_model(folder, variant=...), which reads the variant's own "
            "files, and pass that model: inseq.load_model(model, \"bcos\", tokenizer=folder)")
    if not isinstance(model_kwargs, dict) or "subfolder" not in model_kwargs:
        return model, args, kwargs
    model_kwargs = dict(model_kwargs)  # inseq's default is one dict shared by every call: never changed in place
    folder = subfolder_path(model, model_kwargs.pop("subfolder"), reader='inseq.load_model(..., "bcos")')
    bound.arguments["model_kwargs"] = model_kwargs
    if bound.arguments.get("tokenizer") is None:
        bound.arguments["tokenizer"] = os.fspath(model)
    return folder, bound.args[2:], bound.kwargs


def _padded_prompt_rows(attribution_model: AttributionModel, inputs, skip_special_tokens) -> list[int]:
    """Rows of a batch of prompts that inseq's ``generate`` would left-pad (none for a single prompt)."""
    if isinstance(inputs, list) and len(inputs) > 1 and all(isinstance(x, str) for x in inputs):
        # as inseq's generate encodes text
        inputs = attribution_model.encode(inputs, add_special_tokens=not skip_special_tokens)
    mask = getattr(inputs, "attention_mask", None)
    if not isinstance(mask, Tensor) or mask.ndim != 2 or len(mask) < 2:
        return []
    return (mask == 0).any(dim=1).nonzero().flatten().tolist()


_Inseq071.warn_on_padded_generation()
_Inseq071.refuse_before_loading()


# ---------------------------------------------------------------------------------------------- registration


def _warn_on_special_tokens_generated(tokenizer, generated: Tensor, first_row: int) -> None:
    """Warn where a row generated a special token (other than its final end-of-sequence token and the padding after
    it) before its end. inseq 0.7.1 decodes the generation without special tokens and labels the attributed steps
    with the tokens of that text, so the columns after such a token were labelled with other tokens than the ones
    attributed (a tiny Qwen2 that generated <pad> then w3: the column labelled w3 held <pad>'s logit), silently."""
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    if not special:
        return
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    flagged = {}
    for row, ids in enumerate(generated.tolist()):
        while ids and ids[-1] in ends:  # the end of the row and the padding after it are dropped harmlessly
            ids.pop()
        inside = sorted({i for i in ids if i in special})
        if inside:
            flagged[first_row + row] = tokenizer.convert_ids_to_tokens(inside)
    if flagged:
        warnings.warn(f"inseq: the generation of row(s) {sorted(flagged)} contains special token(s) "
                      f"{sorted({t for ts in flagged.values() for t in ts})} before its end; inseq 0.7.1 decodes "
                      "the generation without them and labels the attributed steps with that text's tokens, so "
                      "columns may be labelled with other tokens than the ones attributed. Keep the model from "
                      "generating them (generation_args={'suppress_tokens': [...]}), or attribute the generated "
                      "texts you want explained (attribute(prompts, generated_texts)).", UserWarning, stacklevel=2)


def _reuse_or_refuse(registry: type[Registry], name: str) -> type | None:
    """Our earlier registration of ``name`` (a reload, or this file imported under a second module name), None
    when nothing holds the name yet; a class of another package holding it is never replaced silently."""
    found = [c for c in registry.subclasses() if getattr(c, registry.registry_attr, None) == name]
    ours = [c for c in found if getattr(c, "_registered_by_bcos_plugins", False)]
    if len(ours) != len(found):
        other = next(c for c in found if c not in ours)
        raise ImportError(
            f"inseq already has a {registry.__name__} named {name!r} ({other.__module__}.{other.__qualname__}); "
            "bcos_plugins will not replace it. Uninstall or stop importing the package that registers it."
        )
    return ours[0] if ours else None


# ---------------------------------------------------------------------------------------------- outputs


class _SignedSum:
    """Sum over the last (embedding) dimension, keeping the sign, not normalised.

    inseq's scores aggregator divides each generated token's column by its L1 norm unless told otherwise; B-cos
    contributions are only exact unnormalised (the column then sums to the explained logit).
    """

    # A plain mixin: a registry subclass would be registered (under its parent's name) on definition.
    aggregator_family = "scores"
    default_fn = "sum"
    _registered_by_bcos_plugins = True

    @classmethod
    def _aggregate(cls, attr, aggregate_fn=None, normalize: bool = False, rescale: bool = False, **kwargs):
        # Always the sum, also for outputs of other methods whose defaults name another function.
        fn = aggregate_fn if aggregate_fn is not None else SumAggregationFunction()
        return super()._aggregate(attr, aggregate_fn=fn, normalize=normalize, rescale=rescale, **kwargs)


_previous_aggregator = _reuse_or_refuse(Aggregator, SIGNED_SUM)
if _previous_aggregator is None:
    class SignedSumAggregator(_SignedSum, SequenceAttributionAggregator):
        """inseq aggregator ``"signed_sum"``: exact token scores from B-cos contributions (see the base class)."""

        aggregator_name = SIGNED_SUM
else:  # registered by an earlier import of this file
    SignedSumAggregator = _previous_aggregator


class _PresentSum:
    """Sum over a merged span of the entries that exist; a span with none stays NaN.

    Merging subwords or spans of a decoder's output sums rows of prefix tokens. A word that starts in the prompt
    and ends in the generation holds, in the column of a step that generates its later part, prompt rows (numbers)
    and rows not generated yet (NaN): inseq's plain sum turns the whole merged cell into NaN and the column loses
    the prompt subwords' share, so it no longer sums to the logit.
    """

    aggregation_function_name = PRESENT_SUM
    _registered_by_bcos_plugins = True

    def __call__(self, scores: Tensor, dim: int) -> Tensor:
        return scores.nansum(dim).masked_fill(scores.isnan().all(dim), float("nan"))


_previous_span_sum = _reuse_or_refuse(AggregationFunction, PRESENT_SUM)
if _previous_span_sum is None:
    class PresentSumAggregationFunction(_PresentSum, AggregationFunction):
        """inseq aggregation function ``"present_sum"``: B-cos outputs merge spans with it (see the base class)."""
else:  # registered by an earlier import of this file
    PresentSumAggregationFunction = _previous_span_sum


# step scores that a merged span of generated tokens sums, as it sums their columns' contributions: the attributed
# logits (or logit differences) and the completeness gap, sum(contributions) - attributed value
_SUMMED_STEP_SCORES = ("logit", "contrast_logits_diff", "deltas")

_DIM_NAMES = {
    "source_attributions": {0: "Input Tokens", 1: "Generated Tokens", 2: "Embedding Dimension"},
    "target_attributions": {0: "Input Tokens", 1: "Generated Tokens", 2: "Embedding Dimension"},
}


def _names_the_sum(aggregator, aggregate_fn) -> bool:
    """Whether an ``aggregate`` call names the sum over d_model: the aggregation function ``"sum"`` as the aggregator,
    or inseq's scores aggregator (``"scores"``) with no function (a B-cos output's is the sum) or ``"sum"``; also as
    one step of a pipeline (a list of aggregators, with a list of functions or none)."""
    aggregators = list(aggregator) if isinstance(aggregator, list | tuple) else [aggregator]
    functions = list(aggregate_fn) if isinstance(aggregate_fn, list | tuple) else [aggregate_fn] * len(aggregators)
    return any(name == "sum" or ((name == "scores" or name is SequenceAttributionAggregator) and fn in (None, "sum"))
               for name, fn in zip(aggregators, functions, strict=False))


def _aggregation_steps(aggregator, aggregate_fn) -> list[tuple[Any, Any]]:
    """The ``(aggregator, function)`` steps of an ``aggregate`` call, in every form inseq takes: one name or class,
    a list of them (with a list of functions or none), a list of ``(aggregator, function)`` pairs, a pipeline."""
    if isinstance(aggregator, AggregatorPipeline):
        return list(zip(aggregator.aggregators, aggregator.aggregate_fn, strict=False))
    if isinstance(aggregator, list | tuple):
        if aggregator and all(isinstance(step, tuple) for step in aggregator):
            return [(step[0], step[1] if len(step) > 1 else None) for step in aggregator]
        functions = list(aggregate_fn) if isinstance(aggregate_fn, list | tuple) else [aggregate_fn] * len(aggregator)
        return list(zip(aggregator, functions, strict=False))
    return [(aggregator, aggregate_fn)]


def _merges_or_slices_tokens(name) -> bool:
    """Whether an aggregation step merges or slices tokens: inseq's ``"spans"``, ``"subwords"``, ``"split"`` or
    ``"slices"`` (its contiguous-span aggregators), by name or class."""
    if isinstance(name, str):
        name = Aggregator.available_classes().get(name)
    return isinstance(name, type) and issubclass(name, ContiguousSpanAggregator)


# a temporary step score: each column's explained value (sum of contributions - deltas), carried through inseq's merge
# so that it is merged as the step scores are; deltas are then restated against it
_EXPLAINED = "_bcos_explained_value"


def _reduces_d_model(name) -> bool:
    """Whether an aggregation step reduces the embedding dimension: inseq's scores aggregator (also named by one of
    its functions, ``"sum"``, ``"absmax"``, ...) or this package's ``"signed_sum"``."""
    if isinstance(name, str):
        return name in ("scores", SIGNED_SUM) or name in AggregationFunction.available_classes()
    return isinstance(name, type) and issubclass(name, SequenceAttributionAggregator)


def _sums_d_model(name, fn) -> bool:
    """Whether a step that reduces the embedding dimension takes the plain sum: ``"sum"`` itself, or the scores
    aggregator / ``"signed_sum"`` with no function (a B-cos output's is the sum) or the sum."""
    if isinstance(name, str) and name not in ("scores", SIGNED_SUM):
        return name == "sum"
    return fn is None or fn == "sum" or isinstance(fn, SumAggregationFunction) or (
        isinstance(fn, type) and issubclass(fn, SumAggregationFunction))


def _step_label(name, fn) -> str:
    """An aggregation step as the caller named it, for a message."""
    def label(x):
        return repr(x) if isinstance(x, str) else getattr(x, "__name__", type(x).__name__)
    return label(name) if fn is None else f"{label(name)} ({label(fn)})"


def _column_totals(seq: FeatureAttributionSequenceOutput) -> Tensor | None:
    """Each attributed column's contributions summed over the tokens (and d_model where not aggregated), in float64;
    rows not generated yet (NaN) count for nothing."""
    parts = [torch.nansum(t.double(), dim=tuple(d for d in range(t.ndim) if d != 1))
             for t in (seq.source_attributions, seq.target_attributions) if isinstance(t, Tensor) and t.ndim >= 2]
    return sum(parts) if parts else None


@dataclass(eq=False, repr=False)
class BcosSequenceAttribution(FeatureAttributionSequenceOutput):
    """One attributed sequence of the "bcos" method.

    Attributions are ``(tokens, generated tokens or classes, d_model)`` contributions; the default aggregation
    (``aggregate()``, ``show()``) is the signed, unnormalised sum over ``d_model``, and merging spans or subwords
    sums as well, so aggregated scores stay exact. Once aggregated to token level, the default aggregation is
    none. Step score ``deltas``: ``sum of contributions - attributed value`` per column; a merged span of generated
    tokens sums its columns and its ``logit`` and ``deltas`` alike, and naming the sum (``aggregate("sum")``) gives
    the unnormalised sum.
    """

    def __post_init__(self):
        if isinstance(self.step_scores, dict):
            # a bfloat16 / float16 model's step scores (inseq's logit, probability) stay in its dtype, which inseq's
            # show() cannot draw ("Got unsupported ScalarType BFloat16"): widened to float32, exactly
            self.step_scores = {name: score.float() if isinstance(score, Tensor) and score.is_floating_point()
                                and torch.finfo(score.dtype).bits < 32 else score
                                for name, score in self.step_scores.items()}
        carried_aggregator = self._aggregator
        carried_fns, carried_names = _Inseq071.isolated_post_init(self)
        if self.sequence_scores is None:  # inseq's aggregators iterate over it
            self.sequence_scores = {}
        fns = self._dict_aggregate_fn
        for field in ("source_attributions", "target_attributions"):
            fns[field] = {"scores": "sum", "spans": PRESENT_SUM}
        if carried_fns:
            fns.update(deepcopy(carried_fns))
        # a merged span of generated tokens sums their columns, which then explain the sum of their attributed values:
        # with inseq's default (absmax) the merged column's logit was the larger one and its deltas the larger gap, so
        # "complete" was claimed for a column 0.45 off its logit (a saved output carries the old default: replaced too)
        fns["step_scores"]["spans"].update(dict.fromkeys(_SUMMED_STEP_SCORES, "sum"))
        self._attribution_dim_names = deepcopy(carried_names) if carried_names else deepcopy(_DIM_NAMES)
        if not self._set_default_aggregator():  # inseq's save/load passes the scores as encoded bytes: kept
            self._aggregator = carried_aggregator if carried_aggregator is not None else SIGNED_SUM

    def _set_default_aggregator(self) -> bool:
        """The default aggregation read off the scores (the signed sum over d_model, none once at token level);
        False where the scores are not decoded yet."""
        scores = self.source_attributions if self.source_attributions is not None else self.target_attributions
        if not isinstance(scores, Tensor):
            return False
        self._aggregator = SIGNED_SUM if scores.ndim > 2 else []
        return True

    def _recover_from_safetensors(self):
        """inseq's ``FeatureAttributionOutput.load`` decodes each saved score as float32, which rounded a float64 model's
        saved contributions, step scores and deltas (1e-8 of them) away from the ones saved: each comes back in float64
        where it was saved so, and in float32 otherwise (as inseq reads it)."""

        def recover(encoded):
            if not isinstance(encoded, str | bytes):  # already a tensor
                return encoded
            scores = safetensors.torch.load(base64.b64decode(encoded))["attribution"]
            return scores.to(torch.float64 if scores.dtype == torch.float64 else torch.float32)

        self.source_attributions = recover(self.source_attributions)
        self.target_attributions = recover(self.target_attributions)
        # decoded only now: an output saved after aggregate() came back with the signed sum as its default, so its
        # aggregate() and show() refused to reduce d_model again (the same object before saving needed none)
        self._set_default_aggregator()
        for field in ("step_scores", "sequence_scores"):
            scores = getattr(self, field)
            if scores is not None:
                setattr(self, field, {name: recover(score) for name, score in scores.items()})
        return self

    def aggregate(self, aggregator=None, aggregate_fn=None, *args, **kwargs):
        """inseq's ``aggregate``, where an aggregator the caller names as the sum (``"sum"``, or inseq's ``"scores"``
        aggregator with its B-cos function, the sum) sums without inseq's normalisation unless ``normalize`` or
        ``rescale`` is given: each column was divided by its L1 norm, so the token scores of ``aggregate("sum")``,
        ``show(aggregator="sum")`` and ``get_scores_dicts(aggregator="sum")`` no longer added up to the logit, silently
        (0.48 off on a tiny GPT-2), while ``aggregate()`` gave the exact signed sum."""
        steps = _aggregation_steps(self._aggregator if aggregator is None else aggregator, aggregate_fn)
        scores = self.source_attributions if self.source_attributions is not None else self.target_attributions
        if isinstance(scores, Tensor) and scores.ndim == 2 and any(_reduces_d_model(name) for name, _ in steps):
            # already at token level: inseq's scores aggregator failed on it with a bare IndexError ("tuple index out
            # of range"). Summing over d_model again is the sum already taken, so asking for it alone is a no-op
            # (as aggregate() is); any other reduction (or a pipeline around it) cannot be read off token scores
            if len(steps) == 1 and _names_the_sum(aggregator, aggregate_fn) and not kwargs.get("normalize") \
                    and not kwargs.get("rescale"):
                return self
            raise argument_error("aggregator", f"asks to reduce the embedding dimension of an output already "
                                 f"aggregated to token level (scores of shape {tuple(scores.shape)}, tokens x "
                                 f"generated tokens or classes): B-cos outputs sum over it when aggregated",
                                 "Aggregate the output as attributed (before its first aggregate()), or leave the "
                                 "scores step out of the aggregators for this one")
        if "normalize" not in kwargs and "rescale" not in kwargs and _names_the_sum(aggregator, aggregate_fn):
            kwargs["normalize"] = False
        if any(_merges_or_slices_tokens(name) for name, _ in steps):
            aggregated = self._aggregate_restating_deltas(aggregator, aggregate_fn, *args, **kwargs)
        else:
            aggregated = super().aggregate(aggregator, aggregate_fn, *args, **kwargs)
        reduced = [(name, fn) for name, fn in steps if _reduces_d_model(name)]
        other = next(((name, fn) for name, fn in reduced if not _sums_d_model(name, fn)), None)
        if other is not None or (reduced and (kwargs.get("normalize") or kwargs.get("rescale"))):
            # the token scores are then a norm, a maximum or a share of the column, not the signed contributions
            # whose sum deltas compares with the attributed value: a completeness claim they do not make
            how = (f"with {_step_label(*other)} instead of the signed sum" if other is not None
                   else "as a normalised or rescaled sum")
            aggregated._drop_stale_deltas(f"aggregate() reduced the embedding dimension {how}, so the token scores "
                                          "no longer sum to the attributed values",
                                          "Check completeness on aggregate() (the signed, unnormalised sum)")
        return aggregated

    def _drop_stale_deltas(self, what: str, fix: str) -> None:
        """Drops the step score ``deltas`` (sum of contributions - attributed value), with one warning, where a
        transform left columns that no longer explain the attributed values: the one rule for every such transform."""
        if isinstance(self.step_scores, dict) and "deltas" in self.step_scores:
            del self.step_scores["deltas"]
            warnings.warn(f"inseq: {what}; the step score 'deltas' (sum of contributions - attributed value) was "
                          f"dropped rather than left stale. {fix}", UserWarning, stacklevel=4)

    def _aggregate_restating_deltas(self, aggregator, aggregate_fn, *args, **kwargs):
        """inseq's ``aggregate`` of a call that merges or slices tokens, with the step score ``deltas`` (sum of
        contributions - attributed value) restated for what the call leaves: the sum of the columns shown minus the
        attributed value, merged as inseq merges the step scores. A slice leaves some tokens' share out (0.32 off on a
        tiny GPT-2, while deltas said 1e-7); a merge with another function than the sum (``aggregate("spans",
        aggregate_fn="mean")``, ``"absmax"``) or inseq's plain sum (which turns a merged cell holding a token not yet
        generated into NaN) left columns 0.05 to 0.66 off their logit while deltas, merged by the same function, still
        said 1e-7, silently. Each column's attributed value (its sum - deltas) rides through inseq's aggregation as a
        temporary step score, merged as the logit is (summed by default, with the caller's function where one is
        named); deltas is then the merged columns' sum minus it."""
        deltas = (self.step_scores or {}).get("deltas")
        before = _column_totals(self) if isinstance(deltas, Tensor) else None
        if before is None or before.shape != deltas.shape:
            aggregated = super().aggregate(aggregator, aggregate_fn, *args, **kwargs)
            aggregated._drop_stale_deltas("the aggregation merged or sliced tokens of an output whose columns do not "
                                          "line up with its 'deltas'", "Check completeness before merging tokens")
            return aggregated
        step_scores, spans_fns = self.step_scores, self._dict_aggregate_fn["step_scores"]["spans"]
        self.step_scores = {**step_scores, _EXPLAINED: before - deltas.double()}
        spans_fns[_EXPLAINED] = "sum"  # a merged span explains the sum of its attributed values, as for the logit
        try:
            aggregated = super().aggregate(aggregator, aggregate_fn, *args, **kwargs)
        finally:
            self.step_scores = step_scores
            del spans_fns[_EXPLAINED]
        aggregated._dict_aggregate_fn["step_scores"]["spans"].pop(_EXPLAINED, None)
        explained = aggregated.step_scores.pop(_EXPLAINED, None) if isinstance(aggregated.step_scores, dict) else None
        after = _column_totals(aggregated)
        if isinstance(explained, Tensor) and after is not None and after.shape == explained.shape \
                and "deltas" in aggregated.step_scores:
            aggregated.step_scores["deltas"] = (after - explained.double()).to(deltas.dtype)
        else:
            aggregated._drop_stale_deltas("the aggregation merged or sliced tokens and left columns that could not be "
                                          "lined up with their attributed values", "Check completeness before "
                                          "merging tokens")
        return aggregated

    def weight_attributions(self, step_fn_id: str):
        """inseq's ``weight_attributions``, dropping the step score ``deltas``: each column is multiplied by its step
        score ``step_fn_id``, so it sums to that multiple of the attributed value, and ``deltas`` (sum of
        contributions - attributed value), computed before, no longer said what the columns sum to (a column weighted
        by its probability summed to 1e-5 while ``deltas`` still claimed 1e-7 of the logit), silently. A float64
        output is weighted at float64 (inseq's own rounded it to float32, 1e-8 of each score: quirk 7 of
        :class:`_Inseq071`)."""
        wide = any(isinstance(t, Tensor) and t.dtype == torch.float64
                   for t in (self.source_attributions, self.target_attributions))
        weighted = (_Inseq071.weight_at_float64(self, step_fn_id) if wide
                    else super().weight_attributions(step_fn_id))
        weighted._drop_stale_deltas(f"weight_attributions({step_fn_id!r}) multiplied each column by its step score "
                                    f"{step_fn_id!r}, so the columns no longer sum to the attributed values",
                                    "Check completeness before weighting")
        return weighted

    # inseq 0.7.1's own bounds reduce over every score with max(), which fails on a row without columns (a row that
    # generated nothing: inseq's show() warns "Found empty attributions" for it, then failed here): such a row has no
    # bound of its own, so it counts as 0, as inseq starts its bounds
    @property
    def minimum(self) -> float:
        return min([0.0] + [float(torch.nan_to_num(t).min()) for t in (self.source_attributions,
                                                                      self.target_attributions)
                            if isinstance(t, Tensor) and t.numel()])

    @property
    def maximum(self) -> float:
        return max([0.0] + [float(torch.nan_to_num(t).max()) for t in (self.source_attributions,
                                                                      self.target_attributions)
                            if isinstance(t, Tensor) and t.numel()])


@dataclass(eq=False, repr=False)
class BcosStepAttribution(FeatureAttributionStepOutput):
    """One generation step of the "bcos" method (contributions per prefix token and embedding dimension)."""

    _sequence_cls: type[FeatureAttributionSequenceOutput] = BcosSequenceAttribution

    def __post_init__(self):
        # inseq's __post_init__ casts every step to float32, which rounded a float64 model's scores (1e-8 of them)
        # away from its explanation and its logit while ``deltas``, computed before, read 0: keep float64
        wide = any(isinstance(t, Tensor) and t.dtype == torch.float64
                   for t in (self.source_attributions, self.target_attributions))
        if not wide:
            super().__post_init__()
            return
        to = self.to
        self.to = lambda device: self if device == torch.float32 else to(device)
        try:
            super().__post_init__()
        finally:
            del self.to

    def remap_from_filtered(self, target_attention_mask, batch, is_final_step_method: bool = False) -> None:
        # inseq 0.7.1 reads batch.sources, which a decoder-only batch lacks, whenever a generated row has ended
        # before the others (its step is filtered out): a batch whose rows stop at different steps failed with
        # "'DecoderOnlyBatch' object has no attribute 'sources'". A decoder-only step has no source attributions,
        # so inseq takes the batch size from the target tokens; the prefix stands in for the sources it never reads
        if not hasattr(batch, "sources"):
            batch = SimpleNamespace(sources=SimpleNamespace(input_tokens=batch.target_tokens),
                                    target_tokens=batch.target_tokens)
        super().remap_from_filtered(target_attention_mask, batch, is_final_step_method)


# ------------------------------------------------------------------------------------------ the method


def _supported_text() -> str:
    return (f"causal LMs {', '.join(_CAUSAL_LMS)} with inseq.load_model(model, 'bcos'), and sequence "
            f"classifiers {', '.join(_CLASSIFIERS)} with bcos_plugins.adapters.inseq.load_classifier")


def _explainable_model(model: nn.Module, *, classifier: bool) -> tuple[nn.Module, ArchitectureSpec]:
    """The B-cos model and its spec, or an :class:`UnsupportedModelError` saying what is supported."""
    # a tokenizer where the model goes (load_classifier(tokenizer, model)) was read as an unknown architecture, its
    # class listed beside some thirty supported ones, the swap unsaid: the package's one reading of such stand-ins
    require_model_object(model, only_stand_ins=True)
    name = type(model).__name__
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model. bcosify has no encoder-decoder architecture, so 'bcos' cannot "
            f"explain it exactly. Supported: {_supported_text()}. For this model use another inseq method, e.g. "
            "'input_x_gradient' or 'integrated_gradients'."
        )
    try:
        spec = spec_for(model)
    except TypeError:
        raise UnsupportedModelError(
            f"{name} is not an architecture bcosify knows ({', '.join(supported_architectures())}). Supported by "
            f"'bcos': {_supported_text()}."
        ) from None
    if classifier and not spec.is_classifier:
        raise UnsupportedModelError(f"load_classifier needs a sequence classifier ({', '.join(_CLASSIFIERS)}); "
                                    f"got {name}. Causal LMs go through inseq.load_model(model, 'bcos').")
    if not classifier and spec.is_classifier:
        raise UnsupportedModelError(
            f"{name} is a sequence classifier; inseq attributes generation models only. Use "
            "bcos_plugins.adapters.inseq.load_classifier(model, tokenizer).attribute(texts) for per-class token "
            "attributions as inseq output objects."
        )
    if not classifier and spec.head != "causal_lm":  # the registry's head, not an attribute that could be anything
        what = ("a masked LM, which predicts tokens in place and cannot generate" if spec.head == "masked_lm"
                else "a base model: it returns hidden states and has no LM head to generate with")
        raise UnsupportedModelError(f"{name} is {what}. Supported: {_supported_text()}.")
    # a config.return_dict=False that the head cannot run with failed at the first attribute call, inside transformers
    require_head_output_object(model)
    if not has_dynamic_weights(model):
        settings = getattr(model.config, BCOS_CONFIG_KEY, None)
        if not isinstance(settings, dict) or "b" not in settings:
            raise UnsupportedModelError(
                f"{name} has no B-cos (dynamic-weight) modules, so its input x gradient is not an exact W(x)x "
                "explanation. Convert it with bcos_plugins.bcosify(model) and fine-tune it (or load a saved B-cos "
                "model), or use inseq's 'input_x_gradient' for plain input x gradient."
            )
        # A folder saved from a B-cos model, loaded by transformers as the stock class (inseq.load_model(path)):
        # convert it again as it was saved (B per layer, query/key choice), as bcos_plugins.load_bcos_model does.
        folder = getattr(model.config, "_name_or_path", "")
        if not (isinstance(folder, str) and os.path.isdir(folder)):
            raise UnsupportedModelError(
                f"{name} carries B-cos settings (config.bcos) but stock modules, and the folder it was loaded from "
                f"({folder!r}) is not a local folder, so the B each layer was saved with cannot be read. Load it "
                "with bcos_plugins.load_bcos_model(folder) and pass that model to inseq.load_model(model, 'bcos').")
        logger.info("%s carries B-cos settings (config.bcos) but stock modules: converting it as saved in %s",
                    name, folder)
        # the weights must be the folder's own: a subfolder or variant loaded by transformers names the folder alone
        refuse_weights_from_elsewhere(model, folder, weight_files(folder, True))
        _, without_b = reconvert_stock_load(model, folder)
        if without_b:
            raise UnsupportedModelError(
                f"{folder} stores no B for the B-cos layers {without_b}; restore the folder from the original "
                "save_pretrained.")
    return model, spec


def _attribute_in_eval_mode(attribution_model: AttributionModel, model: nn.Module) -> None:
    """``attribution_model.attribute`` with the model in eval mode throughout (idempotent): inseq's ``load_model`` puts
    it in eval mode once, but a model set back to training mode afterwards generated with dropout and took its step
    scores with dropout (a GPT-2's ``logit`` step score 0.28 off the attributions' total), while ``LayerBcos`` explained
    it in eval mode; every module's own flag comes back afterwards."""
    if getattr(attribution_model.attribute, "_in_eval_mode", False):
        return
    unpatched = attribution_model.attribute

    @functools.wraps(unpatched)
    def attribute(*args, **kwargs):
        _refuse_token_inputs(args[0] if args else kwargs.get("input_texts"))
        args, kwargs, asked = _without_requested_deltas(attribution_model, unpatched, args, kwargs)
        with evaluating(model):
            out = unpatched(*args, **kwargs)
        if asked is not None:
            # inseq records the step scores it was asked for in info["step_scores"] (merge_attributions compares it):
            # the call's own list, "deltas" included, not the list inseq was handed without it
            out.info["step_scores"] = asked
        _only_each_rows_generated_columns(attribution_model, out, kwargs.get("skip_special_tokens", False))
        return out

    attribute._in_eval_mode = True
    attribution_model.attribute = attribute


def _bcos_also_when_asked_per_call() -> None:
    """``attribute(..., method="bcos")`` on a model loaded with another method runs as a model loaded with "bcos" runs,
    from its first such call (idempotent; wraps ``AttributionModel.attribute``, which every inseq model calls). inseq
    builds the method inside that call, after the call began, so :func:`_attribute_in_eval_mode` came too late for
    it: a model set back to training mode generated and was scored with dropout (attributions 0.12 off the eval-mode
    ones on a tiny GPT-2, silently), and ``step_scores=["deltas"]`` failed with inseq's "Step score deltas not found"."""
    original = AttributionModel.attribute
    if getattr(original, "_bcos_per_call", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def attribute(self, *args, **kwargs):
        try:
            method = signature.bind(self, *args, **kwargs).arguments.get("method")
        except TypeError:  # inseq's own error for a call that does not fit its signature
            method = None
        model = getattr(self, "model", None)
        # a model "bcos" will refuse (no B-cos modules, no saved B-cos settings) keeps inseq's own call for its methods
        if method == METHOD_NAME and not getattr(self.attribute, "_in_eval_mode", False) \
                and isinstance(model, nn.Module) and (has_dynamic_weights(model) or isinstance(
                    getattr(getattr(model, "config", None), BCOS_CONFIG_KEY, None), dict)):
            _attribute_in_eval_mode(self, model)
            return self.attribute(*args, **kwargs)
        return original(self, *args, **kwargs)

    attribute._bcos_per_call = True
    AttributionModel.attribute = attribute


_bcos_also_when_asked_per_call()

# keywords inseq's attribute reads from its **kwargs itself after the split (skip_special_tokens), or splits off whole
_INSEQ_OWN_KWARGS = frozenset({"skip_special_tokens", "attribution_args", "attributed_fn_args", "step_scores_args"})


def _bcos_refuses_unknown_keywords() -> None:
    """``attribute(..., method="bcos", tagret=1)`` (a keyword no part of the call reads: not inseq's, not LayerBcos's,
    not the attributed function's, not a step score's) is refused with a ``TypeError`` naming it (idempotent; wraps the
    ``extract_args`` inseq's ``AttributionModel.attribute`` splits its keywords with). inseq only logged "Unused
    arguments during attribution" and attributed without it: ``contrast_targets=`` with the default attributed
    function explained the plain logit, silently. Other methods keep inseq's log line."""
    import inseq.models.attribution_model as host

    original = host.extract_args
    if getattr(original, "_bcos_refuses_unknown", False):
        return

    @functools.wraps(original)
    def extract_args(attribution_method, attributed_fn, step_scores, default_args, **kwargs):
        split = original(attribution_method, attributed_fn, step_scores, default_args, **kwargs)
        # (the marker, not the class: a reloaded module registers no second "bcos" and keeps the first class)
        if getattr(attribution_method, "_registered_by_bcos_plugins", False):
            used = set().union(*(part.keys() for part in split))
            # (None is how a caller leaves an optional keyword out)
            unknown = [k for k, v in kwargs.items() if k not in used and k not in _INSEQ_OWN_KWARGS and v is not None]
            if unknown:
                fn = getattr(attributed_fn, "__name__", type(attributed_fn).__name__)
                raise argument_error(
                    unknown[0], f"{'is' if len(unknown) == 1 else f'and {unknown[1:]} are'} read by no part of this "
                    f"attribute call (inseq's method \"bcos\", the attributed function {fn}, the step scores "
                    f"{list(step_scores or [])}): inseq would only log {'it' if len(unknown) == 1 else 'them'} and "
                    f"attribute without {'it' if len(unknown) == 1 else 'them'}",
                    "Check the spelling; contrast_targets= needs attributed_fn='contrast_prob_diff' (or another "
                    "contrastive function); keywords of other methods belong to those methods", kind=BcosTypeError)
        return split

    extract_args._bcos_refuses_unknown = True
    host.extract_args = extract_args


_bcos_refuses_unknown_keywords()


def _refuse_token_inputs(input_texts) -> None:
    """inseq's ``attribute`` takes the prompts as texts: the tokenizer's output failed inside inseq with "IndexError:
    list index out of range" and a tensor of ids with "Boolean value of Tensor with more than one value is
    ambiguous", naming neither the argument nor the fix."""
    if isinstance(input_texts, Mapping | Tensor):
        what = (f"the tokenizer's output (a {type(input_texts).__name__})" if isinstance(input_texts, Mapping)
                else "a tensor of token ids")
        raise argument_error("input_texts", f"got {what}; inseq's attribute takes the prompts as texts and tokenises "
                             "them itself", "Pass the strings, e.g. attribute(['Once upon a time'], ...) (from ids: "
                             "tokenizer.batch_decode(ids, skip_special_tokens=True))", kind=BcosTypeError)


def _without_requested_deltas(attribution_model: AttributionModel, attribute, args: tuple, kwargs: dict
                              ) -> tuple[tuple, dict, list | tuple | None]:
    """The call's arguments with ``"deltas"`` left out of ``step_scores`` when "bcos" attributes: the method stores
    the completeness deltas as that step score at every step anyway (:meth:`_BcosMethod.attribute_step`), but inseq
    looks each requested name up in its step-function registry first, where "deltas" is none, and failed with its
    own "Step score deltas not found ... register a custom step score". A registered "deltas" would not do: inseq
    computes a registered score from the forward pass alone and writes it over the step's deltas, and every other
    method would find it too. Calls with another method keep their step scores (and inseq's answer).

    The third value is the call's own ``step_scores`` where "deltas" was left out (``None`` otherwise): the caller
    puts it back in the output's ``info["step_scores"]``, which listed only what inseq was handed (``[]`` for
    ``step_scores=["deltas"]``) while ``step_scores["deltas"]`` was there."""
    try:
        bound = inspect.signature(attribute).bind_partial(*args, **kwargs)
    except TypeError:  # a call that does not fit inseq's signature gets inseq's own error
        return args, kwargs, None
    scores = bound.arguments.get("step_scores")
    method = bound.arguments.get("method") or getattr(attribution_model.attribution_method, "method_name", None)
    if method != METHOD_NAME or not isinstance(scores, list | tuple) or "deltas" not in scores:
        return args, kwargs, None
    bound.arguments["step_scores"] = [score for score in scores if score != "deltas"]
    return bound.args, bound.kwargs, list(scores)


def _only_each_rows_generated_columns(attribution_model: AttributionModel, out: FeatureAttributionOutput,
                                      skip_special_tokens: bool) -> None:
    """Give each "bcos" row of a batch the columns of the tokens it generated, and only those.

    inseq 0.7.1 re-encodes the generated texts left-padded to the batch's longest and attributes the same steps for
    every row, so a row that generated fewer tokens than the longest had its prompt's last tokens taken for a
    generation: ``source`` empty, columns labelled with prompt tokens (the first one a logit after padding only).
    A row that generated nothing (its end-of-sequence token at once) also had its columns shifted: the column labelled
    w30 held w3's logit after padding only (its own "saliency" and "input_x_gradient" do the same, once their crash on
    such batches is patched), silently. Now a row that generated nothing gets no columns and its prompt as source and
    target; a row whose steps are all real keeps the columns of its generated tokens; a row whose columns inseq
    shifted (a padding step among them) and that generated tokens cannot be put right here and warns."""
    if not isinstance(out, FeatureAttributionOutput) or out.info.get("attribution_method") != METHOD_NAME:
        return
    inputs, generated = out.info.get("input_texts"), out.info.get("generated_texts")
    if not (isinstance(inputs, list) and isinstance(generated, list)
            and len(inputs) == len(generated) == len(out.sequence_attributions)):
        return
    tokenizer, shifted = attribution_model.tokenizer, []
    for row, (prompt, text) in enumerate(zip(inputs, generated, strict=True)):
        text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        seq, n_new = out.sequence_attributions[row], len(text_ids) - len(prompt_ids)
        scores = seq.target_attributions
        if text_ids[:len(prompt_ids)] != prompt_ids or not isinstance(scores, Tensor) or scores.ndim < 2:
            continue
        n_columns = scores.shape[1]
        if n_new == 0:
            ids = attribution_model.encode([prompt], add_special_tokens=not skip_special_tokens).input_ids[0].tolist()
            tokens = [TokenWithId(t, i) for t, i in zip(attribution_model.convert_ids_to_tokens(
                torch.tensor(ids), skip_special_tokens=False), ids, strict=True)]
            out.sequence_attributions[row] = type(seq)(
                source=tokens, target=deepcopy(tokens), source_attributions=None,
                target_attributions=scores.new_full((len(ids), 0, *scores.shape[2:]), float("nan")),
                step_scores={name: score[:0] for name, score in (seq.step_scores or {}).items()},
                sequence_scores=seq.sequence_scores, attr_pos_start=len(ids), attr_pos_end=len(ids))
            continue
        if n_columns <= n_new:
            continue
        deltas = (seq.step_scores or {}).get("deltas")
        if not isinstance(deltas, Tensor) or len(deltas) != n_columns or bool(deltas.isnan().any()):
            shifted.append(row)  # a filtered (padding) step among the columns: inseq dropped the last ones
            continue
        start = len(seq.target) - n_new
        out.sequence_attributions[row] = type(seq)(
            source=deepcopy(seq.target[:start]), target=seq.target, source_attributions=None,
            target_attributions=scores[:, n_columns - n_new:],
            step_scores={name: score[n_columns - n_new:] for name, score in (seq.step_scores or {}).items()},
            sequence_scores=seq.sequence_scores, attr_pos_start=start, attr_pos_end=len(seq.target))
    if shifted:
        warnings.warn(f"inseq: row(s) {shifted} generated fewer tokens than the batch's longest and inseq 0.7.1 "
                      "attributed padding steps in their place, so their columns are labelled with other tokens than "
                      "the ones attributed. Attribute them one prompt at a time (or batch prompts that generate as "
                      "many tokens: generation_args={'min_new_tokens': n, 'max_new_tokens': n}).",
                      UserWarning, stacklevel=3)


def _refuse_other_methods_keywords_for_inseq(given) -> None:
    refuse_other_methods_keywords('the inseq method "bcos"', given,
                                  integrated_gradients='inseq\'s method="integrated_gradients"')


class _BcosMethod:
    """The "bcos" inseq method (registered as :class:`BcosInseqAttribution`); see the module docstring."""

    _registered_by_bcos_plugins = True

    def __init__(self, attribution_model, **kwargs):
        super().__init__(attribution_model, hook_to_model=False)
        self.model, self.spec = _explainable_model(attribution_model.model, classifier=False)
        # inseq itself checks nothing: a tokenizer with more tokens than the model's embedding rows failed at the
        # first attribute call, deep in the embedding (IndexError; a device-side assert on a GPU), and is refused
        # here as load_classifier refuses it; another model's tokenizer whose ids fit was read as this model's
        # tokens, silently (warned on strong evidence only, by the same check)
        require_tokenizer_fits(self.model, getattr(attribution_model, "tokenizer", None))
        # as inseq's layer methods: ids in, attributions at a layer of the model
        self.attribute_batch_ids = True
        self.forward_batch_embeds = False
        self.use_baselines = False
        if attribution_model.attribution_method is None:
            # "bcos" becomes this model's default method: make the logit (what B-cos decomposes) its target
            _Inseq071.set_default_attributed_fn(attribution_model, "logit")
        _Inseq071.generate_with_padding_mask(attribution_model)
        _attribute_in_eval_mode(attribution_model, self.model)
        point = text_attribution_point(self.model, self.spec)
        self.hook(target_layer=point.module, **kwargs)
        # the forward here is inseq's attributed function (a logit, a contrast, a probability) over inseq's own
        # target selection, not what LayerBcos would compare the attributions with; inseq's "deltas" step score
        # reports the gap instead
        self.method = LayerBcos(self.attribution_model, self.target_layer, model=self.model,
                                attribute_to_layer_input=point.where == "input", completeness_check=False)

    def get_attribution_args(self, **kwargs) -> tuple[dict[str, Any], dict[str, Any]]:
        # inseq logged "Unused arguments during attribution" for another method's keywords (n_steps=, baselines=,
        # internal_batch_size=) and attributed without them; LayerBcos, called directly, refuses them with the reason
        _refuse_other_methods_keywords_for_inseq(kwargs)
        return super().get_attribution_args(**kwargs)

    def attribute(self, *args, **kwargs) -> FeatureAttributionOutput:
        # the same keywords given as attribution_args={...} reach LayerBcos itself, after the generation: refused first
        _refuse_other_methods_keywords_for_inseq(kwargs.get("attribution_args") or {})
        with _Inseq071.positions_from_mask(self.model, self.spec), \
                _Inseq071.embeddings_without_hooks(self.attribution_model):
            return super().attribute(*args, **kwargs)

    def attribute_step(self, attribute_fn_main_args: dict[str, Any],
                       attribution_args: dict[str, Any] | None = None) -> BcosStepAttribution:
        """inseq's gradient step with the completeness delta always on, as a :class:`BcosStepAttribution`."""
        # inseq's own attribute_step (GradientAttributionRegistry), building our step directly: inseq's step class
        # casts to float32 when made, which rounded a float64 model's scores (BcosStepAttribution keeps float64)
        attributions, deltas = self.method.attribute(**attribute_fn_main_args, **(attribution_args or {}),
                                                     return_convergence_delta=True)
        source, target = get_source_target_attributions(attributions, self.attribution_model.is_encoder_decoder)
        return BcosStepAttribution(source_attributions=source, target_attributions=target,
                                   step_scores={"deltas": deltas})


_previous_method = _reuse_or_refuse(FeatureAttribution, METHOD_NAME)
if _previous_method is None:
    class BcosInseqAttribution(_BcosMethod, GradientAttributionRegistry):
        """inseq feature attribution method ``"bcos"``: exact B-cos contributions (see the module docstring)."""

        method_name = METHOD_NAME
else:  # registered by an earlier import of this file
    BcosInseqAttribution = _previous_method


# ------------------------------------------------------------------------------------------ classifiers


class BcosClassifier:
    """A B-cos sequence classifier with inseq-style attribution; build it with :func:`load_classifier`.

    ``attribute(texts)`` explains every class (or the classes ``target``) of every text with
    :func:`bcos_plugins.explain` and returns an inseq ``FeatureAttributionOutput``: per text one
    :class:`BcosSequenceAttribution` with ``source`` = the input tokens (padding removed, special tokens kept:
    they carry contributions too), ``target`` = the attributed classes (``TokenWithId(label, class_id)``),
    ``source_attributions`` of shape ``(tokens, classes, d_model)`` whose sum over tokens and ``d_model`` is each
    class logit, and step scores ``logit`` (the explained class logits), ``deltas`` (completeness error) and,
    when every class is attributed, ``probability``.
    """

    method_name = METHOD_NAME

    def __init__(self, model: nn.Module, tokenizer, label_names: Sequence[str] | None = None,
                 max_length: int | None = None):
        self.model, self.spec = _explainable_model(model, classifier=True)
        refuse_a_model_as_the_tokenizer(tokenizer, call="load_classifier(model, tokenizer)")
        require_tokenizer_fits(model, tokenizer)  # another model's tokenizer explained its tokens, silently
        self.tokenizer = tokenizer
        num_labels = model.config.num_labels
        if label_names is None:
            id2label = getattr(model.config, "id2label", None) or {}
            label_names = [str(id2label.get(i, f"LABEL_{i}")) for i in range(num_labels)]
        label_names = require_label_names(label_names)  # one string was split into characters, one per class
        if len(label_names) != num_labels:
            raise argument_error("label_names", f"{len(label_names)} names for a model with {num_labels} classes",
                                 "Pass one name per class, in class-id order")
        self.label_names = list(label_names)
        # 1.5 failed inside the tokenizer (TypeError), 0 as an "empty input" naming input_ids; one past the model's
        # position table was refused at attribute, naming input_ids and a tokenizer call the caller never made
        self.max_length = None if max_length is None else require_count("max_length", max_length)
        if self.max_length is not None:
            require_max_length_fits(model, self.max_length)
        self.model.eval()

    @property
    def info(self) -> dict[str, Any]:
        return {"model_name": getattr(self.model.config, "name_or_path", None) or None,
                "model_class": type(self.model).__name__,
                "tokenizer_class": type(self.tokenizer).__name__}

    def _classes(self, target: int | Sequence[int] | Tensor | None) -> list[int]:
        """The class ids of ``target``: an int or a 0-d integer tensor (one class), or a sequence or 1-d integer
        tensor of ids, read by the package's id parser (floats and bools refused, never truncated to a class)."""
        n = len(self.label_names)
        if target is None:
            return list(range(n))
        # a NumPy integer scalar (an id read from an array) is one class, as require_int reads it: it was refused as
        # "got int64 ... pass an int"
        if isinstance(target, numbers.Integral | Tensor) and (not isinstance(target, Tensor) or target.ndim == 0):
            classes = [require_int("target", target)]
        elif isinstance(target, str) or not (isinstance(target, Tensor) or hasattr(target, "__len__")):
            raise argument_error("target", f"must be a class id or a list of class ids, got {type(target).__name__}",
                                 "Pass an int, a list of ints or an integer tensor", kind=BcosTypeError)
        elif isinstance(target, Tensor) and target.ndim > 1:
            raise argument_error("target", f"must be a 0-d or 1-d tensor of class ids, got shape {tuple(target.shape)}",
                                 "Pass the class ids as a flat list or 1-d tensor (each text gets every one)")
        elif len(target) == 0:
            classes = []
        else:
            classes = require_row_ids("target", target, len(target), broadcast=False,
                                      form="class ids as an int, a list of ints or a 1-d integer tensor").tolist()
        bad = [c for c in classes if not 0 <= c < n]
        if bad or not classes:
            raise argument_error("target", f"must be class ids in [0, {n}); got {classes}",
                                 "Pass class ids of this model, or leave target out for all")
        return classes

    def attribute(self, texts: str | Sequence[str], target: int | Sequence[int] | Tensor | None = None,
                  batch_size: int = 8, **renamed) -> FeatureAttributionOutput:
        """Per-class token attributions of ``texts`` as an inseq ``FeatureAttributionOutput``.

        ``target``: the class id or ids to attribute (each text gets every one of them): an int, a list of ints or an
        integer tensor (0-d or 1-d); default every class.
        """
        refuse_renamed_keywords("BcosClassifier.attribute", renamed, {"target_classes": "target"})
        if not isinstance(texts, str):
            refuse_container_of_names("texts", texts)  # a BatchEncoding's keys were attributed as the texts
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise argument_error("texts", "attribute needs one or more non-empty strings", "Pass a text or a list of texts")
        classes = self._classes(target)
        # 0 failed inside range() ("arg 3 must not be zero"), a negative size with an IndexError on an empty output
        batch_size = require_int("batch_size", batch_size, minimum=1)
        sequences, predicted, cut_counts = [], [], []
        for start in range(0, len(texts), batch_size):
            batch_sequences, batch_predicted, batch_cut = self._attribute_batch(texts[start:start + batch_size],
                                                                                 classes, start)
            sequences += batch_sequences
            predicted += batch_predicted
            cut_counts += batch_cut
        # a text longer than max_length was explained as its first tokens without a word (its source shows only
        # those): warned as explain_dataset and predict warn
        warn_of_truncated_texts("BcosClassifier.attribute", cut_counts, self.max_length, self.model, self.tokenizer,
                                False, outcome="explained as")
        info = {
            "attribution_method": METHOD_NAME,
            "attributed_fn": "logit",
            "attr_pos_start": 0,
            "attr_pos_end": len(classes),
            "step_scores": sorted(sequences[0].step_scores),
            "input_texts": texts,
            # the model's predicted class over every class: an argmax over the attributed columns named a column, not a
            # class (target=[2, 0] labelled a class-2 prediction with the name of class 0), and a subset's best class
            # need not be the prediction
            "generated_texts": [self.label_names[c] for c in predicted],
            "target_classes": classes,
            **self.info,
        }
        return FeatureAttributionOutput(sequence_attributions=sequences, step_attributions=None, info=info)

    def _attribute_batch(self, texts: list[str], classes: list[int], first: int = 0
                         ) -> tuple[list[BcosSequenceAttribution], list[int], list[int | None]]:
        """The texts' sequences, the class each text is predicted (over every class, not only ``classes``) and each
        text's token count where ``max_length`` cut it (:func:`~bcos_plugins.corpus.truncated_token_counts`);
        ``first``: the index of ``texts[0]`` among the caller's texts."""
        device = next(self.model.parameters()).device
        if len(texts) > 1 and self.tokenizer.pad_token is None:
            raise BcosValueError("tokenizer: it has no pad token to batch texts with; set one (e.g. tokenizer.pad_token = "
                             "tokenizer.eos_token and model.config.pad_token_id to its id) or pass batch_size=1")
        # the mask asked for (mask_keywords, as predict asks): a tokenizer whose model_input_names leave it out failed
        # here with KeyError: 'attention_mask'
        enc = self.tokenizer(texts, padding=len(texts) > 1, truncation=self.max_length is not None,
                             max_length=self.max_length, return_tensors="pt", **mask_keywords(self.tokenizer)).to(device)
        ids: Int[Tensor, "batch pos"] = enc["input_ids"]
        mask: Int[Tensor, "batch pos"] = enc["attention_mask"]
        extra = {k: enc[k] for k in ("token_type_ids",) if k in enc}
        limit = position_limit(self.model).max_length
        if self.max_length is None and limit is not None and ids.shape[1] > limit:
            # refused by explain naming input_ids and a tokenizer call the caller never made
            long = [first + i for i, n in enumerate(mask.sum(1).tolist()) if n > limit]
            raise argument_error("texts", f"text(s) {long[:8]} have more tokens than the {limit} positions "
                                 f"{type(self.model).__name__} reads", f"Build it with load_classifier(model, tokenizer, "
                                 f"max_length={limit}) to explain their first {limit} tokens (a warning names the cut "
                                 "texts), or split the texts")
        # a refusal of left padding names the tokenizer's padding side (it named attention_mask, never passed)
        with padding_named_as_tokenizers(self.tokenizer):
            per_class = [explain(self.model, ids, mask, target=c, **extra) for c in classes]
        contributions = torch.stack([e.input_contributions for e in per_class], dim=2).cpu()
        logits = torch.stack([e.explained for e in per_class], dim=1).cpu()
        deltas = torch.stack([e.delta for e in per_class], dim=1).cpu()
        # every class's logit, for the prediction and the probabilities: softmax over the attributed columns was wrong
        # for a repeated class (target=[1, 1, 0] of 3 classes counted class 1 twice and left class 2 out)
        with torch.no_grad(), evaluating(self.model):  # as explain computes them: no dropout
            every_logit = self.model(**rows_as_alone_call(self.model, ids, mask, extra, spec=self.spec)).logits.cpu()
        all_classes = set(classes) == set(range(len(self.label_names)))
        sequences = []
        for row in range(len(texts)):
            keep = mask[row].bool().cpu()
            row_ids = ids[row].cpu()[keep].tolist()
            tokens = self.tokenizer.convert_ids_to_tokens(row_ids)
            scores = {"logit": logits[row], "deltas": deltas[row]}
            if all_classes:
                scores["probability"] = every_logit[row].double().softmax(-1)[classes].to(logits.dtype)
            sequences.append(BcosSequenceAttribution(
                source=[TokenWithId(t, i) for t, i in zip(tokens, row_ids, strict=True)],
                target=[TokenWithId(self.label_names[c], c) for c in classes],
                source_attributions=contributions[row][keep],
                target_attributions=None,
                step_scores=scores,
                attr_pos_start=0,
                attr_pos_end=len(classes),
            ))
        cut = (truncated_token_counts(self.tokenizer, texts, None, mask.sum(1).tolist(), self.max_length)
               if self.max_length is not None else [None] * len(texts))
        return sequences, every_logit.argmax(-1).tolist(), cut


def load_classifier(model: nn.Module, tokenizer, label_names: Sequence[str] | None = None,
                    max_length: int | None = None) -> BcosClassifier:
    """Wrap a B-cos sequence classifier (any ``*ForSequenceClassification`` of the registry: BERT, DistilBERT,
    RoBERTa, ModernBERT, GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2) for inseq-style attribution.

    Examples:
        >>> import torch
        >>> from bcos_plugins.adapters.inseq import load_classifier
        >>> clf = load_classifier(bcos_bert, tokenizer, label_names=["negative", "positive"])
        >>> out = clf.attribute(["a gripping, well acted film"])      # inseq FeatureAttributionOutput
        >>> out.show()                                               # tokens x classes, signed
        Source Saliency Heatmap
        ...
        >>> logits = bcos_bert(**tokenizer(["a gripping, well acted film"], return_tensors="pt")).logits
        >>> torch.allclose(out[0].source_attributions.sum(dim=(0, 2)), logits[0], atol=1e-5)   # the logits
        True
    """
    return BcosClassifier(model, tokenizer, label_names=label_names, max_length=max_length)
