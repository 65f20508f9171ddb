"""Each repair transform, and the sensible combinations, measured side by side.

Run from the repository root, one part at a time (digits about 5 minutes, torchvision and
encoder a few)::

    .venv/bin/python benchmarks/repair.py [digits] [torchvision] [encoder] [--settings=3c,4t]

``--settings=`` picks the digits weight settings (``3c``: 3 bits per channel, ``4t``: 4 bits
per tensor; all six by default).

* ``digits``: the embedded digits model, weights 4 / 3 / 2 bits per channel and per tensor,
  activations 8 bits: test accuracy and output SQNR (against the float model, on the test split)
  for float, plain PTQ, qviz's cross-layer equalization (CLE), bias correction (BC), AdaRound
  and their combinations; AIMET's CLE (its equalized module quantized by qviz) and AIMET's
  AdaRound (in its own QuantizationSimModel, beside that simulation's nearest rounding); and
  QAT (``qviz.prepare_qat_pt2e``, 2 epochs on the training split only).
* ``torchvision``: resnet18 and mobilenet_v2 with random weights (BatchNorm statistics from
  train-mode passes on random data), 3x96x96: output SQNR at W8A8 per-tensor and W4A8
  per-channel for plain PTQ, qviz and AIMET CLE, qviz and AIMET AdaRound (few iterations) and
  CLE + bias correction.
* ``encoder``: a pre-norm transformer encoder with planted activation outlier channels after
  its LayerNorms (the float function unchanged): W8A8 per-tensor output SQNR for plain PTQ and
  SmoothQuant at alpha 0.5 and 0.8.

Every row gives the seconds its remedy took (for QAT: the training; for AIMET: its whole flow,
import excluded). For each model and setting the top 3 findings of
``qviz.numeric.diagnose`` on the plain PTQ model are printed (node, cause, layer SQNR and the
prescribed function), to check whether the diagnosis points at the remedy that helped most, and
the row "diagnosis' prescription" applies the worst finding's prescription (the remedy that
gained most on its layer alone) through a ``RepairSession`` (diagnosed on the calibration
batches), and "the cause's suggestion" the rule's, when they differ; per-tensor settings also get a
"per-channel weights" row.
qviz's AdaRound draws as many samples per iteration as AIMET's (one calibration batch), so
their times compare. The CPU and its int8 flags are printed first.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _machine import cpu, set_threads, timed

import qviz
from qviz.data import digits_loaders, digits_model, evaluate
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.repair import adaround, bias_correction, cross_layer_equalization, smooth_quant
from qviz.numeric import RepairSession, sqnr

PARTS = ("digits", "torchvision", "encoder")
DIGITS_ITERATIONS, VISION_ITERATIONS = 300, 50


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timed(fn)


def _inputs(batches: list) -> list[torch.Tensor]:
    return [b[0] if isinstance(b, (tuple, list)) else b for b in batches]


def _outputs(model: Any, inputs: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x) for x in inputs])


def _config(bits: int, per_channel: bool, *, is_qat: bool = False):
    qmax = 2 ** (bits - 1) - 1
    return get_symmetric_quantization_config(
        is_per_channel=per_channel, is_qat=is_qat, weight_qmin=-qmax, weight_qmax=qmax
    )


def _ptq(gm, config, calib: list) -> tuple[Any, Any]:
    """(calibrated prepared, converted) of ``gm``."""
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, calib, progress=False)
    return prepared, qviz.convert_pt2e(prepared)


def _per_step(calib: list) -> int:
    """Samples per AdaRound iteration: one calibration batch, as AIMET's AdaRound draws."""
    first = calib[0]
    return len(first[0] if isinstance(first, tuple | list) else first)


def _adaround(converted, float_gm, calib: list, iterations: int):
    batch = _per_step(calib)
    return adaround(converted, float_gm, calib, iterations=iterations, batch_size=batch,
                    progress=False)  # fmt: skip


