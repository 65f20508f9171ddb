"""Train and eval mode on exported, prepared and converted graph modules.

``torch.export`` records dropout and batch norm in the mode the model was in when it was
captured (``aten.batch_norm(..., training=True, ...)``, ``aten.dropout(x, p, train=True)``);
``nn.Module.eval()`` on the graph module only flips a flag nothing reads. So torch.export's own
modules refuse ``train()`` / ``eval()``, and prepare and convert put the same refusal on the
copies they return (:func:`disallow_train_eval`), with the reason and the fix.

:func:`move_exported_model_to_eval` and :func:`move_exported_model_to_train` switch those ops
in place, as torchao's functions of the same names do (QAT trains a prepared graph, then
evaluates it); :func:`allow_exported_model_train_eval` makes ``model.train()`` /
``model.eval()`` call them. torchao rewrites matched ``dropout`` / ``batch_norm`` subgraphs with
patterns traced at p=0.5, momentum=0.1, eps=1e-5 (its own TODO: custom values are lost); here
the mode argument of each op is set and every other argument kept, so a model with
``Dropout(0.2)`` or ``BatchNorm2d(momentum=0.3)`` behaves as it does in eager mode. Otherwise
the result is the same graph torchao gives, bit for bit in each mode.

What switches (everything else was specialized when the model was exported, e.g. Python code
branching on ``self.training``):

- ``aten.batch_norm``: training (normalize with the batch statistics and update
  ``running_mean`` / ``running_var``) or eval (use them);
- ``aten.dropout`` and its feature / alpha / in-place variants;
- the ``num_batches_tracked += 1`` a train-mode export records for each BatchNorm: it counts in
  train mode and adds 0 in eval mode, as eager BatchNorm does (a model exported in eval mode has
  no counter to switch on; only ``momentum=None`` reads it, and export makes that a constant).

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> qviz.allow_exported_model_train_eval(gm) is gm
    True
    >>> x = torch.ones(2, 4)
    >>> _ = gm.eval()
    >>> torch.equal(gm(x), gm(x))
    True
    >>> [n.args[2] for n in gm.graph.nodes if n.target == torch.ops.aten.dropout.default]
    [False]
"""

from __future__ import annotations

import types

import torch
from torch.fx import GraphModule, Node

from qviz.errors import ConfigError, ExportedModeError

aten = torch.ops.aten

#: The ops whose behaviour depends on the mode, and the position of their mode argument.
MODE_ARG = {
    aten.batch_norm.default: 5,
    aten.dropout.default: 2,
    aten.dropout_.default: 2,
    aten.feature_dropout.default: 2,
    aten.feature_dropout_.default: 2,
    aten.alpha_dropout.default: 2,
    aten.alpha_dropout_.default: 2,
    aten.feature_alpha_dropout.default: 2,
    aten.feature_alpha_dropout_.default: 2,
}

#: torchao's attribute for the mode a graph module was last moved to, shared so that mixing
#: qviz's and torchao's functions on one model keeps a single state.
EXPORTED_TRAINING_ATTR = "_exported_training"

#: ``node.meta`` key of a batch_norm frozen by :func:`freeze_bn_stats`: the training flag it
#: had when frozen.
BN_FROZEN = "qviz_bn_frozen"

_WHY = (
    "train() and eval() do not change an exported graph: its dropout and batch-norm ops were "
    "recorded in the mode the model had when it was exported. Export the model in the mode "
    "you want (model.eval() before qviz.export) and prepare that, or switch those ops with "
    "qviz.move_exported_model_to_eval(model) / qviz.move_exported_model_to_train(model) "
    "(qviz.allow_exported_model_train_eval(model) makes train() / eval() call them)"
)


def _refuse(self: GraphModule, mode: bool = True) -> GraphModule:
    raise ExportedModeError(f"{type(self).__name__}.train({mode}) / .eval(): {_WHY}")


