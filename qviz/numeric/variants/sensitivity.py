"""Which operator costs the most accuracy, and what a different config would do, per layer.

* :func:`fallback` — a quantizer that leaves the named nodes or modules in float (the plan says
  "user fallback").
* :func:`sensitivity` — for each quantized operator, quantize everything *except* it
  (``mode="fallback"``: how much does the model recover?) or *only* it (``mode="solo"``: how much
  does it cost alone?), and measure the model outputs' SQNR against float, and the user's metric.
* :func:`compare_configs` — quantize with each config and put every operator's local SQNR side by
  side, best marked (per-tensor vs per-channel weights, 8 vs 4 bits, ...).

Each variant is prepared from the same exported graph, calibrated on the same batches and
evaluated on the same data, so the rows differ only by what was asked. :func:`sensitivity`
calibrates once: a variant whose every observer sees what one of the fully quantized model's
saw takes copies of their statistics instead of a calibration pass (bit for bit what the pass
would give, :mod:`qviz.engine.pt2e.observer_reuse`); the others are calibrated.

Distributed (``group=`` a process group, or the default group initialised), ``data`` and
``calibration_data`` are each rank's shard: every variant calibrates on all the shards (merged
observers) and is scored over all of them (one reduction per variant), so the ranking on every
rank is one process's over the union; whatever one rank raises (a bad argument included) is
raised on every rank at once, naming that rank (:func:`qviz.engine.distributed.sharded`).

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0) and None
    >>> gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval(),
    ...                  (torch.randn(8, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> data = [torch.randn(8, 4) for _ in range(2)]
    >>> df = sensitivity(gm, q, data, progress=False)
    >>> sorted(df["node"]) == ["linear", "linear_1", "relu"], df.columns[:3].tolist()
    (True, ['rank', 'node', 'op'])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.fx import GraphModule

from qviz.engine import distributed
from qviz.engine.graph.fingerprint import known_origin
from qviz.engine.graph.node_data import op_name
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.observer_reuse import ObserverReuse
from qviz.engine.quantizers.fallback import FallbackQuantizer, module_path
from qviz.errors import ConfigError
from qviz.numeric.measure.progress import progress_bar
from qviz.numeric.variants.variants import (
    VariantScorer,
    quantize_variant,
    quantized_ops,
    variant_batches,
)

_MODES = ("fallback", "solo")


def fallback(quantizer: Any, nodes_or_module_names: Sequence[str] | str) -> FallbackQuantizer:
    """A quantizer that annotates as ``quantizer`` does but leaves the named nodes in float.

    Args:
        quantizer: the quantizer to start from.
        nodes_or_module_names: node names (``"conv2d_2"``, as in the plan and the numeric
            report) and/or module paths (``"block.conv1"``: every operator inside it).

    Returns:
        A :class:`~qviz.engine.quantizers.fallback.FallbackQuantizer`; its plan records the
        reason ``"user fallback"`` for each node it keeps in float. An unknown name is a
        ConfigError at prepare, listing the closest names.

    Example:
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> q = fallback(XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
        ...              "conv2d_2")
        >>> q.names
        ('conv2d_2',)
    """
    return FallbackQuantizer(quantizer, nodes_or_module_names)


def _check_graph(model: Any, where: str) -> None:
    """The one stage these take: the float graph module ``qviz.export`` returned (checked before
    anything runs)."""
    check_stage(model, Stage.FLOAT, where=where, arg="exported_model", exported=True)


def sensitivity(
    exported_model: GraphModule,
    quantizer: Any,
    data: Any,
    *,
    metric: Callable[[Any, Any, Any], float] | None = None,
    mode: str = "fallback",
    calibration_data: Any = None,
    progress: bool = True,
    group: Any = None,
) -> Any:
    """Rank the quantized operators by what quantizing them costs the model.

    Args:
        exported_model: the float graph module from :func:`qviz.export` (not changed).
        quantizer: the quantizer whose operators are tried one by one.
        data: evaluation batches (as for :func:`qviz.calibrate`: tensors, ``(inputs...,
            target)``, dicts); kept in memory, with the float model's outputs on them.
        metric: ``metric(float_out, quant_out, target) -> float`` (higher is better): ranks.
        mode: ``"fallback"``: all quantized but the operator, ranked by what the model recovers;
            ``"solo"``: only the operator quantized, ranked by what it costs (most first).
        calibration_data: batches to calibrate each variant on (default: ``data``).
        progress: show a progress bar over the operators.
        group: a ``torch.distributed`` process group, or ``False`` (this process alone):
            distributed, the data are this rank's shard (see the module docstring).

    Returns:
        A DataFrame: ``rank``, ``node``, ``op``, ``module``, ``output_sqnr`` (dB against the
        float outputs); fallback mode adds ``delta_sqnr`` (the gain over all quantized); a
        metric adds ``metric`` and ``delta_metric`` (against all quantized; solo: against the
        float model). ``df.attrs``: ``quantized_output_sqnr``, ``quantized_metric``,
        ``float_metric``.

    Raises:
        ConfigError: ``exported_model`` is not the float exported graph (checked before
            anything runs), an unknown mode, or a batch that does not bind (named).
        MeasurementError: a variant's output SQNR or metric is not a number (outputs without
            a floating-point tensor, NaN in one output only, ...): nothing is ranked on it.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> df = sensitivity(gm, q, [torch.randn(8, 4)], mode="solo", progress=False)
        >>> df["node"].tolist(), df.attrs["mode"]
        (['linear'], 'solo')
    """
    setup = functools.partial(_setup, exported_model, quantizer, data, metric, mode,
                              calibration_data)  # fmt: skip
    out = distributed.sharded(setup, group, "sensitivity", share=lambda _: None)
    (evaluator, calibration, full), group = out.result, out.shard.group
    rank0 = out.shard.rank == 0  # the one progress bar
    with known_origin(exported_model):  # every variant's prepare: the float digest taken once
        ops, reuse, base = _baseline(exported_model, full, evaluator, calibration, group)
        versus = None if metric is None else base[1] if mode == "fallback" else (
            evaluator.float_metric)  # fmt: skip
        quantize = functools.partial(quantize_variant, exported_model, calibration=calibration,
                                     group=group, reuse=reuse)  # fmt: skip
        rows = [
            _row(node, evaluator.score(quantize(variant), _label(node.name, mode)), mode,
                 base[0], versus)
            for node, variant in _variants(exported_model, quantizer, ops, mode,
                                           progress and rank0)
        ]  # fmt: skip
    return _ranked(rows, mode, metric is not None, *base, evaluator.float_metric)


def _baseline(
    gm: GraphModule, full: GraphModule, evaluator: VariantScorer, calibration: list, group: Any
) -> tuple[list[str], ObserverReuse, tuple[float, float | None]]:
    """The float metric, the quantized operators, the one calibration (of ``full``, every
    operator quantized: its statistics are what the variants reuse) and its score."""
    import qviz

    evaluator.score_float()
    ops = quantized_ops(full.plan, gm)
    reuse = ObserverReuse(full)  # before calibrating: the observers' starting state
    qviz.calibrate(full, calibration, progress=False, group=group)
    converted = qviz.convert_pt2e(full, inplace=True)  # reuse holds its observers, not it
    return ops, reuse, evaluator.score(converted, "the fully quantized model")


def _label(node: str, mode: str) -> str:
    """The variant of ``node``, as a message names it."""
    return f"every operator but {node} quantized" if mode == "fallback" else f"{node} alone"


def _variants(gm: GraphModule, quantizer: Any, ops: list[str], mode: str, show: bool) -> Any:
    """``(node, quantizer)`` for each operator of ``ops``: all but it quantized (fallback
    mode) or it alone (solo); a progress bar when ``show``."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for name in progress_bar(ops, show, f"sensitivity ({mode})"):
        fallen = [name] if mode == "fallback" else [o for o in ops if o != name]
        yield nodes[name], (FallbackQuantizer(quantizer, fallen) if fallen else quantizer)