def _prescribed(gm, config, calib: list, iterations: int) -> list[tuple[str, Any, float]]:
    """The worst finding's prescription (the best remedy measured on its layer alone) applied by
    a RepairSession (diagnosed on the calibration batches, never the test split), and, when it
    differs, the suggestion of the finding's cause alone, each on a copy of the session: their
    labels, models and the seconds each took."""
    q = XNNPACKQuantizer().set_global(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = RepairSession(gm, q, calib, calib, progress=False)
        if not session.diagnosis.findings:
            return [("diagnosis' prescription: none", session.quantized_model, 0.0)]
        worst = session.diagnosis.findings[0]
        tried = [("diagnosis' prescription", worst.prescription)]
        if worst.suggested != worst.prescription:
            tried.append(("the cause's suggestion", worst.suggested))
        rows = []
        for what, prescription in tried:
            mine = copy.deepcopy(session)
            adaround_it = prescription.function.endswith("adaround")
            kwargs = (
                {"iterations": iterations, "batch_size": _per_step(calib)} if adaround_it else {}
            )
            step = mine.apply(prescription, **kwargs)
            label = f"{what} ({step.remedy}, {worst.node})"
            rows.append((label, mine.quantized_model, step.seconds))
    return rows


def _per_channel_row(gm, bits: int, per_channel: bool, calib: list, measure) -> list[tuple]:
    """Per-channel weights at the same bit width, for a per-tensor setting."""
    if per_channel:
        return []
    return [("per-channel weights", *measure(_ptq(gm, _config(bits, True), calib)[1]), None)]


def _diagnosis(gm, prepared, converted, calib: list, top: int = 3) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = qviz.numeric.compare(gm, converted, calib, progress=False)
        found = list(qviz.numeric.diagnose(report, prepared, data=calib))
    if not found:
        return ["    diagnose: no layer below 25 dB"]
    lines = [f"    diagnose ({len(found)} layers below 25 dB), worst {min(top, len(found))}:"]
    for f in found[:top]:
        lines.append(
            f"      {f.node:<24} {f.op.split('.')[-2] if '.' in f.op else f.op:<12} "
            f"{f.cause.value:<17} {f.sqnr:6.1f} dB ({f.figure}) -> {f.prescription.function}"
        )
        lines.append(f"        measured on the layer alone: {f.verdict}")
    return lines


def _table(title: str, rows: list[tuple], with_accuracy: bool) -> None:
    print(f"\n  {title}")
    head = f"    {'method':<52}" + (f"{'acc %':>8}" if with_accuracy else "")
    print(head + f"{'SQNR dB':>9}{'s':>8}")
    for name, acc, db, seconds in rows:
        line = f"    {name:<52}"
        if with_accuracy:
            line += f"{100 * acc:8.2f}" if acc is not None else f"{'':>8}"
        line += f"{db:9.2f}" if db is not None else f"{'-':>9}"
        line += f"{seconds:8.2f}" if seconds is not None else f"{'':>8}"
        print(line)


# --- AIMET 2.42 (the reference implementation): its CLE, its QuantizationSimModel, its AdaRound


def _aimet_config(per_channel: bool) -> str:
    import aimet_torch

    name = "default_config_per_channel.json" if per_channel else "default_config.json"
    return os.path.join(os.path.dirname(aimet_torch.__file__), "common/quantsim_config", name)


def _aimet_import() -> None:
    """Import AIMET once, outside the timed rows, with its INFO log off."""
    import logging

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import aimet_torch.adaround
        import aimet_torch.cross_layer_equalization  # noqa: F401
    for name in list(logging.root.manager.loggerDict):
        logging.getLogger(name).setLevel(logging.ERROR)


def _aimet_cle(model: torch.nn.Module, shape: tuple[int, ...]) -> torch.nn.Module:
    from aimet_torch.cross_layer_equalization import equalize_model

    out = copy.deepcopy(model)
    equalize_model(out, input_shapes=shape)
    return out


def _aimet_sim(model, calib: list, bits: int, per_channel: bool, encodings: str | None = None):
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantsim import QuantizationSimModel

    sim = QuantizationSimModel(
        model,
        dummy_input=calib[0],
        quant_scheme=QuantScheme.post_training_tf,
        default_param_bw=bits,
        default_output_bw=8,
        config_file=_aimet_config(per_channel),
    )
    if encodings:
        sim.set_and_freeze_param_encodings(encodings)

    def forward(m, _=None):
        with torch.no_grad():
            for x in calib:
                m(x)

    sim.compute_encodings(forward, None)
    return sim.model


def _aimet_adaround(model, shape, calib: list, bits: int, per_channel: bool, iterations: int):
    """(AIMET nearest-rounding sim, AIMET AdaRound sim) of ``model`` (BatchNorm folded first)."""
    from aimet_torch.adaround import Adaround, AdaroundParameters
    from aimet_torch.batch_norm_fold import fold_all_batch_norms
    from aimet_torch.common.defs import QuantScheme

    folded = copy.deepcopy(model)
    fold_all_batch_norms(folded, input_shapes=shape)
    nearest = _aimet_sim(folded, calib, bits, per_channel)
    loader = [(x, torch.zeros(len(x), dtype=torch.long)) for x in calib]
    params = AdaroundParameters(
        data_loader=loader, num_batches=len(loader), default_num_iterations=iterations
    )
    with tempfile.TemporaryDirectory() as tmp:
        rounded = Adaround.apply_adaround(
            folded,
            calib[0],
            params,
            path=tmp,
            filename_prefix="m",
            default_param_bw=bits,
            default_quant_scheme=QuantScheme.post_training_tf,
            default_config_file=_aimet_config(per_channel),
        )
        return nearest, _aimet_sim(rounded, calib, bits, per_channel, f"{tmp}/m.encodings")


# --- digits


def _qat(bits: int, per_channel: bool, example: torch.Tensor, loaders, epochs: int = 2):
    torch.manual_seed(0)
    gm = qviz.export(digits_model().train(), (example,), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(_config(bits, per_channel, is_qat=True))
    qat = qviz.prepare_qat_pt2e(gm, quantizer)
    optimizer = torch.optim.SGD(qat.parameters(), lr=1e-3, momentum=0.9)
    for _ in range(epochs):
        for images, labels in loaders.train:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(qat(images), labels).backward()
            optimizer.step()
    qviz.move_exported_model_to_eval(qat)
    return qviz.convert_pt2e(qat)


def _digits_qviz_rows(gm, cle_gm, cle_s, cfg, calib, measure) -> tuple[list, Any]:
    prepared, ptq = _ptq(gm, cfg, calib)
    _, cle = _ptq(cle_gm, cfg, calib)
    it = DIGITS_ITERATIONS
    bc, bc_s = _timed(lambda: bias_correction(ptq, gm, calib))
    ada, ada_s = _timed(lambda: _adaround(ptq, gm, calib, it))
    ada_bc, ada_bc_s = _timed(lambda: bias_correction(ada, gm, calib))
    cle_bc, cle_bc_s = _timed(lambda: bias_correction(cle, cle_gm, calib))
    cle_ada, cle_ada_s = _timed(lambda: _adaround(cle, cle_gm, calib, it))
    rows = [
        ("PTQ (nearest)", *measure(ptq), None),
        ("CLE", *measure(cle), cle_s),
        ("bias correction", *measure(bc), bc_s),
        (f"AdaRound ({it} it)", *measure(ada), ada_s),
        ("CLE + bias correction", *measure(cle_bc), cle_s + cle_bc_s),
        ("CLE + AdaRound", *measure(cle_ada), cle_s + cle_ada_s),
        ("AdaRound + bias correction", *measure(ada_bc), ada_s + ada_bc_s),
    ]
    return rows, (prepared, ptq)


def _digits_setting(bits, per_channel, model, gm, cle, loaders, calib, measure) -> None:
    cle_gm, cle_s = cle
    cfg = _config(bits, per_channel)
    rows, (prepared, ptq) = _digits_qviz_rows(gm, cle_gm, cle_s, cfg, calib, measure)
    inputs = _inputs(calib)
    shape = (1, *inputs[0].shape[1:])
    aimet_cle, a_cle_s = _timed(lambda: _aimet_cle(model, shape))
    aimet_cle_gm = qviz.export(aimet_cle, (inputs[0],), dynamic_batch=True)
    rows.append(("AIMET CLE (qviz PTQ)", *measure(_ptq(aimet_cle_gm, cfg, calib)[1]), a_cle_s))
    it = DIGITS_ITERATIONS
    (near, ada), a_s = _timed(lambda: _aimet_adaround(model, shape, inputs, bits, per_channel, it))
    rows.append(("AIMET sim, nearest", *measure(near), None))
    rows.append((f"AIMET AdaRound ({it} it)", *measure(ada), a_s))
    qat, qat_s = _timed(lambda: _qat(bits, per_channel, inputs[0], loaders))
    rows.append(("QAT (2 epochs)", *measure(qat), qat_s))
    rows += _per_channel_row(gm, bits, per_channel, calib, measure)
    rows += [(label, *measure(fixed), s) for label, fixed, s in _prescribed(gm, cfg, calib, it)]
    gran = "per-channel" if per_channel else "per-tensor"
    _table(f"digits, W{bits} {gran} A8", rows, with_accuracy=True)
    print("\n".join(_diagnosis(gm, prepared, ptq, calib)))


def run_digits(settings: list[tuple[int, bool]]) -> None:
    _aimet_import()
    torch.manual_seed(0)
    model, loaders = digits_model().eval(), digits_loaders(batch_size=64)
    calib = list(loaders.calibration)
    test = list(loaders.test)
    test_inputs = _inputs(test)
    reference = _outputs(model, test_inputs)

    def measure(m) -> tuple[float, float]:
        return evaluate(m, test), sqnr(reference, _outputs(m, test_inputs))

    print(f"\n== digits: {sum(len(x) for x in test_inputs)} test images, "
          f"{sum(len(x) for x in _inputs(calib))} calibration images ==")  # fmt: skip
    print(f"  float: accuracy {100 * evaluate(model, test):.2f} %")
    gm = qviz.export(model, (calib[0][0],), dynamic_batch=True)
    cle = _timed(lambda: cross_layer_equalization(gm))
    for bits, per_channel in settings:
        _digits_setting(bits, per_channel, model, gm, cle, loaders, calib, measure)


# --- torchvision


def _vision_model(name: str, size: int, seed: int = 0) -> torch.nn.Module:
    """Random weights; BatchNorm affine parameters drawn, statistics from train-mode passes."""
    import torchvision

    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(0, 0.5)
        model.train()
        for _ in range(4):
            model(torch.randn(16, 3, size, size))
    return model.eval()


def _vision_setting(name, bits, per_channel, ctx) -> None:
    model, gm, (cle_gm, cle_s), (aimet_gm, a_cle_s), calib, test, reference, shape = ctx
    cfg, it = _config(bits, per_channel), VISION_ITERATIONS
    prepared, ptq = _ptq(gm, cfg, calib)
    _, cle = _ptq(cle_gm, cfg, calib)
    _, aimet_cle = _ptq(aimet_gm, cfg, calib)
    ada, ada_s = _timed(lambda: _adaround(ptq, gm, calib, it))
    (near, a_ada), a_s = _timed(lambda: _aimet_adaround(model, shape, calib, bits, per_channel, it))
    cle_bc, bc_s = _timed(lambda: bias_correction(cle, cle_gm, calib))
    db = lambda m: (None, sqnr(reference, _outputs(m, test)))  # noqa: E731
    rows = [
        ("PTQ (nearest)", *db(ptq), None),
        ("qviz CLE", *db(cle), cle_s),
        ("AIMET CLE (qviz PTQ)", *db(aimet_cle), a_cle_s),
        (f"qviz AdaRound ({it} it)", *db(ada), ada_s),
        ("AIMET sim, nearest", *db(near), None),
        (f"AIMET AdaRound ({it} it)", *db(a_ada), a_s),
        ("qviz CLE + bias correction", *db(cle_bc), cle_s + bc_s),
        *_per_channel_row(gm, bits, per_channel, calib, db),
    ]
    rows += [(label, *db(fixed), s) for label, fixed, s in _prescribed(gm, cfg, calib, it)]
    gran = "per-channel" if per_channel else "per-tensor"
    _table(f"{name}, W{bits} {gran} A8", rows, with_accuracy=False)
    print("\n".join(_diagnosis(gm, prepared, ptq, calib)))


def _vision(name: str, size: int) -> None:
    model = _vision_model(name, size)
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, size, size, generator=g) for _ in range(4)]
    test = [torch.randn(16, 3, size, size, generator=g) for _ in range(2)]
    reference = _outputs(model, test)
    shape = (1, 3, size, size)
    gm = qviz.export(model, (calib[0],), dynamic_batch=True)
    cle = _timed(lambda: cross_layer_equalization(gm))
    aimet_model, a_cle_s = _timed(lambda: _aimet_cle(model, shape))
    aimet_gm = qviz.export(aimet_model, (calib[0],), dynamic_batch=True)
    print(f"\n== {name}: random weights, 3x{size}x{size}, 32 calibration / 32 test inputs ==")
    ctx = (model, gm, cle, (aimet_gm, a_cle_s), calib, test, reference, shape)
    for bits, per_channel in ((8, False), (4, True)):
        _vision_setting(name, bits, per_channel, ctx)


