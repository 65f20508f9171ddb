"""The teaching notebooks: committed without outputs, and each runs top to bottom without error.

The committed-without-outputs checks always run, and so do the checks of what the notebooks
say (no execution needed): a number the prose states is one no machine changes, or a cell
prints it (``test_prose_states_no_measured_number``); an exercise's solution is folded and
hidden until the learner opens it (``test_solutions_are_folded``); the stated run time says how
it was measured (``test_stated_time_says_how_it_was_measured``). The execution with nbclient
runs only when the browser tests are skipped (``QVIZ_SKIP_BROWSER=1``): otherwise
``tests/widgets/e2e/test_notebooks_e2e.py`` runs every notebook in JupyterLab, in a real browser,
and applies the same checks of the executed notebook (``check_executed``) to what the kernel sent
there, so executing each notebook twice would only double the time. Both executions install the
solution guard (``install_solution_guard``): a solution cell must leave every object an exercise
starts from as it found it, and both compare the kernel's CPU time with the stated time.

Each notebook is executed with nbclient in a fresh kernel. The kernel is this very interpreter
(a kernelspec written to a temporary ``JUPYTER_PATH`` points at ``sys.executable``, and the first
cell run checks it), so a notebook sees the same qviz and torch as the tests; IPython, Jupyter
and matplotlib write into pytest's temporary folders, never into $HOME.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 300
#: The PNG figures a notebook shows at least (each ``fig`` cell must render as an image).
IMAGES = {"08_quantization_aware_training.ipynb": 1}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Why the nbclient execution is skipped when the browser tests run.
_IN_THE_BROWSER = (
    "executed in JupyterLab by tests/widgets/e2e/test_notebooks_e2e.py; nbclient executes the "
    "notebooks only when the browser tests are skipped (QVIZ_SKIP_BROWSER=1)"
)
_PROBE = "import json, sys\nprint(json.dumps({'executable': sys.executable, 'prefix': sys.prefix}))"


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _isolated_kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point every Jupyter/IPython/matplotlib folder at tmp_path; register this interpreter."""
    for var in (
        "IPYTHONDIR",
        "MPLCONFIGDIR",
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTER_PATH",
    ):
        folder = tmp_path / var.lower()
        folder.mkdir()
        monkeypatch.setenv(var, str(folder))  # the kernel inherits the environment
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("OMP_NUM_THREADS", KERNEL_THREADS)  # see check_time
    install_solution_guard(Path(os.environ["IPYTHONDIR"]))
    # JUPYTER_PATH comes first in the kernelspec search, before the venv's and the user's own.
    spec_dir = Path(os.environ["JUPYTER_PATH"]) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (qviz tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))


def _failure_report(path: Path, nb: nbformat.NotebookNode, exc: CellExecutionError) -> str:
    """The failing cell's index (as in the committed notebook), its source and the error."""
    for index, cell in enumerate(nb.cells[1:]):  # cell 0 is the interpreter probe
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                traceback = _ANSI.sub("", "\n".join(output.get("traceback", [])))
                error = f"{output['ename']}: {output['evalue']}"
                return (
                    f"{path.name}: cell {index} (0-based) raised {error}\n"
                    f"--- cell source ---\n{cell.source}\n--- traceback ---\n{traceback}"
                )
    return f"{path.name}: {_ANSI.sub('', str(exc))}"


def test_notebooks_are_found() -> None:
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        index
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, (
        f"{path.name}: code cells {dirty} carry outputs or execution counts; clear them before "
        f"committing (e.g. `jupyter nbconvert --clear-output --inplace {path.name}`)"
    )


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("QVIZ_SKIP_BROWSER") != "1", reason=_IN_THE_BROWSER)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolated_kernel_env(tmp_path, monkeypatch)
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_PROBE))
    nb.cells.append(nbformat.v4.new_code_cell(f"print({CPU_SECONDS})"))
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    failure = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failure = _failure_report(path, nb, exc)
    if failure is not None:  # outside the except block: no chained nbclient traceback
        pytest.fail(failure, pytrace=False)

    stdout = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    probe = json.loads(stdout)
    assert probe == {"executable": sys.executable, "prefix": sys.prefix}, (
        f"the notebook ran in {probe}, not in the interpreter running the tests ({sys.executable})"
    )
    _check_widget_state(nb)
    cpu = float("".join(o.get("text", "") for o in nb.cells[-1].outputs))
    del nb.cells[0], nb.cells[-1]  # the probes: the cell indices are the committed notebook's
    check_executed(nb, path.name)
    check_time(nb, path.name, cpu)