def _setup(
    exported_model: GraphModule,
    quantizer: Any,
    data: Any,
    metric: Any,
    mode: str,
    calibration_data: Any,
    shard: distributed.Shard,
) -> tuple[VariantScorer, list[Any], GraphModule]:
    """sensitivity's argument checks, its float pass and the fully quantized model's prepare:
    this rank's part of the first sharded step."""
    import qviz

    _check_graph(exported_model, "sensitivity")
    if mode not in _MODES:
        raise ConfigError(f"sensitivity(mode={mode!r}): choose one of {list(_MODES)}")
    # finite; a shard: maybe none
    batches, calibration = variant_batches(
        data, calibration_data, exported_model, "sensitivity", allow_empty=True
    )
    evaluator = VariantScorer(exported_model, batches, metric, "sensitivity", shard)
    return evaluator, calibration, qviz.prepare_pt2e(exported_model, quantizer)


def _row(
    node: Any, score: tuple[float, float | None], mode: str, base_sqnr: float, versus: Any
) -> dict[str, Any]:
    """One operator's row; ``versus``: the metric its own is measured against (None: none)."""
    out_sqnr, out_metric = score
    row = {
        "node": node.name,
        "op": op_name(node),
        "module": module_path(node),
        "output_sqnr": out_sqnr,
    }
    if mode == "fallback":  # how much keeping it in float recovers
        row["delta_sqnr"] = out_sqnr - base_sqnr
    if versus is not None:
        row |= {"metric": out_metric, "delta_metric": out_metric - versus}
    return row


