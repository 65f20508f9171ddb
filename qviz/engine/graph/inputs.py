"""THE batch path: what a batch is, how it binds to a model's inputs, and the check before it runs.

Every entry point that runs data through a model (``qviz.calibrate``,
``qviz.calibrate_quantizers``, ``qviz.numeric.compare`` of both kinds, ``sensitivity``,
``compare_configs``, ``NumericDashboard``, ``fine_tune``, ``qviz.data.evaluate``) reads its
data here, so a batch that one accepts, all accept, and a bad batch is the same error
everywhere: a **ConfigError** (a bad argument, whichever entry point got it) that names the
batch, what was expected and the fix.

**The data** (:func:`batches_of`): a DataLoader or any iterable of batches; a single tensor,
tuple or dict is one batch (a list is a list of batches).

**A batch** (:func:`bind_batch`) is a tensor (the one input), a tuple or list (inputs first,
then the target), or a dict (inputs by name). It binds to

* a **graph** (``qviz.export``, prepared, converted): the graph's inputs, counted. A tuple's
  first items are the inputs, one per input of the graph; what follows is the target (one
  item: that item; more: a tuple of them). A dict gives every input by its name.
* an **eager module** (a quant_nn model, a float ``nn.Module``): ``forward``'s signature. A
  tuple binds to its *required* positional parameters (at least one); the items after them are
  the target, as ``(inputs, target)`` DataLoader pairs are, and are never passed as an optional
  parameter (``(input_ids, labels)`` does not make ``labels`` a BertModel's
  ``attention_mask``). Give optional inputs by name, in a dict. A ``forward(*args)`` takes
  every item. A dict's keys bind to the parameters of those names.

In a dict, a key of :data:`TARGET_KEYS` (``labels``, ``label``, ``target``, ``targets``) is the
target (and an input too when the model takes a parameter of that name, as a Hugging Face
model takes ``labels``); any other key the model does not take is an error, and so is a
required input that no item or key gives.

For a graph, the bound inputs are then checked against the inputs it was exported with
(:func:`check_inputs`: dtype, number of dimensions, every static dimension; dynamic
dimensions take any size), and :func:`guard_errors` turns torch.export's remaining guards into
the same error, before the batch reaches an observer.

Example:
    >>> import torch, qviz
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),), dynamic_batch=True)
    >>> check_inputs(gm, (torch.randn(3, 4),), where="batch 0")   # any batch size: fine
    >>> check_inputs(gm, (torch.randn(3, 5),), where="batch 1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: batch 1: input 0 (...) has shape (3, 5) but the model was exported \
for (*, 4) (* = any size); give inputs of that shape, or export with dynamic_shapes for the \
dimensions that vary
    >>> bound = bind_batch(gm, (torch.randn(3, 4), torch.tensor([0, 1, 1])), "batch 2")
    >>> len(bound.args), bound.target.tolist()
    (1, [0, 1, 1])
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine.compat import exported_call_args
from qviz.errors import CalibrationError, ConfigError, QvizError

#: Keys of a dict batch that hold the target when the model takes no parameter of that name.
TARGET_KEYS = ("labels", "label", "target", "targets")


def _expected(gm: GraphModule) -> list[tuple[str, Any]]:
    """``(placeholder name, example value)`` of each input, in order."""
    return [(n.name, n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]


def _pattern(shape: Sequence[Any]) -> str:
    dims = ["*" if isinstance(d, torch.SymInt) else str(int(d)) for d in shape]
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def _shape_fits(shape: Sequence[Any], got: torch.Size) -> bool:
    if len(shape) != len(got):
        return False
    return all(isinstance(d, torch.SymInt) or int(d) == g for d, g in zip(shape, got, strict=True))


def _problem(name: str, i: int, expected: Any, value: Any) -> str | None:
    label = f"input {i} ({name!r})"
    if not isinstance(expected, torch.Tensor):
        return None  # a non-tensor input (a number, None): the model checks it itself
    if not isinstance(value, torch.Tensor):
        return (
            f"{label} is a {type(value).__name__} but the model was exported with a "
            f"{expected.dtype} tensor; give a tensor"
        )
    if value.dtype != expected.dtype:
        return (
            f"{label} is {value.dtype} but the model was exported with {expected.dtype}; "
            f"convert the batch (e.g. x.to({expected.dtype})) or export with inputs of that dtype"
        )
    if not _shape_fits(expected.shape, value.shape):
        fix = (
            "give inputs of that shape, or export with dynamic_shapes for the dimensions that vary"
        )
        if _shape_fits(expected.shape[1:], value.shape[1:]):  # only the batch size differs
            fix = (
                "export with dynamic_batch=True for any batch size, or drop the short last "
                "batch (DataLoader(..., drop_last=True))"
            )
        return (
            f"{label} has shape {tuple(value.shape)} but the model was exported for "
            f"{_pattern(expected.shape)} (* = any size); {fix}"
        )
    return None


def check_inputs(
    gm: GraphModule,
    inputs: Sequence[Any],
    *,
    where: str,
) -> None:
    """Raise a ConfigError if ``inputs`` cannot run through ``gm`` as exported.

    Args:
        gm: a graph captured by ``qviz.export`` (float, prepared or converted).
        inputs: the positional inputs of one batch.
        where: what the message starts with, e.g. ``"calibration batch 3"``.
    """
    expected = _expected(gm)
    if len(inputs) != len(expected):
        names = [name for name, _ in expected]
        raise ConfigError(
            f"{where}: {len(inputs)} inputs for a model that takes {len(expected)} {names}; "
            f"give (inputs..., target) batches with the inputs first"
        )
    for i, ((name, example), value) in enumerate(zip(expected, inputs, strict=True)):
        problem = _problem(name, i, example, value)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")


@contextlib.contextmanager
def guard_errors(where: str) -> Iterator[None]:
    """Turn torch.export's input guard failures inside the block into a ConfigError."""
    try:
        yield
    except AssertionError as exc:
        if "Guard failed" not in str(exc):
            raise
        raise ConfigError(
            f"{where} does not fit the shapes the model was exported with ({exc}); export with "
            f"dynamic_shapes (e.g. dynamic_batch=True), or drop the short last batch "
            f"(DataLoader(..., drop_last=True))"
        ) from exc


