"""AIMET's automatic mixed precision (AMP) as the reference for qviz's mixed-precision search.

``amp_search`` runs ``aimet_torch.mixed_precision.choose_mixed_precision`` on a
``QuantizationSimModel`` of a float model (BatchNorm folded first, post-training "tf" min/max
encodings, W8A8 with per-channel or per-tensor weights from AIMET's default configs) and reports
which bits it gave each quantized conv / linear, the score AIMET reached, how many evaluations of
each callback it spent and its wall time. ``benchmarks/precision.py`` sets it beside qviz's search.

How AMP works (read off ``aimet_torch/common/amp/mixed_precision_algo.py``):

* Quantizer groups: each group is the output quantizer(s) of a producer plus the weight
  quantizers of the conv / linear layers it feeds (the model input quantizer with the first
  layer); output quantizers whose consumers have no weights (the classifier output, AIMET's
  ReLU / add modules where the model has them) form activation-only groups, which AMP also
  searches, trying every candidate on them although only the activation bits differ.
* A candidate is ``((act_bits, act_dtype), (param_bits, param_dtype))``: activation first.
  AIMET's only float candidate that keeps a quantizer in place is float16
  (``QuantizationDataType.float``, 16 bits): "float" in this benchmark means fp16 for AIMET.
* Before phase 1, with the phase-2 callback: one evaluation with every quantizer off (the float
  score that ``allowed_accuracy_drop`` is measured from) and one per candidate with every group
  at it; the best of those is the baseline candidate and its score ``AmpOutcome.baseline``.
* Phase 1 (``phase1_optimize``, AIMET's default): per non-baseline candidate, encodings are
  computed once with every group at it, then each group alone is switched on (all others off,
  that is fp32) and scored with the phase-1 callback: groups x (candidates - 1) evaluations.
* Phase 2: the (group, candidate) pairs sorted by their phase-1 score are applied cumulatively
  from the baseline; AMP's default ``AMPSearchAlgo.Binary`` searches that list for the longest
  prefix scoring at least float score - ``allowed_accuracy_drop`` (each probe recomputes the
  encodings and calls the phase-2 callback), applies it and scores it once more.

AMP writes caches, plots and JSON files into ``results_dir``: a temporary folder here, with
``clean_start=True``. Run ``.venv/bin/python benchmarks/precision_amp.py`` for the digits case.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from _machine import Stopwatch
from repair import _aimet_config, _aimet_import

Candidate = tuple[int | None, int | None]


@dataclasses.dataclass(frozen=True)
class AmpOutcome:
    """What one AMP run chose and what it cost.

    ``assignment`` maps the torch module name of each quantized conv / linear to its
    (weight bits, input-activation bits), ``None`` for AIMET's float16; ``baseline`` is AMP's
    score with every group at its largest candidate, ``metric`` ours of the final simulation;
    ``float_score`` is AMP's score with every quantizer off (``allowed_accuracy_drop`` counts
    from it); ``relative_bops`` is AIMET's bit-operation figure of the chosen point against the
    baseline candidate, ``None`` where AMP exits before phase 2.
    """

    assignment: dict[str, tuple[int | None, int | None]]
    baseline: float
    metric: float
    phase1_evaluations: int
    phase2_evaluations: int
    seconds: float
    relative_bops: float | None
    float_score: float = float("nan")


def _size(candidate: Candidate) -> tuple[bool, int, int]:
    """Sort key of a (weight, act) candidate: float (fp16) largest, then weight x act bits."""
    weight, act = candidate
    return weight is None, (weight or 0) * (act or 0), act or 0


def _aimet_candidates(candidates: Sequence[Candidate]) -> list:
    """AIMET's ``((act_bits, dtype), (param_bits, dtype))`` for each (weight, act) pair.

    Largest first: AMP takes the first of equally scoring candidates as its baseline, and from
    a smaller baseline its phase 2 moves groups *up* to the larger candidates.
    """
    from aimet_torch.common.defs import QuantizationDataType

    out = []
    for weight, act in sorted(candidates, key=_size, reverse=True):
        if (weight is None) != (act is None):
            raise ValueError(f"AIMET's float candidate is float16 for both: got {(weight, act)}")
        if weight is None:
            half = (16, QuantizationDataType.float)
            out.append((half, half))
        else:
            out.append(((act, QuantizationDataType.int), (weight, QuantizationDataType.int)))
    return out


def _quantsim(model: torch.nn.Module, example: torch.Tensor, calib: list, per_channel: bool):
    """AIMET W8A8 QuantizationSimModel of ``model`` prepared and BatchNorm-folded, calibrated.

    ``prepare_model`` (torch.fx) gives functional adds their own quantized modules and reused
    modules (torchvision's one ReLU per block) a copy per call, as AIMET's flow asks; a model
    torch.fx cannot trace (nn.TransformerEncoder) is used as it is.

    Returns the sim and the ``CallbackFunc`` that computes its encodings on ``calib``.
    """
    from aimet_torch.batch_norm_fold import fold_all_batch_norms
    from aimet_torch.common.defs import CallbackFunc, QuantScheme
    from aimet_torch.model_preparer import prepare_model
    from aimet_torch.quantsim import QuantizationSimModel

    try:
        folded = prepare_model(copy.deepcopy(model).eval())
    except RuntimeError as exc:  # torch.fx cannot trace it (nn.TransformerEncoder's mask check)
        print(f"  (AIMET's prepare_model failed: {str(exc)[:80]}; the model is used as it is)")
        folded = copy.deepcopy(model).eval()
    fold_all_batch_norms(folded, input_shapes=tuple(example.shape))
    sim = QuantizationSimModel(
        folded,
        dummy_input=example,
        quant_scheme=QuantScheme.post_training_tf,
        default_param_bw=8,
        default_output_bw=8,
        config_file=_aimet_config(per_channel),
    )

    def forward(m: torch.nn.Module, _=None) -> None:
        """One pass over the calibration batches."""
        with torch.no_grad():
            for x in calib:
                m(x)

    calibrate = CallbackFunc(forward, None)
    sim.compute_encodings(calibrate.func, None)
    return sim, calibrate


def _counted(fn: Callable[[torch.nn.Module], float]):
    """``fn`` wrapped to count its calls; returns (wrapper, one-element list holding the count)."""
    calls = [0]

    def wrapper(m: torch.nn.Module) -> float:
        """``fn(m)`` without autograd, counted."""
        calls[0] += 1
        with torch.no_grad():
            return float(fn(m))

    return wrapper, calls


@contextlib.contextmanager
def _recording_algo() -> Iterator[list]:
    """Record the ``GreedyMixedPrecisionAlgo`` that ``choose_mixed_precision`` builds.

    ``choose_mixed_precision`` returns only the evaluated Pareto points; the algorithm object
    holds the quantizer groups, the float and baseline scores and the phase-1 list.
    """
    import aimet_torch._base.mixed_precision as base

    original, seen = base.GreedyMixedPrecisionAlgo, []

    class Recording(original):
        """AIMET's algorithm, remembering its instance."""

        def __init__(self, *args, **kwargs) -> None:
            """Build AIMET's algorithm and keep it."""
            super().__init__(*args, **kwargs)
            seen.append(self)

    base.GreedyMixedPrecisionAlgo = Recording
    try:
        yield seen
    finally:
        base.GreedyMixedPrecisionAlgo = original


def _bits(quantizer) -> int | None:
    """Bits of a (v2) AIMET quantizer: ``None`` for float16 or no quantizer (float)."""
    from aimet_torch.quantization.affine import QuantizeDequantize

    return int(quantizer.bitwidth) if isinstance(quantizer, QuantizeDequantize) else None


def _group_state(algo, group) -> Candidate:
    """(weight bits, activation bits) a quantizer group holds now (weight ``None`` if none)."""
    names = algo._module_name_dict
    acts = group._get_input_quantizers(names) + group._get_output_quantizers(names)
    weights = [names[m].param_quantizers["weight"] for m in group.parameter_quantizers]
    return (_bits(weights[0]) if weights else None), (_bits(acts[0]) if acts else None)


def _as_pair(group, candidate) -> Candidate:
    """An AIMET candidate as the (weight, act) pair ``_group_state`` reads for ``group``."""
    from aimet_torch.common.defs import QuantizationDataType

    (act, act_type), (weight, weight_type) = candidate
    has_act = group.input_quantizers or group.output_quantizers
    act = act if has_act and act_type == QuantizationDataType.int else None
    weight = weight if weight_type == QuantizationDataType.int else None
    return (weight if group.parameter_quantizers else None), act


def _input_bits(algo, graph, name: str) -> int | None:
    """Bits of the activation quantizer feeding layer ``name``: its own input quantizer, else
    the nearest upstream output quantizer through modules whose output AIMET leaves float
    (flatten, identity) and shape ops; ``None`` where the input arrives in float (fp16 included).
    """
    from aimet_torch._base.amp.quantizer_groups import ops_to_skip

    names = algo._module_name_dict
    if names[name].input_quantizers[0] is not None:
        return _bits(names[name].input_quantizers[0])
    op = next(o for o in graph.get_all_ops().values() if o.dotted_name.endswith(f".{name}"))
    while op.input_ops:
        op = op.input_ops[0]
        module = names.get(op.dotted_name.split(".", 1)[-1])
        if module is None and op.type not in ops_to_skip:
            return None  # a functional op AIMET does not quantize: its output is float
        if module is not None and module.output_quantizers[0] is not None:
            return _bits(module.output_quantizers[0])
    return None


def _assignment(sim, algo) -> dict[str, Candidate]:
    """Torch module name of each quantized conv / linear -> (weight bits, input-act bits)."""
    layers = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)
    out = {}
    for group in algo.quantizer_groups:
        for name in group.parameter_quantizers:
            module = algo._module_name_dict[name]
            if isinstance(getattr(module, "_module_to_wrap", module), layers):
                weight = _bits(module.param_quantizers["weight"])
                out[name] = (weight, _input_bits(algo, sim.connected_graph, name))
    return dict(sorted(out.items()))


