"""Where the notebook tests leave each notebook they executed, for the documentation site.

``make docs`` renders the notebooks from ``docs/_build/executed/`` and executes only those
missing there or older than the notebook (``docs/execute_notebooks.py``), so a notebook the
tests executed is not executed again by the docs build.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

EXECUTED_DIR = Path(__file__).resolve().parents[2] / "docs" / "_build" / "executed"


def save_executed(nb: nbformat.NotebookNode, name: str) -> Path:
    """Write the executed notebook ``nb`` as ``EXECUTED_DIR / name``, atomically.

    Call it once the notebook's checks have passed, with the cells as committed (no probe cells).
    """
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    target = EXECUTED_DIR / name
    partial = target.with_name(f".{name}.partial")
    nbformat.write(_writable(nb), partial)
    partial.replace(target)
    return target


def _writable(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy nbformat can write: JupyterLab's notebook model gives markdown cells
    ``"attachments": null``, which nbformat's writer cannot iterate (it wants a dict or none)."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if "attachments" in cell and not cell["attachments"]:
            del cell["attachments"]
    return out