def _ranked(rows, mode, by_metric, base_sqnr, base_metric, float_metric=None) -> Any:
    import pandas as pd

    df = pd.DataFrame(rows)
    key = "metric" if by_metric else "output_sqnr"
    # fallback: the biggest recovery first; solo: the biggest cost (lowest score) first
    df = df.sort_values(key, ascending=(mode == "solo"), kind="stable").reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    df.attrs.update(
        mode=mode, quantized_output_sqnr=base_sqnr, quantized_metric=base_metric, ranked_by=key
    )
    df.attrs["float_metric"] = float_metric
    return df


def compare_configs(
    exported_model: GraphModule,
    configs: Mapping[str, Any],
    data: Any,
    *,
    calibration_data: Any = None,
    progress: bool = True,
) -> Any:
    """Every operator's local SQNR under each config, side by side, the best marked.

    Args:
        exported_model: the float graph module from :func:`qviz.export` (not changed): the
            one stage it takes, checked before anything runs.
        configs: ``{"name": QuantizationConfig or Quantizer}``; a QuantizationConfig is used as
            ``XNNPACKQuantizer().set_global(config)``.
        data: batches to compare on (and to calibrate on, unless ``calibration_data``).
        calibration_data: batches to calibrate each config on (default: ``data``).
        progress: show a progress bar over the configs.

    Returns:
        A DataFrame with ``node``, ``op``, ``module``, one local-SQNR column (dB) per config
        (NaN where that config leaves the operator in float), and ``best`` (the config with the
        highest local SQNR; equal ones joined with ``" = "``). ``df.attrs["output_sqnr"]``
        maps each config to its model-output SQNR.

    Raises:
        ConfigError: ``exported_model`` is not the float exported graph (checked first), no
            configs, or a batch that does not bind (named).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as cfg
        >>> gm = qviz.export(torch.nn.Linear(8, 4).eval(), (torch.randn(8, 8),))
        >>> df = compare_configs(gm, {"per-tensor": cfg(), "per-channel": cfg(True)},
        ...                      [torch.randn(8, 8)], progress=False)
        >>> df.columns.tolist()
        ['node', 'op', 'module', 'per-tensor', 'per-channel', 'best']
    """
    _check_graph(exported_model, "compare_configs")
    if not isinstance(configs, Mapping) or not configs:
        raise ConfigError(
            "compare_configs needs a non-empty dict {name: QuantizationConfig or Quantizer}"
        )
    from qviz.numeric.compare.compare import compare_each

    quantizers = [_quantizer_of(name, config) for name, config in configs.items()]
    batches, calibration = variant_batches(data, calibration_data, exported_model,
                                           "compare_configs")  # fmt: skip
    with known_origin(exported_model):  # the float digest taken once for every config
        quantized = [  # converted models (integer weights), compared in one pass over the data
            quantize_variant(exported_model, quantizer, calibration)
            for quantizer in progress_bar(quantizers, progress, "configs")
        ]
    reports = compare_each(exported_model, quantized, batches, progress=False)
    frames = [r.df.set_index("node")[["op", "module", "local_sqnr"]] for r in reports]
    names = list(map(str, configs))
    output_sqnr = {name: r.output_sqnr for name, r in zip(names, reports, strict=True)}
    return _side_by_side(exported_model, names, frames, output_sqnr)


def _quantizer_of(name: Any, config: Any) -> Any:
    if callable(getattr(config, "annotate", None)):
        return config
    from qviz.engine.quantizers import XNNPACKQuantizer
    from qviz.engine.specs import QuantizationConfig

    if not isinstance(config, QuantizationConfig):
        raise ConfigError(
            f"compare_configs: configs[{name!r}] is a {type(config).__name__}; give a "
            f"QuantizationConfig (e.g. get_symmetric_quantization_config()) or a Quantizer"
        )
    return XNNPACKQuantizer().set_global(config)


def _side_by_side(gm, names, frames, output_sqnr) -> Any:
    import pandas as pd

    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    meta = pd.concat([f[["op", "module"]] for f in frames])
    meta = meta[~meta.index.duplicated()]
    index = sorted(meta.index, key=lambda n: order.get(n, len(order)))
    df = meta.loc[index].copy()
    for name, frame in zip(names, frames, strict=True):
        df[name] = frame["local_sqnr"].reindex(index).astype(float)
    scores = df[names].to_numpy(dtype=float)
    df["best"] = [_best(row, names) for row in scores]
    df = df.reset_index()
    df.attrs["output_sqnr"] = output_sqnr
    return df


def _best(row: Any, names: list[str]) -> str:
    """The config with the highest local SQNR; ties joined with " = "; "" if none quantized."""
    import numpy as np

    if np.isnan(row).all():
        return ""
    top = np.nanmax(row)
    return " = ".join(n for n, v in zip(names, row, strict=True) if v == top)
