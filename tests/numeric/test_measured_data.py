"""Non-finite and empty data are named, never measured; a summary says what its table holds.

Every entry point that measures checks that it measured something (at least one batch, finite
values) and names the batch and the tensor where a NaN or infinity appears; a user metric or
cost that returns NaN, infinity or a negative cost is refused naming the callable; and a
summary is computed from the rows it sits on."""

from __future__ import annotations

import copy

import pytest
import torch

import qviz
import qviz.numeric
from qviz.errors import CalibrationError, ConfigError
from qviz.numeric.lowering.lowered import LoweringComparison
from tests.helpers.fork import fork_data
from tests.helpers.lineage_models import models as _models
from tests.helpers.lineage_models import quantizer as _quantizer
from tests.helpers.lineage_models import state as _state
from tests.helpers.lineage_models import unchanged as _unchanged

pytest.importorskip("pandas")


def _with_nan(batches: list[torch.Tensor], index: int) -> list[torch.Tensor]:
    out = [b.clone() for b in batches]
    out[index][1, 2, 3, 4] = float("nan")
    return out


def test_compare_lowered_refuses_nan_empty_and_no_batches(lowered):
    m = _models()
    with pytest.raises(CalibrationError, match=r"compare_lowered: batch 1: batch holds 1 "
                       r"non-finite value of 768 \(nan at \[1, 2, 3, 4\]\)"):  # fmt: skip
        qviz.numeric.compare_lowered(m.converted, lowered, _with_nan(m.data, 1))
    with pytest.raises(CalibrationError, match="compare_lowered got no batches"):
        qviz.numeric.compare_lowered(m.converted, lowered, [])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match=rf"max_batches={bad!r}\): give a positive int"):
            qviz.numeric.compare_lowered(m.converted, lowered, m.data, max_batches=bad)
    for bad in (-1, float("nan"), "1", None):
        with pytest.raises(ConfigError, match=r"tolerance=.*give an int >= 0"):
            qviz.numeric.compare_lowered(m.converted, lowered, m.data, tolerance=bad)


def test_diagnose_and_compare_name_the_batch_with_a_nan():
    m = _models()
    with pytest.raises(CalibrationError, match=r"diagnose: batch 0: batch holds 1 non-finite"):
        qviz.numeric.diagnose(m.report, m.prepared, data=_with_nan(m.data, 0))
    with pytest.raises(CalibrationError, match="diagnose got no batches"):
        qviz.numeric.diagnose(m.report, m.prepared, data=[])
    with pytest.raises(CalibrationError, match=r"compare: batch 1: batch holds 1 non-finite"):
        qviz.numeric.compare(m.gm, m.converted, _with_nan(m.data, 1), progress=False)


def test_a_repair_session_refuses_nan_data_and_a_nan_metric():
    m = _models()
    before = _state(m.gm)
    with pytest.raises(CalibrationError, match=r"RepairSession: batch 1: "):
        qviz.numeric.RepairSession(m.gm, _quantizer(), m.data, _with_nan(m.data, 1),
                                   progress=False)  # fmt: skip

    def nan_metric(float_out, quant_out, target):
        return float("nan")

    with pytest.raises(ConfigError, match=r"the metric returned float nan; .* must return a "
                       r"finite number .*nan_metric"):  # fmt: skip
        qviz.numeric.RepairSession(m.gm, _quantizer(), m.data, m.data, metric=nan_metric,
                                   progress=False)  # fmt: skip
    assert _unchanged(m.gm, before)


@pytest.mark.parametrize(
    ("cost", "why"),
    [(lambda layer, p: float("nan"), "float nan"), (lambda layer, p: -1.0, "float -1.0"),
     (lambda layer, p: "cheap", "str 'cheap'")],
)  # fmt: skip
def test_search_precision_refuses_a_cost_it_cannot_add_up(cost, why):
    model, data = fork_data()
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    with pytest.raises(ConfigError, match=rf"search_precision: layer .* the cost returned {why}; "
                       r"cost\(layer, precision\) must return a finite number >= 0"):  # fmt: skip
        qviz.numeric.search_precision(gm, _quantizer(), data, min_sqnr=30.0, cost=cost,
                                      progress=False)  # fmt: skip


