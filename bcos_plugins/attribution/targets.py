"""What to explain, parsed with one meaning everywhere: targets, foils and positions.

- Targets and foils are **ids per row**: an int (every row), a sequence or an integer tensor of shape
  ``(batch,)``. A float tensor is refused, never guessed to be a direction: to explain a direction of the
  output space (a linear probe, a difference of unembeddings), pass ``Direction(vector)``.
- Positions are indices of the sequence, per row. Non-negative values are column indices; negative values
  count from each row's **last real token** (``-1`` is the last real token of that row, whatever the
  padding side). A position on padding or outside the sequence raises.

Every path (``explain``, ``explain_image``, the Space head, Captum, inseq, TransformerLens) calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import (
    bad_rows,
    caller_stacklevel,
    named_rows,
    narrowed_to_dtype,
    require_real_tokens,
    require_row_ids,
    require_tensor,
)
from ..errors import BcosTypeError, BcosValueError, argument_error
from .gradient import outside_inference

__all__ = [
    "Direction",
    "ResolvedExplained",
    "last_real_position",
    "parse_ids",
    "real_token_positions",
    "resolve_explained",
    "resolve_positions",
    "same_values",
    "select_explained",
]

IdsLike = int | Sequence[int] | Tensor


@dataclass(frozen=True)
class Direction:
    """A direction of the output space to explain: ``explained = outputs @ vector``.

    ``vector`` is ``(n_outputs,)`` (the same direction for every row) or ``(batch, n_outputs)``. Passing it
    wrapped is what makes a float direction explicit: plain float tensors are refused as targets.

    Examples:
        >>> import torch
        >>> from bcos_plugins import Direction, explain
        >>> ids = tokenizer(["Is the sky blue? Answer:"], return_tensors="pt")["input_ids"]
        >>> vector = torch.zeros(len(tokenizer))                              # one entry per output (token)
        >>> vector[tokenizer.convert_tokens_to_ids(["Ġyes", "ĠYes"])] = 0.5
        >>> vector[tokenizer.convert_tokens_to_ids(["Ġno", "ĠNo"])] = -0.5   # mean "yes" - mean "no" logit
        >>> explanation = explain(bcos_gpt2, ids, target=Direction(vector))
        >>> torch.allclose(explanation.explained, bcos_gpt2(ids).logits[:, -1] @ vector)
        True
    """

    vector: Tensor

    def __eq__(self, other) -> bool:
        # the generated __eq__ compared the vectors with ==, a tensor, and raised "Boolean value of Tensor with more
        # than one value is ambiguous" for two Directions of one vector (and so for two results holding them)
        if type(other) is not type(self):
            return NotImplemented
        return same_values(self.vector, other.vector)

    def __hash__(self) -> int:
        # equal Directions hash equal (the generated hash was the vector's id): the shape and dtype, not the values
        return hash((type(self), tuple(self.vector.shape), self.vector.dtype))

    def __post_init__(self):
        # the package's one reading of lists (require_tensor): Python floats at Python's precision, float64, as the
        # other entry points read them; torch.as_tensor read them as float32, so a float64 model explained
        # outputs @ float32(vector), 7e-7 of the value off outputs @ vector on a tiny Llama, silently
        v = self.vector if isinstance(self.vector, Tensor) else require_tensor("Direction(vector)", self.vector,
                                                                               kind="real", finite=False)
        if not v.is_floating_point():
            raise BcosTypeError(f"Direction(vector): vector must be a float tensor, got {v.dtype}. Class or "
                                "token ids are passed as target= directly, without Direction.")
        if v.ndim not in (1, 2) or v.shape[-1] == 0:
            raise BcosValueError(f"Direction(vector): vector must have shape (n_outputs,) or (batch, "
                                 f"n_outputs); got {tuple(v.shape)}.")
        if not torch.isfinite(v).all():
            raise BcosValueError("Direction(vector): vector has NaN or inf entries. Pass a finite direction.")
        object.__setattr__(self, "vector", v)

    def rows(self, batch: int, n_outputs: int, name: str) -> Float[Tensor, "batch n"]:
        v = self.vector
        if v.shape[-1] != n_outputs:
            raise BcosValueError(f"{name}: Direction has {v.shape[-1]} entries but the explained output has "
                                 f"{n_outputs}. Build the direction in the output space.")
        if v.ndim == 2 and v.shape[0] != batch:
            raise BcosValueError(f"{name}: Direction has {v.shape[0]} rows for a batch of {batch}. Pass one "
                                 "direction (n_outputs,) or one per row (batch, n_outputs).")
        return v.expand(batch, -1) if v.ndim == 1 else v


def same_values(a, b) -> bool:
    """Whether two fields of a result (or two Directions' vectors) hold the same thing, the one equality of the result
    types and :class:`Direction`: tensors of one shape, dtype and device with equal elements (``torch.equal``; a meta
    tensor equals only itself, having no values), Directions of the same vector, anything else by ``==``."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
            return False
        if a is b:
            return True
        return (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and not a.is_meta
                and bool(torch.equal(a, b)))
    return bool(a == b)


def parse_ids(value: IdsLike | Direction, batch: int, name: str, *, n_outputs: int | None = None,
              device: torch.device | str | None = None, allow_direction: bool = True
              ) -> Int[Tensor, " batch"] | Direction:
    """``value`` as ``(batch,)`` long ids (checked against ``[0, n_outputs)`` by the package's one per-row id
    parser, :func:`~bcos_plugins._checks.require_row_ids`), or the Direction itself."""
    if isinstance(value, Direction) and not allow_direction:
        raise BcosTypeError(f"{name}: takes integer indices (an int or one per row), not a Direction.")
    if isinstance(value, Direction):
        if n_outputs is not None:
            value.rows(batch, n_outputs, name)
        return value
    return require_row_ids(name, value, batch, n_ids=n_outputs, device=device, direction_hint=allow_direction)


def select_explained(outputs: Float[Tensor, "batch n"], target: Tensor | Direction,
                     foil: Tensor | Direction | None = None) -> Float[Tensor, " batch"]:
    """The explained value per row: ``outputs[target] (- outputs[foil])``, or a projection on a Direction. ``target``
    and ``foil`` as :func:`resolve_explained` returns them (an int or a list is parsed here, against ``outputs``)."""
    batch, n = _require_outputs(outputs)

    def pick(which, name):
        # outside_inference: a target made under the caller's torch.inference_mode() is saved for backward by the
        # gather / product, which autograd refuses for inference tensors (explain_dataset's per-batch targets)
        if not isinstance(which, Tensor | Direction):  # failed with "'int' object has no attribute 'to'"
            which = parse_ids(which, batch, name, n_outputs=n, device=outputs.device)
        if isinstance(which, Direction):
            vector = which.rows(batch, n, name)
            if torch.finfo(vector.dtype).max > torch.finfo(outputs.dtype).max:
                # a float64 vector on a float32 model (or a float32 one on a float16 model): an entry beyond the
                # outputs' range became inf, and the NaN or inf explained value was blamed on the model's inputs
                # (the vector as given is checked, so the message names its entries, not the batch rows)
                narrowed_to_dtype(name, which.vector, outputs.dtype)
            return (outputs * outside_inference(vector.to(outputs.device, outputs.dtype))).sum(-1)
        return outputs.gather(-1, outside_inference(which.to(outputs.device))[:, None]).squeeze(-1)

    explained = pick(target, "target")
    if foil is not None:
        explained = explained - pick(foil, "foil")
    return explained


def _require_outputs(outputs, name: str = "outputs") -> tuple[int, int]:
    """``(batch, n_outputs)`` of the outputs a value is picked from, refused by name unless a 2-d tensor (a 1-d or
    3-d one failed with "not enough (too many) values to unpack")."""
    if not isinstance(outputs, Tensor) or outputs.ndim != 2:
        got = f"shape {tuple(outputs.shape)}" if isinstance(outputs, Tensor) else f"a {type(outputs).__name__}"
        raise argument_error(name, f"must be a (batch, n_outputs) tensor, got {got}",
                             "Pass one row of outputs per example (e.g. the logits at the explained position)")
    return outputs.shape


class ResolvedExplained(NamedTuple):
    """What :func:`resolve_explained` returns: the explained value per row and the parsed target / foil."""

    explained: Float[Tensor, " batch"]
    target: Tensor | Direction
    foil: Tensor | Direction | None


def resolve_explained(values: Float[Tensor, "batch n"], target: IdsLike | Direction | None,
                      foil: IdsLike | Direction | None = None) -> ResolvedExplained:
    """The one target / foil resolution, run by every path that takes the package's ``target`` / ``foil``
    (``explain``, ``explain_image``, the Space head, the TransformerLens adapter) on its outputs ``values``
    ``(batch, n_outputs)``; Captum's classes take Captum's own target forms instead.

    ``target`` defaults to each row's top output (the predicted class or next token); ``target`` and ``foil``
    are parsed by :func:`parse_ids` against ``n_outputs`` and the explained value is
    :func:`select_explained`'s ``values[target] (- values[foil])``, still attached to the autograd graph.
    """
    batch, n = _require_outputs(values, "values")
    parsed_target = (values.argmax(-1) if target is None
                     else parse_ids(target, batch, "target", n_outputs=n, device=values.device))
    parsed_foil = None if foil is None else parse_ids(foil, batch, "foil", n_outputs=n, device=values.device)
    if isinstance(parsed_target, Tensor) and isinstance(parsed_foil, Tensor):
        if values.device.type == "cpu":
            warn_on_foil_equal_to_target(parsed_target, parsed_foil, predicted=target is None)
        elif _on_host(target) and _on_host(foil):  # read where they were given: no wait for the device's stream
            warn_on_foil_equal_to_target(parse_ids(target, batch, "target"), parse_ids(foil, batch, "foil"),
                                          predicted=False)
    return ResolvedExplained(select_explained(values, parsed_target, parsed_foil), parsed_target, parsed_foil)


def _on_host(value) -> bool:
    """Whether ids were given on the host (an int, a list, a CPU tensor): comparing them costs no device sync, which
    a device tensor's (or the predicted class's) comparison would add to every contrastive call on a GPU."""
    return value is not None and not (isinstance(value, Tensor) and value.device.type != "cpu")


def warn_on_foil_equal_to_target(target: Tensor, foil: Tensor, *, predicted: bool,
                                  consequence: str = "the explained value target - foil is 0 there and so is every "
                                                     "contribution") -> None:
    """Warn naming the rows whose foil is their target: ``target - foil`` is 0 there, and so is every contribution
    (exact, but almost always a slip: ``foil=target`` returned all zeros without a word). On a GPU only ids given on
    the host are compared (:func:`_on_host`). ``consequence``: what the caller computes from them (the metrics' logit
    difference)."""
    same = target.to(foil.device) == foil
    if not bool(same.any()):
        return
    import warnings

    ids = sorted(set(target[same.to(target.device)].tolist()))
    what = "the predicted output (target was left out)" if predicted else "target"
    warnings.warn(f"foil: equals {what} in {bad_rows(same)} (output id{'s' if len(ids) > 1 else ''} "
                  f"{', '.join(map(str, ids[:8]))}{', ...' if len(ids) > 8 else ''}), so {consequence}. Pass another "
                  "output as the foil (the one to contrast with), or leave foil out to explain the target's own value",
                  UserWarning, stacklevel=caller_stacklevel())


def last_real_position(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, " batch"]:
    """Index of the last real (non-padding) token of each row, for left and right padding alike."""
    attention_mask = _require_mask_form(attention_mask)
    _refuse_mask(attention_mask, *torch.stack(_mask_conditions(attention_mask)).tolist())
    return _last_real_column(attention_mask)


def _require_mask_form(attention_mask) -> Tensor:
    """``attention_mask`` given to a public helper, refused by name unless it is a real ``(batch, pos)`` tensor (a 1-d
    mask failed with torch's "Dimension out of range", a list with "'list' object has no attribute 'sum'"); no sync."""
    if not isinstance(attention_mask, Tensor) or attention_mask.ndim != 2 or attention_mask.is_complex():
        got = (f"shape {tuple(attention_mask.shape)} {attention_mask.dtype}" if isinstance(attention_mask, Tensor)
               else f"a {type(attention_mask).__name__}")
        raise argument_error("attention_mask", f"must be a (batch, pos) tensor of 0s and 1s, got {got}",
                             "Pass the tokenizer's mask (add a batch dimension with mask[None] for one row)",
                             kind=BcosTypeError if not isinstance(attention_mask, Tensor) else BcosValueError)
    return attention_mask


def _mask_conditions(attention_mask: Tensor) -> list[Tensor]:
    """Whether a row has no real token, and whether an entry is neither 0 nor 1, as 0-dim tensors left on the device
    (read by the caller's one sync, then passed to :func:`_refuse_mask`)."""
    return [(attention_mask.sum(1) == 0).any(), ((attention_mask != 0) & (attention_mask != 1)).any()]


def _refuse_mask(attention_mask: Tensor, no_real_token: bool, not_binary: bool) -> None:
    """Refuse a mask :func:`_mask_conditions` found wrong, with the package's messages: an entry such as 2 was read as
    the row's last real token wherever it stood (``[[2, 1, 0]]`` gave position 0), silently."""
    if not_binary:
        require_tensor("attention_mask", attention_mask, kind="mask", finite=False)
    if no_real_token:
        require_real_tokens(attention_mask)


def _last_real_column(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, " batch"]:
    """:func:`last_real_position` without its check (a row without a real token gets the last column)."""
    return attention_mask.shape[1] - 1 - attention_mask.flip(dims=(1,)).to(torch.long).argmax(dim=1)


def real_token_positions(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Position ids that count real tokens only (padding gets 0); the rule ``generate`` and ``explain`` use,
    so left padding does not shift a decoder's positions."""
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)


def resolve_positions(position: int | Sequence[int] | Tensor | None, attention_mask: Int[Tensor, "batch pos"],
                      *, default: str = "last", mask_checked: bool = False,
                      padded: bool | None = None) -> Int[Tensor, " batch"]:
    """Explained position per row (see the module docstring for the meaning of negative values).

    Args:
        position: int, one per row, or ``None`` for ``default``.
        attention_mask: ``(batch, pos)``, 1 on real tokens.
        default: ``"last"`` (the last real token: decoders) or ``"first"`` (the first real token: encoders'
            [CLS]).
        mask_checked: ``attention_mask`` already passed :func:`~bcos_plugins._checks.require_token_batch` (every
            row has a real token), so that check is not repeated.
        padded: ``False`` where the caller's token check found no 0 in the mask
            (:func:`~bcos_plugins._checks.token_batch_and_padding`): the default position is then the last (or
            first) column of every row, made without reading the mask (the same ids).
    """
    if default not in ("last", "first"):  # another word was read as "first", silently
        raise argument_error("default", f"must be 'last' or 'first', got {default!r}",
                             "Pass 'last' (decoders: the next-token prediction) or 'first' (encoders: [CLS])")
    if not mask_checked:
        attention_mask = _require_mask_form(attention_mask)
    batch, length = attention_mask.shape
    if position is None and padded is False:
        # one kernel instead of the mask's flip, argmax and subtraction (about 8 us against 1.5 alone)
        return torch.full((batch,), length - 1 if default == "last" else 0, dtype=torch.long,
                          device=attention_mask.device)
    last = _last_real_column(attention_mask)
    # every refusal's condition reaches the host in one device-to-host sync; the messages (which may sync) are
    # built only on a failure, in the order of the checks: rows without a real token, then outside, then padding
    conditions = [] if mask_checked else _mask_conditions(attention_mask)
    if position is None:
        if conditions:
            _refuse_mask(attention_mask, *torch.stack(conditions).tolist())
        if default == "last":
            return last
        return attention_mask.to(torch.long).argmax(dim=1)
    pos = parse_ids(position, batch, "position", device=attention_mask.device, allow_direction=False)
    resolved = torch.where(pos < 0, last + 1 + pos, pos)
    # a negative position counting back past a left-padded row's first real token is outside the row, as it is on a
    # right-padded one (there it lands before column 0): the same refusal on either padding side
    before_first = (pos < 0) & (resolved < attention_mask.to(torch.long).argmax(dim=1))
    outside = (resolved < 0) | (resolved >= length) | before_first
    rows = torch.arange(batch, device=attention_mask.device)
    on_padding = (attention_mask[rows, resolved.clamp(0, length - 1)] == 0) & ~outside
    *mask_flags, any_outside, any_on_padding = torch.stack([*conditions, outside.any(), on_padding.any()]).tolist()
    if mask_flags:
        _refuse_mask(attention_mask, *mask_flags)
    if any_outside:
        raise BcosValueError(
            f"position: {pos[outside].tolist()} is outside row(s) {named_rows(outside)} (length {length}; negative "
            "positions count back from each row's last real token, -1 being it). Pass an index of a real token."
        )
    if any_on_padding:
        bad = named_rows(on_padding)
        raise BcosValueError(
            f"position: {resolved[on_padding].tolist()} of row(s) {bad} is a padding token; the output there is "
            "meaningless. Pass a real token's index, or a negative position (-1 = last real token, per row)."
        )
    return resolved
