"""What ``bcosify`` changed, module by module."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ConversionReport"]


@dataclass
class ConversionReport:
    """Every change ``bcosify`` made, by module path.

    Attributes:
        architecture: class name of the converted model (before conversion).
        b: alignment pressure used.
        bcos_query_key: whether query/key projections became B-cos layers (``False``: kept stock, listed in
            ``kept``).
        bcos_layers: linear / Conv1D layers replaced by B-cos layers.
        dropped_biases: full parameter names of the biases removed (linear, norm, classifier).
        norms: normalisation layers made bias-free and detachable.
        activations: activations made detachable, with the gate they use.
        removed_activations: head activations removed (tanh / ReLU in poolers and pre-classifiers).
        constant_outputs: query/key projections whose outputs are constants in explanation mode (B-cos or
            stock).
        constant_gate_outputs: gated-MLP input projections whose activated units (the half that only feeds the
            dynamic weight ``act(input)``) are constants in explanation mode (the spec's ``gate_units``).
        gate_branch_activations: gated-MLP activations with no ``x * gate(x)`` form (tanh, sigmoid, mish, ...) kept
            as they are, with the reason: their output is the MLP's dynamic weight, held constant while explaining,
            so the explanation is exact (``bcos_plugins.convert.bcosify.GATE_BRANCH_ACTIVATIONS``).
        kept: modules deliberately left as they are (e.g. tied LM heads), with the reason.
        patched_modules: modules whose class was swapped for a B-cos subclass, with the reason.
    """

    architecture: str
    b: float
    bcos_query_key: bool = True
    bcos_layers: list[str] = field(default_factory=list)
    dropped_biases: list[str] = field(default_factory=list)
    norms: list[str] = field(default_factory=list)
    activations: dict[str, str] = field(default_factory=dict)
    removed_activations: list[str] = field(default_factory=list)
    constant_outputs: list[str] = field(default_factory=list)
    constant_gate_outputs: list[str] = field(default_factory=list)
    gate_branch_activations: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    patched_modules: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [
            f"bcosify({self.architecture}, b={self.b}):",
            f"  {len(self.bcos_layers)} linear layers -> B-cos",
            f"  {len(self.norms)} norms -> bias-free, detachable",
            f"  {len(self.activations)} activations -> detachable "
            f"({', '.join(sorted(set(self.activations.values()))) or 'none'})",
            f"  {len(self.constant_outputs)} query/key projections constant in explanation mode"
            + ("" if self.bcos_query_key else " (kept stock: pretrained weights and biases)"),
            f"  {len(self.dropped_biases)} biases dropped",
        ]
        if self.constant_gate_outputs:
            lines.insert(-1, f"  {len(self.constant_gate_outputs)} gated-MLP input projections with their activated "
                             "units constant in explanation mode")
        if self.gate_branch_activations:
            kinds = sorted({why.partition(":")[0] for why in self.gate_branch_activations.values()})
            lines.insert(-1, f"  {len(self.gate_branch_activations)} gated-MLP activations kept as they are "
                             f"({', '.join(kinds)}): each is its MLP's gate branch, held constant in explanation mode")
        for name in self.removed_activations:
            lines.append(f"  removed head activation: {name}")
        for name, why in self.patched_modules.items():
            lines.append(f"  patched {name}: {why}")
        for name, why in self.kept.items():
            lines.append(f"  kept as is: {name} ({why})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
