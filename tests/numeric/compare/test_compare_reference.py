"""``qviz.numeric.compare`` against independent references.

1. torchao's PT2E numeric debugger (torchao 0.18) on torchvision resnet18 and the digits model,
   each quantized by torchao's flow and by qviz's (bitwise-identical engines for this config);
2. a recording ``torch.fx.Interpreter`` written here, on the float and the converted graph;
3. torchao's known defects, each on a tiny model where qviz gives the right number:
   (i) an in-place ReLU overwrites what torchao logged for the conv before it; (ii) torchao
   compares a conv with a folded BatchNorm against the pre-BatchNorm conv; (iii) a ReLU module
   called twice gets one row per call in qviz; (iv) the torch.ao FX numeric suite raises
   ``KeyError`` on stock resnet18 (watched in tests/upstream/test_torch_ao.py), qviz compares
   every quantized operator of it.

SQNR here is always qviz's definition, the float tensor as signal, pooled over all batches:
``10 log10(sum ref^2 / sum (ref - q)^2)``.
"""

import copy
import math

import pytest
import torch
from torch import nn
from torch.fx import GraphModule, Interpreter

from qviz.data import digits_loaders, digits_model
from qviz.numeric import compare
from tests.helpers.quantize import quantize

ao_debug = pytest.importorskip("torchao.quantization.pt2e")
ao_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ao_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
torchvision = pytest.importorskip("torchvision")

qd = torch.ops.quantized_decomposed
QUANTIZE = {qd.quantize_per_tensor.default, qd.quantize_per_channel.default}
DEQUANTIZE = {qd.dequantize_per_tensor.default, qd.dequantize_per_channel.default}


# -- independent machinery ------------------------------------------------------------------
def _sqnr(refs: list[torch.Tensor], tests: list[torch.Tensor]) -> float:
    """Float-as-signal SQNR (dB) pooled over batches, in float64."""
    signal = sum(float(r.double().pow(2).sum()) for r in refs)
    noise = sum(
        float((t.double() - r.double()).pow(2).sum()) for r, t in zip(refs, tests, strict=True)
    )
    return 10 * math.log10(signal / noise)


class _Recorder(Interpreter):
    """Runs a graph and keeps a clone of every call_function output, by node name."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.seen: dict[str, list[torch.Tensor]] = {}

    def run_node(self, n):
        out = super().run_node(n)
        if n.op == "call_function" and isinstance(out, torch.Tensor):
            self.seen.setdefault(n.name, []).append(out.detach().clone())
        return out


def _record(gm: GraphModule, batches: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    rec = _Recorder(gm)
    with torch.no_grad():
        for b in batches:
            rec.run(b)
    return rec.seen


def _probe(qgm: GraphModule, name: str) -> str:
    """The node the next operator reads: the op's output dequantize if it has one."""
    node = next(n for n in qgm.graph.nodes if n.name == name)
    for q in node.users:
        if q.target in QUANTIZE:
            return next(dq.name for dq in q.users if dq.target in DEQUANTIZE)
    return name


def _float_twin(fgm: GraphModule, name: str) -> str:
    """The float node whose output ``name`` computes after prepare: a BatchNorm it feeds alone."""
    node = next(n for n in fgm.graph.nodes if n.name == name)
    users = list(node.users)
    if len(users) == 1 and "batch_norm" in str(users[0].target):
        return users[0].name
    return name


def _quantized_ops(qgm: GraphModule) -> set[str]:
    """Every operator that reads a dequantized value or whose output is quantized."""
    qdq = QUANTIZE | DEQUANTIZE
    ops = set()
    for n in qgm.graph.nodes:
        if n.op != "call_function" or n.target in qdq:
            continue
        reads_dq = any(getattr(a, "target", None) in DEQUANTIZE for a in n.all_input_nodes)
        if reads_dq or any(u.target in QUANTIZE for u in n.users):
            ops.add(n.name)
    return ops


# -- the two flows ----------------------------------------------------------------------------
def _qviz_flow(model: nn.Module, batches: list[torch.Tensor]):
    gm, _, quantized = quantize(model, batches, per_channel=True)  # gm stays the float graph
    return gm, quantized, compare(gm, quantized, batches, progress=False)