def _relative_bops(algo) -> float | None:
    """AIMET's relative bit ops of the Pareto point the final simulation matches, if any."""
    if not algo.pareto_list:
        return None
    state = {g: _group_state(algo, g) for g in algo.quantizer_groups}
    expected = {g: _as_pair(g, algo.baseline_candidate) for g in algo.quantizer_groups}
    scored = {(g, c): bops for bops, _, g, c in algo.pareto_list}
    if expected == state:
        return 1.0
    for group, candidate, _, _ in algo.accuracy_list:
        expected[group] = _as_pair(group, candidate)
        if expected == state and (group, candidate) in scored:
            return float(scored[group, candidate])
    return None


def _float_score(sim, score: Callable[[torch.nn.Module], float]) -> float:
    """``score`` of the simulation with every quantizer off, as AMP measures its float score."""
    from aimet_torch.utils import disable_all_quantizers

    with torch.no_grad(), disable_all_quantizers(sim.model):
        return float(score(sim.model))


def amp_search(
    model: torch.nn.Module,
    example: torch.Tensor,
    calib: list,
    score: Callable[[torch.nn.Module], float],
    candidates: Sequence[Candidate],
    allowed_drop: float | None,
    *,
    per_channel: bool,
    phase1_score: Callable[[torch.nn.Module], float] | None = None,
    target: float | None = None,
) -> AmpOutcome:
    """AIMET AMP on a W8A8 simulation of ``model``: the bits it chose, its scores and its cost.

    ``candidates`` are (weight bits, activation bits) pairs; ``(None, None)`` is AIMET's float16
    candidate (AIMET cannot keep a quantizer group in fp32). ``score(sim_model)`` (higher is
    better) is AMP's phase-2 callback and the final measure; ``phase1_score`` (default
    ``score``) its phase-1 callback. ``allowed_drop`` is ``allowed_accuracy_drop``, in the
    score's units, counted by AIMET from its all-quantizers-off score, not from ``baseline``;
    ``target`` instead sets it to that float score (measured here first, uncounted) - ``target``:
    for an SQNR score against ``model`` the float score is BatchNorm folding's own, 100+ dB.
    ``model`` is not touched.
    """
    from aimet_torch.mixed_precision import choose_mixed_precision

    _aimet_import()
    sim, calibrate = _quantsim(model, example, calib, per_channel)
    phase1, phase1_calls = _counted(phase1_score or score)
    phase2, phase2_calls = _counted(score)
    if target is not None:
        allowed_drop = _float_score(sim, score) - target
    with tempfile.TemporaryDirectory() as results, _recording_algo() as seen:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Stopwatch() as watch:
                choose_mixed_precision(
                    sim,
                    example,
                    _aimet_candidates(candidates),
                    phase1,
                    phase2,
                    allowed_accuracy_drop=allowed_drop,
                    results_dir=results,
                    clean_start=True,
                    forward_pass_callback=calibrate,
                )
    seconds = watch.seconds
    algo = seen[0]
    with torch.no_grad():
        metric = float(score(sim.model))
    return AmpOutcome(
        assignment=_assignment(sim, algo),
        baseline=max(s for s, _ in algo._eval_scores),
        metric=metric,
        phase1_evaluations=phase1_calls[0],
        phase2_evaluations=phase2_calls[0],
        seconds=seconds,
        relative_bops=_relative_bops(algo),
        float_score=float(algo.fp32_accuracy),
    )


def _digits() -> AmpOutcome:
    """AMP on the embedded digits model: test accuracy, W4A8 / W8A8 / W8A16 / fp16, drop 0.005."""
    from qviz.data import digits_loaders, digits_model

    loaders = digits_loaders(batch_size=64)
    calib = [x for x, _ in loaders.calibration]
    test = list(loaders.test)

    def accuracy(m: torch.nn.Module) -> float:
        """Share of the test split that ``m`` classifies right."""
        right = sum(int((m(x).argmax(1) == y).sum()) for x, y in test)
        return right / sum(len(y) for _, y in test)

    candidates = [(4, 8), (8, 8), (8, 16), (None, None)]
    model = digits_model()
    return amp_search(model, calib[0], calib, accuracy, candidates, 0.005, per_channel=True)


if __name__ == "__main__":
    outcome = _digits()
    for field in dataclasses.fields(outcome):
        print(f"{field.name}: {getattr(outcome, field.name)}")