def check_executed(nb: nbformat.NotebookNode, name: str) -> None:
    """The checks of an executed notebook ``name`` (its cells as committed, with the outputs the
    kernel sent), shared with the JupyterLab run of tests/widgets/e2e/test_notebooks_e2e.py."""
    _check_figures_render(nb, name)
    _check_solution_guard(nb, name)
    _check_float_kernel_tooltips(nb, name)
    if name.startswith("02_"):
        _check_prepared_counts(nb)
    for check in CLAIMS.get(Path(name).stem, []):
        assert check(nb), f"{name}: the prose says {check.__doc__!r}; the outputs do not"


def _check_prepared_counts(nb: nbformat.NotebookNode) -> None:
    """Notebook 02: the printed observer count is the plan's and the next sentence says it
    (issue 25: it printed ``observers: 0`` and then said the prepared copy has 14)."""
    text = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    printed = re.search(
        r"prepared\s+batch_norm ops: (\d+), conv2d ops: \d+, observers: (\d+)", text
    )
    assert printed, "notebook 02 no longer prints the prepared model's counts"
    said = re.search(
        r"(\d+) observers", "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    )
    assert printed.group(1) == "0" and said
    assert printed.group(2) == said.group(1) != "0", (printed.group(0), said.group(0))


def _check_figures_render(nb: nbformat.NotebookNode, name: str) -> None:
    """Every matplotlib Figure a cell displayed came out as an image, not as its text repr
    (issue 25: ``fig = monitor.plot(); fig`` showed ``<Figure size 1000x572 with 4 Axes>``)."""
    as_text = [
        index
        for index, cell in enumerate(nb.cells)
        for o in cell.get("outputs", [])
        if str(o.get("data", {}).get("text/plain", "")).startswith("<Figure size")
        and "image/png" not in o["data"]
    ]
    assert not as_text, f"{name}: cells {as_text} (0-based) show a Figure as text, not an image"
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    expected = IMAGES.get(name, 0)
    assert images >= expected, f"{name}: {images} PNG images shown, expected at least {expected}"


def _check_widget_state(nb: nbformat.NotebookNode) -> None:
    """Every widget a cell displayed has its state saved in the notebook's metadata."""
    shown = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for cell in nb.cells
        for o in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    if not shown:
        return
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    missing = [m for m in shown if m not in state]
    assert not missing, f"widgets displayed without saved state: {missing}"


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


# ---- what the prose may say ---------------------------------------------------------------------
# A notebook runs on every torch version and CPU; its Markdown is fixed text. So a number the
# prose states is either one no machine changes (a definition, an integer range, a count fixed by
# the model, the data or the notebook's own code), or a cell prints it: "the table above", never
# "29.87 dB". The test finds every number in the Markdown (not in LaTeX, code blocks or the
# stated time, which test_stated_time_says_how_it_was_measured checks) and accepts it when a code
# cell of the notebook writes it (a constant the notebook sets), when it is one of _DEFINED, or
# when PROSE_NUMBERS declares it for that notebook, with why it holds on every machine. A number
# with a unit of measurement (dB, %, ×, s, KiB, ...) must always be declared: code that writes
# `100 *` does not make a "100%" in the prose a fact. The few measured claims the prose keeps are
# checked against the outputs on every run (CLAIMS).

_FENCE = re.compile(r"```.*?```", re.S)
_LATEX = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
_TIME = re.compile(r"\*Time:.*?\*", re.S)
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|[-−]?\d+(?:\.\d+)?)(?!x\w)(?![^\Wx])")
_UNIT = re.compile(r"\s?(dB|%|×|x(?![\w-])|s(?!\w)|ms(?!\w)|KiB|MB|GBOP|GB(?!\w))")
_REFERENCE = re.compile(  # "notebook 04", "sections 2 and 3", "Nagel et al. 2019": not claims
    r"(?:notebooks?|Notebooks?|sections?|Sections?|Exercise|Scenario|et al\.|opset|Python|torch"
    r"|onnxruntime|JupyterLab|ipywidgets|Graphviz|step|steps|Step)\s*(?:\d+\s*(?:,|and|or)\s*)*$"
)
#: Numbers of the integer grids and bit widths every notebook uses.
_DEFINED = frozenset(
    {"0", "1", "2", "3", "4", "7", "8", "16", "32", "127", "-127", "128", "-128", "255", "256"}
)
_DB = {
    "0 dB": "the definition: the error as strong as the signal",
    "6 dB": "one bit: 20·log10(2), the definition of a halved error",
    "10": "the 10 of 10·log10, the definition of a dB",
}
_IMAGES = {
    "360": "the test split's size (qviz.data.digits_loaders)",
    "0.28 %": "one test image of 360: arithmetic",
}
#: Per notebook (its stem): the numbers its Markdown states that no code cell writes and
#: _DEFINED does not hold, each with why it is the same on every machine.
PROSE_NUMBERS: dict[str, dict[str, str]] = {
    "01_tensor_quantization": {
        "6 dB": _DB["6 dB"],
        "20": "the 20 of 20·log10, the dB of an amplitude ratio",
        "288": "block.conv1's weights per output channel: 32 × 3 × 3",
        "2048": "HistogramCalibrator's bins (num_bins' default)",
        "99.99 %": "the percentile method's default",
        "0.01 %": "the share it drops: 100 - 99.99",
    },
    "02_pt2e_post_training_quantization": {
        "180": "the calibration split's size (qviz.data.digits_loaders)",
        "52": "180 = 64 + 64 + 52: the last calibration batch",
        "40": "360 = 5 × 64 + 40: the last test batch",
        "14": "the prepared digits model's observers and groups (checked: CLAIMS and "
        "_check_prepared_counts)",
        "11": "a plan group's number, and the quantize ops of the counts table (checked: CLAIMS)",
        "6": "the dequantize_per_channel ops: the model's six weights (checked: CLAIMS)",
        "4 x": "int8 against float32: 1 byte a value against 4; qviz.viz.ranges' red: past 4x "
        "the median",
        "6 dB": _DB["6 dB"],
        **_IMAGES,
    },
    "03_writing_a_quantizer": {
        "0.0039": "1/256, the fixed scale: arithmetic",
        "0.003906": "the same",
    },
    "04_debugging_numerics": {
        **{k: _DB[k] for k in ("0 dB", "6 dB")},
        "12": "the 12 of 1/√12, the RMS of an error spread evenly over one step",
        "0.29": "1/√12: arithmetic",
        "10 dB": "a band edge of qviz.viz.bands.SQNR",
        "40 dB": "a band edge of qviz.viz.bands.SQNR",
        "36863": "64·64·3·3 − 1: conv2.0's weights but the planted one",
        "63": "64 − 1: conv2.0's output channels but channel 0",
    },
    "05_interactive_quantization": {
        **_DB,
        "50 dB": "the dashboard's fixed colour scale (qviz.widgets.dashboard_view)",
        "18 dB": "10·log10(64): arithmetic",
        "180": "the calibration split's size (qviz.data.digits_loaders)",
        "0.01 %": "the percentile method's default, 99.99",
        "1 %": "one image in 180: arithmetic",
    },
    "06_backend_config": {"6 dB": _DB["6 dB"], "0.000244": "2**-12: arithmetic"},
    "07_quantized_modules_and_onnx": {
        "0.01 %": "the share the percentile method drops: 100 - 99.99",
        **_IMAGES,
        "6 dB": _DB["6 dB"],
        "40 dB": "an error of 1 % of the logits: 20·log10(100), arithmetic",
        "1 %": "the same",
        "15": "the 4-bit narrow grid's levels, -7..7",
        "-7": "its lowest integer",
        "18": "127 / 7: arithmetic",
        "30": "the epochs the embedded checkpoint trained (qviz.data.train)",
    },
    "08_quantization_aware_training": {"0.28 %": _IMAGES["0.28 %"]},
    "09_lowering": {"512": "AVX-512, the name of a CPU feature"},
    "10_repair": {
        "10 ×": "the literature's range of channel spreads in trained networks (Nagel et al.)",
        "100 ×": "the same",
        "25 dB": "diagnose()'s default threshold_db",
        "0 dB": "the definition: the error as strong as the signal",
    },
    "11_mixed_precision": {"4096": "4**6 assignments: arithmetic", **_IMAGES},
}


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


