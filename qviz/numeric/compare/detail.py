"""One layer up close: its float and quantized outputs on a sample batch.

:func:`layer_detail` runs the float and the quantized model on one batch and keeps the outputs of
one operator (matched by debug handle, as :func:`qviz.numeric.compare` matches them; the
quantized value after the operator's output quantize/dequantize), for a float-vs-quantized
scatter and an error histogram (:meth:`LayerDetail.plot`).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(32, 4)
    >>> gm = qviz.export(torch.nn.Linear(4, 3).eval(), (x,))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> qm = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), [x], progress=False))
    >>> layer_detail(gm, qm, "linear", (x,)).numel
    96
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from qviz.engine.graph.debug_handles import float_handle, handle
from qviz.engine.graph.inputs import bind_batch
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import ConfigError, closest_names
from qviz.numeric.compare.runs import output_probe
from qviz.numeric.measure.metrics import sqnr

#: Values kept for the scatter (a seeded random subsample).
MAX_POINTS = 5000


@dataclass(frozen=True, kw_only=True)
class LayerDetail:
    """One layer's float and quantized outputs on a sample batch (values subsampled).

    Attributes:
        node: the operator (node name of the quantized model).
        sqnr: dB, its quantized output (as the next operator sees it) against the float one over
            the whole sample batch: the report's ``cumulative_sqnr`` measured on one batch.
        numel: how many output values the sample batch gave.
        float_values, quantized_values: a random subsample (at most 5000, seed 0) of both, as
            numpy arrays, for the scatter.
        error_counts, error_edges: histogram of ``quantized - float`` over all values.
        in_float: the layer is kept in float (a fallback); its error is inherited only.
    """

    node: str
    sqnr: float
    numel: int
    float_values: Any = field(repr=False)
    quantized_values: Any = field(repr=False)
    error_counts: Any = field(repr=False)
    error_edges: Any = field(repr=False)
    in_float: bool = False

    def plot(self) -> Any:
        """The scatter (float against quantized) and the error histogram: a matplotlib Figure."""
        from qviz.numeric.compare.plots import detail_figure

        return detail_figure(self)

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.plot().savefig(buf, format="png", dpi=80)
        return buf.getvalue()


class _Capture(Interpreter):
    """Runs a graph module and keeps a copy of one node's output."""

    def __init__(self, gm: GraphModule, wanted: Node) -> None:
        super().__init__(gm)
        self.wanted, self.value = wanted, None

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n is self.wanted and isinstance(result, torch.Tensor):
            self.value = result.detach().clone()
        return result


def _node(gm: GraphModule, name: str) -> Node:
    for n in gm.graph.nodes:
        if n.name == name:
            return n
    known = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    raise ConfigError(
        f"layer_detail: the quantized model has no node {name!r} ({closest_names(name, known)})"
    )


def layer_detail(
    float_gm: GraphModule,
    quantized_gm: GraphModule,
    node: str,
    inputs: tuple[Any, ...],
    *,
    max_points: int = MAX_POINTS,
) -> LayerDetail:
    """Run both models on ``inputs`` and compare ``node``'s float and quantized outputs.

    The float output is the float model's operator with the same debug handle
    (:func:`qviz.engine.graph.debug_handles.float_handle`, so a conv with a folded BatchNorm is
    compared with the BatchNorm); the quantized one is taken after the operator's output
    quantize/dequantize, as :func:`qviz.numeric.compare` measures the cumulative error.

    Args:
        float_gm: the float graph module (debug handles from :func:`qviz.export`): float.
        quantized_gm: the model from :func:`qviz.convert_pt2e`, made from ``float_gm``:
            converted. Both stages are checked before either runs.
        node: an operator of ``quantized_gm`` (a row of the numeric report).
        inputs: one batch (its inputs, as for :func:`qviz.calibrate`).
        max_points: how many values to keep for the scatter.

    Raises:
        ConfigError: a model at the wrong stage, ``node`` is not in the quantized model or has
            no float counterpart, or ``inputs`` that do not fit the exported ones.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(32, 4)
        >>> gm = qviz.export(torch.nn.Linear(4, 3).eval(), (x,))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> qm = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), [x], progress=False))
        >>> d = layer_detail(gm, qm, "linear", (x,))
        >>> d.numel, d.float_values.shape, d.sqnr > 30
        (96, (96,), True)
    """
    check_stage(quantized_gm, Stage.CONVERTED, where="layer_detail", arg="quantized_gm")
    check_stage(float_gm, Stage.FLOAT, where="layer_detail", arg="float_gm", exported=True)
    inputs = bind_batch(quantized_gm, inputs, "layer_detail: inputs").args
    qnode = _node(quantized_gm, node)
    ref = float_handle(qnode)
    fnode = next((n for n in float_gm.graph.nodes if handle(n) == ref), None)
    if ref is None or fnode is None:
        raise ConfigError(
            f"layer_detail: {qnode.format_node()} has no float counterpart (no debug handle); "
            f"pass the float graph module the quantized model was prepared from"
        )
    with torch.no_grad():
        f_run, q_run = _Capture(float_gm, fnode), _Capture(quantized_gm, output_probe(qnode)[0])
        f_run.run(*inputs)
        q_run.run(*inputs)
    if f_run.value is None or q_run.value is None:
        raise ConfigError(f"layer_detail: {node!r} does not output a tensor")
    f, q = f_run.value.float().flatten(), q_run.value.float().flatten()
    plan = plan_of(quantized_gm)
    in_float = any(r.node == node for r in getattr(plan, "float_nodes", ()))
    return _detail(node, f, q, max_points, in_float)


def _detail(node: str, f: torch.Tensor, q: torch.Tensor, max_points: int, in_float: bool):
    err = q - f
    low, high = float(err.min()), float(err.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    counts = torch.histc(err, bins=60, min=low, max=high)
    keep = torch.arange(f.numel())
    if f.numel() > max_points:
        keep = torch.randperm(f.numel(), generator=torch.Generator().manual_seed(0))[:max_points]
    return LayerDetail(
        node=node, sqnr=sqnr(f, q), numel=f.numel(), float_values=f[keep].numpy(),
        quantized_values=q[keep].numpy(), error_counts=counts.numpy(),
        error_edges=torch.linspace(low, high, 61).numpy(), in_float=in_float,
    )  # fmt: skip
