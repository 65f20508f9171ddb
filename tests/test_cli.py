"""The `qviz` command: the main job on the embedded model, and its errors."""

import re

from qviz.cli import main
from qviz.data import digits_loaders, digits_model, evaluate


def test_main_job_prints_the_calibrator_table(capsys, tmp_path):
    csv = tmp_path / "table.csv"
    assert main(["calibrators", "--batch-size", "32", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    float_accuracy = evaluate(digits_model(), digits_loaders(batch_size=64).test)
    assert f"float test accuracy {float_accuracy:.2%}" in out
    for name in ("stem.0.input", "block.conv2.weight", "conv2.0.input", "fc.weight"):
        assert name in out
    for method in ("max", "percentile", "entropy", "mse"):
        assert method in out
    assert csv.read_text().splitlines()[0] == "tensor,kind,method,amax,scale,clipped,sqnr_db,best"


def test_no_arguments_runs_the_main_job(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    out = capsys.readouterr().out
    html = (tmp_path / "report.html").read_text()  # the main job writes the report
    assert "<svg" in html and "data:image/png;base64," in html
    assert "SQNR dB" in out  # the calibrator table
    float_accuracy = evaluate(digits_model(), digits_loaders(batch_size=64).test)
    assert f"test accuracy: float {float_accuracy:.2%}, int8" in out  # the PT2E flow
    assert "left in float: 0" in out
    assert "five worst operators by local SQNR" in out  # the numeric suite
    assert "local dB" in out and "cumulative dB" in out
    assert "Numeric suite" in html
    # the reference model on ExecuTorch's XNNPACK kernels, measured against the reference
    pattern = (
        r"lowered to ExecuTorch XNNPACK .*accuracy ([\d.]+)%, at most (\d+) "
        r"output step.* (\d+) operators on int8 kernels, 0 on float"
    )
    lowered = re.search(pattern, out)
    assert lowered, out
    assert int(lowered.group(2)) <= 1 and int(lowered.group(3)) >= 6


def test_quantize_reports_float_and_int8_accuracy(capsys, monkeypatch):
    import qviz
    from qviz.errors import MissingDependencyError

    def no_executorch(*args, **kwargs):
        raise MissingDependencyError("executorch is not installed (this test)")

    # the lowering is the main job's test's; here only the flow's own lines are read
    monkeypatch.setattr(qviz, "lower", no_executorch)
    assert main(["quantize", "--per-tensor", "--batch-size", "50"]) == 0
    out = capsys.readouterr().out
    accuracy = re.search(r"test accuracy: float [\d.]+%, int8 ([\d.]+)%", out).group(1)
    assert float(accuracy) > 97.0  # per-tensor weights cost at most a few images
    assert "on 360 images" in out and "180 calibration images" in out
    assert "lowered: skipped (executorch is not installed (this test))" in out


def test_errors_are_reported_without_a_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("QVIZ_DATA_DIR", str(tmp_path))
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qviz: error:") and "qviz train-digits" in err


def test_report_command_writes_the_digits_report(capsys, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", "--out", str(out), "--stage", "converted"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    html = out.read_text()
    assert "qviz report: DigitsNet (converted)" in html and "<svg" in html


def test_report_command_takes_a_users_model(capsys, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tiny_factory.py").write_text(
        "import torch\n\ndef build():\n    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()\n"
        "    return m, [torch.randn(2, 4) for _ in range(3)]\n"
    )
    out = tmp_path / "tiny.html"
    assert main(["report", "--model", "tiny_factory:build", "--out", str(out)]) == 0
    html = out.read_text()
    assert "tiny_factory:build" in html and "data:image/png;base64," in html


def test_report_command_names_a_bad_model_spec(capsys):
    assert main(["report", "--model", "no_such_module_xyz:build"]) == 2
    err = capsys.readouterr().err
    assert "--model 'no_such_module_xyz:build': cannot load it" in err
    assert main(["report", "--model", "missing_colon"]) == 2
    assert "expected 'package.module:function'" in capsys.readouterr().err
