"""The measured claims the teaching notebooks' prose keeps: per notebook, the checks of an
executed notebook's outputs (``CLAIMS``, registered with ``@claim``) that
tests/test_notebooks.py's ``check_executed`` runs, and the readers of printed outputs they use
(``printed``, ``number_after``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import nbformat


def printed(nb: nbformat.NotebookNode, marker: str | None = None) -> str:
    """What the code cells printed or showed as text (streams and text/plain): of every cell,
    or of the one cell whose source contains ``marker``."""
    cells = [
        c for c in nb.cells if c.cell_type == "code" and (marker is None or marker in c.source)
    ]
    assert marker is None or len(cells) == 1, f"{len(cells)} code cells contain {marker!r}"
    return "\n".join(
        o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
        for c in cells
        for o in c.get("outputs", [])
    )


def number_after(text: str, label: str) -> float:
    """The number printed after ``label`` in ``text`` (``label`` is a regular expression)."""
    found = re.search(label + r"\s*([-+]?\d+(?:\.\d+)?)", text)
    assert found, f"nothing printed after {label!r}"
    return float(found.group(1))


# ---- measured claims the prose keeps ---------------------------------------------------------
# Each is a function of the executed notebook, registered for its notebook with @claim; its
# docstring is the claim as the prose makes it. check_executed runs them on every execution.

#: Per notebook (its stem): the checks of the measured claims its prose makes.
CLAIMS: dict[str, list[Callable[[nbformat.NotebookNode], Any]]] = {}
_METHODS = ("max", "percentile", "entropy", "mse")


def claim(notebook: str) -> Callable[[Any], Any]:
    """Register the decorated check for ``notebook`` (its stem)."""

    def register(check: Any) -> Any:
        CLAIMS.setdefault(notebook, []).append(check)
        return check

    return register


def _rows(text: str, names: tuple[str, ...]) -> dict[str, list[float]]:
    """The numbers of each row of a printed DataFrame whose label is one of ``names``, in
    column order (a wide frame is printed in blocks of columns: a row's blocks are joined)."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in names:
            numbers = [float(w) for w in words[1:] if re.fullmatch(r"[-+]?(?:[\d.]+|inf)", w)]
            found.setdefault(words[0], []).extend(numbers)
    return found


def _indexed_rows(text: str, names: tuple[str, ...]) -> dict[str, list[float]]:
    """A printed DataFrame whose rows start with their index and then a name of ``names`` (in
    the first two columns): each name's numbers after it, blocks of columns joined by index."""
    named: dict[str, str] = {}
    numbers: dict[str, list[float]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or not words[0].isdigit():
            continue
        name = next((w for w in words[1:3] if w in names), None)
        if name:
            named[words[0]] = name
        after = words[words.index(name) + 1 :] if name else words[1:]
        numbers.setdefault(words[0], []).extend(
            float(w) for w in after if re.fullmatch(r"[-+]?\d+(?:\.\d+)?(?:e[-+]\d+)?", w)
        )
    return {name: numbers[index] for index, name in named.items()}


def _labelled_rows(text: str, labels: tuple[str, ...]) -> dict[str, list[float]]:
    """A printed DataFrame whose row labels may hold spaces: each label's numbers."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        for label in labels:
            if line.startswith(label + " "):
                numbers = re.findall(r"[-+]?\d+(?:\.\d+)?|inf", line[len(label) :])
                found.setdefault(label, []).extend(float(v) for v in numbers)
    return found


# -- 01
def _read_tables(nb: nbformat.NotebookNode, bits: int) -> str:
    lines = printed(nb, "def read_tables").splitlines()
    return next(line for line in lines if line.startswith(f"{bits} bits"))


def _calibrated(nb: nbformat.NotebookNode, bits: int) -> str:
    lines = printed(nb, "calib4, table4 = calibrate_and_score").splitlines()
    return next(line for line in lines if line.startswith(f"{bits} bits"))


@claim("01_tensor_quantization")
def _close_at_8_apart_at_4(nb: nbformat.NotebookNode) -> bool:
    """percentile, entropy and mse land close together at 8 bits, far apart at 4; entropy and
    mse clip much harder at 4 bits."""
    within = {b: number_after(_calibrated(nb, b), "within") for b in (8, 4)}
    shares = {
        (b, m): number_after(_calibrated(nb, b), f"{m}'s(?: amax)?")
        for b in (8, 4)
        for m in ("entropy", "mse")
    }
    harder = all(shares[4, m] < shares[8, m] for m in ("entropy", "mse"))
    return within[8] < 2 and within[4] > 2 * within[8] and harder


@claim("01_tensor_quantization")
def _a_4_bit_input(nb: nbformat.NotebookNode) -> bool:
    """One 4-bit activation barely moves the accuracy; mse clips hardest and is not the best
    for the logits. At 2 bits max loses the model, mse keeps most of its accuracy."""
    four = _rows(printed(nb, "score_methods(tq)"), _METHODS)  # amax, accuracy, logits SQNR
    two = _rows(printed(nb, "display(score_methods(tq2))"), _METHODS)
    accuracies = [v[1] for v in four.values()]
    return (
        min(four, key=lambda m: four[m][0]) == "mse"
        and max(four, key=lambda m: four[m][2]) != "mse"
        and max(accuracies) - min(accuracies) <= 0.01
        and two["max"][1] < 0.5
        and two["mse"][1] > 0.8
    )


@claim("01_tensor_quantization")
def _the_model_tables(nb: nbformat.NotebookNode) -> bool:
    """max, percentile and entropy tie at amax 1 on the image, mse a hair below; mse wins most
    tensors at both widths; entropy is close behind on most tensors at 8 bits; max comes close
    to the best on weights at 8 bits; at 4 bits the methods spread further and max wins only
    on the image."""
    head = printed(nb, "df.head(8)")
    tie = all(
        re.search(rf"stem\.0\.input\s+input\s+{m}\s+1\.0000", head)
        for m in ("max", "percentile", "entropy")
    ) and re.search(r"stem\.0\.input\s+input\s+mse\s+0\.99", head)
    wins = _rows(printed(nb, "wins at 8 bits"), _METHODS)
    most = wins["mse"] == [max(v[0] for v in wins.values()), max(v[1] for v in wins.values())]
    close = re.search(r"entropy within a dB of the best on (\d+) of (\d+)", _read_tables(nb, 8))
    spread = {b: number_after(_read_tables(nb, b), "at most") for b in (8, 4)}
    max_best = set(re.findall(r"'([\w.]+)'", _read_tables(nb, 4).split("max best on")[1]))
    return bool(
        tie
        and most
        and close
        and 2 * int(close.group(1)) > int(close.group(2))
        and number_after(_read_tables(nb, 8), "max at most") < 1.5
        and spread[4] > 2 * spread[8]
        and max_best <= {"stem.0.input"}
    )


# -- 02
_LAYERS_02 = ("stem.0", "block.conv1", "block.conv2", "conv1.0", "conv2.0", "fc")


@claim("02_pt2e_post_training_quantization")
def _groups_and_ops(nb: nbformat.NotebookNode) -> bool:
    """14 sharing groups, one observer each; 11 quantize ops; the 6 weights dequantized per
    channel."""
    groups = printed(nb, 'print("sharing groups in prepared.plan:"')
    counts = _rows(
        printed(nb, "counts = Counter(op_names(quantized))"),
        ("quantize_per_tensor", "dequantize_per_channel"),
    )
    return number_after(groups, "sharing groups in prepared.plan:") == 14 and counts == {
        "quantize_per_tensor": [11.0],
        "dequantize_per_channel": [6.0],
    }


@claim("02_pt2e_post_training_quantization")
def _methods_on_relu_2(nb: nbformat.NotebookNode) -> bool:
    """max clips nothing on relu_2's output; the methods differ little."""
    text = printed(nb, "fig.qviz_rows")
    clips = re.search(r"^max\s+range \[[\d.]+, [\d.]+\]\s+clips 0\.0000%", text, re.M)
    return bool(clips) and number_after(text, "span") < 1.5


@claim("02_pt2e_post_training_quantization")
def _per_tensor_against_per_channel(nb: nbformat.NotebookNode) -> bool:
    """Both int8 models keep the float accuracy, per-channel weights give a cleaner output;
    per-channel scales gain on every layer, least on fc, most on stem.0; BatchNorm folding more
    than doubles stem.0's spread, fc keeps its own."""
    labels = ("float", "int8, per-tensor weights", "int8, per-channel weights")
    r = _labelled_rows(printed(nb, '"same prediction as float"'), labels)
    t = _rows(printed(nb, "weights = pd.DataFrame("), _LAYERS_02)  # tensor, channel, gain, ...
    gain = {layer: v[2] for layer, v in t.items()}
    return (
        r[labels[1]][0] == r[labels[2]][0] == r["float"][0]
        and r[labels[2]][2] > r[labels[1]][2]
        and all(g > 0 for g in gain.values())
        and min(gain, key=gain.__getitem__) == "fc"
        and max(gain, key=gain.__getitem__) == "stem.0"
        and t["stem.0"][4] > 2 * t["stem.0"][3]
        and t["fc"][4] == t["fc"][3]
    )


@claim("02_pt2e_post_training_quantization")
def _sizes_and_steps(nb: nbformat.NotebookNode) -> bool:
    """The weights shrink 4x, the file far less; the reference representation is within one
    output step of the q/dq model."""
    sizes = _rows(printed(nb, "def tensor_bytes"), ("conv/linear", ".pt2"))
    steps = number_after(printed(nb, "largest difference"), "largest difference:")
    return sizes["conv/linear"][-1] == 4 and sizes[".pt2"][-1] < 3 and steps <= 1


# -- 04
_OPS_04 = (
    "conv2d", "relu", "conv2d_1", "relu_1", "conv2d_2", "add", "relu_2", "max_pool2d",
    "conv2d_3", "relu_3", "conv2d_4", "relu_4", "adaptive_avg_pool2d", "flatten", "linear",
)  # fmt: skip


@claim("04_debugging_numerics")
def _the_culprit(nb: nbformat.NotebookNode) -> bool:
    """Per-tensor int8 falls to about chance with the output SQNR below 0 dB; conv2d_4's local
    SQNR is below 0 dB, far below every other operator's, its weight SQNR the worst; after it
    the local SQNR is normal and the cumulative as low as conv2d_4's."""
    accuracy = number_after(printed(nb, "quantized = quantize(per_tensor)"), "int8  test accuracy:")
    output = number_after(printed(nb, "report = compare(gm, quantized,"), "output SQNR")
    worst = _indexed_rows(printed(nb, 'report.worst(5)[["node"'), _OPS_04)  # local, cum., weight
    after = _indexed_rows(printed(nb, 'report.df["node"].tolist().index("conv2d_3")'), _OPS_04)
    others = {k: v for k, v in worst.items() if k != "conv2d_4"}
    return (
        accuracy < 20
        and output < 0
        and worst["conv2d_4"][0] < 0
        and all(v[0] > 20 for v in others.values())
        and all(v[2] > worst["conv2d_4"][2] for v in others.values() if len(v) > 2)
        and all(after[k][0] > 20 and after[k][1] < 5 for k in ("relu_4", "flatten", "linear"))
    )


@claim("04_debugging_numerics")
def _activations_fine_weights_not(nb: nbformat.NotebookNode) -> bool:
    """rmse_scale stays close to 0.29 step and a tiny share is clipped; nearly every weight of
    conv2.0 became 0."""
    grids = printed(nb, "grids = report.df")
    used = printed(nb, "torch.unique(w_int8")
    return (
        0.15 <= number_after(grids, "rmse_scale from")
        and number_after(grids, "to") <= 0.45
        and number_after(grids, "clipped at most") < 0.1
        and number_after(used, "{0:") >= 0.99 * number_after(used, "conv2.0:")
    )


@claim("04_debugging_numerics")
def _the_fixes(nb: nbformat.NotebookNode) -> bool:
    """Keeping conv2d_4 in float alone brings the accuracy back, no other fallback changes it;
    per-channel conv2d_4 measures about 10·log10(64) and stays the worst layer; per-tensor is
    useless, fallback, per-channel and repaired weights restore the accuracy, per-channel's
    SQNR is below the fallback's and both together are the best."""
    ranking = _indexed_rows(printed(nb, "ranking = sensitivity("), _OPS_04)  # ..., delta_metric
    configs = _indexed_rows(printed(nb, "side_by_side = compare_configs("), _OPS_04)
    options: dict[str, list[float]] = {}
    for line in printed(nb, "candidates = {").splitlines():
        row = re.match(r"(.*?)\s+([-\d.]+)\s+([-\d.]+|inf)\s*$", line)
        if row and line.startswith(("float", "int8,", "repaired")):
            options[row.group(1)] = [float(row.group(2)), float(row.group(3))]
    per_channel = {k: v[1] for k, v in configs.items()}
    return (
        ranking["conv2d_4"][-1] > 0.5
        and all(v[-1] == 0 for k, v in ranking.items() if k != "conv2d_4")
        and abs(per_channel["conv2d_4"] - 10 * math.log10(64)) < 3
        and min(per_channel, key=per_channel.__getitem__) == "conv2d_4"
        and options["int8, per-tensor"][0] < 0.2
        and options["int8, per-tensor, conv2.0 in float"][0]
        == options["int8, per-channel"][0]
        == options["repaired weights, int8, per-tensor"][0]
        == options["float"][0]
        and options["int8, per-channel"][1]
        < options["int8, per-tensor, conv2.0 in float"][1]
        < options["int8, per-channel, conv2.0 in float"][1]
    )


# -- 05
def _scores_05(nb: nbformat.NotebookNode, marker: str, label: str) -> tuple[float, float]:
    """Notebook 05's ``scores()`` line starting with ``label``: (accuracy %, logits SQNR dB)."""
    lines = printed(nb, marker).splitlines()
    line = next(ln for ln in lines if ln.startswith(label) and "accuracy" in ln)
    found = re.search(r"accuracy ([\d.]+)%, logits SQNR\s+([-\d.]+) dB", line)
    assert found, f"no scores in {line!r}"
    return float(found.group(1)), float(found.group(2))


@claim("05_interactive_quantization")
def _the_red_layer(nb: nbformat.NotebookNode) -> bool:
    """Per-tensor int8 falls to about chance; the red box is conv2d_4, below 0 dB and far below
    every other operator; its fallback brings the accuracy back to the float model's."""
    solution = printed(nb, "solved = NumericDashboard(")
    worst = re.search(r"worst: (\w+) at ([-\d.]+) dB; next: \w+ at ([-\d.]+) dB", solution)
    back = re.search(r"accuracy [\d.]+% -> ([\d.]+)%", solution)
    float_accuracy = re.search(r"float: accuracy ([\d.]+)%", printed(nb, "float_accuracy = "))
    return bool(
        _scores_05(nb, 'print(f"int8:  {scores(quantized)}")', "int8:")[0] < 20
        and worst
        and worst.group(1) == "conv2d_4"
        and float(worst.group(2)) < 0
        and float(worst.group(3)) > float(worst.group(2)) + 20
        and back
        and float_accuracy
        and back.group(1) == float_accuracy.group(1)
    )


@claim("05_interactive_quantization")
def _per_channel_and_glitch(nb: nbformat.NotebookNode) -> bool:
    """Per-channel conv2.0 keeps the float accuracy with a lower SQNR than the fallback;
    entropy's ranges work around the glitch; without the glitched image the calibration scores
    about as the clean one."""
    editor, explorer = "solved_editor = AnnotationEditor(", "solved_explorer = CalibrationExplorer("
    channel = _scores_05(nb, editor, "per-channel")
    in_float = _scores_05(nb, editor, "conv2.0 in float")
    removed = _scores_05(nb, "peaks.argmax()", "image")
    clean = _scores_05(nb, "peaks.argmax()", "clean calibration")
    return (
        channel[0] == in_float[0]
        and channel[1] < in_float[1]
        and _scores_05(nb, explorer, "entropy ranges")[0] > _scores_05(nb, explorer, "l2")[0]
        and abs(removed[0] - clean[0]) <= 0.5
        and abs(removed[1] - clean[1]) <= 1
    )


# -- 06
@claim("06_backend_config")
def _the_fitted_qconfig(nb: nbformat.NotebookNode) -> bool:
    """With both eps fixed only sigmoid stays in float; reduce_range costs output SQNR."""
    text = printed(nb, "def quantize_and_measure")
    fitted = text.count("in float ['sigmoid']") == 2
    return fitted and number_after(text, "reduce_range costs") > 0


# -- 07
def _ranking_07(nb: nbformat.NotebookNode, bits: str) -> tuple[list[str], float, float]:
    """Notebook 07's ranking line: the methods best first, the accuracy range (in %)."""
    lines = printed(nb, "both = {").splitlines()
    line = next(ln for ln in lines if ln.startswith(f"{bits}: accuracy"))
    low, high = (float(v) for v in re.findall(r"accuracy ([\d.]+)% to ([\d.]+)%", line)[0])
    ranked = line.split("best first:")[1].split("(spread")[0]
    return re.findall(r"(\w+) [-\d.]+ dB", ranked), low, high


@claim("07_quantized_modules_and_onnx")
def _methods_at_8_and_4(nb: nbformat.NotebookNode) -> bool:
    """8 bits: every method keeps the float accuracy, max keeps the logits closest. 4 bits: mse
    comes last for the logits, the accuracy moves by a few images at most."""
    eight, four = _ranking_07(nb, "8 bits"), _ranking_07(nb, "4 bits")
    return (
        eight[0][0] == "max"
        and eight[1] == eight[2]
        and four[0][-1] == "mse"
        and (four[2] - four[1] <= 3 / 3.6)
    )


@claim("07_quantized_modules_and_onnx")
def _one_tensor_against_the_model(nb: nbformat.NotebookNode) -> bool:
    """mse is the best on the pool's input alone (the smallest amax, a small share clipped, the
    best SQNR of the tensor), and its amax there alone costs the logits."""
    line = r"^(\w+)\s+amax ([\d.]+)\s+clips ([\d.]+)%\s+SQNR of this tensor ([-\d.]+) dB"
    text = printed(nb, "four_bit.pool.input_quantizer, log=True")
    rows = {m[0]: [float(v) for v in m[1:]] for m in re.findall(line, text, re.M)}
    swap = printed(nb, 'swap["max, mse')
    return (
        min(rows, key=lambda m: rows[m][0]) == "mse"
        and max(rows, key=lambda m: rows[m][2]) == "mse"
        and rows["mse"][1] < 1
        and number_after(swap, "max everywhere: logits SQNR")
        > number_after(swap, "input: logits SQNR")
    )


@claim("07_quantized_modules_and_onnx")
def _mse_weights(nb: nbformat.NotebookNode) -> bool:
    """With mse weights the 4-bit model is back at the float accuracy, the logits closer."""
    text = printed(nb, "mine = copy.deepcopy(four_bit)")
    return number_after(text, "mse weights: accuracy") == number_after(
        text, "float: accuracy"
    ) and number_after(text, r"mse weights: accuracy [\d.]+%, logits SQNR") > number_after(
        text, r"max weights: accuracy [\d.]+%, logits SQNR"
    )


@claim("07_quantized_modules_and_onnx")
def _fine_tuning_and_onnx(nb: nbformat.NotebookNode) -> bool:
    """One epoch repairs most of what calibration lost; w3a4 starts lowest and gains the most;
    every run ends close to the float accuracy; onnxruntime gives torch's predictions."""
    text = printed(nb, "histories[name] = [calibrated]")
    runs = {
        m.group(1): [float(v) for v in m.group(2, 3, 4)]
        for m in re.finditer(
            r"(w\da\d): accuracy ([\d.]+)% calibrated, ([\d.]+)% after one epoch, "
            r"([\d.]+)% after three",
            text,
        )
    }
    best = number_after(text, "float: accuracy")
    onnx = _rows(printed(nb, "values that differ"), ("no", "default"))
    return (
        len(runs) == 3
        and min(runs, key=lambda k: runs[k][0]) == "w3a4"
        and max(runs, key=lambda k: runs[k][2] - runs[k][0]) == "w3a4"
        and all(v[1] - v[0] >= 0.5 * (best - v[0]) for v in runs.values())
        and all(v[2] >= best - 2 / 3.6 for v in runs.values())
        and onnx["no"][3] == 1.0
    )


# -- 08
@claim("08_quantization_aware_training")
def _freezing(nb: nbformat.NotebookNode) -> bool:
    """Before the freeze nearly every module changes its scale at almost every step, after it
    none; in the frozen runs no scale moves in the last steps, in the others one does at every
    step; the four runs' accuracies lie within a few test images; QAT recovers accuracy PTQ
    loses."""
    shares: dict[str, list[float]] = {}
    pattern = r"(\S.*?(?:weight|output|input x)(?: \(\+\d shared\))?)\s+([\d.]+)"
    for line in printed(nb, 'df["frozen"]').splitlines():
        if m := re.match(pattern, line):
            shares.setdefault(m.group(1), []).append(float(m.group(2)))  # before, after, ...
    runs = _labelled_rows(
        printed(nb, "histories, rows = {}, []"),
        ("nothing frozen", "lr 1e-4", "observers frozen at 40", "BN at 30, observers at 40"),
    )  # steps changed in the last 20, changes, accuracy, images right
    right = [v[-1] for v in runs.values()]
    result = printed(nb, "qat_int8 = qviz.convert_pt2e(qat)")
    return (
        all(v[1] == 0 for v in shares.values())
        and sum(v[0] >= 0.9 for v in shares.values()) >= len(shares) - 1
        and runs["observers frozen at 40"][0] == runs["BN at 30, observers at 40"][0] == 0
        and runs["nothing frozen"][0] == runs["lr 1e-4"][0] == 20
        and max(right) - min(right) <= 5
        and number_after(result, "QAT") > number_after(result, "PTQ")
    )


# -- 09
@claim("09_lowering")
def _the_planted_defect(nb: nbformat.NotebookNode) -> bool:
    """The shipped file's accuracy drops; the bisection names the operator whose scale was
    planted; lowering again restores the reference's accuracy."""
    shipped = printed(nb, 'folder / "shipped.onnx")')
    found = re.search(r"planted at the quantize of (\w+); found: (\w+)", printed(nb, "Solution, 1"))
    again = printed(nb, "Solution, 3")
    return bool(
        number_after(shipped, "shipped") < number_after(shipped, "reference")
        and found
        and found.group(1) == found.group(2)
        and number_after(again, "lowered again") == number_after(again, r"\(reference")
    )


# -- 10
def _gain(nb: nbformat.NotebookNode, marker: str) -> float:
    """The change in output SQNR of the RepairStep the cell containing ``marker`` printed."""
    found = re.search(r"output SQNR ([-\d.]+) -> ([-\d.]+) dB", printed(nb, marker))
    assert found, f"no RepairStep printed by the cell with {marker!r}"
    return float(found.group(2)) - float(found.group(1))


@claim("10_repair")
def _the_broken_model(nb: nbformat.NotebookNode) -> bool:
    """W4A8 falls to about chance, and without the planted channels keeps the float accuracy;
    outlier channels at conv2d_3, relu_3 and conv2d_4, rounding everywhere else."""
    accuracy = printed(nb, "W4A8  test accuracy")
    causes = printed(nb, "for cause in")
    outliers = re.search(r"outlier channels: (.*)", causes)
    return bool(
        number_after(accuracy, "W4A8  test accuracy:") < 20
        and number_after(accuracy, "no outliers:")
        >= number_after(accuracy, "float test accuracy:") - 1
        and outliers
        and set(outliers.group(1).split(", ")) == {"conv2d_3", "relu_3", "conv2d_4"}
        and "rounding: " in causes
    )


@claim("10_repair")
def _the_remedies(nb: nbformat.NotebookNode) -> bool:
    """The first step brings the accuracy back to the float model's; equalization gains far
    less than it, and only rounding is left; bias correction and AdaRound both raise the
    output SQNR; a float layer buys less than AdaRound did."""
    first = re.search(r"accuracy [\d.]+% -> ([\d.]+)%", printed(nb, "findings[0]))"))
    with_outliers = re.search(r"with outliers ([\d.]+)%", printed(nb, "with outliers"))
    fallback = printed(nb, "a float layer gains")
    return bool(
        first
        and with_outliers
        and first.group(1) == with_outliers.group(1)
        and _gain(nb, "step = tried(session.apply(finding.suggested))")
        < _gain(nb, "findings[0]))") / 2
        and "outlier" not in printed(nb, 'session.diagnosis.df[["node"')
        and _gain(nb, 'session.apply("bias_correction")') > 0
        and _gain(nb, 'session.apply("adaround"') > 0
        and number_after(fallback, "a float layer gains")
        < number_after(fallback, "AdaRound gained")
    )


# -- 11
@claim("11_mixed_precision")
def _uniform_and_mixed(nb: nbformat.NotebookNode) -> bool:
    """8-bit weights keep the float accuracy, 4 bits cost a little, 2 bits break the model; the
    mixed model is smaller than uniform 4-bit and at least as accurate."""
    uniform = {
        int(b): float(a)
        for b, a in re.findall(
            r"(\d)-bit\s+[\d.]+\s+([\d.]+)", printed(nb, "for bits in (8, 4, 2):")
        )
    }
    chosen = printed(nb, "chosen_accuracy = ")
    return (
        uniform[8] >= uniform[4] >= uniform[8] - 0.02
        and uniform[2] < uniform[8] - 0.1
        and number_after(chosen, "chosen:") < number_after(chosen, "uniform 4-bit:")
        and number_after(chosen, "test accuracy")
        >= number_after(chosen, r"uniform 4-bit: [\d.]+ KiB,")
    )
