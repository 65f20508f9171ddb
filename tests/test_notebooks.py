"""The teaching notebooks: committed without outputs, and each runs top to bottom without error.

The committed-without-outputs checks always run. The execution with nbclient runs only when the
browser tests are skipped (``QVIZ_SKIP_BROWSER=1``): otherwise
``tests/widgets/e2e/test_notebooks_e2e.py`` runs every notebook in JupyterLab, in a real browser,
and applies the same checks of the executed notebook (``check_executed``) to what the kernel sent
there, so executing each notebook twice would only double the time.

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
    del nb.cells[0]  # the probe: the cell indices are the committed notebook's from here on
    check_executed(nb, path.name)


def check_executed(nb: nbformat.NotebookNode, name: str) -> None:
    """The checks of an executed notebook ``name`` (its cells as committed, with the outputs the
    kernel sent), shared with the JupyterLab run of tests/widgets/e2e/test_notebooks_e2e.py."""
    _check_figures_render(nb, name)
    if name.startswith("02_"):
        _check_prepared_counts(nb)


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
