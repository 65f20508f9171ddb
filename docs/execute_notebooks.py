"""Prepare the notebooks the documentation renders, executing only those without a fresh copy.

The committed notebooks (``notebooks/*.ipynb``) carry no outputs; the site shows them with their
outputs and figures. The notebook tests execute every notebook anyway (nbclient in
``tests/test_notebooks.py``, JupyterLab in ``tests/widgets/e2e/test_notebooks_e2e.py``) and
write what they executed to ``docs/_build/executed/`` (``tests/helpers/executed_notebooks.py``,
the one writer of those copies, used here too),
so ``make test`` (pytest, then ``make docs``) executes each notebook once. This script, run by
``make docs`` before Sphinx, executes with nbclient only the notebooks whose executed copy is
missing or older than the notebook (one kernel per notebook, this interpreter,
``OMP_NUM_THREADS=1``, 300 s per cell), then copies every executed notebook to
``docs/notebooks/`` where Sphinx reads it (git ignores those copies).

Usage: ``python docs/execute_notebooks.py [--force] [NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.executed_notebooks import EXECUTED_DIR, save_executed  # noqa: E402

NOTEBOOK_DIR = ROOT / "notebooks"
RENDERED_DIR = ROOT / "docs" / "notebooks"
CELL_TIMEOUT_S = 300
KERNEL_NAME = "python3"


def is_fresh(notebook: Path) -> bool:
    """Whether an executed copy of ``notebook`` exists and is newer than the notebook."""
    executed = EXECUTED_DIR / notebook.name
    return executed.is_file() and executed.stat().st_mtime >= notebook.stat().st_mtime


def _kernel_env(scratch: Path) -> dict[str, str]:
    """An environment whose Jupyter, IPython and matplotlib folders are in ``scratch``, with a
    kernelspec that runs this interpreter (so the notebook sees this qviz and torch)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    for var in ("IPYTHONDIR", "MPLCONFIGDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR"):
        folder = scratch / var.lower()
        folder.mkdir(exist_ok=True)
        env[var] = str(folder)
    spec_dir = scratch / "jupyter_path" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (qviz docs)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    env["JUPYTER_PATH"] = str(scratch / "jupyter_path")
    return env


def execute(notebook: Path) -> None:
    """Execute ``notebook`` in a fresh kernel and write it to ``EXECUTED_DIR``."""
    nb = nbformat.read(notebook, as_version=4)
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="qviz-docs-") as scratch:
        env = _kernel_env(Path(scratch))
        os.environ.clear()
        os.environ.update(env)  # the kernel inherits this environment
        try:
            client = NotebookClient(
                nb,
                timeout=CELL_TIMEOUT_S,
                kernel_name=KERNEL_NAME,
                resources={"metadata": {"path": str(notebook.parent)}},
            )
            client.execute()
        except CellExecutionError as exc:
            raise SystemExit(f"{notebook.name}: a cell failed\n{exc}") from None
        finally:
            os.environ.clear()
            os.environ.update(saved)
    save_executed(nb, notebook.name)


def copy_for_sphinx(notebooks: list[Path]) -> None:
    """Copy each executed notebook where Sphinx reads it; drop copies of removed notebooks."""
    RENDERED_DIR.mkdir(parents=True, exist_ok=True)
    names = {nb.name for nb in notebooks}
    for stale in RENDERED_DIR.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    for notebook in notebooks:
        source, target = EXECUTED_DIR / notebook.name, RENDERED_DIR / notebook.name
        if not source.is_file():  # not executed (a chosen subset): Sphinx names it missing
            continue
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    parser.add_argument("--force", action="store_true", help="execute even fresh ones")
    args = parser.parse_args(argv)
    notebooks = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    wanted = set(args.names)
    chosen = [nb for nb in notebooks if not wanted or {nb.stem, nb.name} & wanted]
    for notebook in chosen:
        if is_fresh(notebook) and not args.force:
            continue
        start = time.perf_counter()
        where = EXECUTED_DIR.relative_to(ROOT)
        print(f"executing {notebook.name} (no fresh copy in {where})", flush=True)
        execute(notebook)
        print(f"  {notebook.name}: {time.perf_counter() - start:.0f} s", flush=True)
    copy_for_sphinx(notebooks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