@contextlib.contextmanager
def batch_errors(where: str, after: str = "target") -> Iterator[None]:
    """A batch the model rejects (shape, dtype, device) becomes a ConfigError naming the
    batch; qviz's own errors pass as they are. ``after``: what a batch holds after the inputs."""
    try:
        with guard_errors(where):
            yield
    except QvizError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise ConfigError(
            f"{where} failed in the model: {type(exc).__name__}: {exc}; check that the batches "
            f"hold the inputs the model takes (inputs first, {after} after)"
        ) from exc


@dataclass(frozen=True)
class ModelInputs:
    """One batch bound to a model: ``model(*args, **kwargs)``, and the target (None: none)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    target: Any = None

    def __repr__(self) -> str:
        return f"ModelInputs({len(self.args)} args, kwargs {sorted(self.kwargs)})"


def batches_of(data: Any, where: str) -> Iterable[Any]:
    """The batches of ``data``: a single tensor, tuple or dict is one batch; a DataLoader, list
    or any other iterable is the batches.

    Example:
        >>> len(batches_of(torch.ones(2, 3), "compare")), len(batches_of([1, 2], "compare"))
        (1, 2)
    """
    if isinstance(data, torch.Tensor | tuple | Mapping | ModelInputs):
        return [data]
    if isinstance(data, Iterable) and not isinstance(data, str | bytes):
        return data
    raise ConfigError(
        f"{where} needs a DataLoader, an iterable of batches, or one batch (a tensor, a tuple "
        f"of inputs then target, or a dict of inputs by name); got {type(data).__name__}"
    )


def _items(batch: Any, where: str) -> tuple[Any, ...] | Mapping[str, Any]:
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, tuple | list):
        return tuple(batch)
    if isinstance(batch, Mapping):
        return batch
    raise ConfigError(
        f"{where} is a {type(batch).__name__}; give a tensor, a tuple or list (inputs first, "
        f"target after) or a dict of inputs by name"
    )


def _target(rest: Sequence[Any]) -> Any:
    return None if not rest else rest[0] if len(rest) == 1 else tuple(rest)


def _from_dict(
    items: Mapping[str, Any],
    takes: Sequence[str],
    required: Sequence[str],
    any_key: bool,
    where: str,
    owner: str,
) -> tuple[dict[str, Any], Any]:
    """``(inputs by name, target)`` of a dict batch; ``any_key``: the model takes **kwargs."""
    inputs = {k: v for k, v in items.items() if k in takes or (any_key and k not in TARGET_KEYS)}
    targets = {k: v for k, v in items.items() if k in TARGET_KEYS}  # passed too if taken
    unknown = [k for k in items if k not in inputs and k not in targets]
    if unknown:
        raise ConfigError(
            f"{where} has key(s) {unknown} that {owner} does not take and that are not a target "
            f"{list(TARGET_KEYS)}; the inputs are {list(takes)}: drop or rename them"
        )
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ConfigError(
            f"{where} lacks {missing}, required by {owner}; add them to the dict (its keys are "
            f"{list(items)})"
        )
    target = next(iter(targets.values())) if len(targets) == 1 else (targets or None)
    return inputs, target


def _bind_graph(gm: GraphModule, items: Any, where: str) -> ModelInputs:
    names = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    if isinstance(items, Mapping):
        inputs, target = _from_dict(items, names, names, False, where, "the exported graph")
        args = tuple(inputs[name] for name in names)
    else:
        args, target = items[: len(names)], _target(items[len(names) :])
    check_inputs(gm, args, where=where)
    return ModelInputs(tuple(args), {}, target)


def _signature(model: nn.Module) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature: takes anything
        return None


def _bind_eager(model: nn.Module, items: Any, where: str) -> ModelInputs:
    count = getattr(model, "input_count", None)  # a module taking *inputs that knows how many
    if isinstance(count, int) and not isinstance(items, Mapping):
        return ModelInputs(tuple(items[:count]), {}, _target(items[count:]))
    params = _signature(model)
    if params is None or any(p.kind is p.VAR_POSITIONAL for p in params):
        if isinstance(items, Mapping):
            return ModelInputs((), dict(items))
        return ModelInputs(tuple(items))
    owner = f"{type(model).__name__}.forward{inspect.signature(model.forward)}"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    if isinstance(items, Mapping):
        takes = [p.name for p in params if p.kind is not p.VAR_KEYWORD]
        any_key = any(p.kind is p.VAR_KEYWORD for p in params)
        inputs, target = _from_dict(items, takes, required, any_key, where, owner)
        return ModelInputs((), inputs, target)
    count = max(sum(1 for p in positional if p.default is p.empty), 1 if positional else 0)
    by_keyword = [name for name in required if name not in {p.name for p in positional}]
    if len(items) < count or by_keyword:
        need = [p.name for p in positional[:count]]
        raise ConfigError(
            f"{where} has {len(items)} item(s) but {owner} requires {need + by_keyword}; give "
            f"(inputs..., target) batches with the required inputs first, or a dict of inputs "
            f"by name"
        )
    return ModelInputs(tuple(items[:count]), {}, _target(items[count:]))


def bind_batch(model: nn.Module, batch: Any, where: str) -> ModelInputs:
    """Bind one batch to ``model``'s inputs (the module docstring's rule) and check it.

    Args:
        model: a graph module (its inputs counted) or an eager module (its forward's
            signature).
        batch: a tensor, a tuple or list (inputs, then the target), or a dict by name.
        where: what an error starts with, naming the batch (``"compare: batch 3"``).

    Returns:
        :class:`ModelInputs`: what to call the model with, and the target.

    Raises:
        ConfigError: a batch that is none of these, inputs missing, a key the model does not
            take, or (graph) inputs that do not fit the exported ones.

    Example:
        >>> class HF(nn.Module):
        ...     def forward(self, input_ids, attention_mask=None, labels=None):
        ...         return input_ids
        >>> ids, labels = torch.ones(2, 3), torch.zeros(2)
        >>> bound = bind_batch(HF(), (ids, labels), "batch 0")  # labels: the target, not a mask
        >>> len(bound.args), bound.target is labels
        (1, True)
        >>> sorted(bind_batch(HF(), {"input_ids": ids, "attention_mask": ids}, "batch 1").kwargs)
        ['attention_mask', 'input_ids']
    """
    if isinstance(batch, ModelInputs):
        if isinstance(model, GraphModule):
            check_inputs(model, batch.args, where=where)
        return batch
    items = _items(batch, where)
    if isinstance(model, GraphModule):
        return _bind_graph(model, items, where)
    return _bind_eager(model, items, where)


def call_model(model: nn.Module, inputs: ModelInputs, where: str) -> Any:
    """``model`` run on a bound batch; a batch it rejects is a ConfigError naming ``where``."""
    args, kwargs = inputs.args, inputs.kwargs
    if isinstance(model, GraphModule) and not kwargs:
        args, kwargs = exported_call_args(model, args)
    with batch_errors(where):
        return model(*args, **kwargs)


def _float_leaves(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield path, value
    elif isinstance(value, ModelInputs):
        yield from _float_leaves((*value.args, value.kwargs), path)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _float_leaves(item, f"{path}[{key!r}]")
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            yield from _float_leaves(item, f"{path}[{i}]")


def check_finite(batch: Any, where: str) -> None:
    """Refuse a batch holding a NaN or infinite value, naming the tensor, how many values and
    the first one's position: a non-finite input makes every figure measured from it
    meaningless (NaN biases, a "departure" at the input), so it is named, never measured.

    Args:
        batch: one batch (a tensor, tuple, list or dict of them; other items are skipped).
        where: the entry point and batch, for the message (``"diagnose: batch 2"``).

    Raises:
        CalibrationError: naming ``where``, the tensor's place in the batch and the count.

    Example:
        >>> x = torch.ones(2, 3)
        >>> x[1, 2] = float("nan")
        >>> check_finite((x, torch.tensor([0, 1])), "compare: batch 4")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.CalibrationError: compare: batch 4: batch[0] holds 1 non-finite value of 6 ...
    """
    for path, t in _float_leaves(batch, "batch"):
        bad = ~torch.isfinite(t.detach())
        if bool(bad.any()):
            first = [int(i) for i in bad.nonzero()[0]] if t.dim() else []
            value = float(t.detach()[tuple(first)].real) if t.dim() else float(t.real)
            raise CalibrationError(
                f"{where}: {path} holds {int(bad.sum())} non-finite value"
                f"{'s' if int(bad.sum()) != 1 else ''} of {t.numel()} ({value} at {first}); "
                f"drop or clean the batch (torch.nan_to_num, or filter with torch.isfinite)"
            )


def measured_batches(
    data: Any, where: str, *, max_batches: Any = None, allow_empty: bool = False
) -> list[Any]:
    """THE data of an entry point that measures: the batches of ``data`` (at most
    ``max_batches``), each checked finite, and at least one, so that a figure is never reported
    after measuring nothing, or measured from NaN.

    Args:
        data: as :func:`batches_of` takes it.
        where: the entry point, for the messages.
        max_batches: a positive int, or None for all.
        allow_empty: no batch is fine: a rank's shard, when the entry point checks that some
            rank had data.

    Raises:
        ConfigError: ``max_batches`` is not a positive int or None.
        CalibrationError: no batch (an empty list, a DataLoader of nothing), or a batch with a
            NaN or infinite value (:func:`check_finite`, naming the batch).

    Example:
        >>> len(measured_batches([torch.ones(2), torch.zeros(2)], "compare_lowered"))
        2
        >>> measured_batches([], "compare_lowered")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.CalibrationError: compare_lowered got no batches: data is empty, so nothing ...
    """
    if max_batches is not None and (
        isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1
    ):
        raise ConfigError(
            f"{where}(max_batches={max_batches!r}): give a positive int, or None for every batch"
        )
    batches = []
    for index, batch in enumerate(batches_of(data, where)):
        if max_batches is not None and index >= max_batches:
            break
        check_finite(batch, f"{where}: batch {index}")
        batches.append(batch)
    if not batches and not allow_empty:
        raise CalibrationError(
            f"{where} got no batches: data is empty, so nothing would be measured; pass at least "
            f"one batch"
        )
    return batches


def checked_batches(data: Any, model: nn.Module, where: str) -> list[Any]:
    """The batches of ``data`` as a list (:func:`measured_batches`: finite; none is fine), each
    bound to ``model`` and checked first, so that a bad batch stops the entry point before any
    model runs (named ``"{where}: batch i"``)."""
    batches = measured_batches(data, where, allow_empty=True)  # an empty shard is fine
    for index, batch in enumerate(batches):
        bind_batch(model, batch, f"{where}: batch {index}")
    return batches


def labelled_batches(model: nn.Module, data: Any, where: str) -> Iterator[tuple[str, ModelInputs]]:
    """``(name, bound batch)`` for each batch of ``data``, which must carry a target (training
    and accuracy need one): ``(inputs, target)`` tuples, or dicts with a ``labels`` key.

    Args:
        model: the model the batches bind to.
        data: as for :func:`batches_of`.
        where: each batch's name, with ``{index}`` (``"evaluate: batch {index}"``).

    Example:
        >>> pairs = [(torch.ones(2, 4), torch.tensor([0, 1]))]
        >>> [(name, b.target.tolist()) for name, b in labelled_batches(
        ...     nn.Linear(4, 2), pairs, "evaluate: batch {index}")]
        [('evaluate: batch 0', [0, 1])]
    """
    what = where.split(":")[0]
    for index, batch in enumerate(batches_of(data, what)):
        name = where.format(index=index)
        bound = bind_batch(model, batch, name)
        if bound.target is None:
            raise ConfigError(
                f"{name} has no target: {what} needs (inputs, target) batches, or dicts with a "
                f"'labels' key"
            )
        yield name, bound


def batch_and_dtype(gm: GraphModule) -> tuple[Any, str] | None:
    """The batch (an int, or None when dynamic) and dtype of ``gm``'s first tensor input, as
    exported; None when it has no tensor input.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.ReLU(), (torch.randn(4, 2),), dynamic_batch=True)
        >>> batch_and_dtype(gm)
        (None, 'torch.float32')
    """
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.dim() > 0:
            batch = val.shape[0]
            return (None if isinstance(batch, torch.SymInt) else int(batch)), str(val.dtype)
    return None


def example_tuple(example_inputs: Any, where: str = "") -> tuple[Any, ...]:
    """``example_inputs`` as the tuple ``torch.export`` takes: a single tensor is wrapped; any
    other non-tuple is a ConfigError (prefixed with ``where``) saying how to pass it.

    Example:
        >>> len(example_tuple(torch.ones(2))), example_tuple((1, 2))
        (1, (1, 2))
    """
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, tuple):
        raise ConfigError(
            f"{where}{': ' if where else ''}example_inputs must be a tuple of inputs, got "
            f"{type(example_inputs).__name__}: wrap a single input as (x,)"
        )
    return example_inputs


def rows_repeated(inputs: tuple[Any, ...], rows: int) -> tuple[Any, ...]:
    """``inputs`` with each batched tensor's rows repeated in turn to ``rows`` rows (cut where it
    has more); scalars and 0-d tensors as given.

    Example:
        >>> rows_repeated((torch.tensor([[1], [2]]), 0.5), 3)[0].flatten().tolist()
        [1, 2, 1]
    """
    return tuple(
        x[torch.arange(rows) % x.shape[0]] if isinstance(x, torch.Tensor) and x.dim() else x
        for x in inputs
    )


def traced_example(example_inputs: tuple[Any, ...], dynamic: bool) -> tuple[Any, ...]:
    """The example the backend traces: a dynamic batch of 1 becomes a batch of 2 (its rows
    repeated), since torch specialises sizes 0 and 1; anything else as given.

    Example:
        >>> traced_example((torch.ones(1, 3),), dynamic=True)[0].shape
        torch.Size([2, 3])
    """
    if not dynamic:
        return example_inputs
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == 0:
            raise ConfigError(f"lower: example input {i} has batch 0; give at least one row")
    batch = next((x.shape[0] for x in example_inputs if isinstance(x, torch.Tensor) and x.dim()), 2)
    return rows_repeated(example_inputs, 2) if batch < 2 else example_inputs
