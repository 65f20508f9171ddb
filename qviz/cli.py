"""The ``qviz`` command.

``qviz`` runs the main job on the embedded digits model: ``qviz quantize --report report.html``
(the PT2E flow: export, prepare, calibrate, convert; float vs int8 accuracy and size; an HTML
report of the prepared model) then ``qviz calibrators``
(what each calibration method picks for every Conv/Linear weight and input). ``qviz report``
writes the HTML report of the digits model or of a user's model (``--model pkg.module:function``).
``qviz train-digits`` re-trains the embedded model and rewrites its checkpoint.

Example:
    >>> main(["calibrators", "--methods", "max", "--batch-size", "16"])  # doctest: +ELLIPSIS
    DigitsNet ... float test accuracy ...
    0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qviz.errors import ConfigError, QvizError


def _calibrators(args: argparse.Namespace) -> int:
    from qviz.data import digits_loaders, digits_metadata, digits_model, evaluate
    from qviz.numeric import compare_calibrators

    model = digits_model()
    loaders = digits_loaders(batch_size=args.batch_size)
    accuracy = evaluate(model, loaders.test)
    recorded = digits_metadata()["float_test_accuracy"]
    print(
        f"DigitsNet ({sum(p.numel() for p in model.parameters()):,} parameters): float test "
        f"accuracy {accuracy:.2%} (recorded {recorded:.2%})"
    )
    images, _ = next(iter(loaders.calibration))
    df = compare_calibrators(
        model, images, args.methods, num_bits=args.num_bits, percentile=args.percentile
    )
    print(
        f"Per-tensor {args.num_bits}-bit calibration on one batch of {len(images)} calibration "
        f"images (scale = amax / {2 ** (args.num_bits - 1) - 1}; * = best SQNR for the tensor):\n"
    )
    table = df.assign(
        clipped=df["clipped"].map(lambda v: f"{v:.3%}"),
        best=df["best"].map(lambda b: "*" if b else ""),
    ).rename(columns={"sqnr_db": "SQNR dB"})
    print(
        table.to_string(
            index=False,
            formatters={
                "amax": "{:.4f}".format,
                "scale": "{:.3e}".format,
                "SQNR dB": "{:.2f}".format,
            },
        )
    )
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    return 0


def _saved_bytes(module, example) -> int:
    import io

    import torch

    buffer = io.BytesIO()
    torch.export.save(torch.export.export(module, example), buffer)
    return len(buffer.getvalue())


def _quantize(args: argparse.Namespace) -> int:
    from qviz.data import digits_loaders, digits_model, evaluate
    from qviz.data.int8 import quantize_digits

    model = digits_model()
    loaders = digits_loaders(batch_size=args.batch_size)
    calib = [images for images, _ in loaders.calibration]
    example = (calib[0],)
    report_path = getattr(args, "report", None)
    exported, prepared, quantized = quantize_digits(
        model, loaders, per_channel=not args.per_tensor, switchable=report_path is not None
    )  # switchable: the report's histograms show every calibration method's range
    test = loaders.test
    float_acc, int8_acc = evaluate(model, test), evaluate(quantized, test)
    plan = prepared.plan
    print(
        f"PT2E post-training quantization of DigitsNet (XNNPACKQuantizer, "
        f"{'per-tensor' if args.per_tensor else 'per-channel'} int8 weights, "
        f"{sum(len(x) for x in calib)} calibration images)"
    )
    print(
        f"  observers: {len(plan.groups)} groups over {len(plan.tensors)} tensors; "
        f"left in float: {len(plan.float_nodes)}"
    )
    print(
        f"  test accuracy: float {float_acc:.2%}, int8 {int8_acc:.2%} "
        f"({int8_acc - float_acc:+.2%}) on {sum(len(y) for _, y in test)} images"
    )
    ns = _worst_layers(exported, quantized, test)
    if report_path is not None:
        from qviz.viz import report

        title = "qviz report: DigitsNet"
        print(f"  wrote {report(prepared, report_path, ns=ns, title=title)}")
    f_size, q_size = _saved_bytes(exported, example), _saved_bytes(quantized, example)
    print(
        f"  saved program: float {f_size / 1024:.0f} KiB, int8 {q_size / 1024:.0f} KiB "
        f"({f_size / q_size:.1f}x smaller)"
    )
    _lowered(quantized, example, test)
    print()
    return 0


def _lowered(quantized: Any, example: tuple, test: Any) -> None:
    """The reference model on ExecuTorch's XNNPACK kernels: accuracy, agreement, size, and speed
    against the same backend's float program, with the machine it ran on."""
    import qviz
    from qviz.errors import MissingDependencyError

    try:
        lowered = qviz.lower(quantized, example, backend="xnnpack")
    except MissingDependencyError as exc:
        print(f"  lowered: skipped ({exc})")
        return
    step = float(quantized.plan.groups[-1].qparams.scale)
    worst, right, total = 0.0, 0, 0
    for x, y in test:
        out = lowered(x)
        worst = max(worst, float((out - quantized(x)).abs().max()) / step)
        right, total = right + int((out.argmax(1) == y).sum()), total + len(y)
    counts = lowered.kernel_counts()
    print(
        f"  lowered to ExecuTorch XNNPACK in {lowered.lowering_seconds:.1f} s: accuracy "
        f"{right / total:.2%}, at most {worst:.0f} output step(s) from the reference; "
        f"{counts.get('integer', 0)} operators on int8 kernels, {counts.get('float', 0)} on "
        f"float; .pte {lowered.size_bytes / 1024:.0f} KiB"
    )
    speed = lowered.compare_speed(quantized, (1, 8))
    print(f"  machine: {lowered.machine}; integer format {lowered.int_format.name}")
    print("\n".join(f"  {line}" for line in speed.lines(machine=False)))


