"""bisect_lowering: the first tensor a lowered program departs at, in fewer probes than tensors.

A defect is planted in the lowered program only (never in the reference): a QuantizeLinear's
scale in the lowered .onnx (onnxruntime), a quantize operator's scale in the program handed to
ExecuTorch (XNNPACK). The bisection names that tensor; compare_lowered, which compares every
tensor at once, is the independent reference on onnxruntime.
"""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import qviz
from qviz.engine.lower.lowered import LoweredModel
from qviz.engine.lower.xnnpack import lower_exported
from qviz.errors import ConfigError
from qviz.numeric import BisectionResult, bisect_lowering, compare_lowered
from qviz.numeric.lowering.bisect import _cut, _search
from tests.helpers.quantize import quantize


class Residual(nn.Module):
    """8 quantized tensors: the input, six linears and an add; ``a`` feeds a branch and the add."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.l4, self.l5, self.l6 = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.l1(x)
        return self.l6(self.l5(self.l4(a + self.l3(self.l2(a)))))


def _is_quantize(node) -> bool:
    return "quantize_per_tensor" in str(node.target) and "dequantize" not in str(node.target)


def _quantizes(gm) -> list[str]:
    return [n.name for n in gm.graph.nodes if _is_quantize(n)]


@pytest.fixture(scope="module")
def data():
    torch.manual_seed(0)
    return [torch.randn(32, 8) for _ in range(2)]


@pytest.fixture(scope="module")
def chain(data):
    torch.manual_seed(1)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(9)])
    return quantize(model, data[0], per_channel=False).converted


@pytest.fixture(scope="module")
def residual(data):
    torch.manual_seed(2)
    return quantize(Residual(), data[0], per_channel=False).converted


def _plant_onnx(lowered, index: int, factor: float = 1.5):
    """A copy of ``lowered`` whose ``index``-th QuantizeLinear has its scale times ``factor``."""
    model = onnx.load_from_string(lowered.artifact)
    node = [n for n in model.graph.node if n.op_type == "QuantizeLinear"][index]
    old = next(i for i in model.graph.initializer if i.name == node.input[1])
    model.graph.initializer.append(
        numpy_helper.from_array(numpy_helper.to_array(old) * factor, name="planted_scale")
    )
    node.input[1] = "planted_scale"
    planted = copy.copy(lowered)
    planted.artifact = model.SerializeToString()
    return planted


@pytest.mark.parametrize(("model", "index"), [("chain", 3), ("chain", 8), ("residual", 1),
                                              ("residual", 3)])  # fmt: skip
def test_a_scale_planted_in_the_lowered_onnx_is_found_in_few_probes(request, data, model, index):
    converted = request.getfixturevalue(model)
    lowered = qviz.lower(converted, (data[0],), backend="onnxruntime")
    planted = _plant_onnx(lowered, index)
    result = bisect_lowering(converted, planted, data)
    everything = compare_lowered(converted, planted, data)  # every tensor: the reference
    assert len(everything.rows) == result.candidates >= 8
    first = result.first_departure
    assert first["tensor"] == everything.first_departure["tensor"] == _quantizes(converted)[index]
    assert first["op"] == everything.first_departure["op"] and first["departed"]
    assert len(result.probes) < result.candidates and result.propagation_held
    assert result.probes[0]["role"] == "output" and result.probes[0]["departed"]
    # each probe agrees with the full comparison of the same tensor
    rows = {r["tensor"]: r for r in everything.rows}
    for probe in result.probes:
        assert probe["max_steps"] == rows[probe["tensor"]]["max_steps"]
        assert probe["departed"] == (probe["max_steps"] > 1)
    assert first["tensor"] in repr(result) and first["tensor"] in result._repr_html_()
    assert result.df["tensor"].tolist() == [p["tensor"] for p in result.probes]


def test_a_clean_onnx_lowering_agrees_after_probing_only_the_output(chain, data):
    lowered = qviz.lower(chain, (data[0],), backend="onnxruntime")
    result = bisect_lowering(chain, lowered, data, max_batches=1)
    assert isinstance(result, BisectionResult) and result.agrees
    assert [p["role"] for p in result.probes] == ["output"]
    assert result.probes[0]["tensor"] == _quantizes(chain)[-1]
    assert result.probes[0]["elements"] == data[0].shape[0] * 8  # one batch: the output's grid
    assert "agrees" in repr(result) and result.backend == "onnxruntime"


def _planted_xnnpack(converted, x, index: int, factor: float = 1.5) -> LoweredModel:
    """``converted`` exported and lowered to XNNPACK with the ``index``-th activation quantize's
    scale in the exported program (before ExecuTorch sees it) times ``factor``."""
    program = torch.export.export(converted, (x,))
    node = [n for n in program.graph.nodes if _is_quantize(n)][index]
    node.args = (node.args[0], node.args[1] * factor, *node.args[2:])
    program.graph_module.recompile()
    run, records, buffer = lower_exported(program)
    return LoweredModel(
        run, backend="xnnpack", kernels=records, artifact=buffer, example_inputs=(x,),
        fingerprint=qviz.engine.graph.fingerprint.fingerprint(converted), lowering_seconds=0.0,
        dynamic_batch=False,
    )  # fmt: skip


def test_a_scale_planted_in_the_program_lowered_to_xnnpack_is_found(chain, data):
    planted = _planted_xnnpack(chain, data[0], 5)
    step = float(chain.plan.groups[-1].qparams.scale)
    assert float((planted(data[0]) - chain(data[0])).abs().max()) > 2 * step  # it is a defect
    result = bisect_lowering(chain, planted, data[:1])
    assert result.first_departure["tensor"] == _quantizes(chain)[5]
    assert result.first_departure["max_steps"] > 1 and result.propagation_held
    assert len(result.probes) < result.candidates
    assert result.method.startswith("the lowered program cut")
    # the tensor it is computed from was probed and agrees
    before = next(p for p in result.probes if p["tensor"] == _quantizes(chain)[4])
    assert not before["departed"]


def test_a_clean_xnnpack_lowering_agrees(chain, data):
    lowered = qviz.lower(chain, (data[0],), backend="xnnpack")
    assert lowered.program is not None
    result = bisect_lowering(chain, lowered, data[:1])
    assert result.agrees and len(result.probes) == 1 and result.probes[0]["max_steps"] <= 1
    # the program cut at the output's quantize, lowered again, gives the lowered model's integers
    module = lowered.program.module()
    last = [n for n in module.graph.nodes if _is_quantize(n)][-1]
    run, _, _ = lower_exported(torch.export.export(_cut(module, last), (data[1],)))
    dq = next(n for n in chain.graph.nodes if n.op == "output").args[0][0]
    whole = torch.round(lowered(data[1]) / dq.args[1]).to(torch.int64) + dq.args[2]
    assert torch.equal(run([data[1]])[0].to(torch.int64), whole)


class Fading(nn.Module):
    """A residual block whose branch is 40 linears: a departure at ``a`` fades along the branch
    (each random linear shrinks what it is given) but reaches the add through the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.out = nn.Linear(8, 8), nn.Linear(8, 4)
        self.branch = nn.Sequential(*[nn.Linear(8, 8) for _ in range(40)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        return self.out(a + self.branch(a))


def test_a_departure_that_fades_is_found_and_reported(data):
    """Measured (3 seeds): the planted ``a`` departs by about 50 steps, the branch falls to one
    step within 12 linears, the add and the output depart. The bisection probes the branch's
    middle (agrees: ``a`` is cleared under the assumption), lands on the add, and verifying it
    finds ``a`` departing: the search goes on from ``a``, names it and says the assumption
    failed."""
    torch.manual_seed(3)
    converted = quantize(Fading(), data[0], per_channel=False).converted
    planted = _plant_onnx(qviz.lower(converted, (data[0],), backend="onnxruntime"), 1)
    result = bisect_lowering(converted, planted, data)
    everything = compare_lowered(converted, planted, data)
    a = _quantizes(converted)[1]
    assert result.first_departure["tensor"] == everything.first_departure["tensor"] == a
    assert not result.propagation_held and f"{a} departs by" in result.note
    assert "agrees" in result.note and result.note in repr(result)
    assert [p["tensor"] for p in result.probes if p["role"] == "verify"] == [a]
    assert len(result.probes) < result.candidates // 3  # 9 of 44 measured


def test_the_search_on_a_chain_probes_as_the_module_docstring_says():
    """q0 -> ... -> q9, q6 departs (and so q7..q9): after the output q9, q4 agrees, q6 departs,
    q5 agrees; q6 is named and its input q5 has already been probed."""
    below = [(1 << i) - 1 for i in range(10)]
    near = [0] + [1 << (i - 1) for i in range(1, 10)]
    asked: list[int] = []

    def departs(i: int, role: str) -> bool:
        asked.append(i)
        return i >= 6

    assert _search(9, below, near, departs) == (6, [])
    assert asked == [4, 6, 5, 5]  # the last ask (verification) is answered from the probes


def test_a_departure_that_does_not_propagate_is_reported():
    """The residual block x(0) -> a(1) -> b(2) -> c(3), d(4) = a + c, e(5) = f(d): ``a`` departs
    but its departure vanishes on the way to ``c``; ``d`` departs through the skip connection.
    The agreeing ``b`` clears ``a``, so the search lands on ``d``; verification finds ``a``
    departing, goes on from it, and says so."""
    below = [0, 0b1, 0b11, 0b111, 0b1111, 0b11111]
    near = [0, 0b1, 0b10, 0b100, 0b1010, 0b10000]
    asked: list[int] = []

    def departs(i: int, role: str) -> bool:
        asked.append(i)
        return i in {1, 4, 5}

    assert _search(5, below, near, departs) == (1, [1])
    assert asked == [2, 3, 4, 1, 0, 0]  # x: bisected, then verified (from the probes made)


def test_refusals(chain, residual, data):
    lowered = qviz.lower(chain, (data[0],), backend="onnxruntime")
    with pytest.raises(
        ConfigError, match=r"lowered program was made from another model .*: other op"
    ):
        bisect_lowering(residual, lowered, data)
    with pytest.raises(ConfigError, match=r"needs what qviz\.lower returned"):
        bisect_lowering(chain, chain, data)
    other = copy.copy(lowered)
    other.backend = "tflite"
    with pytest.raises(ConfigError, match="no exact probe of one tensor for backend 'tflite'"):
        bisect_lowering(chain, other, data)
    with pytest.raises(ConfigError, match="tolerance"):
        bisect_lowering(chain, lowered, data, tolerance=-1)
    bare = copy.copy(lowered)
    bare.backend, bare.program = "xnnpack", None
    with pytest.raises(ConfigError, match="keeps none"):
        bisect_lowering(chain, bare, data)


def test_a_defect_planted_in_inductors_compile_is_found_by_compiling_cuts():
    """A buggy compiler pass (a pre-grad pass doubling one quantize's scale) is in every program
    Inductor compiles, the whole model's and each cut's, as a real lowering bug would be: the
    outputs depart, and bisecting compiled cuts names the tensor it altered; without the pass
    the same lowering agrees after one probe."""
    pytest.importorskip("torchao")
    from qviz.engine.quantizers import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    torch.manual_seed(0)
    model = nn.Sequential(
        *[m for _ in range(6) for m in (nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())]
    )
    x = torch.randn(8, 4, 8, 8)
    from qviz.engine.lower.machine import machine

    # 7-bit activations where oneDNN's uint8 x int8 sums saturate (x86 without VNNI), as
    # qviz.lower asks there: the planted pass is the only defect on every CPU
    config = get_default_x86_inductor_quantization_config(reduce_range=not machine().exact_u8s8)
    quantizer = X86InductorQuantizer().set_global(config)
    converted = quantize(model, x, quantizer).converted
    quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
    planted = [n for n in converted.graph.nodes if n.target == quantize_op][3]
    scale = planted.args[1]

    def buggy_pass(graph):
        for node in graph.nodes:
            if node.target == quantize_op and node.args[1] == scale:
                node.args = (node.args[0], scale * 2, *node.args[2:])

    clean = qviz.lower(converted, (x,), backend="inductor")
    assert bisect_lowering(converted, clean, x).agrees
    with torch._inductor.config.patch(pre_grad_custom_pass=buggy_pass):
        lowered = qviz.lower(converted, (x,), backend="inductor")
        assert compare_lowered(converted, lowered, x).first_departure is not None
        result = bisect_lowering(converted, lowered, x)
    assert result.first_departure["tensor"] == planted.name
    assert len(result.probes) < result.candidates and result.method.startswith("the converted")
