"""Everything the Captum adapter takes from Captum's private modules, in one place (as ``_Inseq071`` holds
inseq's quirks in adapters/inseq.py).

A Captum attribution method that behaves like Captum's own (tuple or tensor inputs, additional forward
arguments, Captum's target forms) needs the helpers Captum's methods call, which Captum 0.9 keeps private in
``captum._utils.common``, the ``TargetType`` alias of ``captum._utils.typing``, and the record type of
``captum.attr._utils.visualization`` (its ``visualize_text`` takes). Nothing else in the package
imports those modules. :meth:`CaptumInternals.helpers_behave` runs each helper on a small case and compares
with what the adapter relies on; tests/test_captum_adapter.py asserts it, so a Captum release that renames or
changes one fails that test rather than the adapter failing obscurely (or silently computing something else).
"""

from __future__ import annotations

import inspect

import torch
from captum._utils import common as _common
from captum._utils.typing import TargetType
from captum.attr._utils.visualization import VisualizationDataRecord

__all__ = ["CaptumInternals", "TargetType", "VisualizationDataRecord"]


class CaptumInternals:
    """The private Captum helpers :class:`~bcos_plugins.adapters.captum.BcosAttribution` and
    :class:`~bcos_plugins.adapters.captum.LayerBcos` call, under the adapter's names.

    - ``is_tuple(inputs)``: whether ``attribute`` got a tuple (then it returns one);
    - ``as_tuple(inputs)``: a tensor as a one-tensor tuple (a tuple unchanged);
    - ``forward_args(additional_forward_args)``: Captum's extra arguments as a tuple (``None`` unchanged);
    - ``run_forward(forward_func, inputs, target, additional)``: the forward with Captum's target selection;
    - ``output_as(is_tuple, outputs)``: the attributions in the form the inputs came in;
    - ``select_targets(output, target)``: Captum's target selection on an output tensor.
    """

    is_tuple = staticmethod(_common._is_tuple)
    as_tuple = staticmethod(_common._format_tensor_into_tuples)
    forward_args = staticmethod(_common._format_additional_forward_args)
    run_forward = staticmethod(_common._run_forward)
    output_as = staticmethod(_common._format_output)
    select_targets = staticmethod(_common._select_targets)

    # the parameters the adapter passes, by position, per helper
    SIGNATURES = {
        "_is_tuple": ["inputs"],
        "_format_tensor_into_tuples": ["inputs"],
        "_format_additional_forward_args": ["additional_forward_args"],
        "_run_forward": ["forward_func", "inputs", "target", "additional_forward_args"],
        "_format_output": ["is_inputs_tuple", "output"],
        "_select_targets": ["output", "target"],
    }

    @classmethod
    def helpers_behave(cls) -> dict[str, bool]:
        """Per helper: it still exists with the parameters above and does what the adapter relies on."""
        x, y = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
        probes = {
            "_is_tuple": lambda: cls.is_tuple((x,)) is True and cls.is_tuple(x) is False,
            "_format_tensor_into_tuples": lambda: cls.as_tuple(x)[0] is x and cls.as_tuple((x, y)) == (x, y),
            "_format_additional_forward_args": lambda: cls.forward_args(None) is None
            and cls.forward_args(y)[0] is y and cls.forward_args((x, 1)) == (x, 1),
            "_run_forward": lambda: torch.equal(cls.run_forward(lambda a, b: a + b, (x,), 2, (y,)), x[:, 2] + 1)
            and torch.equal(cls.run_forward(lambda a: a, (x,), torch.tensor([0, 1]), None), torch.tensor([0.0, 4.0])),
            "_format_output": lambda: cls.output_as(False, (x,)) is x and cls.output_as(True, (x, y)) == (x, y),
            "_select_targets": lambda: torch.equal(cls.select_targets(x, 1), x[:, 1])
            and torch.equal(cls.select_targets(x, [2, 0]), torch.tensor([2.0, 3.0]))
            and cls.select_targets(x, None) is x,
        }
        present = {}
        for name, parameters in cls.SIGNATURES.items():
            helper = getattr(_common, name, None)
            try:
                ok = helper is not None and list(inspect.signature(helper).parameters)[:len(parameters)] == parameters
                present[name] = bool(ok and probes[name]())
            except Exception:  # a changed helper may fail on the probe instead of answering it
                present[name] = False
        return present
