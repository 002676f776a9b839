"""The result type family: one set of field names for text, images, TransformerLens and the Space head.

Every explanation in the package is an :class:`Explanation`:

- ``contributions``: the scores users look at, one per unit (token or pixel), the per-feature contributions
  reduced over the feature axis;
- ``input_contributions``: the contributions per unit *and* feature at the attribution point (``W(x) x`` per
  token and embedding dimension; per encoded channel and pixel for images; per concept unit for the Space
  head);
- ``explained``: what was explained, one value per row (a logit, a logit difference ``target - foil``, a
  hidden unit, an SAE feature's pre-activation);
- ``target`` / ``foil``: what was explained, per row (ids, or a :class:`~bcos_plugins.attribution.Direction`);
- ``attribution_point``: where the contributions were taken, in words.

Completeness has one definition. ``delta = sum(input_contributions) - explained`` per row is the signed
difference (what Captum and inseq call the convergence delta); ``completeness_error = |delta| / |explained|``
is its relative size. For B-cos models ``completeness_error`` is float rounding (about 1e-6 in float32); on a
stock model it says how far plain input x gradient is from the explained value.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._checks import require_available_device, require_tensor
from ..errors import BcosTypeError, BcosValueError, argument_error
from ..nn.functional import at_least_float32

__all__ = ["Explanation", "TokenExplanation", "relative_completeness_error"]

# an explained value of exactly 0 is treated as this: the relative error of a zero logit is |delta| / 1e-12, which
# is huge unless delta is exactly 0, rather than a division by zero.
_TINY = 1e-12


def relative_completeness_error(delta: Float[Tensor, " batch"], explained: Float[Tensor, " batch"]
                                ) -> Float[Tensor, " batch"]:
    """``|delta| / |explained|`` per row, the package's one definition of completeness error (in at least float32:
    the floor under ``|explained|`` is 0 in float16). Lists are read as the package reads them (Python floats at
    float64); the two must have one shape."""
    delta = require_tensor("delta", delta, kind="real", finite=False)
    explained = require_tensor("explained", explained, kind="real", finite=False)
    if delta.shape != explained.shape:  # broadcasting made one row's delta every row's (a (1,) delta against 3 rows)
        raise argument_error("explained", f"has shape {tuple(explained.shape)} but delta has {tuple(delta.shape)}",
                             "Pass one delta per explained value (the same shape)")
    dtype = at_least_float32(torch.promote_types(delta.dtype, explained.dtype))
    size = explained.to(dtype).abs()
    # the floor is for an explained value of exactly 0 only: clamping every |explained| below 1e-12 up to it read a
    # tiny logit's error as up to 1e12 times smaller than it is (1e-4 for a 100 % miss of a logit of 1e-16, a B = 10
    # model's), so a wrong explanation looked complete; the quotient of a subnormal value stays finite
    error = delta.to(dtype).abs() / torch.where(size == 0, torch.full_like(size, _TINY), size)
    return error.clamp_max(torch.finfo(dtype).max)


def _short(value) -> str:
    """A target or foil that is not a tensor, as repr shows it: a Direction by its vector's shape."""
    vector = getattr(value, "vector", None)
    if isinstance(vector, Tensor):
        return f"{type(value).__name__}(vector of shape {tuple(vector.shape)})"
    return repr(value)


# how many targets / foils / positions repr shows (the rest as "...")
_REPR_SHOWN = 8