def run_torchvision(names=("resnet18", "mobilenet_v2"), size: int = 96) -> None:
    _aimet_import()
    for name in names:
        _vision(name, size)


# --- encoder


class Encoder(torch.nn.Module):
    """A pre-norm transformer encoder (2 layers, d_model 64, 4 heads, 16 tokens), a linear head."""

    def __init__(self, d_model: int = 64, layers: int = 2) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(
            d_model, 4, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(
            layer, layers, norm=torch.nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.head = torch.nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _plant_outliers(model: Encoder, channels=(3, 17, 40), factor: float = 80.0) -> None:
    """Scale ``channels`` of every LayerNorm's output by ``factor`` and divide the matching
    input columns of the linears that read it: the float function stays the same."""
    ch = list(channels)
    with torch.no_grad():
        pairs = [(la.norm1, la.self_attn.in_proj_weight) for la in model.encoder.layers]
        pairs += [(la.norm2, la.linear1.weight) for la in model.encoder.layers]
        pairs.append((model.encoder.norm, model.head.weight))
        for norm, weight in pairs:
            norm.weight.uniform_(0.5, 1.5), norm.bias.normal_(0, 0.1)
            norm.weight[ch] *= factor
            norm.bias[ch] *= factor
            weight[:, ch] /= factor


def run_encoder() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    _plant_outliers(model)
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 16, 64, generator=g) for _ in range(4)]
    test = [torch.randn(8, 16, 64, generator=g) for _ in range(4)]
    reference = _outputs(model, test)
    print("\n== encoder: 2 pre-norm layers, d_model 64, 16 tokens; LayerNorm outputs with")
    print("   3 channels x80 (the linears' columns /80), 32 calibration / 32 test sequences ==")
    gm = qviz.export(model, (calib[0],), dynamic_batch=True)
    cfg = get_symmetric_quantization_config(is_per_channel=False)
    prepared, ptq = _ptq(gm, cfg, calib)
    rows = [("PTQ (nearest)", None, sqnr(reference, _outputs(ptq, test)), None)]
    for alpha in (0.5, 0.8):
        smoothed, s = _timed(lambda a=alpha: smooth_quant(gm, calib, alpha=a, progress=False))
        rows.append(
            (
                f"SmoothQuant alpha {alpha}",
                None,
                sqnr(reference, _outputs(_ptq(smoothed, cfg, calib)[1], test)),
                s,
            )
        )
    for label, fixed, s in _prescribed(gm, cfg, calib, DIGITS_ITERATIONS):
        rows.append((label, None, sqnr(reference, _outputs(fixed, test)), s))
    _table("encoder, W8A8 per-tensor", rows, with_accuracy=False)
    print("\n".join(_diagnosis(gm, prepared, ptq, calib)))


def main(argv: list[str]) -> None:
    parts = [a for a in argv if not a.startswith("--")] or list(PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; choose from {PARTS}")
    set_threads(2)
    print(f"CPU: {cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if "digits" in parts:
        settings = [(b, pc) for b in (4, 3, 2) for pc in (True, False)]
        chosen = [a.split("=", 1)[1] for a in argv if a.startswith("--settings=")]
        if chosen:  # e.g. --settings=3c,4t: 3-bit per-channel, 4-bit per-tensor weights
            settings = [(int(x[:-1]), x[-1] == "c") for x in chosen[0].split(",")]
        run_digits(settings)
    if "torchvision" in parts:
        run_torchvision()
    if "encoder" in parts:
        run_encoder()


if __name__ == "__main__":
    main(sys.argv[1:])