def disallow_train_eval(gm: GraphModule) -> GraphModule:
    """Make ``gm.train()`` and ``gm.eval()`` raise :class:`~qviz.errors.ExportedModeError`.

    Example:
        >>> import torch
        >>> gm = disallow_train_eval(torch.fx.symbolic_trace(torch.nn.ReLU()))
        >>> try:
        ...     gm.eval()
        ... except NotImplementedError as e:
        ...     print(type(e).__name__)
        ExportedModeError
    """
    gm.train = types.MethodType(_refuse, gm)  # type: ignore[method-assign]
    gm.eval = types.MethodType(lambda self: _refuse(self, False), gm)  # type: ignore[method-assign]
    return gm


def _check_exported(model: object, where: str) -> GraphModule:
    if not isinstance(model, GraphModule):
        raise ConfigError(
            f"{where} needs the graph module qviz.export returns (or one prepared or converted "
            f"from it), got {type(model).__name__}: call model.train() / model.eval() on an "
            f"nn.Module itself"
        )
    if not any("val" in n.meta for n in model.graph.nodes):
        raise ConfigError(
            f"{where}: this GraphModule was not made by torch.export (no node has meta['val']), "
            f"so its dropout / batch norm are modules or Python calls this cannot switch: "
            f"call model.train() / model.eval() on it, or export it with qviz.export"
        )
    return model


def _is_batch_counter(node: Node) -> bool:
    """``aten.add_(<bn>.num_batches_tracked, 1 or 0)``: a BatchNorm's batch counter."""
    if node.op != "call_function" or node.target != aten.add_.Tensor or len(node.args) != 2:
        return False
    buffer, step = node.args
    return (
        isinstance(buffer, Node)
        and buffer.op == "get_attr"
        and str(buffer.target).rsplit(".", 1)[-1] == "num_batches_tracked"
        and step in (0, 1)
        and not isinstance(step, bool)
    )


def _bn_owner(node: Node) -> str | None:
    """The module path of a batch_norm node's buffers (from its ``running_mean``)."""
    mean = node.args[3] if len(node.args) > 3 else None
    if isinstance(mean, Node) and mean.op == "get_attr":
        return str(mean.target).rpartition(".")[0]
    return None


def _mode_updates(graph: torch.fx.Graph, training: bool) -> list[tuple[Node, int, object]]:
    """``(node, argument index, value)`` for every mode-dependent op and batch counter in
    ``training`` mode; a BatchNorm frozen by :func:`freeze_bn_stats` (and its counter) stays
    in eval."""
    frozen = {
        _bn_owner(n)
        for n in graph.nodes
        if n.op == "call_function" and n.meta.get(BN_FROZEN) is not None
    }
    updates: list[tuple[Node, int, object]] = []
    for node in graph.nodes:
        index = MODE_ARG.get(node.target) if node.op == "call_function" else None
        if index is not None and len(node.args) > index:
            updates.append((node, index, training and node.meta.get(BN_FROZEN) is None))
        elif _is_batch_counter(node):
            owner = str(node.args[0].target).rpartition(".")[0]
            updates.append((node, 1, int(training and owner not in frozen)))
    return updates


def _set_mode(graph: torch.fx.Graph, training: bool) -> None:
    """Set the mode argument of every mode-dependent op, and the step of each batch counter."""
    for node, index, value in _mode_updates(graph, training):
        node.update_arg(index, value)


def _move(model: GraphModule, training: bool) -> GraphModule:
    """Switch ``model`` (and the graph modules inside it, e.g. cond branches) in place.

    Skipped when the model was last moved to ``training`` (torchao's state attribute) and its
    graphs agree, so a repeated call neither rewrites nor recompiles; a model never moved is
    always rewritten and recompiled once, as torchao does.
    """
    graphs = [m for m in model.modules() if isinstance(m, GraphModule)]
    if getattr(model, EXPORTED_TRAINING_ATTR, not training) == training and all(
        node.args[i] == value and type(node.args[i]) is type(value)
        for m in graphs
        for node, i, value in _mode_updates(m.graph, training)
    ):
        return model
    for module in graphs:
        _set_mode(module.graph, training)
    _recompile(graphs)
    setattr(model, EXPORTED_TRAINING_ATTR, training)
    model.training = training  # the root only: observers and fake quantizers keep their flags
    return model