def prose_numbers(markdown: str) -> list[str]:
    """The numbers a Markdown cell states, as ``"48"`` or, with a unit, ``"48 ×"``.

    >>> prose_numbers("about 48x the median; see notebook 04, section 2; int8 [-128, 127]")
    ['48 x', '-128', '127']
    """
    text = _TIME.sub(" ", _LATEX.sub(" ", _FENCE.sub(" ", markdown)))
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\s*#+\s*\d+(\.\d+)?", "", line)  # a heading's section number
        line = re.sub(r"^\s*\d+\.\s", "", line)  # a numbered list's marker
        for m in _NUMBER.finditer(line):
            if _REFERENCE.search(line[: m.start()]):
                continue
            number = _canonical(m.group(0))
            unit = _UNIT.match(line, m.end())
            found.append(f"{number} {unit.group(1)}" if unit else number)
    return found


def _canonical(number: str) -> str:
    """``"30.0"`` and ``"30"`` are one number; ``"36,863"`` is ``"36863"``."""
    number = number.replace("−", "-").replace(",", "")
    value = float(number)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else number


def _code_numbers(nb: nbformat.NotebookNode) -> set[str]:
    code = " ".join(c.source for c in nb.cells if c.cell_type == "code")
    return {_canonical(m.group(0)).lstrip("-") for m in _NUMBER.finditer(code)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_prose_states_no_measured_number(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    code, declared = _code_numbers(nb), PROSE_NUMBERS.get(path.stem, {})
    undeclared = [
        f"cell {index}: {number!r}"
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "markdown"
        for number in prose_numbers(cell.source)
        if number not in declared
        and (" " in number or (number not in _DEFINED and number.lstrip("-") not in code))
    ]
    assert not undeclared, (
        f"{path.name}: the prose states numbers a machine could change: {undeclared}. Print "
        f"them from the cell that computes them (or say it without the number); a number that "
        f"holds everywhere goes into PROSE_NUMBERS[{path.stem!r}] with the reason"
    )
    unused = sorted(
        set(declared)
        - {n for c in nb.cells if c.cell_type == "markdown" for n in prose_numbers(c.source)}
    )
    assert not unused, (
        f"{path.name}: PROSE_NUMBERS declares numbers the prose no longer states: {unused}"
    )


# ---- exercises and their solutions -----------------------------------------------------------
# An exercise is a code cell tagged "exercise"; its solution a code cell tagged "solution" that
# starts with "# Solution", whose source is hidden (metadata jupyter.source_hidden: JupyterLab
# shows a bar to click) and whose output folds itself (`with qviz.viz.folded(...)`: one closed
# <details>; JupyterLab unfolds a cell's outputs_hidden whenever the cell runs, so that flag
# would not survive Run All). The prose of a solution is inside a <details> block. A solution
# runs in Run All (so it is tested), on its own copies: the guard below checks, in the kernel,
# that it leaves every object of the notebook's namespace as it found it, so a learner's own
# attempt after Run All starts from the state the exercise meant.

SOLUTION_MARK = "# Solution"
#: The line a folded solution shows until it is opened.
SOLUTION_SUMMARY = "Solution's output (click to open)"
#: Markdown that opens a solution: a <summary>, a heading or a paragraph starting "Solution".
_SOLUTION_PROSE = re.compile(
    r"<summary>.*Solution|^\s*(?:#+\s*)?\**Solution\b|The solution, run", re.M
)
GUARD_LINE = "qviz solution guard:"


def _cells_tagged(nb: nbformat.NotebookNode, tag: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if tag in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_solutions_are_folded(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    exercises, solutions = _cells_tagged(nb, "exercise"), _cells_tagged(nb, "solution")
    marked = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and c.source.lstrip().startswith(SOLUTION_MARK)
    ]
    unmarked_exercises = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and "your code here" in c.source and i not in exercises
    ]
    assert not unmarked_exercises, f"{path.name}: exercise cells {unmarked_exercises} untagged"
    assert [i for i in solutions if nb.cells[i].cell_type == "code"] == marked, (
        f"{path.name}: the code cells starting {SOLUTION_MARK!r} ({marked}) and those tagged "
        f"'solution' ({solutions}) differ"
    )
    for i in marked:
        assert nb.cells[i].metadata.get("jupyter", {}).get("source_hidden"), (
            f"{path.name}: solution cell {i} shows its code before the learner opens it: set "
            f"its metadata jupyter.source_hidden"
        )
        body = nb.cells[i].source.splitlines()[1:]
        assert body and body[0].startswith("with qviz.viz.folded("), (
            f"{path.name}: solution cell {i} shows its output before the learner opens it: "
            f"put its code under `with qviz.viz.folded(...):`"
        )
        assert all(not line or line.startswith(" ") for line in body[1:]), (
            f"{path.name}: solution cell {i} has code outside its folded block"
        )
    for i in exercises:
        after = [s for s in marked if s > i]
        assert after, f"{path.name}: exercise cell {i} has no solution cell after it"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or not _SOLUTION_PROSE.search(cell.source):
            continue
        text = cell.source.strip()
        assert text.startswith("<details>") and text.endswith("</details>"), (
            f"{path.name}: markdown cell {i} shows a solution outside a folded <details> block"
        )
        assert "```" not in text, (
            f"{path.name}: markdown cell {i} repeats the solution's code: the folded solution "
            f"cell runs it (and is tested)"
        )


#: The IPython start-up file the tests' kernels run: before a cell that starts with
#: SOLUTION_MARK, a digest of every object of the namespace; after it, the digest again, and one
#: line into the cell's output saying whether any object changed or any name was rebound.
_GUARD = r"""
import hashlib as _hashlib

_QVIZ_OPAQUE = ("ipywidgets", "traitlets", "comm", "ipykernel", "zmq", "tornado", "asyncio",
                "threading", "logging", "matplotlib", "tqdm", "IPython", "anywidget", "graphviz",
                "concurrent", "_thread", "weakref", "multiprocessing", "onnxruntime", "jupyter")


_QVIZ_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_state_dict_hooks")


def _qviz_digest(obj, h, seen, depth):
    import numpy, torch
    kind = type(obj)
    h.update(kind.__qualname__.encode())
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        h.update(repr(obj).encode())
        return
    if id(obj) in seen or depth > 10:
        return
    seen.add(id(obj))
    module = getattr(kind, "__module__", "") or ""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.device.type != "meta" and not t.is_sparse:
            if t.is_quantized:
                t = t.int_repr()
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, numpy.ndarray):
        h.update(obj.tobytes() if obj.dtype != object else repr(obj).encode())
    elif module.startswith("pandas"):
        h.update(obj.to_csv().encode() if hasattr(obj, "to_csv") else repr(obj).encode())
    elif isinstance(obj, torch.fx.Graph):
        h.update(str(obj).encode())
    elif isinstance(obj, torch.fx.Node):
        h.update(obj.name.encode())
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _qviz_digest(item, h, seen, depth + 1)
    elif isinstance(obj, dict):
        for key, value in list(obj.items()):
            h.update(repr(key).encode())
            _qviz_digest(value, h, seen, depth + 1)
    elif isinstance(obj, (set, frozenset)):
        h.update(repr(sorted(map(repr, obj))).encode())
    elif callable(obj) and not hasattr(obj, "__dict__") or module.startswith(_QVIZ_OPAQUE):
        return
    elif isinstance(obj, (type, type(_hashlib))) or kind.__name__ in ("function", "method"):
        return
    else:
        if isinstance(obj, torch.nn.Module):
            for key, value in obj.state_dict(keep_vars=True).items():
                h.update(key.encode())
                _qviz_digest(value, h, seen, depth + 1)
        state = getattr(obj, "__dict__", None)
        if state is None and hasattr(kind, "__slots__"):
            state = {k: getattr(obj, k) for k in kind.__slots__ if hasattr(obj, k)}
        for key, value in list((state or {}).items()):
            if key in _QVIZ_HOOKS:
                continue
            h.update(str(key).encode())
            _qviz_digest(value, h, seen, depth + 1)


class _QvizSolutionGuard:
    def __init__(self, ip):
        self.ip, self.before = ip, None

    def _names(self):
        import types
        hidden = set(getattr(self.ip, "user_ns_hidden", {}))
        return {
            name: value for name, value in self.ip.user_ns.items()
            if not name.startswith("_") and name not in hidden
            and name not in ("In", "Out", "exit", "quit", "get_ipython")
            and not isinstance(value, (types.ModuleType, types.FunctionType, type))
        }

    def _snapshot(self):
        seen, found = set(), {}
        for name, value in self._names().items():
            h = _hashlib.sha256()
            try:
                _qviz_digest(value, h, seen, 0)
            except Exception as error:  # a digest that fails says so; it never breaks a cell
                h.update(f"unreadable {type(error).__name__}".encode())
            found[name] = (id(value), h.hexdigest())
        return found

    def pre(self, info):
        cell = getattr(info, "raw_cell", "") or ""
        self.before = self._snapshot() if cell.lstrip().startswith(SOLUTION_MARK) else None

    def post(self, result):
        if self.before is None:
            return
        after, before, self.before = self._snapshot(), self.before, None
        rebound = sorted(n for n in before if n in after and after[n][0] != before[n][0])
        changed = sorted(
            n for n in before if n in after and n not in rebound and after[n] != before[n]
        )
        gone = sorted(n for n in before if n not in after)
        if rebound or changed or gone:
            print(f"{GUARD_LINE} CHANGED the exercise's state: changed {changed}, rebound "
                  f"{rebound}, deleted {gone}")
        else:
            print(f"{GUARD_LINE} unchanged ({len(before)} names)")


def _qviz_install_guard():
    ip = get_ipython()  # noqa: F821 - the start-up file runs in the kernel
    if ip is not None:
        guard = _QvizSolutionGuard(ip)
        ip.events.register("pre_run_cell", guard.pre)
        ip.events.register("post_run_cell", guard.post)


_qviz_install_guard()
"""


def install_solution_guard(ipython_dir: Path) -> None:
    """Write the solution guard as an IPython start-up file of the profile in ``ipython_dir``
    (the kernels of both test runs read it; a learner's kernel never does)."""
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    header = f"SOLUTION_MARK = {SOLUTION_MARK!r}\nGUARD_LINE = {GUARD_LINE!r}\n"
    (startup / "00-qviz-solution-guard.py").write_text(header + _GUARD)


def _check_solution_guard(nb: nbformat.NotebookNode, name: str) -> None:
    """Each solution cell ran under the guard and left the namespace as it found it, and shows
    nothing but its folded output (and the guard's line)."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.lstrip().startswith(SOLUTION_MARK):
            continue
        shown = [o for o in cell.get("outputs", []) if not o.get("text", "").startswith(GUARD_LINE)]
        unfolded = [
            o
            for o in shown
            if o.get("output_type") != "display_data"
            or not str(o["data"].get("text/plain", "")).startswith(SOLUTION_SUMMARY)
            or not str(o["data"].get("text/html", "") or "<details").startswith("<details")
        ]  # (the browser test's copy of the outputs keeps their text/plain only)
        assert len(shown) == 1 and not unfolded, (
            f"{name}: solution cell {index} shows output outside its fold: {unfolded}"
        )
        said = [
            line
            for o in cell.get("outputs", [])
            for line in o.get("text", "").splitlines()
            if line.startswith(GUARD_LINE)
        ]
        assert said, f"{name}: solution cell {index} ran without the solution guard"
        assert all("unchanged" in line for line in said), (
            f"{name}: solution cell {index} changed what its exercise starts from (work on a "
            f"copy): {said}"
        )


# ---- the stated run time ----------------------------------------------------------------------
# A learner runs a notebook in JupyterLab; what the introduction states is measured that way and
# says how: the kernel's CPU time in JupyterLab (Run All, the widgets rendered), one thread,
# and the CPU it ran on (a slower CPU takes up to about twice as long: notebook 01 took 8.6 s
# on an AMD EPYC with AVX-512, 17 s on a learner's machine; on a busy machine CPU time grows far
# less than wall time: 13 s against 20 s wall there). Both executions compare the kernel's CPU
# time with it: a notebook that grew slower than its statement allows on any CPU fails, and the
# statement is then measured again.

_STATED = re.compile(
    r"\*Time: about (\d+) s in JupyterLab, measured as the kernel's CPU time \(one thread, "
    r"on (?:an? )?[A-Z][^)]*\)".replace(" ", r"\s+")
)
#: How much more CPU time than stated a run may take (a CPU up to twice as slow, a busy
#: machine) before the statement counts as wrong.
TIME_SLACK, TIME_MARGIN_S = 2.5, 5.0
#: The tests' kernels run with one thread (OMP_NUM_THREADS), as the stated times were measured:
#: with two threads on a busy two-core machine, a waiting thread spins, and the kernel's CPU time
#: grew eightfold (notebook 10's AdaRound), measuring the machine's load, not the notebook.
KERNEL_THREADS = "1"
#: The kernel's CPU time so far (its threads and the processes it waited for), in seconds.
CPU_SECONDS = (
    "sum(getattr(__import__('resource').getrusage(w), f) for w in (0, -1) "
    "for f in ('ru_utime', 'ru_stime'))"
)


def stated_seconds(nb: nbformat.NotebookNode) -> float | None:
    for cell in nb.cells:
        found = _STATED.search(cell.source) if cell.cell_type == "markdown" else None
        if found:
            return float(found.group(1))
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stated_time_says_how_it_was_measured(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert stated_seconds(nb) is not None, (
        f'{path.name}: the introduction states no time in the form "*Time: about N s in '
        f"JupyterLab, measured as the kernel's CPU time (one thread, on <the CPU>)\" (run "
        f"tests/widgets/e2e/test_notebooks_e2e.py with -s: it prints each notebook's CPU time)"
    )


def check_time(nb: nbformat.NotebookNode, name: str, cpu_seconds: float) -> None:
    """The kernel's CPU time for the whole notebook is within TIME_SLACK of the stated time."""
    stated = stated_seconds(nb)
    assert stated is not None, f"{name}: no stated time"
    print(f"\n{name}: kernel CPU {cpu_seconds:.1f} s, stated {stated:.0f} s")
    assert cpu_seconds <= TIME_SLACK * stated + TIME_MARGIN_S, (
        f"{name}: the kernel took {cpu_seconds:.0f} s of CPU time, the notebook states about "
        f"{stated:.0f} s: measure it again (tests/widgets/e2e/test_notebooks_e2e.py prints it) "
        f"and update the statement"
    )


# ---- what a hover promises --------------------------------------------------------------------
# A graph drawn with lowered= marks each op a float kernel runs with an orange dashed border and
# the notebooks say "hover for the reason": every such box, a collapsed module's too, carries
# the backend's reason in its tooltip, not only the op's name.

_FLOAT_BORDER = re.compile(  # the orange *dashed* border (a quantize box's is solid orange)
    r'<g id="a_node\d+"><a xlink:title="([^"]*)">(?:(?!</a>).)*?stroke="#e6550d"[^>]*dasharray',
    re.S,
)


def _check_float_kernel_tooltips(nb: nbformat.NotebookNode, name: str) -> None:
    for index, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            svg = str(o.get("data", {}).get("image/svg+xml", ""))
            for title in _FLOAT_BORDER.findall(svg):
                assert has_reason(title.split("&#10;")), (
                    f"{name}: cell {index}: a box on a float kernel says no reason on hover: "
                    f"{title!r}"
                )


def has_reason(lines: list[str]) -> bool:
    """Whether a float-kernel box's tooltip lines give a reason: ``op (aten.op): why`` (a
    collapsed module) or ``float kernel aten.op: why`` (an op), not only the op's name.

    >>> has_reason(["float kernels: pool (aten.pool)"])
    False
    >>> has_reason(["float kernels:", "pool (aten.pool): no int8 kernel for it"])
    True
    """
    return any(
        re.search(r"\): .{10,}", line) or re.match(r"float kernel \S+: .{10,}", line)
        for line in lines
    )