@dataclass
class Explanation:
    """Base of every explanation result (see the module docstring for the fields' meaning)."""

    contributions: Tensor
    input_contributions: Tensor
    explained: Float[Tensor, " batch"]
    target: object
    foil: object | None = None
    attribution_point: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # @dataclass writes a field-by-field __repr__ on every subclass it decorates unless the class defines its own
        # (it leaves a __repr__ in the class's __dict__ alone, and this runs before the decorator): the generated one
        # printed whole (batch, pos, d_model) tensors for print(explanation), so every result type gets the short one
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Explanation.__repr__
        # the same for __eq__: the generated one compared the tensors with ==, so two results of one call raised
        # "Boolean value of Tensor with more than one value is ambiguous"
        if "__eq__" not in cls.__dict__:
            cls.__eq__ = Explanation.__eq__

    def __eq__(self, other) -> bool:
        """Value equality: the same result type, every field the same (tensors of one shape, dtype and device with
        equal elements: :func:`~bcos_plugins.attribution.targets.same_values`); results hold tensors, so they are not
        hashable."""
        from .targets import same_values  # imported here, as in to(): targets imports nothing of this module

        if type(other) is not type(self):
            return NotImplemented
        return all(same_values(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None  # equal results must hash equal, and tensors' values cannot be hashed

    def __repr__(self) -> str:
        """One line: the class, the batch size, the positions (or the shape of a row), the target(s) and foil(s) and
        the largest completeness error; the numbers reach the host in one device-to-host sync."""
        name = type(self).__name__
        contributions = self.contributions
        if not isinstance(contributions, Tensor) or contributions.ndim == 0:
            return f"{name}(contributions={type(contributions).__name__}, target={self.target!r})"
        shown = [("error", None), ("target", self.target), ("foil", self.foil), *self._repr_tensors()]
        tensors = [(key, value) for key, value in shown if isinstance(value, Tensor)]
        try:
            error = self.completeness_error.detach().reshape(-1)
            errors = int(error.numel())
            # float64 holds every id exactly (MPS has no float64: ids up to 2 ** 24 are exact in float32 too)
            dtype = torch.float32 if error.device.type == "mps" else torch.float64
            parts = [error.amax()[None] if errors else error.to(dtype)]
            parts += [value.detach().reshape(-1)[:_REPR_SHOWN].to(error.device, dtype) for _, value in tensors]
            host = torch.cat([part.to(dtype) for part in parts]).tolist()  # the one sync
        except Exception:  # a result built by hand with odd fields: repr must not raise
            return f"{name}(batch={contributions.shape[0]}, target={self.target!r})"
        values: dict = {}
        start = 1 if errors else 0
        for key, value in tensors:
            count = min(value.numel(), _REPR_SHOWN)
            numbers = [int(v) if not value.is_floating_point() else v for v in host[start:start + count]]
            start += count
            shown_value = numbers[0] if value.ndim == 0 else numbers + (["..."] if value.numel() > count else [])
            values[key] = str(shown_value).replace("'...'", "...")
        fields = [f"batch={contributions.shape[0]}", self._repr_units()]
        for key, value in shown[1:]:
            if key == "foil" and value is None:
                continue
            fields.append(f"{key}={values.get(key, _short(value))}")
        fields.append(f"completeness_error max={host[0]:.2g}" if errors else "completeness_error=none (no rows)")
        return f"{name}({', '.join(field for field in fields if field)})"

    def _repr_units(self) -> str:
        return f"shape={tuple(self.contributions.shape[1:])}"

    def _repr_tensors(self) -> list[tuple[str, object]]:
        return []

    @property
    def embedding_contributions(self):
        # the 0.1 name; refused by name (an AttributeError, so hasattr() is False) rather than kept as a
        # second spelling of input_contributions
        raise AttributeError("embedding_contributions: renamed input_contributions in 0.2 (the name every "
                             "result type shares). Read explanation.input_contributions.")

    @property
    def logits(self) -> Float[Tensor, " batch"]:
        """The explained values (``explained``; kept because most explained values are logits)."""
        return self.explained

    @property
    def total(self) -> Float[Tensor, " batch"]:
        """Sum of all contributions per row (equals ``explained`` when the explanation is complete), accumulated and
        returned in at least float32: a float16 / bfloat16 sum keeps 3 significant digits, which hid completeness
        gaps of half-precision explanations (0.0 reported for a 1e-3 gap) or made them up."""
        flat = self.input_contributions.reshape(self.input_contributions.shape[0], -1)
        return flat.sum(-1, dtype=at_least_float32(flat.dtype))

    @property
    def delta(self) -> Float[Tensor, " batch"]:
        """Signed difference ``sum(input_contributions) - explained`` per row (Captum's / inseq's delta)."""
        return self.total - self.explained

    @property
    def completeness_error(self) -> Float[Tensor, " batch"]:
        """``|delta| / |explained|`` per row."""
        return relative_completeness_error(self.delta, self.explained)


@dataclass
class TokenExplanation(Explanation):
    """Explanation of token sequences (returned by :func:`bcos_plugins.explain`).

    ``contributions`` is ``(batch, pos)``, ``input_contributions`` ``(batch, pos, d_model)``; ``position`` is
    the explained position per row (causal LMs and base models; ``None`` for classifiers); ``reduce`` says
    how ``contributions`` were reduced over ``d_model`` (``"sum"`` is exact, ``"mean"`` ranks the same).
    """

    position: Int[Tensor, " batch"] | None = None
    input_ids: Int[Tensor, "batch pos"] | None = None
    attention_mask: Int[Tensor, "batch pos"] | None = None
    reduce: str = "sum"

    def _repr_units(self) -> str:
        return f"positions={self.contributions.shape[1]}" if self.contributions.ndim > 1 else ""

    def _repr_tensors(self) -> list[tuple[str, object]]:
        return [("position", self.position)] if self.position is not None else []

    def _keep(self, i: int):
        if self.attention_mask is None:
            return slice(None)
        return self.attention_mask[i].bool()

    def tokens(self, tokenizer) -> list[list[str]]:
        """Tokens of each row (padding removed), aligned with :meth:`scores`.

        ``tokenizer`` must be the explained model's: an id outside its vocabulary (``len(tokenizer)``) proves it is
        another model's and is refused, but the explanation does not record its model, so another tokenizer whose
        vocabulary holds every id reads them as other tokens without a word (visualize's pages read the tokens through this method).
        """
        if not callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
            # None (or token strings, a hub name) failed with "'NoneType' object has no attribute
            # 'convert_ids_to_tokens'", naming neither the argument nor the fix
            raise argument_error("tokenizer", f"expected the explained model's tokenizer (an object with "
                                 f"convert_ids_to_tokens), got {type(tokenizer).__name__}",
                                 "Pass the tokenizer object the ids came from, e.g. "
                                 "AutoTokenizer.from_pretrained(the model's folder or hub name)", kind=BcosTypeError)
        if self.input_ids is None:
            raise BcosValueError("tokenizer: this explanation holds no input_ids (it was made from embeddings), so "
                                 "there are no tokens to look up. Use the tokens of the inputs you explained.")
        rows = [ids[self._keep(i)].tolist() for i, ids in enumerate(self.input_ids)]
        size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        # an id past the vocabulary (some tokenizers raise on it) or one the tokenizer maps to None (transformers'
        # answer for an unknown id, which the page builders showed as "None") proves another model's tokenizer
        unknown = [(i, j) for i, row in enumerate(rows) for j, token_id in enumerate(row)
                   if size is not None and token_id >= size]
        tokens = None
        if not unknown:
            tokens = [tokenizer.convert_ids_to_tokens(row) for row in rows]
            unknown = [(i, j) for i, row in enumerate(tokens) for j, token in enumerate(row) if token is None]
        if unknown:
            i, j = unknown[0]
            raise argument_error("tokenizer", f"{type(tokenizer).__name__} has no token for id {rows[i][j]} (row {i}, "
                                 f"position {j}; {len(unknown)} such tokens): it is not the tokenizer of the explained "
                                 "model", "Pass the tokenizer the explained ids came from")
        return tokens

    def scores(self) -> list[Tensor]:
        """Per-token scores of each row with padding removed."""
        return [row[self._keep(i)] for i, row in enumerate(self.contributions)]

    def to(self, device: str | torch.device | torch.dtype | None = None,
           dtype: torch.dtype | None = None) -> TokenExplanation:
        """A copy with every tensor moved to ``device`` and the floating-point ones (the contributions and the
        explained values) cast to ``dtype`` (a dtype alone may come first, as in ``Tensor.to``); a
        :class:`~bcos_plugins.attribution.Direction` target's or foil's vector too. The token ids, mask, positions and
        integer targets keep their integer dtype, as ``nn.Module.to`` casts only parameters (``to(torch.float64)`` made
        them float64, and ``tokens()`` then looked up float ids)."""
        from .targets import Direction  # targets imports nothing of this module; imported here to keep it so

        if isinstance(device, torch.dtype):
            if dtype is not None:
                raise argument_error("device", f"is the dtype {device} and dtype= is {dtype} too",
                                     "Pass a device and a dtype: to(device, dtype), or to(dtype) alone")
            device, dtype = None, device
        if device is not None:
            device = require_available_device("device", device)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise argument_error("dtype", f"is {dtype!r}; it casts the contributions and explained values, which are "
                                 "floating-point numbers (the ids and positions keep theirs)",
                                 "Pass a floating-point dtype (torch.float32, torch.float64, torch.bfloat16)")

        def moved(value):
            if isinstance(value, Direction):
                return Direction(moved(value.vector))
            if not isinstance(value, Tensor):
                return value
            return value.to(device=device, dtype=dtype if value.is_floating_point() else None)

        return type(self)(**{k: moved(v) for k, v in self.__dict__.items()})