def move_exported_model_to_eval(model: GraphModule) -> GraphModule:
    """Switch the dropout and batch-norm ops of an exported graph module to eval mode, in place.

    Like ``model.eval()`` on the eager model, for the ops an exported graph can switch (see
    the module docstring): dropout passes its input through, batch norm normalizes with
    ``running_mean`` / ``running_var`` and leaves them alone. Call it on a QAT-prepared model
    before evaluating it. Idempotent: a model already moved to eval is returned untouched.

    Args:
        model: a graph module from :func:`qviz.export`, prepared or converted from one.

    Returns:
        ``model`` itself.

    Raises:
        ConfigError: ``model`` is not a graph module made by torch.export.

    Example:
        >>> import torch, qviz
        >>> model = torch.nn.Sequential(torch.nn.BatchNorm1d(3)).train()
        >>> gm = qviz.export(model, (torch.randn(4, 3),))
        >>> before = gm.state_dict()["0.running_mean"].clone()
        >>> _ = qviz.move_exported_model_to_eval(gm)(torch.randn(4, 3))
        >>> torch.equal(gm.state_dict()["0.running_mean"], before)
        True
    """
    return _move(_check_exported(model, "move_exported_model_to_eval"), False)


def move_exported_model_to_train(model: GraphModule) -> GraphModule:
    """Switch the dropout and batch-norm ops of an exported graph module to train mode, in place.

    Like ``model.train()`` on the eager model, for the ops an exported graph can switch:
    dropout zeroes elements (from torch's random generator, as eager dropout does), batch norm
    normalizes with the batch statistics and updates ``running_mean`` / ``running_var`` with
    the momentum the model was exported with. Idempotent.

    Args:
        model: a graph module from :func:`qviz.export`, prepared or converted from one.

    Returns:
        ``model`` itself.

    Raises:
        ConfigError: ``model`` is not a graph module made by torch.export.

    Example:
        >>> import torch, qviz
        >>> model = torch.nn.Sequential(torch.nn.BatchNorm1d(3)).eval()
        >>> gm = qviz.export(model, (torch.randn(4, 3),))
        >>> _ = qviz.move_exported_model_to_train(gm)(torch.full((4, 3), 5.0))
        >>> bool((gm.state_dict()["0.running_mean"] > 0.4).all())
        True
    """
    return _move(_check_exported(model, "move_exported_model_to_train"), True)


def _train(self: GraphModule, mode: bool = True) -> GraphModule:
    return _move(self, bool(mode))


def _eval(self: GraphModule) -> GraphModule:
    return _move(self, False)


def allow_exported_model_train_eval(model: GraphModule) -> GraphModule:
    """Make ``model.train()`` / ``model.eval()`` switch the exported dropout and batch-norm ops.

    After this call, ``model.train(mode)`` is :func:`move_exported_model_to_train` (``mode``
    True) or :func:`move_exported_model_to_eval`, and ``model.eval()`` the latter; both return
    ``model``. Only those ops switch (see the module docstring), so this approximates eager
    ``train()`` / ``eval()``. ``prepare_pt2e`` and ``convert_pt2e`` return new models that
    refuse both calls again: allow each one you want to switch this way.

    Args:
        model: a graph module from :func:`qviz.export`, prepared or converted from one.

    Returns:
        ``model`` itself (changed in place: only its ``train`` and ``eval`` methods).

    Raises:
        ConfigError: ``model`` is not a graph module made by torch.export.

    Example:
        >>> import torch, qviz
        >>> model = torch.nn.Sequential(torch.nn.Dropout(0.5)).train()
        >>> gm = qviz.allow_exported_model_train_eval(qviz.export(model, (torch.ones(8),)))
        >>> torch.equal(gm.eval()(torch.ones(8)), torch.ones(8))
        True
        >>> gm.train() is gm
        True
    """
    _check_exported(model, "allow_exported_model_train_eval")
    model.train = types.MethodType(_train, model)  # type: ignore[method-assign]
    model.eval = types.MethodType(_eval, model)  # type: ignore[method-assign]
    return model


