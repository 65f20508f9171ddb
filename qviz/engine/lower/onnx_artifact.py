"""A given ``.onnx`` checked against the converted model before onnxruntime runs it.

``qviz.lower(converted, x, backend="onnxruntime", artifact=...)`` measures a shipped file
against the reference: that only means something if the file is an ONNX model, quantized, and
of this model (the same inputs and outputs). Each mismatch is a ConfigError that says which.

Example:
    >>> import torch
    >>> check_artifact(b"not onnx", None, (torch.ones(1),), "model.onnx")
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: lower(artifact='model.onnx') is not an ONNX model (it does not \
parse as one): give the .onnx file qviz.export_onnx or qviz.lower(path=...) wrote
"""

from __future__ import annotations

from typing import Any

import torch

from qviz.errors import ConfigError

#: ONNX element types by torch dtype (those a quantized model's inputs and outputs take).
_ELEMENT = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int32: 6, torch.int64: 7,
            torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}  # fmt: skip


def _parse(data: bytes, name: str) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"lower(artifact={name!r}) is not an ONNX model (it does not parse as one): give the "
            f".onnx file qviz.export_onnx or qviz.lower(path=...) wrote"
        ) from exc
    if not model.graph.node:
        raise ConfigError(
            f"lower(artifact={name!r}) is not an ONNX model (it parses to an empty graph): give "
            f"the .onnx file qviz.export_onnx or qviz.lower(path=...) wrote"
        )
    return model


def _signature(values: Any, skip: set[str]) -> list[tuple[int, tuple]]:
    """``(element type, dims)`` of each graph input or output (a symbolic dim is None)."""
    out = []
    for v in values:
        if v.name in skip:
            continue
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        out.append((t.elem_type, dims))
    return out


def _expected(converted: Any, example_inputs: tuple) -> tuple[list, list]:
    """``(element type, shape)`` of the converted model's tensor inputs and outputs (one call
    of it on the example)."""
    inputs = [(_ELEMENT.get(x.dtype), tuple(x.shape)) for x in example_inputs
              if isinstance(x, torch.Tensor)]  # fmt: skip
    with torch.no_grad():
        result = converted(*example_inputs)
    flat = result if isinstance(result, (tuple, list)) else [result]
    outputs = [(_ELEMENT.get(t.dtype), tuple(t.shape)) for t in flat if isinstance(t, torch.Tensor)]
    return inputs, outputs


def _match(got: list, want: list) -> bool:
    if len(got) != len(want):
        return False
    for (gtype, gdims), (wtype, wshape) in zip(got, want, strict=True):
        if gtype != wtype or len(gdims) != len(wshape):
            return False
        for i, (g, w) in enumerate(zip(gdims, wshape, strict=True)):
            static_w = isinstance(w, int)
            if i and g is not None and static_w and g != w:  # the batch may differ
                return False
    return True


def _words(signature: list) -> str:
    """``float32[N, 10]``: each tensor's type and shape, its batch (first) dimension as N."""
    names = {v: k for k, v in _ELEMENT.items()}
    return ", ".join(
        f"{str(names.get(t, t)).replace('torch.', '')}"
        f"[{', '.join('N' if i == 0 or d is None else str(d) for i, d in enumerate(s))}]"
        for t, s in signature
    )


def check_artifact(data: bytes, converted: Any, example_inputs: tuple, name: str) -> None:
    """Raise a ConfigError unless ``data`` is a quantized ONNX model taking and giving what
    ``converted`` does (``name`` is how the message calls the file).

    Raises:
        ConfigError: not ONNX, an empty graph, no QuantizeLinear (a float model), or inputs
            or outputs another model has.
    """
    model = _parse(data, name)
    ops = {n.op_type for n in model.graph.node}
    if not ops & {"QuantizeLinear", "QLinearConv", "QLinearMatMul", "QGemm"}:
        raise ConfigError(
            f"lower(artifact={name!r}) is a float model: it has no QuantizeLinear; export the "
            f"quantized model (qviz.export_onnx(converted, ...) or qviz.lower(path=...))"
        )
    if converted is None:
        return
    initializers = {i.name for i in model.graph.initializer}
    got_in = _signature(model.graph.input, initializers)
    got_out = _signature(model.graph.output, set())
    want_in, want_out = _expected(converted, example_inputs)
    for what, got, want in (("inputs", got_in, want_in), ("outputs", got_out, want_out)):
        if not _match(got, want):
            raise ConfigError(
                f"lower(artifact={name!r}) is another model's .onnx: its {what} are "
                f"{_words(got) or 'none'}, the converted model's are {_words(want) or 'none'}; "
                f"give the file exported from this model"
            )