def _torchao_flow(gm: GraphModule, batches: list[torch.Tensor]):
    """torchao's numeric debugger on its own copies of ``gm``: {root node name: summary}."""
    ref = ao_debug.prepare_for_propagation_comparison(copy.deepcopy(gm))
    quantizer = ao_xnnpack.XNNPACKQuantizer().set_global(
        ao_xnnpack.get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = ao_pt2e.prepare_pt2e(copy.deepcopy(gm), quantizer)  # folds BN in place: a copy
    with torch.no_grad():
        for b in batches:
            ref(b)
            prepared(b)
    converted = ao_pt2e.convert_pt2e(prepared)
    actual = ao_debug.prepare_for_propagation_comparison(converted)
    with torch.no_grad():
        for b in batches:
            actual(b)
    results = ao_debug.compare_results(
        ao_debug.extract_results_from_loggers(ref), ao_debug.extract_results_from_loggers(actual)
    )
    return converted, {info.name: summary for info, summary in results.items()}


def _ao_sqnr(summary) -> float:
    # torchao's own number (QuantizationComparisonResult.sqnr) puts the *quantized* tensor in
    # the numerator and is per call; recomputing qviz's formula from the tensors torchao logged
    # makes the comparison test the pairing and logging, not the choice of formula.
    return _sqnr([r.ref for r in summary.results], [r.actual for r in summary.results])


def _run_both(model: nn.Module, batches: list[torch.Tensor]) -> dict:
    gm, quantized, report = _qviz_flow(model, batches)
    converted, ao = _torchao_flow(gm, batches)
    return {
        "gm": gm,
        "q": quantized,
        "report": report,
        "ao_q": converted,
        "ao": ao,
        "batches": batches,
    }


def _randomize_batchnorms(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) - 0.5)
            bn.running_var.copy_(torch.rand(bn.num_features, generator=g) * 1.5 + 0.5)
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) - 0.5)


def _resnet18(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def resnet():
    """resnet18, ReLUs out of place (torchao logs views), random BatchNorm statistics."""
    model = _resnet18()
    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    _randomize_batchnorms(model, seed=1)
    g = torch.Generator().manual_seed(2)
    # one small batch keeps the file fast; pooling over batches is checked on digits
    return _run_both(model, [torch.randn(2, 3, 32, 32, generator=g)])


@pytest.fixture(scope="module")
def digits():
    batches = [images for images, _ in digits_loaders(batch_size=16).calibration][:2]
    return _run_both(digits_model(), batches)


# -- 1. agreement with torchao ----------------------------------------------------------------
def _agreement(run: dict) -> tuple[dict[str, float], set[str]]:
    """|Δ dB| per op where torchao's pairing is valid, and the ops left out."""
    df = run["report"].df.set_index("node")
    float_nodes = {n.name: n for n in run["gm"].graph.nodes}
    assert set(run["ao"]) == set(df.index)  # both compare the same operators
    for b in run["batches"]:  # the engines agree bit for bit, so the numbers must too
        assert torch.equal(run["q"](b), run["ao_q"](b))
    deltas, left_out = {}, set()
    for name, summary in run["ao"].items():
        # torchao's pairing is valid when the quantized op computes what the float node of the
        # same name computes, i.e. no BatchNorm was folded into it (torchao then compares the
        # folded conv with the pre-BatchNorm conv, defect ii). The ReLUs are out of place; the
        # in-place add_ of resnet18 mutates only values logged under a folded conv (the float
        # BatchNorm's output, the quantized conv's dequantize), i.e. rows left out anyway.
        folded = _float_twin(run["gm"], name) != name
        assert summary.ref_node_name == name
        if folded:
            left_out.add(name)
            continue
        deltas[name] = abs(_ao_sqnr(summary) - df.loc[name, "cumulative_sqnr"])
    assert {float_nodes[n].target for n in left_out} == {torch.ops.aten.conv2d.default}
    return deltas, left_out


def test_resnet18_agrees_with_torchao_on_every_op_without_a_folded_batchnorm(resnet):
    deltas, left_out = _agreement(resnet)
    ops = {str(n.target).split(".")[1] for n in resnet["gm"].graph.nodes if n.name in deltas}
    assert ops == {"relu", "add_", "max_pool2d", "adaptive_avg_pool2d", "flatten", "linear"}
    assert len(deltas) == 29 and len(left_out) == 20  # 17 relu, 8 add_, 4 more; 20 convs
    # same engine, same tensors, same formula: measured ~1e-8 dB, far inside 0.1 dB
    assert max(deltas.values()) < 1e-3, max(deltas.items(), key=lambda kv: kv[1])


def test_digits_agrees_with_torchao_on_every_op_without_a_folded_batchnorm(digits):
    deltas, left_out = _agreement(digits)
    assert len(deltas) == 10 and len(left_out) == 5  # relu x5, add, pools, flatten, linear
    assert max(deltas.values()) < 1e-3, max(deltas.items(), key=lambda kv: kv[1])


# -- 2. an independent recomputation ------------------------------------------------------------
def test_digits_cumulative_sqnr_matches_a_recording_interpreter(digits):
    fgm, qgm, df = digits["gm"], digits["q"], digits["report"].df
    floats, quants = _record(fgm, digits["batches"]), _record(qgm, digits["batches"])
    assert set(df["node"]) == _quantized_ops(qgm)
    folded = 0
    for name, sqnr in zip(df["node"], df["cumulative_sqnr"], strict=True):
        twin = _float_twin(fgm, name)  # a conv whose BatchNorm was folded: the BN's output
        folded += twin != name
        expected = _sqnr(floats[twin], quants[_probe(qgm, name)])
        assert sqnr == pytest.approx(expected, rel=1e-6), name
    assert folded == 5


def test_the_first_ops_local_sqnr_is_its_cumulative_sqnr(digits):
    first = digits["report"].df.iloc[0]
    assert first["node"] == "conv2d"  # it reads the model input: nothing upstream to inherit
    assert first["local_sqnr"] == pytest.approx(first["cumulative_sqnr"], rel=1e-9)


# -- 3. torchao's defects ----------------------------------------------------------------------
class _ConvThen(nn.Module):
    def __init__(self, after: nn.Module) -> None:
        super().__init__()
        self.conv, self.after = nn.Conv2d(3, 8, 3), after

    def forward(self, x):
        return self.after(self.conv(x))


def _small_batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, 3, 12, 12, generator=g) for _ in range(2)]


