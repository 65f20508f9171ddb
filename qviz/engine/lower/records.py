"""The records a lowering writes: one :class:`KernelRecord` per operator of the lowered
program, and the :class:`IntegerFormat` it chose for the machine; plain data, read by
:class:`~qviz.engine.lower.lowered.LoweredModel` and every view.

Example:
    >>> KernelRecord(node="conv2d", op="QLinearConv", kernel="integer").kernel
    'integer'
"""

from __future__ import annotations

from dataclasses import dataclass

#: The kernel kinds a record names.
KERNELS = ("integer", "float", "quantize", "data")
#: The largest batch ``qviz.lower`` plans a dynamic-batch ``"xnnpack"`` program for by default.
DEFAULT_MAX_BATCH = 64


@dataclass(frozen=True)
class IntegerFormat:
    """The integer format a lowering chose for the machine it ran on, and why.

    Attributes:
        name: e.g. ``"U8S8"`` (uint8 activations x int8 weights), ``"U8U8"``, ``"QS8"``.
        why: the reason, naming the machine class.

    Example:
        >>> IntegerFormat("U8U8", "no VNNI here").name
        'U8U8'
    """

    name: str
    why: str


@dataclass(frozen=True, kw_only=True)
class KernelRecord:
    """One operator of a lowered program.

    Attributes:
        node: its name in the lowered program (an ONNX node, an ExecuTorch graph node).
        op: its operator (``QLinearConv``, ``aten.convolution.default``, ...).
        kernel: ``"integer"`` (an int8 kernel computes it), ``"float"`` (a float kernel),
            ``"quantize"`` (a quantize / dequantize boundary) or ``"data"`` (moves or reshapes
            data, in whichever dtype it is given).
        where: what runs it (``"onnxruntime CPU"``, ``"XNNPACK delegate 0"``, ``"ExecuTorch
            portable kernels"``).
        reason: why a compute operator stayed float ("" otherwise).
        source: the converted model's node it computes (``"conv2d"``), read from the names and
            provenance the lowering kept; "" where the backend kept none.
    """

    node: str
    op: str
    kernel: str
    where: str = ""
    reason: str = ""
    source: str = ""