def _batch_norms(model: GraphModule, where: str) -> tuple[list[GraphModule], list[Node]]:
    """The graph modules holding a switchable ``batch_norm``, and those batch_norm nodes."""
    graphs = [m for m in model.modules() if isinstance(m, GraphModule)]
    nodes = [
        n
        for m in graphs
        for n in m.graph.nodes
        if n.op == "call_function" and n.target == aten.batch_norm.default
    ]
    if not nodes:
        raise ConfigError(
            f"{where}: the graph has no batch_norm whose statistics can update (a model exported "
            f"in eval mode, or prepared for PTQ, has its BatchNorms folded or fixed): export "
            f"the model in train mode and prepare it with qviz.prepare_qat_pt2e"
        )
    return [m for m in graphs if any(n.graph is m.graph for n in nodes)], nodes


def _recompile(graphs: list[GraphModule]) -> None:
    for module in graphs:
        module.graph.lint()
        module.recompile()


def freeze_bn_stats(model: GraphModule) -> GraphModule:
    """Stop the BatchNorms of an exported (QAT-prepared) model updating their statistics.

    The PT2E counterpart of torch.ao's ``freeze_bn_stats``: every ``batch_norm`` of the graph
    normalizes with ``running_mean`` / ``running_var`` and leaves them (and
    ``num_batches_tracked``) alone, while dropout, fake quantization and the weights keep
    training. QAT recipes freeze them for the last epochs, so the statistics the conversion
    folds into the convs are the ones the model trained with. The freeze survives
    :func:`move_exported_model_to_train` / ``_to_eval`` until :func:`update_bn_stats`.

    Args:
        model: a graph module from :func:`qviz.export` in train mode, or prepared from one.

    Returns:
        ``model`` itself, changed in place.

    Raises:
        ConfigError: ``model`` is not an exported graph module, or has no batch_norm to freeze.

    Example:
        >>> import torch, qviz
        >>> model = torch.nn.Sequential(torch.nn.BatchNorm1d(3)).train()
        >>> gm = qviz.export(model, (torch.randn(4, 3),))
        >>> before = gm.state_dict()["0.running_mean"].clone()
        >>> _ = qviz.freeze_bn_stats(gm)(torch.randn(4, 3) + 5)
        >>> torch.equal(gm.state_dict()["0.running_mean"], before)
        True
        >>> _ = qviz.update_bn_stats(gm)(torch.randn(4, 3) + 5)
        >>> torch.equal(gm.state_dict()["0.running_mean"], before)
        False
    """
    graphs, nodes = _batch_norms(_check_exported(model, "freeze_bn_stats"), "freeze_bn_stats")
    for node in nodes:
        if node.meta.get(BN_FROZEN) is None:
            node.meta[BN_FROZEN] = bool(node.args[MODE_ARG[node.target]])
    for module in graphs:
        for node, index, value in _mode_updates(module.graph, True):
            if not value:  # only what the freeze turns off
                node.update_arg(index, value)
    _recompile(graphs)
    return model


def update_bn_stats(model: GraphModule) -> GraphModule:
    """Undo :func:`freeze_bn_stats`: the BatchNorms update their statistics again in train mode.

    Each batch_norm gets back the mode the model is in (the last
    :func:`move_exported_model_to_train` / ``_to_eval``, else the mode it had when frozen).

    Args:
        model: a graph module :func:`freeze_bn_stats` was called on.

    Returns:
        ``model`` itself, changed in place.

    Raises:
        ConfigError: ``model`` is not an exported graph module, or has no batch_norm.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.BatchNorm1d(3).train(), (torch.randn(4, 3),))
        >>> n = [n for n in qviz.update_bn_stats(qviz.freeze_bn_stats(gm)).graph.nodes
        ...      if n.target == torch.ops.aten.batch_norm.default][0]
        >>> n.args[5]
        True
    """
    graphs, nodes = _batch_norms(_check_exported(model, "update_bn_stats"), "update_bn_stats")
    was = {id(node): node.meta.pop(BN_FROZEN, None) for node in nodes}
    default = next((w for w in was.values() if w is not None), False)
    training = getattr(model, EXPORTED_TRAINING_ATTR, default)
    for module in graphs:
        for node, index, value in _mode_updates(module.graph, bool(training)):
            if id(node) in was or _is_batch_counter(node):
                node.update_arg(index, value)
    _recompile(graphs)
    return model
