"""The numeric suite's progress bars end finished when a loop stops early by design, and
failed (short of their total) when it raises; checked on tqdm's notebook bar, no kernel."""

from __future__ import annotations

import pytest
import tqdm.auto
import tqdm.notebook

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import search_precision
from qviz.numeric.measure.progress import progress_bar
from qviz.numeric.precision import precision
from tests.helpers.fork import fork_data


@pytest.fixture
def notebook_bars(monkeypatch):
    """tqdm.auto gives the notebook bar, as it does in Jupyter."""
    monkeypatch.setattr(tqdm.auto, "tqdm", tqdm.notebook.tqdm)


def _style(progress) -> str:
    return progress.bar.container.children[1].bar_style


def test_a_loop_stopped_by_design_ends_finished_and_says_why(notebook_bars):
    bar = progress_bar(range(7), True, "confirming the front")
    for i in bar:
        if i == 2:
            bar.stop("confirmed after 2 evaluations")
            break
    assert (bar.bar.n, bar.bar.total) == (2, 2)
    assert bar.bar.disable  # closed
    assert _style(bar) == "success"
    text = bar.bar.container.children[2].value.replace("\u2007", " ")  # tqdm pads with U+2007
    assert "confirmed after 2 evaluations" in text


def test_a_loop_run_to_its_end_ends_finished(notebook_bars):
    bar = progress_bar(["a", "b"], True, "screening")
    assert list(bar) == ["a", "b"]
    assert (bar.bar.n, bar.bar.total, _style(bar)) == (2, 2, "success")


def test_a_loop_that_raises_leaves_the_bar_failed(notebook_bars):
    bar = progress_bar(range(7), True, "confirming the front")
    with pytest.raises(RuntimeError):
        for i in bar:
            if i == 2:
                raise RuntimeError("broken batch")
    assert (bar.bar.n, bar.bar.total, _style(bar)) == (2, 7, "danger")


def test_a_stop_before_any_work_ends_at_zero(notebook_bars):
    bar = progress_bar(range(3), True, "confirming the front")
    for _ in bar:
        bar.stop("nothing to confirm")
        break
    assert (bar.bar.n, bar.bar.total, _style(bar)) == (0, 0, "success")


def test_a_disabled_bar_stops_at_the_work_done():
    bar = progress_bar(range(5), False, "probes")
    for i in bar:
        if i == 3:
            bar.stop("done")
            break
    assert (bar.bar.n, bar.bar.total) == (3, 3)


def test_the_search_that_stops_early_ends_its_bar_finished(notebook_bars, monkeypatch):
    """search_precision's confirming stops once the cheapest passing point is known, well
    before its budget: the bar ends at the evaluations done, green, and every bar is closed."""
    bars = []

    def recording(*args, **kwargs):
        bars.append(progress_bar(*args, **kwargs))
        return bars[-1]

    monkeypatch.setattr(precision, "progress_bar", recording)
    model, data = fork_data()
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    result = search_precision(gm, quantizer, data, min_sqnr=40.0, max_evaluations=12)
    confirming = [b for b in bars if b.bar.desc == "confirming the front"]
    assert len(confirming) == 1, [b.bar.desc for b in bars]
    bar = confirming[0].bar
    done = len([e for e in result.full_evaluations if e.point is not None])
    assert bar.n == bar.total < 12
    assert bar.n <= done
    assert all(b.bar.disable and _style(b) == "success" for b in bars)
