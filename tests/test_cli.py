"""The `qviz` command: the main job on the embedded model, and its errors."""

from qviz.cli import main


def test_main_job_prints_the_calibrator_table(capsys, tmp_path):
    csv = tmp_path / "table.csv"
    assert main(["calibrators", "--batch-size", "32", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "float test accuracy 99.72%" in out
    for name in ("stem.0.input", "block.conv2.weight", "conv2.0.input", "fc.weight"):
        assert name in out
    for method in ("max", "percentile", "entropy", "mse"):
        assert method in out
    assert csv.read_text().splitlines()[0] == "tensor,kind,method,amax,scale,clipped,sqnr_db,best"


def test_no_arguments_runs_the_main_job(capsys):
    assert main([]) == 0
    assert "SQNR dB" in capsys.readouterr().out


def test_errors_are_reported_without_a_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("QVIZ_DATA_DIR", str(tmp_path))
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qviz: error:") and "qviz train-digits" in err
