"""Which ONNX integer type holds a quantized range at an opset: the decisions ``export_onnx``
makes before it touches a graph. Pure: no onnx, no graph.

ONNX's ``QuantizeLinear`` has no ``quant_min`` / ``quant_max``: it saturates to the full range of
its zero point's type, int8 or uint8 (and int16 / uint16 from opset 21). A range narrower than
its type (narrow range ``-127..127``, 4-bit ``-8..7`` held in int8, ``0..127``) is written by
clamping the float input to the range's end levels first,
``[(quant_min - zero_point) * scale, (quant_max - zero_point) * scale]``, and quantizing with the
type's full range. That gives the same integers: the clamp moves only values whose quantized
level lies beyond an end level, and those are exactly the values the range clamps to that end
level (rounding is monotonic, and an end level times the scale rounds back to itself).

Example:
    >>> onnx_type(-127, 127, opset=20, where="conv's input")
    OnnxType(name='int8', quant_min=-128, quant_max=127)
    >>> onnx_type(-8, 7, opset=20, where="x").clamps(-8, 7)
    True
    >>> onnx_type(-32768, 32767, opset=20, where="quantize_per_tensor_default")
    Traceback (most recent call last):
    ...
    qviz.errors.OnnxExportError: quantize_per_tensor_default: the range -32768..32767 needs int16, which ONNX's QuantizeLinear has from opset 21 on; export with opset=21 or later, or quantize to 8 bits
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass

import torch

from qviz.errors import OnnxExportError

#: The first opset whose QuantizeLinear / DequantizeLinear take int16 and uint16.
INT16_OPSET = 21


@dataclass(frozen=True)
class OnnxType:
    """An ONNX integer type that QuantizeLinear saturates to: its name and full range."""

    name: str
    quant_min: int
    quant_max: int

    def clamps(self, quant_min: int, quant_max: int) -> bool:
        """``[quant_min, quant_max]`` is narrower than this type: the input needs a clamp.

        Example:
            >>> OnnxType("int8", -128, 127).clamps(-128, 127)
            False
        """
        return (quant_min, quant_max) != (self.quant_min, self.quant_max)


#: Smallest first: a range goes into the first type that holds it.
_TYPES: tuple[tuple[OnnxType, int], ...] = (
    (OnnxType("int8", -128, 127), 10),
    (OnnxType("uint8", 0, 255), 10),
    (OnnxType("int16", -(2**15), 2**15 - 1), INT16_OPSET),
    (OnnxType("uint16", 0, 2**16 - 1), INT16_OPSET),
)
_BY_DTYPE = {
    torch.int8: _TYPES[0],
    torch.uint8: _TYPES[1],
    torch.int16: _TYPES[2],
    torch.uint16: _TYPES[3],
}


@dataclass(frozen=True)
class OnnxRange:
    """How one quantized tensor is written to ONNX.

    Attributes:
        name: the converted graph's quantize node, or the TensorQuantizer's module path.
        quant_min, quant_max: the integer range qviz quantizes to.
        onnx_type: the QuantizeLinear output type holding it (``"int8"``, ``"uint16"``, ...).
        clamped: the range is narrower than ``onnx_type``, so the float input is clamped to
            the range's end levels before QuantizeLinear (a ``Clip``, or ``Max`` / ``Min`` per
            channel).
    """

    name: str
    quant_min: int
    quant_max: int
    onnx_type: str
    clamped: bool

    def __str__(self) -> str:
        how = f"clamped, then {self.onnx_type}" if self.clamped else self.onnx_type
        return f"{self.name}: {self.quant_min}..{self.quant_max} ({how})"


def _too_new(where: str, what: str, first: int) -> OnnxExportError:
    return OnnxExportError(
        f"{where}: {what}, which ONNX's QuantizeLinear has from opset {first} on; export with "
        f"opset={first} or later, or quantize to 8 bits"
    )


def onnx_type(quant_min: int, quant_max: int, *, opset: int, where: str) -> OnnxType:
    """The smallest ONNX integer type holding ``[quant_min, quant_max]`` at ``opset``.

    Args:
        quant_min, quant_max: the integer range.
        opset: the ONNX opset the model is written for.
        where: what is quantized (a node or module name), for the error message.

    Raises:
        OnnxExportError: no type of ``opset`` holds the range (16-bit ranges before opset 21,
            anything wider than 16 bits).

    Example:
        >>> onnx_type(0, 200, opset=20, where="x").name
        'uint8'
    """
    for kind, first in _TYPES:
        if kind.quant_min <= quant_min and quant_max <= kind.quant_max:
            if opset < first:
                needs = f"the range {quant_min}..{quant_max} needs {kind.name}"
                raise _too_new(where, needs, first)
            return kind
    raise OnnxExportError(
        f"{where}: the range {quant_min}..{quant_max} is wider than 16 bits, and ONNX's "
        f"QuantizeLinear saturates to at most int16 / uint16; quantize to 16 bits or fewer"
    )


def onnx_type_of_dtype(
    dtype: torch.dtype, *, opset: int, where: str, dequantize_only: bool = False
) -> OnnxType | None:
    """The ONNX type of a converted graph's quantized ``dtype`` at ``opset``.

    ``dequantize_only``: the tensor is only dequantized (a stored int32 bias, say), which
    DequantizeLinear accepts for int32 too; then None means "int32, no QuantizeLinear".

    Raises:
        OnnxExportError: ``dtype`` has no QuantizeLinear / DequantizeLinear type at ``opset``.

    Example:
        >>> onnx_type_of_dtype(torch.uint8, opset=20, where="q").name
        'uint8'
        >>> onnx_type_of_dtype(torch.int32, opset=20, where="dq", dequantize_only=True) is None
        True
    """
    if dtype == torch.int32 and dequantize_only:
        return None
    if dtype not in _BY_DTYPE:
        raise OnnxExportError(
            f"{where}: quantized dtype {dtype} has no ONNX QuantizeLinear form (int8, uint8, "
            f"int16 and uint16 do); quantize to one of those"
        )
    kind, first = _BY_DTYPE[dtype]
    if opset < first:
        raise _too_new(where, f"dtype {dtype} needs {kind.name}", first)
    return kind