def _user_model(spec: str) -> tuple[Any, list[Any]]:
    """``pkg.module:function`` -> ``function()``'s ``(model, batches)``, checked."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"--model {spec!r}: expected 'package.module:function', a function returning "
            f"(model, batches) with batches an iterable of example inputs"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--model {spec!r}: cannot load it ({exc})") from exc
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError(
            f"--model {spec!r}: the function must return (model, batches), got "
            f"{type(result).__name__}"
        )
    model, batches = result
    batches = [b if isinstance(b, tuple) else (b,) for b in batches]
    if not batches:
        raise ConfigError(f"--model {spec!r}: the batches are empty; give at least one")
    return model, batches


def _report(args: argparse.Namespace) -> int:
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    from qviz.numeric.variants.variants import prepare_variant
    from qviz.viz import report

    if args.model is None:
        from qviz.data import digits_loaders, digits_model

        model, title = digits_model(), "DigitsNet"
        batches = [(x,) for x, _ in digits_loaders(batch_size=args.batch_size).calibration]
    else:
        (model, batches), title = _user_model(args.model), args.model
    exported = qviz.export(model, batches[0], dynamic_batch=True)
    config = get_symmetric_quantization_config(
        is_per_channel=not args.per_tensor,
        switchable=True,  # every method in the histograms
    )
    quantizer = XNNPACKQuantizer().set_global(config)
    prepared = prepare_variant(exported, quantizer, batches, where="qviz report")
    target = qviz.convert_pt2e(prepared) if args.stage == "converted" else prepared
    path = report(target, args.out, title=f"qviz report: {title} ({args.stage})")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


def _worst_layers(exported: Any, quantized: Any, test: Any) -> Any:
    """Print the five operators with the lowest local SQNR; return the numeric report."""
    from qviz.numeric import compare

    ns = compare(exported, quantized, test, progress=False)
    print(f"  output SQNR (logits, int8 vs float): {ns.output_sqnr:.2f} dB")
    print("  five worst operators by local SQNR (own error; cumulative includes upstream):")
    worst = ns.worst(5)[["node", "op", "module", "local_sqnr", "cumulative_sqnr"]]
    table = worst.rename(columns={"local_sqnr": "local dB", "cumulative_sqnr": "cumulative dB"})
    lines = table.to_string(index=False, float_format=lambda v: f"{v:.2f}").splitlines()
    print("\n".join(f"    {line}" for line in lines))
    return ns


def _main_job(args: argparse.Namespace) -> int:
    return _quantize(args) or _calibrators(args)


def _train_digits(args: argparse.Namespace) -> int:
    from qviz.data import digits_loaders, save_digits_checkpoint, train_digits_model
    from qviz.data.checkpoint import build_fingerprint
    from qviz.data.int8 import int8_accuracy
    from qviz.data.train import TrainConfig

    model, accuracy = train_digits_model(progress=True)
    int8 = int8_accuracy(model, digits_loaders(batch_size=64))
    meta = {
        "float_test_accuracy": accuracy,
        "int8_test_accuracy": int8,
        "recipe": TrainConfig.as_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        **build_fingerprint(),
    }
    path = save_digits_checkpoint(model, meta, args.out)
    print(f"float test accuracy {accuracy:.2%}, int8 {int8:.2%}; wrote {path} and its .json")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qviz", description="See, steer and trust quantization.")
    sub = parser.add_subparsers(dest="command")
    quant = sub.add_parser("quantize", help="PT2E flow on the digits model: float vs int8")
    quant.add_argument("--batch-size", type=int, default=64, help="batch size (64)")
    quant.add_argument("--per-tensor", action="store_true", help="per-tensor weights")
    quant.add_argument(
        "--report", type=Path, help="also write an HTML report of the prepared model"
    )
    quant.set_defaults(func=_quantize)
    cal = sub.add_parser("calibrators", help="compare calibration methods on the digits model")
    cal.add_argument("--batch-size", type=int, default=64, help="calibration batch size (64)")
    cal.add_argument("--num-bits", type=int, default=8, help="bit width (8)")
    cal.add_argument("--percentile", type=float, default=99.99, help="for 'percentile' (99.99)")
    cal.add_argument(
        "--methods", nargs="+", default=["max", "percentile", "entropy", "mse"], help="methods"
    )
    cal.add_argument("--csv", type=Path, help="also write the table as CSV")
    cal.set_defaults(func=_calibrators)
    rep = sub.add_parser("report", help="write the HTML report of a quantized model")
    rep.add_argument("--out", type=Path, default=Path("report.html"), help="(report.html)")
    rep.add_argument(
        "--model",
        default=None,
        help="pkg.module:function returning (model, batches); default: the digits model",
    )
    rep.add_argument(
        "--stage", choices=("prepared", "converted"), default="prepared", help="(prepared)"
    )
    rep.add_argument("--per-tensor", action="store_true", help="per-tensor weights")
    rep.add_argument("--batch-size", type=int, default=64, help="digits batch size (64)")
    rep.set_defaults(func=_report)
    train = sub.add_parser("train-digits", help="re-train the embedded digits model")
    train.add_argument("--out", type=Path, default=None, help="folder (default: the data folder)")
    train.set_defaults(func=_train_digits)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``qviz`` command; return its exit status."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command is None:  # the main job: both reports with their defaults
        args = parser.parse_args(["calibrators"])
        args.per_tensor = False
        args.report = Path("report.html")
        args.func = _main_job
    try:
        return args.func(args)
    except QvizError as exc:
        print(f"qviz: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
