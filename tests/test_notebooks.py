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
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.helpers.executed_notebooks import save_executed
from tests.helpers.notebook_claims import CLAIMS
from tests.helpers.notebook_prose import _DEFINED, PROSE_NUMBERS, _code_numbers, prose_numbers

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
    save_executed(nb, path.name)  # the docs site renders it (make docs does not run it again)


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


# ---- what the prose may say ---------------------------------------------------------------------
# PROSE_NUMBERS and the readers of the Markdown are in tests/helpers/notebook_prose.py; the
# measured claims the prose keeps (CLAIMS) in tests/helpers/notebook_claims.py.


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