def _hooked(model: nn.Module, module: nn.Module, batches: list[torch.Tensor]) -> list:
    """Clones of ``module``'s output on each call (a forward hook on the float model)."""
    seen = []
    hook = module.register_forward_hook(lambda _m, _i, out: seen.append(out.detach().clone()))
    with torch.no_grad():
        for b in batches:
            model(b)
    hook.remove()
    return seen


def test_i_inplace_relu_overwrites_torchaos_conv_but_not_qvizs():
    torch.manual_seed(0)
    model = _ConvThen(nn.ReLU(inplace=True)).eval()
    batches = _small_batches()
    float_conv = _hooked(model, model.conv, batches)
    run = _run_both(model, batches)
    quant_conv = _record(run["q"], batches)[_probe(run["q"], "conv2d")]
    truth = _sqnr(float_conv, quant_conv)
    row = run["report"].df.set_index("node").loc["conv2d"]
    assert row["cumulative_sqnr"] == pytest.approx(truth, rel=1e-6)
    assert min(float(t.min()) for t in float_conv) < -0.1  # the ReLU does change the output

    logged = run["ao"]["conv2d"].results
    # torchao kept views; relu_ then overwrote them on both sides with relu(conv)
    for r, f, q in zip(logged, float_conv, quant_conv, strict=True):
        assert torch.equal(r.ref, torch.relu(f)) and not torch.equal(r.ref, f)
        assert float(r.actual.min()) >= 0 > float(q.min())
    # what torchao logged as the quantized conv output is far from the float conv output
    assert truth > 30 and _sqnr(float_conv, [r.actual for r in logged]) < truth - 20


def test_ii_folded_batchnorm_torchao_compares_with_the_pre_bn_conv_qviz_with_the_bn():
    torch.manual_seed(0)
    model = _ConvThen(nn.BatchNorm2d(8)).eval()
    _randomize_batchnorms(model, seed=4)
    batches = _small_batches()
    float_conv = _hooked(model, model.conv, batches)
    float_bn = _hooked(model, model.after, batches)
    run = _run_both(model, batches)
    quant_conv = _record(run["q"], batches)[_probe(run["q"], "conv2d")]
    row = run["report"].df.set_index("node").loc["conv2d"]
    assert row["cumulative_sqnr"] == pytest.approx(_sqnr(float_bn, quant_conv), rel=1e-6)
    assert row["cumulative_sqnr"] > 30

    summary = run["ao"]["conv2d"]
    assert all(torch.equal(r.ref, f) for r, f in zip(summary.results, float_conv, strict=True))
    assert all(float(r.sqnr) < 10 for r in summary.results)  # torchao's own number
    assert _ao_sqnr(summary) < 10


class _ReusedReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))))


def test_iii_a_module_called_twice_gets_a_row_per_call():
    torch.manual_seed(0)
    model = _ReusedReLU().eval()
    batches = _small_batches()
    calls = _hooked(model, model.relu, batches)  # call 1, call 2, call 1, call 2
    _, quantized, report = _qviz_flow(model, batches)
    df = report.df.set_index("node")
    assert list(df.loc[["relu", "relu_1"], "module"]) == ["relu", "relu"]
    recorded = _record(quantized, batches)
    for i, name in enumerate(["relu", "relu_1"]):
        expected = _sqnr(calls[i::2], recorded[_probe(quantized, name)])
        assert df.loc[name, "cumulative_sqnr"] == pytest.approx(expected, rel=1e-6)
    assert (
        abs(df.loc["relu", "cumulative_sqnr"] - df.loc["relu_1", "cumulative_sqnr"]) > 0.1
    )  # two values, not one


def test_iv_qviz_compares_every_quantized_op_of_stock_resnet18():
    model = _resnet18()  # stock: in-place ReLUs, one ReLU module called twice per block
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    _, quantized, report = _qviz_flow(model, [x])
    df = report.df
    assert len(df) == 49 and set(df["node"]) == _quantized_ops(quantized)
    order = [n.name for n in quantized.graph.nodes]
    assert list(df["node"]) == sorted(df["node"], key=order.index)  # rows in graph order
    assert df["node"].is_unique and df["cumulative_sqnr"].gt(20).all()