def test_search_precision_progress_counts_what_its_summary_counts(capsys):
    model, data = fork_data()
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    result = qviz.numeric.search_precision(gm, _quantizer(), data, min_sqnr=40.0)
    stderr = capsys.readouterr().err
    full = len(result.full_evaluations)
    assert f"{full} full evaluation" in result.summary()
    if "confirmed point" in stderr or "misses the target" in stderr:  # stopped early
        assert f"after {full} evaluation" in stderr


def _row(op: str, steps: int) -> dict:
    return {"tensor": f"q_{op}", "op": op, "elements": 10, "differing": int(steps > 0),
            "share": 0.1 * (steps > 0), "max_steps": steps}  # fmt: skip


def test_a_lowering_summary_is_read_from_its_rows_at_its_tolerance():
    rows = (_row("conv2d", 0), _row("linear", 160))
    wide = LoweringComparison(rows, "xnnpack", "per tensor", tolerance=200)
    assert (
        wide.summary
        == "no tensor more than 200 steps from the reference (largest: 160 steps, linear)"
    )
    tight = LoweringComparison(rows, "xnnpack", "per tensor", tolerance=1)
    assert tight.summary.startswith("first departure: linear (160 steps); 1 of 2 tensors")
    assert tight.summary in repr(tight)
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(ConfigError, match="tolerance"):
            LoweringComparison(rows, "xnnpack", "per tensor", tolerance=bad)


def test_nothing_is_changed_by_a_refused_measurement(lowered):
    m = _models()
    converted = copy.deepcopy(m.converted)
    before = _state(converted)
    with pytest.raises(CalibrationError):
        qviz.numeric.compare_lowered(converted, lowered, _with_nan(m.data, 0))
    assert _unchanged(converted, before)


def test_a_repair_step_that_moved_nothing_says_no_gain():
    from qviz.numeric.repair.session import RepairStep

    def step(before: float, after: float) -> RepairStep:
        return RepairStep(
            remedy="per_channel",
            arguments=(),
            scope=(),
            transforms=(),
            layers=(),
            output_sqnr_before=before,
            output_sqnr_after=after,
            metric_before=None,
            metric_after=None,
            seconds=0.1,
        )

    assert repr(step(10.77, 10.77)) == (
        "RepairStep(per_channel: no gain (output SQNR 10.77 dB, unchanged within 0.05 dB))"
    )
    assert "worse by 1.20 dB" in repr(step(20.0, 18.8))
    assert step(20.0, 23.5).gained and "20.00 -> 23.50 dB" in repr(step(20.0, 23.5))
    assert "(no gain)" in step(10.77, 10.77)._repr_html_()


def test_bias_correction_and_adaround_refuse_nan_data_and_another_float_model():
    from qviz.engine.repair import adaround, bias_correction

    m = _models()
    converted = copy.deepcopy(m.converted)
    before = _state(converted)
    with pytest.raises(CalibrationError, match=r"bias_correction: batch 1: batch holds 1 non"):
        bias_correction(converted, m.gm, _with_nan(m.data, 1))
    with pytest.raises(CalibrationError, match="adaround got no batches"):
        adaround(converted, m.gm, [], iterations=2, progress=False)
    for remedy in (bias_correction, adaround):
        with pytest.raises(ConfigError, match=r"\(float_gm=...\): the quantized model was "
                           r"prepared from another float model"):  # fmt: skip
            remedy(converted, m.other_gm, m.data)
    assert _unchanged(converted, before)
    corrected = bias_correction(converted, m.gm, m.data)  # its own float model: accepted
    assert corrected.meta["qviz_origin"] == converted.meta["qviz_origin"]
