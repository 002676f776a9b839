"""sae-lens adapter: which tokens build an SAE feature (:func:`explain_sae_feature`), what spliced SAEs' error
terms carry (:func:`sae_error_share`), and SAE features traced through a bilinear layer, from the weights
(paper §3.1, §5).

Given a bilinear layer and sae-lens ``SAE`` objects on its input and its output (any architecture with
``W_enc`` (d_in, d_sae) and ``W_dec`` (d_sae, d_in)), with ``e`` the output SAE's encoder direction of an
output feature and ``D`` the input SAE's decoder directions (rows)::

    pre-activation of the output feature = e . out(x) + const = x^T Q(e) x + const
    Q_feat = D Q(e) D^T         (d_sae_in, d_sae_in): how input-feature pairs build the output feature
    x^T Q(e) x = sum_i lambda_i (v_i . x)^2 ~= sum over the top-k |lambda_i|   (low-rank approximation)

For TopK SAEs trained with ``rescale_acts_by_decoder_norm`` the effective directions are
``W_enc[:, f] * ||W_dec[f]||`` and ``W_dec[f] / ||W_dec[f]||`` (that is what their ``encode``/``decode``
compute). The maths lives in :mod:`bcos_plugins.bilinear`; this module only reads sae-lens' conventions and
checks that the SAEs belong to the layer: widths (``cfg.d_in``) and hook names (``cfg.metadata.hook_name``).

Hook names for a TransformerLens bilinear model (``model.blocks[L].mlp``): the MLP reads
``blocks.L.ln2.hook_normalized`` (or ``blocks.L.hook_resid_mid`` / ``blocks.L.hook_mlp_in`` when the model has
no normalisation; ``blocks.L.mlp.hook_in``, its exact input, in sae-lens' ``HookedSAETransformer``) and writes
``blocks.L.hook_mlp_out`` (except where the block normalises the MLP's output again,
``use_normalization_before_and_after``: ``hook_mlp_out`` is then after ``ln2_post``, and an output SAE there is
refused). TransformerLens records ``hook_normalized`` before ln2 multiplies by its weight (a LayerNorm also adds its
bias), so for an SAE there pass ``input_norm=model.blocks[L].ln2``: the analysed layer is then
``x -> mlp(x * ln2.w + ln2.b)``, exactly, in the SAE's coordinates. For other layers pass
``input_hook=``/``output_hook=`` to have the SAEs' hook names checked.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float
from sae_lens import SAE
from torch import Tensor

from bcos_plugins._checks import require_int
from bcos_plugins.attribution import Direction
from bcos_plugins.bilinear import (
    Eigendecomposition,
    augment_input,
    bilinear_weights,
    eigendecompose,
    eigenvector_activations,
    interaction_matrix,
    top_eigen_indices,
)
from bcos_plugins.bilinear.sources import fold_input_norm, lens_mlp_prefix
from bcos_plugins.errors import BcosTypeError, BcosValueError, argument_error
from bcos_plugins.nn.functional import at_least_float32

from ._lens.bridge import linear_normalized, native_norm_input_hook
from ._lens.explain import LensExplanation, explain_lens_value
from ._lens.hook_point import DynamicHookPoint
from ._lens.sae_error import sae_error_capture

__all__ = [
    "BilinearSAEInteractions",
    "FeatureInteraction",
    "LowRankCorrelation",
    "SAEErrorShare",
    "SAEFeatureExplanation",
    "expected_hook_names",
    "explain_sae_feature",
    "sae_error_share",
]


class FeatureInteraction(NamedTuple):
    """``value = Q_feat[first, second]`` (``first <= second``), input-SAE feature indices."""

    first: int
    second: int
    value: float


class LowRankCorrelation(NamedTuple):
    """Pearson correlation, on tokens where the output feature is active, between its activation and the
    top-``ranks[r]`` eigenvector approximation: ``correlations[r, f]``; NaN where fewer than 2 active tokens."""

    ranks: list[int]
    features: list[int]
    correlations: Float[Tensor, "n_ranks n_features"]
    active_tokens: Float[Tensor, " n_features"]


# TransformerLens' LayerNorm and RMSNorm record hook_normalized before they multiply by their weight (a LayerNorm then
# adds its bias); their weightless forms (LNPre, RMSPre) record their output there
_WEIGHTED_NORMS = ("LN", "RMS")


def expected_hook_names(layer) -> tuple[set[str], set[str]] | None:
    """Input and output hook names of a TransformerLens MLP inside a set-up model; ``None`` if unknown.

    The input is ``blocks.L.ln2.hook_normalized`` behind a norm (read before a weighted norm's weight: see
    :class:`BilinearSAEInteractions`' ``input_norm``), ``blocks.L.hook_resid_mid`` / ``blocks.L.hook_mlp_in``
    without one, and ``blocks.L.mlp.hook_in`` (the MLP's exact input) where sae-lens' ``HookedSAETransformer``
    records it."""
    prefix = lens_mlp_prefix(layer)
    if prefix is None:
        return None
    cfg = getattr(layer, "cfg", None)
    if getattr(cfg, "normalization_type", None) is None:
        inputs = {f"{prefix}.hook_resid_mid", f"{prefix}.hook_mlp_in"}
    else:
        inputs = {f"{prefix}.ln2.hook_normalized"}
    hook_in = getattr(layer, "hook_in", None)
    if getattr(hook_in, "name", None):
        inputs.add(hook_in.name)
    return inputs, {f"{prefix}.hook_mlp_out"}


def _refuse_input_before_norm_weight(layer, sae) -> None:
    """Refuse an input SAE on ``blocks.L.ln2.hook_normalized`` of a weighted norm when no ``input_norm`` is given:
    the MLP reads ``hook_normalized * ln2.w (+ ln2.b)``, so the SAE's directions are in other coordinates than the
    layer's input, and every interaction, output activation and correlation was another layer's, silently (a bilinear
    Llama from hooked_transformer_from_hf, or any trained bilinear_config model, whose ln2 weight is not 1)."""
    prefix = lens_mlp_prefix(layer)
    norm = getattr(getattr(layer, "cfg", None), "normalization_type", None)
    hook = sae.cfg.metadata.hook_name
    if prefix is None or norm not in _WEIGHTED_NORMS or hook != f"{prefix}.ln2.hook_normalized":
        return
    bias = " and adds its bias" if norm == "LN" else ""
    raise argument_error(
        "input_sae", f"it reads {hook!r}, which TransformerLens records before ln2 multiplies by its weight{bias}: "
        f"the MLP reads hook_normalized * ln2.w{' + ln2.b' if bias else ''}, so the SAE's directions are not in the "
        "layer's input coordinates and the interactions, activations and correlations would be another layer's",
        f"Pass input_norm={prefix.replace('blocks.', 'model.blocks[')}].ln2 (its weight{' and bias' if bias else ''} "
        f"are folded into the analysed layer, exactly), or train the input SAE on {prefix}.mlp.hook_in (sae-lens' "
        "HookedSAETransformer records the MLP's input there)")


def _refuse_output_after_post_norm(layer, sae) -> None:
    """Refuse an output SAE on ``blocks.L.hook_mlp_out`` of a model that normalises each MLP output again
    (``use_normalization_before_and_after``, Gemma 2's layout): TransformerLens records that hook after ``ln2_post``,
    a per-token scale no weight can fold, so it is not the bilinear layer's output and the output SAE's activations
    computed from the weights were another layer's (off by up to 5.5 on a tiny model), silently."""
    prefix = lens_mlp_prefix(layer)
    hook = sae.cfg.metadata.hook_name
    if prefix is None or hook != f"{prefix}.hook_mlp_out" \
            or not getattr(getattr(layer, "cfg", None), "use_normalization_before_and_after", False):
        return
    raise argument_error(
        "output_sae", f"it reads {hook!r}, which this model records after {prefix}.ln2_post normalises the MLP's output "
        "again (use_normalization_before_and_after): a per-token scale, so it is not the bilinear layer's output and "
        "the output feature activations, interactions and correlations would be another layer's",
        "Train the output SAE on the MLP's own output (TransformerLens records none in this layout: add a hook of "
        "your own and pass output_hook= with its name), or analyse a model without use_normalization_before_and_after")


def _check_sae(sae, role: str, width: int, hooks: set[str] | None) -> None:
    if not isinstance(sae, SAE):
        raise BcosTypeError(
            f"the {role} SAE must be a sae_lens.SAE (any architecture, e.g. TopKSAE or a TrainingSAE), got "
            f"{type(sae).__name__}"
        )
    if sae.cfg.d_in != width:
        raise BcosValueError(
            f"the {role} SAE has d_in={sae.cfg.d_in} but the bilinear layer's {role} has width {width}; it was trained "
            f"on a different activation."
        )
    if sae.cfg.normalize_activations != "none":
        raise BcosValueError(
            f"the {role} SAE normalises its inputs ({sae.cfg.normalize_activations!r}), so its directions are not in "
            "the layer's coordinates; fold the normalisation first (e.g. sae.fold_activation_norm_scaling_factor(s))."
        )
    if sae.cfg.reshape_activations != "none":
        raise BcosValueError(f"the {role} SAE reshapes its inputs ({sae.cfg.reshape_activations!r}); it belongs to "
                         "an attention hook, not to an MLP.")
    if hooks is None:
        return
    hook_name = sae.cfg.metadata.hook_name
    if hook_name is None:
        raise BcosValueError(
            f"the {role} SAE has no hook name (cfg.metadata.hook_name is None), so it cannot be checked against the "
            f"layer, which reads {sorted(hooks)}; set sae.cfg.metadata.hook_name = {sorted(hooks)[0]!r}."
        )
    if hook_name not in hooks:
        hint = ""
        if role == "input" and hook_name.endswith("hook_resid_mid") and any(h.endswith("ln2.hook_normalized")
                                                                           for h in hooks):
            hint = (" The MLP reads the normalised residual stream (ln2), not hook_resid_mid; train the input SAE on "
                    "ln2.hook_normalized.")
        raise BcosValueError(
            f"the {role} SAE was trained on {hook_name!r} but the bilinear layer's {role} is {sorted(hooks)}.{hint}"
        )


def _feature_ids(features, name: str, d_sae: int, role: str) -> Tensor:
    """Feature ids as a 1-d long tensor; refuses floats, empty lists and ids outside ``[0, d_sae)`` (a negative
    id would silently index from the end)."""
    ids = torch.as_tensor(features)
    if ids.numel() == 0:
        raise BcosValueError(f"{name}: no feature ids given. Pass at least one index in [0, {d_sae}).")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise BcosTypeError(f"{name}: feature ids must be ints, got dtype {ids.dtype}. Pass indices of the {role} "
                            "SAE's features.")
    ids = ids.to(torch.long).reshape(-1)
    bad = ids[(ids < 0) | (ids >= d_sae)]
    if bad.numel():
        raise BcosValueError(f"{name}: ids {bad.tolist()[:8]} are outside [0, {d_sae}), the {role} SAE's features "
                             f"(d_sae={d_sae}). Pass indices in that range.")
    return ids


def _encoder_directions(sae) -> Float[Tensor, "d_in d_sae"]:
    directions = sae.W_enc.detach()
    if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
        directions = directions * sae.W_dec.detach().norm(dim=-1)
    return directions


def _decoder_directions(sae) -> Float[Tensor, "d_sae d_in"]:
    directions = sae.W_dec.detach()
    if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
        directions = directions / directions.norm(dim=-1, keepdim=True)
    return directions


def _bilinear_layer(layer):
    """The layer's bilinear weights, or an error that says which layers are bilinear."""
    try:
        return bilinear_weights(layer)
    except (TypeError, ValueError) as error:  # its refusal names `source`; here the argument is `layer`
        raise BcosTypeError(
            f"layer: {type(layer).__name__} is not a bilinear layer P((W x) * (V x)), so it has no feature "
            f"interactions to read ({error}) Bilinear layers: model.blocks[L].mlp of a HookedTransformer built from "
            "bcos_plugins.adapters.transformer_lens.bilinear_config, or of hooked_transformer_from_hf(llama) for a "
            "transformers Llama with hidden_act='linear' (not B-cosified); a BilinearMLP; a transformers gated MLP "
            "with the identity activation. The MLP of a B-cos or GELU model (e.g. a B-cos GPT-2 block) is not one: "
            "explain such a model with explain_logits or token_component_decomposition") from error


def _layer_inputs(mlp_inputs, d_in: int, name: str = "mlp_inputs") -> Tensor:
    """``mlp_inputs`` as ``(tokens, d_in)``; refuses another width (a reshape would silently mix tokens)."""
    if not isinstance(mlp_inputs, Tensor) or not mlp_inputs.is_floating_point():
        what = mlp_inputs.dtype if isinstance(mlp_inputs, Tensor) else type(mlp_inputs).__name__
        raise BcosTypeError(f"{name}: expected a float tensor (..., {d_in}) of the layer's input activations, got "
                            f"{what}. Pass the activations at the input SAE's hook, e.g. "
                            "cache[input_sae.cfg.metadata.hook_name]")
    if mlp_inputs.ndim == 0 or mlp_inputs.shape[-1] != d_in:
        raise BcosValueError(f"{name}: shape {tuple(mlp_inputs.shape)}, but the bilinear layer reads vectors of width "
                             f"{d_in} (last dimension). Pass the activations at the layer's input (the input SAE's "
                             "hook), shaped (..., d_in)")
    if mlp_inputs.numel() == 0:  # was refused as a width mismatch, naming the very width it had
        raise argument_error(name, f"shape {tuple(mlp_inputs.shape)} holds no tokens", "Pass at least one token's "
                             "activations (e.g. cache[input_sae.cfg.metadata.hook_name])")
    return mlp_inputs.reshape(-1, d_in)


class BilinearSAEInteractions:
    """Feature-level analysis of one bilinear layer with sae-lens SAEs on its input and output.

    Args:
        layer: anything :func:`bcos_plugins.bilinear.bilinear_weights` accepts (our ``BilinearMLP``,
            ``model.blocks[L].mlp`` of a bilinear ``HookedTransformer``, plain tensors ``(W, V, P)``).
            A layer with biases is analysed exactly through its augmented form on ``[x, 1]``.
        input_sae: SAE on the layer's input activations (``cfg.d_in == d_in``).
        output_sae: SAE on the layer's output (``cfg.d_in == d_out``).
        input_hook, output_hook: hook names the SAEs must carry; by default taken from a TransformerLens
            MLP, and unchecked for layers that have no hook names.
        input_norm: the TransformerLens norm in front of ``layer`` (``model.blocks[L].ln2``), needed for an input
            SAE on ``blocks.L.ln2.hook_normalized`` behind a LayerNorm / RMSNorm: TransformerLens records that hook
            before the norm's weight (and a LayerNorm's bias), so the analysed layer is ``x -> layer(x * w + b)``
            (exact; ``weights`` holds it). Such an SAE without it is refused.

    Raises:
        TypeError: on a layer that is not bilinear (e.g. the MLP of a B-cos GPT-2 block); the message lists
            the layers that are.
        ValueError: on a width mismatch, a hook-name mismatch (or a missing hook name where one is
            expected), SAEs whose inputs are normalised or reshaped, an input SAE on ``ln2.hook_normalized``
            behind a weighted norm without ``input_norm``, or an output SAE on ``hook_mlp_out`` of a model that
            normalises the MLP's output again (``use_normalization_before_and_after``).
    """

    def __init__(self, layer, input_sae, output_sae, *, input_hook: str | None = None,
                 output_hook: str | None = None, input_norm=None) -> None:
        weights = _bilinear_layer(layer)
        expected = expected_hook_names(layer)
        input_hooks = {input_hook} if input_hook else (expected[0] if expected else None)
        if input_norm is not None:
            weights = fold_input_norm(weights, input_norm, layer)
            norm_hook = getattr(input_norm.hook_normalized, "name", None)
            # the folded layer reads the norm's hook_normalized: an SAE on the MLP's own input (hook_in) would be
            # multiplied by the norm's weight twice
            input_hooks = {input_hook} if input_hook else ({norm_hook} if norm_hook else None)
        self.augmented = weights.has_bias
        self.weights = weights
        self._analysed = weights.augmented() if self.augmented else weights
        output_hooks = {output_hook} if output_hook else (expected[1] if expected else None)
        _check_sae(input_sae, "input", weights.d_in, input_hooks)
        _check_sae(output_sae, "output", weights.d_out, output_hooks)
        if input_norm is None:
            _refuse_input_before_norm_weight(layer, input_sae)
        _refuse_output_after_post_norm(layer, output_sae)
        self.input_sae, self.output_sae = input_sae, output_sae

    def _encoder(self, features) -> Float[Tensor, "n d_out"]:
        features = _feature_ids(features, "output_feature", self.output_sae.cfg.d_sae, "output")
        return _encoder_directions(self.output_sae)[:, features].T.to(self.weights.P.dtype)

    def _input_decoder(self, input_features, dtype) -> tuple[Tensor, Tensor]:
        """The input SAE's decoder directions (of ``input_features`` if given) and their feature ids."""
        decoder = _decoder_directions(self.input_sae).to(dtype)
        if input_features is None:
            return decoder, torch.arange(decoder.shape[0])
        names = _feature_ids(input_features, "input_features", self.input_sae.cfg.d_sae, "input")
        return decoder[names], names

    def _input_coordinates(self, x: Tensor) -> Tensor:
        return augment_input(x) if self.augmented else x

    def _one_encoder(self, output_feature) -> Float[Tensor, " d_out"]:
        """The encoder direction of exactly one output feature: the single-feature methods read row 0, so a list of
        features silently gave the first feature's answer alone."""
        if torch.as_tensor(output_feature).numel() > 1:
            raise BcosValueError(f"output_feature: one feature id, got {output_feature!r}. Call once per feature (or use "
                                 "spectrum(features) / low_rank_approximation(x, features, rank) for several)")
        return self._encoder(output_feature)[0]

    def interaction_matrix(self, output_feature: int) -> Float[Tensor, "d_in d_in"]:
        """``Q(e)`` of the output feature in the layer's input coordinates (augmented if the layer has biases)."""
        return interaction_matrix(self._analysed, self._one_encoder(output_feature))

    def feature_interactions(self, output_feature: int, input_features=None) -> Float[Tensor, "n_in n_in"]:
        """``D Q(e) D^T``: the interaction of every pair of input-SAE features (or of ``input_features``)."""
        q = self.interaction_matrix(output_feature)[: self.weights.d_in, : self.weights.d_in]  # quadratic part
        decoder, _ = self._input_decoder(input_features, q.dtype)
        return decoder @ q @ decoder.T

    def top_interactions(self, output_feature: int, k: int = 15, input_features=None,
                         block_size: int = 4096) -> list[FeatureInteraction]:
        """The ``k`` input-feature pairs ``(i <= j)`` with the largest ``|Q_feat[i, j]|``, largest first.

        Streams over row blocks of ``Q_feat`` so that ``d_sae_in^2`` numbers are never held at once.
        """
        k = require_int("k", k, minimum=0)
        block_size = require_int("block_size", block_size, minimum=1)
        q = self.interaction_matrix(output_feature)[: self.weights.d_in, : self.weights.d_in]
        decoder, names = self._input_decoder(input_features, q.dtype)
        ids, counts = names.unique(return_counts=True)
        if (counts > 1).any():  # each copy would pair with every other: one pair listed up to three times
            raise BcosValueError(f"input_features: ids {ids[counts > 1].tolist()[:8]} are given more than once, so "
                                 "their pairs would fill the top list several times. Pass each feature once.")
        projected = decoder @ q  # (n_in, d_in)
        best_values = q.new_empty(0)
        # index tensors on the analysis' device: a CPU mask or pair list next to CUDA blocks fails there
        best_pairs = torch.empty(0, 2, dtype=torch.long, device=q.device)
        for start in range(0, decoder.shape[0], block_size):
            block = projected[start:start + block_size] @ decoder.T  # rows start.., all columns
            rows = torch.arange(start, start + block.shape[0], device=block.device)[:, None]
            lower = torch.arange(decoder.shape[0], device=block.device)[None] < rows  # keep each pair once, as i <= j
            key = block.abs().masked_fill(lower, -1.0).flatten()
            take = min(k, int((~lower).sum()))
            top = key.topk(take).indices
            pairs = torch.stack([top // block.shape[1] + start, top % block.shape[1]], dim=1)
            best_values = torch.cat([best_values, block.flatten()[top]])
            best_pairs = torch.cat([best_pairs, pairs])
            keep = best_values.abs().topk(min(k, best_values.numel())).indices
            best_values, best_pairs = best_values[keep], best_pairs[keep]
        # ids in order (first <= second, as FeatureInteraction promises): with input_features=[5, 2] the pair was
        # (5, 2), positions in the given list being in order but not the ids
        return [FeatureInteraction(*sorted((int(names[i]), int(names[j]))), float(v))
                for (i, j), v in zip(best_pairs.tolist(), best_values.tolist(), strict=True)]

    def spectrum(self, output_features) -> Eigendecomposition:
        """Eigendecomposition (ascending) of ``Q(e)`` for one output feature or a list of them."""
        eig = eigendecompose(self._analysed, self._encoder(output_features))
        # one feature however it is given: a NumPy integer or a 0-d tensor (an argmax) got the batched form, so
        # eig.eigenvalues[-1] was every eigenvalue of the feature instead of its largest one
        if isinstance(output_features, numbers.Integral) or (isinstance(output_features, Tensor)
                                                             and output_features.ndim == 0):
            return Eigendecomposition(eig.eigenvalues[0], eig.eigenvectors[0])
        return eig

    def output_activations(self, mlp_inputs: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae_out"]:
        """The output SAE's feature activations on the layer's output, computed from the weights."""
        # in the layer's dtype, as the other methods read inputs: float64 activations of a float32 layer failed in
        # its matmul ("expected m1 and m2 to have the same dtype")
        mlp_inputs = _layer_inputs(mlp_inputs, self.weights.d_in).reshape(mlp_inputs.shape).to(self.weights.W.dtype)
        with torch.no_grad():
            return self.output_sae.encode(self.weights.forward(mlp_inputs).to(self.output_sae.dtype))

    def low_rank_approximation(self, mlp_inputs: Float[Tensor, "tokens d_in"], output_features, rank: int
                               ) -> Float[Tensor, "tokens n"]:
        """``sum over the top-rank |lambda_i| of lambda_i (v_i . x)^2`` for each output feature (paper §5.2)."""
        rank = require_int("rank", rank, minimum=1)
        eig = eigendecompose(self._analysed, self._encoder(output_features))
        # named here: top_eigen_indices refused it as "k: k=100 must lie in [0, 8]", an argument the caller never saw
        rank = require_int("rank", rank, maximum=eig.eigenvalues.shape[-1],
                           fix=f"Pass a rank in [1, {eig.eigenvalues.shape[-1]}] (the layer's input coordinates: all "
                               "of them give the exact quadratic form)")
        x = self._input_coordinates(_layer_inputs(mlp_inputs, self.weights.d_in).to(self.weights.W.dtype))
        activations = eigenvector_activations(eig, x)
        keep = top_eigen_indices(eig.eigenvalues, rank)
        return activations.gather(-1, keep.expand(activations.shape[0], *keep.shape)).sum(-1)

    def low_rank_correlation(self, mlp_inputs: Float[Tensor, "... d_in"], output_features, ranks=(1, 2, 4, 8)
                             ) -> LowRankCorrelation:
        """Correlation of each output feature's activation with its low-rank approximations, on active tokens."""
        # A rank below 1 would index the last cumulative sum (the full form) and report a correlation of 1.
        ranks = list(ranks) if not isinstance(ranks, int | str) else []
        if not ranks:
            raise BcosValueError("ranks: must be a non-empty sequence of ints >= 1. Pass e.g. ranks=(1, 2, 4, 8).")
        ranks = [require_int("ranks", r, minimum=1) for r in ranks]
        features = _feature_ids(output_features, "output_features", self.output_sae.cfg.d_sae, "output").tolist()
        x = _layer_inputs(mlp_inputs, self.weights.d_in).to(self.weights.W.dtype)
        # correlations and token counts in at least float32: a half-precision layer's counts past 256 (bfloat16) or
        # 2048 (float16) were rounded, and its correlations kept 3 significant digits
        wide = at_least_float32(x.dtype)
        actual = self.output_activations(x)[:, features].to(wide)  # (tokens, n)
        active = actual > 0
        eig = eigendecompose(self._analysed, self._encoder(features))
        eigen_acts = eigenvector_activations(eig, self._input_coordinates(x))  # (tokens, n, d_in)
        order = top_eigen_indices(eig.eigenvalues, eig.eigenvalues.shape[-1])  # by |lambda|, descending
        sorted_acts = eigen_acts.gather(-1, order.expand(eigen_acts.shape[0], *order.shape)).cumsum(-1)
        correlations = torch.full((len(ranks), len(features)), float("nan"), dtype=wide, device=x.device)
        for f in range(len(features)):
            rows = active[:, f]
            if rows.sum() < 2:
                continue
            for r, rank in enumerate(ranks):
                approx = sorted_acts[rows, f, min(rank, sorted_acts.shape[-1]) - 1]
                correlations[r, f] = torch.corrcoef(torch.stack([actual[rows, f], approx.to(wide)]))[0, 1]
        return LowRankCorrelation(ranks, features, correlations, active.sum(0).to(wide))


@dataclass
class SAEErrorShare:
    """How much of an explained logit the SAEs' error terms carry (see :func:`sae_error_share`).

    Attributes:
        explanation: the token-level explanation (``explain_logits``) of the SAE-spliced model.
        error_shares: per SAE hook name, ``sum(error_term * d explained / d sae_output)`` per row: the part of the
            explained value that flows through that SAE's error term (exact: everything after the SAE is linear
            in explanation mode).
    """

    explanation: object
    error_shares: dict[str, Float[Tensor, " batch"]]

    @property
    def error_share(self) -> Float[Tensor, " batch"]:
        """The error terms' part of the explained value, all SAEs together."""
        return sum(self.error_shares.values(), torch.zeros_like(self.explanation.explained))

    @property
    def error_fraction(self) -> Float[Tensor, " batch"]:
        """``error_share / explained`` per row: 0 when the SAEs reconstruct exactly what the model needs.

        NaN in a row whose explained value is exactly 0: a share of nothing has no fraction (read ``error_share``
        there, the absolute part). A floor of 1e-12 in its place turned a rounding-sized error share of 1e-7 into a
        fraction of 1e5, and a zero share into 0, "the SAEs reconstruct everything", for a logit that is 0 whatever
        they do; inf would read as an infinitely bad reconstruction. Other rows are unaffected."""
        explained = self.explanation.explained
        return torch.where(explained == 0, torch.full_like(explained, float("nan")), self.error_share / explained)

    @property
    def other_share(self) -> Float[Tensor, " batch"]:
        """``explained - token contributions - error_share``: what neither the tokens nor the error terms carry,
        i.e. the SAEs' biases (``b_enc``, ``b_dec``: an SAE is affine, not linear, in its input). Float rounding
        (about 1e-6 relative) for SAEs without biases."""
        return self.explanation.explained - self.explanation.total - self.error_share


def sae_error_share(model, tokens: Tensor, *, target: int | Tensor | Direction | None = None,
                    foil: int | Tensor | Direction | None = None, position: int | Tensor | None = None,
                    attention_mask: Tensor | None = None) -> SAEErrorShare:
    """Explain a logit of a ``HookedSAETransformer`` with SAEs attached, and say how much their error terms carry.

    With ``add_sae(sae, use_error_term=True)`` the spliced model computes the original activations
    (``reconstruction + error``), but sae-lens computes the error term under ``torch.no_grad()``: an
    explanation at the embeddings sees only the reconstruction path and is incomplete by the error term's share.
    This runs :func:`bcos_plugins.adapters.transformer_lens.explain_logits` once (same arguments) and captures,
    at every attached SAE, the error term and the gradient of the explained value at the SAE's output; their
    product is that SAE's error share. ``explanation.total + error_share + other_share == explained``, where
    ``other_share`` is the SAEs' biases' part (zero for bias-free SAEs).

    Args:
        model: an explainable ``HookedSAETransformer`` (e.g. ``hooked_transformer_from_hf(...,
            model_class=HookedSAETransformer)``) with SAEs attached (``model.add_sae``).
        tokens, target, foil, position, attention_mask: as for ``explain_logits``. Spelt out rather than passed on
            as ``**kwargs``, so a misspelt keyword is refused naming ``sae_error_share`` (Python's TypeError named
            ``explain_logits``, which the caller never called).
    """
    from .transformer_lens import explain_logits  # local: this module is importable without the lens adapter

    saes = getattr(model, "acts_to_saes", None)
    if not saes:
        raise BcosTypeError(
            "model: no SAEs are attached (model.acts_to_saes is empty or missing). Attach them with "
            "HookedSAETransformer.add_sae(sae, use_error_term=True), or use explain_logits for a model without SAEs.")
    with sae_error_capture(model) as capture:
        explanation = explain_logits(model, tokens, target=target, foil=foil, position=position,
                                     attention_mask=attention_mask)
    shares = capture.shares()
    return SAEErrorShare(explanation=explanation, error_shares=shares)


# Architectures whose hook_sae_acts_pre is ``process_sae_in(x) @ W_enc + b_enc``: affine in the activation. A
# gated SAE's hook holds the magnitude path (exp(r_mag)-scaled W_enc, b_mag); matching-pursuit and temporal SAEs
# are iterative or read other tokens: none of those has one affine pre-activation per token.
AFFINE_ENCODER_ARCHITECTURES = frozenset({
    "standard", "topk", "batchtopk", "matryoshka_batchtopk", "abstopk", "jumprelu",
    "transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder",
})


@dataclass
class SAEFeatureExplanation(LensExplanation):
    """Token-level explanation of an SAE feature's pre-activation (see :func:`explain_sae_feature`).

    ``explained`` is the pre-activation minus its bias terms (the part linear in the tokens), so
    ``total == explained`` up to float rounding and ``total + bias_terms == pre_activation``.

    Attributes:
        pre_activation: the value sae-lens records at the SAE's ``hook_sae_acts_pre`` for ``feature`` at the
            explained position, per row.
        bias_terms: the pre-activation of a zero activation (``b_enc[feature]``, minus ``b_dec @ W_enc[:, feature]``
            when the SAE subtracts ``b_dec`` from its input), per row: what no token contributes.
        feature: the explained feature's index; hook_name: the SAE's hook.
    """

    pre_activation: Float[Tensor, " batch"] | None = None
    bias_terms: Float[Tensor, " batch"] | None = None
    feature: int | None = None
    hook_name: str | None = None


class _FeatureReached(Exception):
    """Ends the forward pass once the pre-activation is computed: nothing after the SAE's hook matters, and SAEs
    further on (with their error terms) must not run."""


def _check_feature_sae(model, sae, feature) -> tuple[str, int]:
    if not isinstance(sae, SAE):
        raise BcosTypeError(f"sae: must be a sae_lens.SAE (e.g. StandardSAE, TopKSAE, JumpReLUSAE), got "
                            f"{type(sae).__name__}.")
    architecture = sae.cfg.architecture()
    if architecture not in AFFINE_ENCODER_ARCHITECTURES:
        raise BcosValueError(
            f"sae: a {architecture!r} SAE has no pre-activation of the form sae_in @ W_enc + b_enc (e.g. a gated SAE's "
            f"hook_sae_acts_pre is its magnitude path), so it cannot be split into token contributions and bias "
            f"terms. Supported architectures: {sorted(AFFINE_ENCODER_ARCHITECTURES)}.")
    if sae.cfg.normalize_activations in ("constant_norm_rescale", "layer_norm"):
        raise BcosValueError(
            f"sae: it normalises each input at run time ({sae.cfg.normalize_activations!r}), so its pre-activation is "
            "not affine in the activation and no token split of it is exact. Use an SAE without run-time "
            "normalisation (normalize_activations='none', or a constant scale folded in with "
            "sae.fold_activation_norm_scaling_factor).")
    if sae.cfg.reshape_activations != "none":
        raise BcosValueError(f"sae: it reshapes its inputs ({sae.cfg.reshape_activations!r}, an attention hook_z SAE); "
                             "explain_sae_feature takes SAEs on (batch, pos, d_in) activations such as the residual "
                             "stream or an MLP's output.")
    hook_name = sae.cfg.metadata.hook_name
    if hook_name is None:
        raise BcosValueError("sae: it has no hook name (sae.cfg.metadata.hook_name is None), so there is no "
                             "activation to read. Set it, e.g. sae.cfg.metadata.hook_name = 'blocks.0.hook_resid_post'.")
    attached = (getattr(model, "acts_to_saes", None) or {}).get(hook_name)
    if hook_name not in model.hook_dict and attached is None:
        near = sorted(n for n in model.hook_dict if n.split(".")[-1] == hook_name.split(".")[-1])[:4]
        raise BcosValueError(f"sae: its hook {hook_name!r} is not a hook of the model (model.hook_dict). Hooks of that "
                             f"kind: {near or 'none'}. Set sae.cfg.metadata.hook_name to one of the model's hooks.")
    if isinstance(model.hook_dict.get(hook_name), DynamicHookPoint):
        # explanation mode holds the value at such a hook constant (it is a dynamic weight): the feature read there
        # got no token contributions at all (completeness error 1.0), silently, on a HookedTransformer
        raise argument_error(
            "sae", f"its hook {hook_name!r} carries a dynamic weight of the model (a norm's scale, an attention "
            "pattern, a gated MLP's gate branch or a B-cos scale), which explanations hold constant, so no token "
            "contributes to a value read there", "Explain an SAE on an activation the tokens reach linearly: the "
            "residual stream, hook_attn_out / hook_mlp_out, ln*.hook_normalized, mlp.hook_pre_linear or "
            "mlp.hook_post")
    if attached is not None and attached is not sae and hook_name not in model.hook_dict:
        raise BcosValueError(f"sae: another SAE is attached at {hook_name!r}, so the model's activation there is not "
                             "this SAE's input. Attach this SAE (model.add_sae(sae)) or remove the other "
                             "(model.reset_saes()).")
    feature = require_int("feature", feature, minimum=0)
    if feature >= sae.cfg.d_sae:
        raise BcosValueError(f"feature: {feature} is outside [0, {sae.cfg.d_sae}), the SAE's features (d_sae="
                             f"{sae.cfg.d_sae}). Pass an index in that range.")
    return hook_name, feature


def _pre_activations(sae, activation: Tensor) -> Tensor:
    """sae-lens' own ``hook_sae_acts_pre`` of ``sae.encode(activation)`` (attached to the graph)."""
    grabbed: list[Tensor] = []
    with sae.hooks(fwd_hooks=[("hook_sae_acts_pre", lambda t, hook: grabbed.append(t))]):
        sae.encode(activation)
    return grabbed[0]


def _zero_input_pre_activation(sae, feature: int) -> Tensor:
    """``feature``'s pre-activation of a zero activation (its bias terms), 0-dim: bit-identical to
    ``_pre_activations(sae, zeros)[0, feature]`` without the encode of a whole row. An affine architecture's
    ``hook_sae_acts_pre`` is ``process_sae_in(x) @ W_enc + b_enc`` (:data:`AFFINE_ENCODER_ARCHITECTURES`); sae-lens'
    own ``process_sae_in`` makes the zero row's input (``-b_dec`` when ``apply_b_dec_to_input``, zero for a
    transcoder, whose ``b_dec`` is its output's), and one column of the product is the encode's (the same
    ``(1, d_in) @ (d_in, n)`` product; tests/test_review_s23_small_mends.py compares them bit for bit). The encode
    read all of ``W_enc`` (24576 columns on GPT-2 small's SAE) for one entry. A hook on ``hook_sae_acts_pre`` (which
    may change the value) keeps the encode."""
    zero_input = torch.zeros(1, sae.cfg.d_in, dtype=sae.dtype, device=sae.W_enc.device)
    hook = sae.hook_sae_acts_pre
    if hook._forward_hooks or hook._forward_pre_hooks:
        return _pre_activations(sae, zero_input)[0, feature]
    sae_in = sae.process_sae_in(zero_input)
    return (sae_in @ sae.W_enc[:, feature:feature + 1])[0, 0] + sae.b_enc[feature]


def _checked_feature_bias(sae, feature: int) -> Tensor:
    """``feature``'s bias terms (:func:`_zero_input_pre_activation`), refused when they or its encoder column are
    not finite, or when another feature's encoder column is not (see below). One sync for the three checks, where
    there were three; each check runs again, for its own message, only when one failed."""
    with torch.no_grad():
        bias = _zero_input_pre_activation(sae, feature).detach()
    column = sae.W_enc.detach()[:, feature]
    if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):  # _encoder_directions' column, not all d_sae of them
        column = column * sae.W_dec.detach()[feature].norm()
    weights = sae.W_enc.detach()
    if bool(torch.isfinite(bias) & torch.isfinite(column).all() & torch.isfinite(weights.sum())):
        return bias
    # a NaN / inf in the feature's encoder weights or biases was reported as the model's ("its output is NaN or
    # infinite ... check those rows' inputs and the embedding rows of their tokens")
    if not (torch.isfinite(bias) and torch.isfinite(column).all()):
        raise argument_error("sae", f"feature {feature}'s encoder weights (W_enc[:, {feature}]) or bias terms "
                             f"(b_enc[{feature}], b_dec) hold NaN or infinite values, so its pre-activation is not "
                             "finite", "Check how the SAE was trained or loaded (a diverged run), or explain another "
                             "feature")
    # another feature's NaN / inf encoder column breaks this one's gradient too: the backward of sae_in @ W_enc gives
    # it a zero weight, and 0 * NaN is NaN; refused as a NaN gradient "outside the range the model computes in"
    # (check the inputs), which sent users to inputs that were fine. A NaN or inf entry makes the sum NaN or inf, so
    # the columns are read only when it is not finite (an overflowing sum of finite weights reads them and passes):
    # 5 ms instead of 49 ms a call on a 768 x 24576 W_enc (thread CPU, one thread; docs/benchmarks.md#sae-encoder-check)
    broken = ~torch.isfinite(weights).all(0)
    if bool(broken.any()):
        bad = broken.nonzero().flatten().tolist()
        raise argument_error("sae", f"W_enc holds NaN or infinite values in the encoder column(s) of feature(s) "
                             f"{bad[:8]}{' ...' if len(bad) > 8 else ''}, so no feature can be explained: feature "
                             f"{feature}'s gradient passes through sae_in @ W_enc, which gives those columns a zero "
                             "weight, and zero times NaN or inf is NaN", "Check how the SAE was trained or loaded (a "
                             "diverged run); zeroing those columns (with torch.no_grad(): sae.W_enc[:, bad] = 0) "
                             "leaves every other feature's pre-activation unchanged")
    return bias


def explain_sae_feature(model, tokens: Tensor, sae, feature: int, position=None, *,
                        attention_mask: Tensor | None = None) -> SAEFeatureExplanation:
    """Explain an SAE feature's pre-activation token by token, exactly.

    The pre-activation is the value sae-lens records at ``hook_sae_acts_pre`` (``sae_in @ W_enc + b_enc``, with
    ``sae_in = x - b_dec`` when ``cfg.apply_b_dec_to_input``; before a TopK SAE's decoder-norm rescaling). Inside
    explanation mode the model is linear in its embeddings, so the pre-activation minus its bias terms is too:
    the contributions at the embeddings (``hook_embed`` + ``hook_pos_embed``, as :func:`explain_logits`) sum to
    ``explained = pre_activation - bias_terms``, and ``total + bias_terms == pre_activation``.

    Args:
        model: an explainable ``HookedTransformer`` / ``HookedSAETransformer`` (e.g. from
            ``hooked_transformer_from_hf``), the SAE attached (``model.add_sae(sae)``) or not; or a bridge from
            ``transformer_bridge_from_hf`` (every family, Gemma 2 included), the SAE not attached.
        tokens: ``(batch, pos)`` token ids.
        sae: a sae-lens SAE whose ``cfg.metadata.hook_name`` is a hook of ``model`` (its encoder reads there).
        feature: index of the feature, in ``[0, d_sae)``.
        position: the explained position, one or one per row; default each row's last real token; negative
            values count back from it.
        attention_mask: 1 for real tokens, passed to the model.

    Other SAEs attached before the hook with ``use_error_term=True`` carry a share through their error terms:
    it is reported in ``sae_error_shares``, as for :func:`explain_logits`. On a plain model with non-zero biases
    the contributions leave the biases' share out, without a warning (``completeness_error`` shows it). Forward hooks
    of the caller's that patch an activation (``model.hooks(...)``, ``add_hook``: an activation added or mean-ablated)
    add a share no token carries: a ``UserWarning`` names the hooks when the contributions miss the explained value
    by more than rounding, as :func:`~bcos_plugins.adapters.transformer_lens.explain_logits` does.
    """
    hook_name, feature = _check_feature_sae(model, sae, feature)
    # the model's own hook when it is there (unattached SAE, or a transcoder's input hook); otherwise the attached
    # SAE's pre-activation hook, where sae-lens computes the very value explained
    hook_is_free = hook_name in model.hook_dict
    bias = _checked_feature_bias(sae, feature)
    found: dict[str, Tensor] = {}
    # a bridge's natively run norm computes hook_normalized beside its output with a scale that is not held
    # constant in explanation mode: read there, the feature's contributions missed all of it (completeness error
    # 1.0) without a word; its input is captured to give the same value, linear in the tokens
    native_norm = native_norm_input_hook(model, hook_name) if hook_is_free else None

    def keep_norm_input(activation: Tensor, hook) -> Tensor:
        found["norm_input"] = activation
        return activation

    def read(activation: Tensor, hook) -> Tensor:
        # with autograd on: a hook inside a bridge's gate branch (mlp.gate.hook_in, the MLP's input) fires where
        # explanation mode runs that branch without autograd, and the encode there had no graph ("no gradient path")
        with torch.enable_grad():
            if native_norm is not None:
                activation = linear_normalized(found.pop("norm_input"), activation, centred=native_norm[1])
            if hook_is_free:
                if activation.shape[-1] != sae.cfg.d_in:
                    raise BcosValueError(f"sae: it reads vectors of width d_in={sae.cfg.d_in}, but {hook_name!r} has "
                                         f"width {activation.shape[-1]}; it was trained on another activation.")
                activation = _pre_activations(sae, activation)
        found["pre"] = activation
        raise _FeatureReached

    def feature_at(run, pos: Tensor):
        try:
            run(([] if native_norm is None else [(native_norm[0], keep_norm_input)])
                + [(hook_name if hook_is_free else f"{hook_name}.hook_sae_acts_pre", read)])
        except _FeatureReached:
            pass
        pre = found["pre"]
        if pre.ndim != 3:
            raise BcosValueError(f"sae: the activation at {hook_name!r} has shape {tuple(pre.shape)}, not "
                                 "(batch, pos, d_in); explain_sae_feature takes per-token activations.")
        at_position = pre[torch.arange(pre.shape[0], device=pre.device), pos.to(pre.device), feature]
        found["pre_activation"] = at_position.detach()
        targets = torch.full_like(pos, feature)
        return at_position - bias, targets, None

    explanation = explain_lens_value(model, tokens, feature_at, position=position, attention_mask=attention_mask,
                                     result_class=SAEFeatureExplanation, who="explain_sae_feature", logits=False,
                                     feature=feature, hook_name=hook_name)
    explanation.pre_activation = found["pre_activation"]
    explanation.bias_terms = bias.expand_as(found["pre_activation"]).clone()
    return explanation
