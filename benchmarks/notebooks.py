"""Each teaching notebook's run time: executed top to bottom in a fresh kernel with nbclient,
alone, as ``QVIZ_SKIP_BROWSER=1 make test`` executes it, against the time its first cell states;
with ``--lab``, also Run All in JupyterLab in headless Chromium, as the browser test
tests/widgets/e2e/test_notebooks_e2e.py runs it (and as a learner does).

Run from the repository root (a few minutes; twice that with ``--lab``)::

    .venv/bin/python benchmarks/notebooks.py [--repeat 1] [--lab] [NAME_PART ...]

Prints, per notebook, the best wall time of ``--repeat`` runs (the kernel's start included),
the slowest cell and its time, and the time the notebook's introduction states ("*Time: about
40 s ...*"), or "-" where it states none. With ``--lab``: the best Run All time in JupyterLab
(from the click until no cell is queued or running; the kernel already started) and its ratio
to the nbclient time. The CPU and its int8 flags are printed first: the figures hold for this
machine only.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path

import nbformat
from _machine import Stopwatch, cpu, timed
from lab_runner import LabRunner
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
_STATED = re.compile(r"\*Time:[^*]*?(\d+)\s*(s|min)", re.IGNORECASE)


def stated_seconds(nb: nbformat.NotebookNode) -> float | None:
    """The run time the notebook's markdown states (``*Time: about 40 s ...*``), in seconds."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (found := _STATED.search(cell.source)):
            return float(found.group(1)) * (60 if found.group(2).lower() == "min" else 1)
    return None


def run(path: Path) -> tuple[float, int, float]:
    """(wall seconds, index of the slowest code cell, its seconds) of one fresh execution."""
    nb = nbformat.read(path, as_version=4)
    cell_times: list[tuple[float, int]] = []
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={
        "metadata": {"path": str(path.parent)}})  # fmt: skip
    original = client.async_execute_cell

    async def timed_cell(cell, index, **kwargs):
        with Stopwatch() as watch:
            out = await original(cell, index, **kwargs)
        cell_times.append((watch.seconds, index))
        return out

    client.async_execute_cell = timed_cell  # type: ignore[method-assign]
    _, seconds = timed(client.execute)
    slowest, index = max(cell_times, default=(0.0, -1))
    return seconds, index, slowest


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--lab", action="store_true", help="also time Run All in JupyterLab")
    parser.add_argument("names", nargs="*", help="run only notebooks whose name contains one")
    args = parser.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.names:
        paths = [p for p in paths if any(n in p.name for n in args.names)]
    print(f"CPU: {cpu()}\n")
    with LabRunner() if args.lab else contextlib.nullcontext() as lab:
        table(paths, args.repeat, lab)


def table(paths: list[Path], repeat: int, lab: LabRunner | None) -> None:
    """One row per notebook: nbclient's time, slowest cell, stated time (and JupyterLab's)."""
    print(f"{'notebook':<42}{'s':>7}{'slowest cell':>14}{'its s':>7}{'stated s':>10}"
          + (f"{'lab s':>8}{'lab/s':>7}" if lab else ""))  # fmt: skip
    total, lab_total = 0.0, 0.0
    for path in paths:
        best = min((run(path) for _ in range(repeat)), key=lambda r: r[0])
        stated = stated_seconds(nbformat.read(path, as_version=4))
        total += best[0]
        row = (f"{path.name:<42}{best[0]:>7.1f}{best[1]:>14}{best[2]:>7.1f}"
               f"{'-' if stated is None else f'{stated:.0f}':>10}")  # fmt: skip
        if lab:
            in_lab = min(lab.run_all(path) for _ in range(repeat))
            lab_total += in_lab
            row += f"{in_lab:>8.1f}{in_lab / best[0]:>7.2f}"
        print(row, flush=True)
    print(f"{'all':<42}{total:>7.1f}" + (f"{'':>31}{lab_total:>8.1f}" if lab else ""))
    if lab and lab.blocked:
        print(f"requests that left 127.0.0.1 were blocked: {lab.blocked}")


if __name__ == "__main__":
    main(sys.argv[1:])
