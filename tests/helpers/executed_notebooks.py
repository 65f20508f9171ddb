"""Where the notebook tests leave each notebook they executed, for the documentation site.

``make docs`` renders the notebooks from ``docs/_build/executed/`` and executes only those
missing there or older than the notebook (``docs/execute_notebooks.py``), so a notebook the
tests executed is not executed again by the docs build.
"""

from __future__ import annotations

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
    nbformat.write(nb, partial)
    partial.replace(target)
    return target
