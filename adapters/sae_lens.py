"""sae-lens adapter: trace SAE features through a bilinear layer, from the weights (paper §3.1, §5).

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
no normalisation) and writes ``blocks.L.hook_mlp_out``. For other layers pass ``input_hook=``/``output_hook=``
to have the SAEs' hook names checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float
from sae_lens import SAE
from torch import Tensor

from bcos_plugins._checks import require_int
from bcos_plugins.bilinear import (
    Eigendecomposition,
    augment_input,
    bilinear_weights,
    eigendecompose,
    eigenvector_activations,
    interaction_matrix,
    top_eigen_indices,
)
from bcos_plugins.errors import BcosError, BcosTypeError, BcosValueError

from ._lens.sae_error import sae_error_capture

__all__ = [
    "BilinearSAEInteractions",
    "FeatureInteraction",
    "LowRankCorrelation",
    "SAEErrorShare",
    "expected_hook_names",
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


def expected_hook_names(layer) -> tuple[set[str], set[str]] | None:
    """Input and output hook names of a TransformerLens MLP inside a set-up model; ``None`` if unknown."""
    hook_pre = getattr(layer, "hook_pre", None)
    name = getattr(hook_pre, "name", None)
    if not name or ".mlp." not in name:
        return None
    prefix = name.split(".mlp.")[0]  # "blocks.L"
    cfg = getattr(layer, "cfg", None)
    if getattr(cfg, "normalization_type", None) is None:
        inputs = {f"{prefix}.hook_resid_mid", f"{prefix}.hook_mlp_in"}
    else:
        inputs = {f"{prefix}.ln2.hook_normalized"}
    return inputs, {f"{prefix}.hook_mlp_out"}


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
    except BcosError:
        raise  # already names the layer's problem (e.g. a B-cos gated MLP)
    except (TypeError, ValueError) as error:
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
                            f"{what}. Pass e.g. cache['blocks.L.ln2.hook_normalized']")
    if mlp_inputs.ndim == 0 or mlp_inputs.shape[-1] != d_in or mlp_inputs.numel() == 0:
        raise BcosValueError(f"{name}: shape {tuple(mlp_inputs.shape)}, but the bilinear layer reads vectors of width "
                             f"{d_in} (last dimension). Pass the activations at the layer's input (the input SAE's "
                             "hook), shaped (..., d_in)")
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

    Raises:
        TypeError: on a layer that is not bilinear (e.g. the MLP of a B-cos GPT-2 block); the message lists
            the layers that are.
        ValueError: on a width mismatch, a hook-name mismatch (or a missing hook name where one is
            expected), or SAEs whose inputs are normalised or reshaped.
    """

    def __init__(self, layer, input_sae, output_sae, *, input_hook: str | None = None,
                 output_hook: str | None = None) -> None:
        weights = _bilinear_layer(layer)
        self.augmented = weights.has_bias
        self.weights = weights
        self._analysed = weights.augmented() if self.augmented else weights
        expected = expected_hook_names(layer)
        input_hooks = {input_hook} if input_hook else (expected[0] if expected else None)
        output_hooks = {output_hook} if output_hook else (expected[1] if expected else None)
        _check_sae(input_sae, "input", weights.d_in, input_hooks)
        _check_sae(output_sae, "output", weights.d_out, output_hooks)
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

    def interaction_matrix(self, output_feature: int) -> Float[Tensor, "d_in d_in"]:
        """``Q(e)`` of the output feature in the layer's input coordinates (augmented if the layer has biases)."""
        return interaction_matrix(self._analysed, self._encoder(output_feature)[0])

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
        projected = decoder @ q  # (n_in, d_in)
        best_values = q.new_empty(0)
        best_pairs = torch.empty(0, 2, dtype=torch.long)
        for start in range(0, decoder.shape[0], block_size):
            block = projected[start:start + block_size] @ decoder.T  # rows start.., all columns
            rows = torch.arange(start, start + block.shape[0])[:, None]
            lower = torch.arange(decoder.shape[0])[None] < rows  # keep each pair once, as i <= j
            key = block.abs().masked_fill(lower, -1.0).flatten()
            take = min(k, int((~lower).sum()))
            top = key.topk(take).indices
            pairs = torch.stack([top // block.shape[1] + start, top % block.shape[1]], dim=1)
            best_values = torch.cat([best_values, block.flatten()[top]])
            best_pairs = torch.cat([best_pairs, pairs])
            keep = best_values.abs().topk(min(k, best_values.numel())).indices
            best_values, best_pairs = best_values[keep], best_pairs[keep]
        return [FeatureInteraction(int(names[i]), int(names[j]), float(v))
                for (i, j), v in zip(best_pairs.tolist(), best_values.tolist(), strict=True)]

    def spectrum(self, output_features) -> Eigendecomposition:
        """Eigendecomposition (ascending) of ``Q(e)`` for one output feature or a list of them."""
        eig = eigendecompose(self._analysed, self._encoder(output_features))
        if isinstance(output_features, int):
            return Eigendecomposition(eig.eigenvalues[0], eig.eigenvectors[0])
        return eig

    def output_activations(self, mlp_inputs: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae_out"]:
        """The output SAE's feature activations on the layer's output, computed from the weights."""
        mlp_inputs = _layer_inputs(mlp_inputs, self.weights.d_in).reshape(mlp_inputs.shape)
        with torch.no_grad():
            return self.output_sae.encode(self.weights.forward(mlp_inputs).to(self.output_sae.dtype))

    def low_rank_approximation(self, mlp_inputs: Float[Tensor, "tokens d_in"], output_features, rank: int
                               ) -> Float[Tensor, "tokens n"]:
        """``sum over the top-rank |lambda_i| of lambda_i (v_i . x)^2`` for each output feature (paper §5.2)."""
        rank = require_int("rank", rank, minimum=1)
        eig = eigendecompose(self._analysed, self._encoder(output_features))
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
        actual = self.output_activations(x)[:, features].to(x.dtype)  # (tokens, n)
        active = actual > 0
        eig = eigendecompose(self._analysed, self._encoder(features))
        eigen_acts = eigenvector_activations(eig, self._input_coordinates(x))  # (tokens, n, d_in)
        order = top_eigen_indices(eig.eigenvalues, eig.eigenvalues.shape[-1])  # by |lambda|, descending
        sorted_acts = eigen_acts.gather(-1, order.expand(eigen_acts.shape[0], *order.shape)).cumsum(-1)
        correlations = torch.full((len(ranks), len(features)), float("nan"), dtype=x.dtype)
        for f in range(len(features)):
            rows = active[:, f]
            if rows.sum() < 2:
                continue
            for r, rank in enumerate(ranks):
                approx = sorted_acts[rows, f, min(rank, sorted_acts.shape[-1]) - 1]
                correlations[r, f] = torch.corrcoef(torch.stack([actual[rows, f], approx]))[0, 1]
        return LowRankCorrelation(ranks, features, correlations, active.sum(0).to(x.dtype))


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
        """``error_share / explained``: 0 when the SAEs reconstruct exactly what the model needs."""
        explained = self.explanation.explained
        return self.error_share / torch.where(explained == 0, torch.full_like(explained, 1e-12), explained)

    @property
    def other_share(self) -> Float[Tensor, " batch"]:
        """``explained - token contributions - error_share``: what neither the tokens nor the error terms carry,
        i.e. the SAEs' biases (``b_enc``, ``b_dec``: an SAE is affine, not linear, in its input). Float rounding
        (about 1e-6 relative) for SAEs without biases."""
        return self.explanation.explained - self.explanation.total - self.error_share


def sae_error_share(model, tokens: Tensor, **explain_kwargs) -> SAEErrorShare:
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
        tokens, explain_kwargs: as for ``explain_logits`` (``target``, ``foil``, ``position``, ``attention_mask``).
    """
    from .transformer_lens import explain_logits  # local: this module is importable without the lens adapter

    saes = getattr(model, "acts_to_saes", None)
    if not saes:
        raise BcosTypeError(
            "model: no SAEs are attached (model.acts_to_saes is empty or missing). Attach them with "
            "HookedSAETransformer.add_sae(sae, use_error_term=True), or use explain_logits for a model without SAEs.")
    with sae_error_capture(model) as capture:
        explanation = explain_logits(model, tokens, **explain_kwargs)
    shares = capture.shares()
    return SAEErrorShare(explanation=explanation, error_shares=shares)
