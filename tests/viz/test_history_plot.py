"""qviz.viz.history_plot: one panel per metric, one labelled line per run, values as given."""

from __future__ import annotations

import pytest
import torch

from qviz.engine import quant_nn
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.fine_tune import fine_tune
from qviz.errors import ConfigError
from qviz.viz.history_plot import history_plot


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_every_run_is_a_labelled_line_in_every_panel_with_its_values():
    runs = {
        "w4a8": [{"epoch": 0, "accuracy": 0.9, "eval_loss": 0.3}, {"epoch": 1, "accuracy": 0.95}],
        "w3a4": [{"epoch": 0, "accuracy": 0.8, "eval_loss": 0.5}, {"epoch": 1, "accuracy": 0.9}],
    }
    fig = history_plot(runs, baseline={"accuracy": 0.97}, ylabels={"accuracy": "test accuracy"})
    acc, loss = fig.axes
    assert set(_lines(acc)) == {"w4a8", "w3a4", "float"}
    assert list(_lines(acc)["w3a4"].get_ydata()) == [0.8, 0.9]
    assert list(_lines(loss)["w4a8"].get_ydata()) == [0.3]  # the missing value is skipped
    assert "float" not in _lines(loss)  # no baseline given for the loss
    assert acc.get_ylabel() == "test accuracy" and loss.get_ylabel() == "eval loss"
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["w4a8", "w3a4"]
    assert len(fig.qviz_rows) == 4
    assert fig._repr_png_()[:4] == b"\x89PNG"


def test_fine_tune_histories_plot_as_they_are():
    model = torch.nn.Sequential(quant_nn.QuantLinear(4, 3))
    data = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(2)]
    calibrate_quantizers(model, data, progress=False)
    history = fine_tune(model, data, epochs=2, lr=1e-3, eval_data=data, progress=False)
    fig = history_plot({"run": history})
    assert list(_lines(fig.axes[0])["run"].get_xdata()) == [1, 2]
    assert list(_lines(fig.axes[0])["run"].get_ydata()) == [r.accuracy for r in history]


@pytest.mark.parametrize(
    ("runs", "metrics", "match"),
    [({}, ("loss",), "at least one run"), ({"a": [{"loss": 1.0}]}, ("loss",), "row 0 of run 'a'")],
)
def test_bad_input_raises_a_config_error_naming_it(runs, metrics, match):
    with pytest.raises(ConfigError, match=match):
        history_plot(runs, metrics=metrics)
