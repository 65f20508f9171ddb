"""Capture a model as an ATen graph with torch.export, with errors that say what to do.

Example:
    >>> import torch
    >>> gm = export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.linear', overload='default')>]
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine.graph.debug_handles import assign_handles
from qviz.engine.graph.inputs import example_tuple
from qviz.engine.graph.train_eval import disallow_train_eval
from qviz.errors import ConfigError, QvizError


def dynamic_batch_shapes(
    example_inputs: tuple[Any, ...], max_batch: int = 2**20
) -> tuple[Any, ...]:
    """``dynamic_shapes`` making dimension 0 of every tensor input one shared dynamic "batch"
    (from 1 to ``max_batch``).

    Raises:
        ConfigError: an input's batch is 0 or 1: torch specialises those sizes (a graph traced
            with them is fixed to them), so a dynamic batch needs an example batch of 2 or more.

    Example:
        >>> dynamic_batch_shapes((torch.randn(2, 3), 1.0))
        ({0: Dim('batch', min=1, max=1048576)}, None)
    """
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] < 2:
            raise ConfigError(
                f"dynamic_batch=True: example input {i} has batch {x.shape[0]} (shape "
                f"{tuple(x.shape)}), but torch specialises sizes 0 and 1; give an example with "
                f"batch >= 2 (e.g. torch.cat([x, x])), and the graph takes any batch from 1 on"
            )
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return tuple(
        {0: batch} if isinstance(x, torch.Tensor) and x.dim() > 0 else None for x in example_inputs
    )


def export(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    example_kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    dynamic_batch: bool = False,
    strict: bool = False,
) -> GraphModule:
    """``torch.export.export(model, example_inputs).module()``: the graph qviz quantizes.

    The model is not changed. Put it in eval mode first for post-training quantization
    (BatchNorm and dropout then export as inference ops).

    Args:
        model: the float model.
        example_inputs: a tuple of example positional inputs (a single tensor is accepted).
        example_kwargs: example keyword inputs.
        dynamic_shapes: as for ``torch.export.export`` (e.g. a dynamic batch dimension).
        dynamic_batch: make dimension 0 of every tensor input dynamic (one shared "batch"
            size), so batches of any size run, the short last one of a DataLoader included.
        strict: use torch.export's strict (TorchDynamo) tracing; some quantizers need it.

    Raises:
        QvizError: the model cannot be exported, with torch.export's reason.

    Example:
        >>> import torch, qviz
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()).eval()
        >>> gm = qviz.export(model, (torch.randn(8, 4),), dynamic_batch=True)
        >>> [n.name for n in gm.graph.nodes if n.op == "call_function"]
        ['linear', 'relu']
        >>> gm(torch.randn(3, 4)).shape      # any batch size
        torch.Size([3, 2])
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"export needs an nn.Module, got {type(model).__name__}")
    example_inputs = example_tuple(example_inputs)
    if dynamic_batch:
        if dynamic_shapes is not None:
            raise ConfigError("give dynamic_batch=True or dynamic_shapes, not both")
        dynamic_shapes = dynamic_batch_shapes(example_inputs)
    try:
        program = _export_program(
            model, example_inputs, example_kwargs, dynamic_shapes, dynamic_batch, strict
        )
    except Exception as exc:  # torch.export raises many types; report them all the same way
        raise _capture_error(exc, model, dynamic_batch, strict) from exc
    # the numeric suite matches operators by the handles; train() / eval() raise qviz's
    # ExportedModeError (why, and the fix) instead of torch's bare NotImplementedError
    return disallow_train_eval(assign_handles(program.module()))


def _export_program(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    example_kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    dynamic_batch: bool,
    strict: bool,
) -> Any:
    """``torch.export.export``; with a dynamic batch that a kernel caps (CUDA's convolutions
    take at most 65535), again with that cap as the batch's maximum."""
    try:
        return torch.export.export(
            model, example_inputs, kwargs=example_kwargs, dynamic_shapes=dynamic_shapes,
            strict=strict,
        )  # fmt: skip
    except Exception as exc:
        cap = _kernel_batch_limit(exc) if dynamic_batch else None
        if cap is None:
            raise
        return torch.export.export(
            model, example_inputs, kwargs=example_kwargs,
            dynamic_shapes=dynamic_batch_shapes(example_inputs, cap), strict=strict,
        )  # fmt: skip


def _capture_error(
    exc: Exception, model: nn.Module, dynamic_batch: bool, strict: bool
) -> Exception:
    """The QvizError for torch.export's failure ``exc``, with the fix it calls for."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if dynamic_batch and "Constraints violated (batch)" in first:
        return ConfigError(
            f"qviz.export(dynamic_batch=True): {type(model).__name__}'s code fixes the batch "
            f"size (e.g. x.reshape(<batch>, -1)); write it from the input (x.shape[0], or "
            f"-1), or export without dynamic_batch ({first})"
        )
    return QvizError(
        f"torch.export could not capture {type(model).__name__}: "
        f"{type(exc).__name__}: {first}. "
        f"Make the failing code export-friendly (no data-dependent Python control flow), try "
        f"strict={not strict}, or quantize an exportable submodule"
    )


def _kernel_batch_limit(exc: Exception) -> int | None:
    """The largest batch torch.export's guards allow, when its only complaint about the dynamic
    batch is an upper bound (a kernel's limit, not code that fixes the batch); else None.

    Example:
        >>> _kernel_batch_limit(ValueError("Constraints violated (batch)! ... Suggested fixes:"
        ...                                "\\n  batch = Dim('batch', max=65535)"))
        65535
        >>> _kernel_batch_limit(ValueError("Constraints violated (batch)! batch = 8"))
    """
    text = str(exc)
    if "Constraints violated (batch)" not in text:
        return None
    fixes = re.findall(r"batch = Dim\('batch', max=(\d+)\)", text)
    others = re.findall(r"^\s*batch = (.*)$", text, flags=re.MULTILINE)
    if len(fixes) != 1 or len(others) != 1:
        return None
    return int(fixes[0]) if int(fixes[0]) >= 2 else None
