"""export_onnx's arguments: the path, the example inputs and dynamic_batch, checked before the
export runs, and the batch sizes a written file takes, run in onnxruntime (the reference)."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

import qviz
from qviz.engine.onnx.export import export_onnx
from qviz.errors import ConfigError
from tests.helpers.quantize import quantize

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _converted(batch: int, *, dynamic_batch: bool) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    x = torch.randn(batch, 4)
    return quantize(model, x, per_channel=False, dynamic_batch=dynamic_batch).converted, x


@pytest.fixture(scope="module")
def fixed():
    return _converted(32, dynamic_batch=False)


@pytest.fixture(scope="module")
def dynamic():
    return _converted(8, dynamic_batch=True)


def _outputs(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


# -- item 1: the path is checked before the export runs -------------------------------------------
def _refused_quickly(model, x, path, match: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        export_onnx(model, (x,), path)
    assert time.perf_counter() - start < 0.5  # refused before torch.onnx ran (it takes seconds)


def test_a_path_under_a_file_is_refused_before_exporting(fixed, tmp_path):
    (tmp_path / "file").write_text("")
    _refused_quickly(*fixed, tmp_path / "file" / "m.onnx", r"is a file.*choose")


def test_an_existing_folder_is_refused(fixed, tmp_path):
    _refused_quickly(*fixed, tmp_path, r"is a folder.*give a file path")


@pytest.mark.parametrize("path", [None, 3, ["m.onnx"]])
def test_a_path_that_is_not_a_path_is_refused(fixed, path):
    _refused_quickly(*fixed, path, r"path must be a file path \(str or Path\)")


@pytest.mark.skipif(sys.platform != "linux", reason="/sys refuses files to every user on Linux")
def test_an_unwritable_place_is_refused_before_exporting(fixed):
    _refused_quickly(*fixed, "/sys/qviz_export_test/m.onnx", r"cannot write.*writable")


def test_a_refused_path_creates_nothing(fixed, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError):
        export_onnx(*fixed[:1], (fixed[1],), tmp_path / "file" / "sub" / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- item 2: the example inputs are checked against the graph -------------------------------------
@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.randn(2, 4), r"exported for batch 32 / torch.float32: pass that, or export with "
                            r"qviz.export\(\.\.\., dynamic_batch=True\)"),
        (torch.randn(32, 4).double(), r"exported for batch 32 / torch.float32: pass that"),
    ],
)  # fmt: skip
def test_an_example_of_another_batch_or_dtype_names_what_the_graph_takes(fixed, x, match, tmp_path):
    with pytest.raises(ConfigError, match=match) as info:
        export_onnx(fixed[0], (x,), tmp_path / "m.onnx")
    assert "export-friendly" not in str(info.value)


def test_onnx_with_a_dynamic_batch_of_one_asks_for_batch_two(dynamic, tmp_path):
    with pytest.raises(ConfigError, match=r"batch >= 2"):
        export_onnx(dynamic[0], (torch.randn(1, 4),), tmp_path / "m.onnx", dynamic_batch=True)


# -- item 3: dynamic_batch=True writes a file that takes any batch, or is refused -----------------
def test_dynamic_batch_on_a_fixed_batch_graph_is_refused(fixed, tmp_path):
    with pytest.raises(ConfigError, match=r"fixed batch of 32.*qviz.export\(\.\.\., dynamic_batch"):
        export_onnx(fixed[0], (fixed[1],), tmp_path / "m.onnx", dynamic_batch=True)
    assert not (tmp_path / "m.onnx").exists()


def test_dynamic_batch_file_takes_every_batch_size_in_onnxruntime(dynamic, tmp_path):
    model, x = dynamic
    result = export_onnx(model, (x,), tmp_path / "m.onnx", dynamic_batch=True)
    dim = result.model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.dim_value  # symbolic in the file
    for batch in (1, 3, 8, 17):
        inputs = torch.randn(batch, 4)
        got = _outputs(result.path, inputs)
        expected = model(inputs).numpy()
        assert got.shape == expected.shape
        step = 2 * float(np.abs(expected).max()) / 255 + 1e-6  # one output step at most
        assert np.abs(got - expected).max() <= step


def test_fixed_batch_file_takes_its_batch_only(fixed, tmp_path):
    model, x = fixed
    result = export_onnx(model, (x,), tmp_path / "m.onnx")
    assert result.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 32
    assert _outputs(result.path, x).shape == (32, 3)
    with pytest.raises(Exception, match=r"(?i)dimension|shape"):
        _outputs(result.path, torch.randn(3, 4))


@pytest.mark.parametrize(
    ("x", "match"),
    [(torch.randn(8, 4).double(), "dtype"), (torch.randn(8, 5), r"\[8, 5\]|8x5|shape")],
)
def test_a_tensor_quantizer_model_names_example_inputs_it_cannot_run(x, match, tmp_path):
    from qviz.engine.tensor.quant_modules import quantize_model

    model = quantize_model(nn.Sequential(nn.Linear(4, 3)).eval())
    qviz.calibrate_quantizers(model, [torch.randn(8, 4)], progress=False)
    with pytest.raises(ConfigError, match=rf"example_inputs .*{match}.*pass inputs") as info:
        export_onnx(model, (x,), tmp_path / "m.onnx")
    assert "export-friendly" not in str(info.value)
    assert not (tmp_path / "m.onnx").exists()


def test_dynamic_batch_for_tensor_quantizers_is_refused_before_exporting(tmp_path):
    """torch cannot trace TensorQuantizers' fake-quantize ops with a dynamic batch: said before
    the export runs, with the fix."""
    from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer

    model = nn.Sequential(TensorQuantizer(QuantDescriptor(num_bits=8, amax=1.0)))
    start = time.perf_counter()
    with pytest.raises(
        ConfigError, match=r"dynamic_batch=True.*TensorQuantizer.*dynamic_batch=False"
    ):
        export_onnx(model, (torch.randn(8, 4),), tmp_path / "m.onnx", dynamic_batch=True)
    assert time.perf_counter() - start < 0.5
    model[0].disable()  # no fake-quantize op left: any batch, as asked
    result = export_onnx(model, (torch.randn(8, 4),), tmp_path / "m.onnx", dynamic_batch=True)
    assert _outputs(result.path, torch.randn(3, 4)).shape == (3, 4)
