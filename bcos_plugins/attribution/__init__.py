"""The attribution core: the one input x gradient step, what to explain, and the result types.

Every explanation path of the package calls this package and none re-implements it:

- :mod:`.targets`: targets / foils (ids per row, or an explicit :class:`Direction`), resolved against a
  path's outputs by :func:`resolve_explained`, and positions (negative = counted from each row's last real
  token; padding and out-of-range positions raise);
- :mod:`.gradient`: :func:`input_x_gradient` inside :func:`~bcos_plugins.nn.explanation_mode`;
- :mod:`.results`: :class:`Explanation` and its family (``TokenExplanation`` here; ``ImageExplanation``,
  ``SpaceExplanation`` and the TransformerLens ``LensExplanation`` in their subpackages), with one
  definition of ``delta`` and ``completeness_error``;
- :mod:`.text`: input checks and the attribution point of transformers text models.

The paths themselves (``bcos_plugins.explain``, ``bcos_plugins.corpus.explain_dataset``, the subpackages and the
adapters) are built on this package; it imports none of them.
"""

from ..nn.dynamic import has_dynamic_weights
from .gradient import GradientStep, as_leaf, capture_point, input_x_gradient
from .results import Explanation, TokenExplanation, relative_completeness_error
from .targets import (
    Direction,
    last_real_position,
    parse_ids,
    real_token_positions,
    resolve_explained,
    resolve_positions,
    select_explained,
)
from .text import check_first_column_is_real, check_token_inputs, model_call_kwargs, text_attribution_point

__all__ = [
    "Direction",
    "Explanation",
    "GradientStep",
    "TokenExplanation",
    "as_leaf",
    "capture_point",
    "check_first_column_is_real",
    "check_token_inputs",
    "has_dynamic_weights",
    "input_x_gradient",
    "last_real_position",
    "model_call_kwargs",
    "parse_ids",
    "real_token_positions",
    "relative_completeness_error",
    "resolve_explained",
    "resolve_positions",
    "select_explained",
    "text_attribution_point",
]
