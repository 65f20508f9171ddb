"""The one place qviz touches PyTorch's private or registration-only APIs (DESIGN rule 7).

Example:
    >>> ops = quantized_decomposed()
    >>> ops.quantize_per_tensor.default.__name__
    'quantize_per_tensor.default'
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch._subclasses.fake_tensor import FakeTensor

#: Types of ATen operators (``torch.ops.aten.add.Tensor`` and ``torch.ops.aten.add``).
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def quantized_decomposed():
    """``torch.ops.quantized_decomposed``, with its ops registered (importing a torch module does
    that as a side effect; done here, on first use, rather than when qviz is imported)."""
    importlib.import_module("torch.ao.quantization.fx._decomposed")
    return torch.ops.quantized_decomposed


def exported_call_args(
    gm: torch.fx.GraphModule, flat: tuple[Any, ...]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` to call ``gm`` with, one value per input placeholder in ``flat``.

    A graph from ``torch.export`` checks the call against the positional / keyword structure
    it was exported with (``example_kwargs`` become keywords); other graphs take ``flat``.

    Example:
        >>> gm = torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),)).module()
        >>> args, kwargs = exported_call_args(gm, (torch.ones(1, 2),))
        >>> len(args), kwargs
        (1, {})
    """
    info = getattr(gm.graph._codegen, "pytree_info", None)
    spec = getattr(info, "in_spec", None)
    if spec is None or spec.num_leaves != len(flat):
        return tuple(flat), {}
    args, kwargs = torch.utils._pytree.tree_unflatten(list(flat), spec)
    return tuple(args), dict(kwargs)


@contextlib.contextmanager
def traced_meta(key: str, value: Any) -> Iterator[None]:
    """Nodes that ``torch.export`` traces inside the block carry ``node.meta["custom"][key]``.

    ``value`` must be plain data (numbers, strings, lists, dicts): ``torch.export.save`` writes
    it. Strict export (TorchDynamo) keeps ``torch.fx.traceback.annotate`` on its own; the
    non-strict tracer copies the custom meta only while node meta is preserved, and then would
    also copy torch's own annotations of the enclosing trace, which are dropped here, so that
    only ``key`` is added.

    Example:
        >>> class Tagged(torch.nn.Module):
        ...     def forward(self, x):
        ...         with traced_meta("tag", {"bits": 8}):
        ...             return x * 2
        >>> ep = torch.export.export(Tagged(), (torch.ones(2),))
        >>> [n.meta.get("custom") for n in ep.graph.nodes if n.op == "call_function"]
        [{'tag': {'bits': 8}}]
    """
    if torch.compiler.is_dynamo_compiling():
        with fx_traceback.annotate({key: value}):
            yield
        return
    with fx_traceback.preserve_node_meta():
        fx_traceback.current_meta.pop("custom", None)  # restored when preserve_node_meta exits
        with fx_traceback.annotate({key: value}):
            yield


def is_tracing(x: torch.Tensor) -> bool:
    """Whether ``x`` is being traced (TorchDynamo, torch.export's fake tensors, jit), where a
    data-dependent check such as ``bool(isfinite(x).all())`` cannot run.

    Example:
        >>> is_tracing(torch.ones(2))
        False
    """
    return (
        isinstance(x, FakeTensor)
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or torch.jit.is_tracing()
    )


def copy_tensors_(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``d.copy_(s)`` for each pair, in one call (torch's private ``_foreach_copy_``).

    Example:
        >>> a, b = [torch.zeros(2), torch.zeros(1)], [torch.ones(2), torch.full((1,), 2.0)]
        >>> copy_tensors_(a, b); a
        [tensor([1., 1.]), tensor([2.])]
    """
    torch._foreach_copy_(dst, src)


def remove_hooks_of(module: torch.nn.Module, owner: type) -> None:
    """Remove the forward hooks and pre-hooks of ``module`` that are methods of an ``owner``
    instance (a copy has no handles to remove them by).

    Example:
        >>> class Counter:
        ...     def hook(self, module, args): pass
        >>> m = torch.nn.Linear(1, 1); _ = m.register_forward_pre_hook(Counter().hook)
        >>> remove_hooks_of(m, Counter); len(m._forward_pre_hooks)
        0
    """
    for hooks in (module._forward_pre_hooks, module._forward_hooks):
        for key, hook in list(hooks.items()):
            if isinstance(getattr(hook, "__self__", None), owner):
                del hooks[key]
                module._forward_hooks_always_called.pop(key, None)


def on_deepcopy(gm: torch.fx.GraphModule, hook: Any, *, add: bool = True) -> None:
    """Call ``hook(copy)`` on every deep copy of ``gm`` (GraphModule's deepcopy drops forward
    hooks; its private deepcopy hooks re-register them); ``add=False`` removes ``hook``.

    Example:
        >>> import copy
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> on_deepcopy(gm, lambda c: setattr(c, "tag", 1)); copy.deepcopy(gm).tag
        1
    """
    hooks = gm.__dict__.setdefault("_deepcopy_hooks", [])
    if add:
        hooks.append(hook)
    else:
        hooks[:] = [h for h in hooks if h != hook]


def buffers_of(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every buffer of ``module`` and its submodules (2.5x faster than ``list(buffers())``,
    which also deduplicates: a buffer shared by two modules is listed twice here).

    Example:
        >>> [tuple(b.shape) for b in buffers_of(torch.nn.BatchNorm1d(3))]
        [(3,), (3,), ()]
    """
    return [b for m in module.modules() for b in m._buffers.values() if b is not None]
