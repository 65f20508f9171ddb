"""Every teaching notebook, run with Run All in JupyterLab in a real browser.

For each notebook in notebooks/: a copy is opened in the session's JupyterLab (its own kernel,
this interpreter), every cell is run with "Run All", and the test checks what a learner sees:

* no cell raised (the failure names the cell's index, as in the committed notebook, and the
  error), and the checks of an executed notebook in tests/test_notebooks.py (``check_executed``)
  hold for the outputs the kernel sent;
* every value a cell displayed (the kernel's ``Out``) is on the page, every image and SVG has a
  non-zero rendered size and loaded, no output shows a traceback;
* every widget rendered (no "Loading widget..." or "Error displaying widget" left);
* no request left 127.0.0.1 and the page raised no JavaScript error;
* every solution cell is still folded after Run All (its code hidden, its output a closed
  ``<details>``), and every box a float kernel runs says why on hover;
* the kernel's CPU time is within what the notebook's stated time allows (``check_time``);
* the exercise's clicks, for the notebooks whose exercises click a widget (``EXERCISES``).

With ``QVIZ_SCREENSHOTS`` set, screenshots of the whole notebook at 1280 and 1920 px wide go to
``$QVIZ_SCREENSHOTS/<notebook>_<width>.png`` (stitched while scrolling, since JupyterLab only
paints the cells in view; without it no picture is taken: nobody looks at one in a temporary
folder). Every run writes ``<notebook>_layout.json``: per output its size, horizontal overflow
and smallest text in CSS px at both widths, and prints what a reader would notice. Each
notebook's Run All wall time is printed (``pytest -s``) and written to
``$QVIZ_SCREENSHOTS/lab_times.json``.

This test executes the notebooks; tests/test_notebooks.py executes them with nbclient only when
the browser tests are skipped (``QVIZ_SKIP_BROWSER=1``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.helpers.executed_notebooks import save_executed
from tests.test_notebooks import (
    CPU_SECONDS,
    GUARD_LINE,
    SOLUTION_SUMMARY,
    check_executed,
    check_time,
    has_reason,
)
from tests.widgets.e2e.conftest import Lab, graph_group, labelled

pytestmark = pytest.mark.browser

NOTEBOOK_DIR = Path(__file__).resolve().parents[3] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
#: Alone a notebook takes 10-25 s; a machine busy with other tests makes it many times that.
RUN_ALL_S = 600
WIDGETS_S = 30
WIDTHS = (1280, 1920)
#: The viewport's height while the screenshots are taken (fewer pieces to stitch).
SHOT_HEIGHT = 2000
SMALL_TEXT_PX = 10
#: Whether the whole-notebook pictures are taken (``QVIZ_SCREENSHOTS`` names their folder).
SHOTS = bool(os.environ.get("QVIZ_SCREENSHOTS"))

#: Per code cell: its index, "running" while it is queued or running, and its execution count.
#: A queued cell's state is idle until the kernel starts it; its prompt says ``[*]:`` at once.
_STATES = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .map((c, index) => [index, c, (c.node.querySelector('.jp-InputArea-prompt') || {}).textContent])
  .filter(([, c]) => c.model.type === 'code')
  .map(([index, c, prompt]) => [index,
    c.model.executionState === 'running' || /\\*/.test(prompt || '') ? 'running' : 'idle',
    c.model.executionCount])"""

#: "Run all cells", not waiting for the command's promise (it resolves when all cells ran).
_RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
_STARTED = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
  .some((p) => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""

#: The notebook as the kernel's messages left it, every output's data but text/plain emptied.
_NOTEBOOK = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content.model.toJSON();
  for (const cell of nb.cells) for (const o of cell.outputs || []) for (const k in o.data || {})
    if (k !== 'text/plain') o.data[k] = '';
  return nb;
}"""

#: Per rendered output, each cell scrolled into view first (JupyterLab skips painting cells out
#: of view): its size, horizontal overflow, images or SVGs that did not render, the scale of each
#: image, the smallest text in CSS px and its text.
_RENDERED = """async () => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const frames = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const found = [];
  for (const [index, cell] of nb.widgets.entries()) {
    const outputs = [...cell.node.querySelectorAll('.jp-OutputArea-output')];
    if (cell.model.type !== 'code' || !outputs.length) continue;
    cell.node.scrollIntoView({ block: 'start' });
    await frames();
    const right = cell.node.getBoundingClientRect().right;
    outputs.forEach((o, n) => {
      const box = o.getBoundingClientRect();
      const media = [...o.querySelectorAll('img, svg')]
        .filter((e) => !e.parentElement.closest('svg') && e.checkVisibility());
      const broken = media.filter((e) => {
        const b = e.getBoundingClientRect();
        return b.width < 1 || b.height < 1 || (e.tagName === 'IMG' && !e.naturalWidth);
      }).map((e) => e.tagName);
      const scales = media.filter((e) => e.tagName === 'IMG' && e.naturalWidth)
        .map((e) => +(e.getBoundingClientRect().width / e.naturalWidth).toFixed(2));
      let small = null;
      for (const e of o.querySelectorAll('*')) {
        if (![...e.childNodes].some((t) => t.nodeType === 3 && t.textContent.trim())) continue;
        if (!e.checkVisibility()) continue;
        let px = parseFloat(getComputedStyle(e).fontSize);
        const m = e instanceof SVGGraphicsElement ? e.getScreenCTM() : null;
        if (m) px *= Math.hypot(m.a, m.b);
        const text = e.textContent.trim().slice(0, 40);
        if (!small || px < small.px) small = { px: +px.toFixed(1), text };
      }
      found.push({ cell: index, output: n, mime: o.dataset.mimeType || '', width: box.width,
        height: box.height, overflow: o.scrollWidth - o.clientWidth, past_cell: box.right - right,
        broken, scales, small, text: o.textContent.slice(0, 3000) });
    });
  }
  return found;
}"""

#: The notebook's scrolling element: its height, the height in view, and its box on the page.
_SCROLLER = """(top) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const s = [nb.node, ...nb.node.querySelectorAll('*')]
    .find((e) => e.scrollHeight > e.clientHeight + 1
      && /auto|scroll/.test(getComputedStyle(e).overflowY))
    || nb.node;
  if (top !== null) s.scrollTop = top;
  const r = s.getBoundingClientRect();
  return { top: s.scrollTop, height: s.scrollHeight, view: s.clientHeight,
           box: { x: r.x, y: r.y, width: r.width, height: r.height } };
}"""


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def run_all(page: Any, name: str, timeout_s: float = RUN_ALL_S) -> tuple[float, dict[int, float]]:
    """Run All; wait until no code cell is queued or running. Returns the wall seconds and, by
    cell index, the seconds from the start until the cell finished (to 0.1 s)."""
    Lab.kernel_json(page, "0")  # a round trip: the kernel is connected, Run All is not lost
    start = time.perf_counter()
    page.evaluate(_RUN_ALL)
    page.wait_for_function(_STARTED, timeout=30_000)
    deadline = time.monotonic() + timeout_s
    finished: dict[int, float] = {}
    while time.monotonic() < deadline:
        states = page.evaluate(_STATES)
        for index, state, count in states:
            if state != "running" and count is not None:
                finished.setdefault(index, time.perf_counter() - start)
        if all(state != "running" for _, state, _ in states):
            return time.perf_counter() - start, finished
        page.wait_for_timeout(100)
    done = sum(count is not None and state != "running" for _, state, count in states)
    pytest.fail(f"{name}: Run All did not finish in {timeout_s} s ({done}/{len(states)} cells)")


def _executed(page: Any) -> nbformat.NotebookNode:
    return nbformat.from_dict(page.evaluate(_NOTEBOOK))


def _check_errors(nb: nbformat.NotebookNode, name: str) -> None:
    """No error output and no traceback on stderr; every code cell with code was run."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            if output.output_type == "error":
                pytest.fail(
                    f"{name}: cell {index} raised {output.ename}: {output.evalue}\n"
                    f"--- cell source ---\n{cell.source}",
                    pytrace=False,
                )
            text = output.get("text", "")
            if output.get("name") == "stderr" and "Traceback (most recent call last)" in text:
                pytest.fail(f"{name}: cell {index} printed a traceback:\n{text[-3000:]}")
        if cell.source.strip() and cell.execution_count is None:
            pytest.fail(f"{name}: cell {index} was not run (an earlier cell stopped Run All?)")


def _wait_for_widgets(page: Any, name: str) -> None:
    """Every widget view rendered: no "Loading widget..." left, no "Error displaying widget"."""
    pending = ".jp-OutputArea-output:has-text('Loading widget...')"
    deadline = time.monotonic() + WIDGETS_S
    while page.locator(pending).count() and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    for text in ("Loading widget...", "Error displaying widget"):
        stuck = page.locator(f".jp-OutputArea-output:has-text('{text}')")
        assert stuck.count() == 0, f"{name}: {stuck.count()} outputs still show {text!r}"


def _check_rendered(page: Any, nb: nbformat.NotebookNode, name: str) -> list[dict[str, Any]]:
    """Each value the kernel's ``Out`` holds is on the page, with a non-zero size; no image or
    SVG failed to render; no output shows a traceback. Returns the measurements."""
    rendered = page.evaluate(_RENDERED)
    by_cell: dict[int, list[dict[str, Any]]] = {}
    for output in rendered:
        by_cell.setdefault(output["cell"], []).append(output)
        where = f"{name}: cell {output['cell']} output {output['output']} ({output['mime']})"
        assert not output["broken"], f"{where}: {output['broken']} with no rendered size or image"
        assert "Traceback (most recent call last)" not in output["text"] or (
            "stderr" in output["mime"]
        ), f"{where} shows a traceback: {output['text'][-500:]}"
    shown = {int(n): kind for n, kind in Lab.kernel_json(page, _OUT).items()}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.execution_count not in shown:
            continue
        kind = shown[cell.execution_count]
        results = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert results, f"{name}: cell {index} displays a {kind} but has no result output"
        sizes = [(o["width"], o["height"]) for o in by_cell.get(index, [])]
        assert any(w >= 1 and h >= 1 for w, h in sizes), (
            f"{name}: cell {index} displays a {kind}, but nothing of it is on the page: {sizes}"
        )
    return rendered


#: The type of each value the kernel's ``Out`` holds, by execution count.
_OUT = "{n: type(v).__name__ for n, v in Out.items()}"

#: The tooltip (SVG <title> or xlink:title) of each box drawn with a float kernel's border
#: (orange, dashed) in the outputs: what a hover shows.
_FLOAT_TOOLTIPS = """() => [...document.querySelectorAll('.jp-Cell-outputArea svg g.node')]
  .filter((g) => [...g.querySelectorAll('[stroke="#e6550d"]')]
    .some((e) => e.getAttribute('stroke-dasharray')))
  .map((g) => { const a = g.querySelector('a');
    return (a && (a.getAttribute('xlink:title') || a.getAttribute('title')))
      || (g.querySelector('title') || {}).textContent || ''; })"""

#: For the code cells at the given indices, each scrolled into view first (JupyterLab paints only
#: the cells in view): whether its input is collapsed, and the text its outputs show on screen (a
#: closed <details> shows only its summary).
_FOLDED = """async (indices) => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets;
  const frames = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const found = [];
  for (const index of indices) {
    const c = cells[index];
    c.node.scrollIntoView({ block: 'start' });
    await frames();
    found.push([index, c.inputHidden,
      [...c.node.querySelectorAll('.jp-OutputArea-output')].map((o) => o.innerText.trim())]);
  }
  return found;
}"""


def _check_hover_reasons(page: Any, name: str) -> None:
    """Every box a float kernel runs says why on hover (issue: only the op's name)."""
    for title in page.evaluate(_FLOAT_TOOLTIPS):
        assert has_reason(title.splitlines()), f"{name}: a float-kernel box's hover: {title!r}"


def _check_solutions_folded(page: Any, nb: Any, name: str) -> None:
    """After Run All, every solution cell is still folded: its code hidden, and on screen of
    its output only the fold's summary line (and the test's solution guard line)."""
    solutions = [
        index for index, cell in enumerate(nb.cells)
        if "solution" in cell.metadata.get("tags", []) and cell.cell_type == "code"
    ]  # fmt: skip
    for index, hidden, texts in page.evaluate(_FOLDED, solutions):
        shown = [t for t in texts if t and not t.startswith(GUARD_LINE)]
        assert hidden and shown == [SOLUTION_SUMMARY], (
            f"{name}: solution cell {index} is open after Run All: code hidden {hidden}, "
            f"outputs on screen {shown}"
        )


def _findings(rendered: list[dict[str, Any]], width: int) -> list[str]:
    """What a reader would notice: overflow, outputs past the cell, small text, empty outputs,
    images drawn smaller than their pixels."""
    found = []
    for o in rendered:
        where = f"cell {o['cell']} output {o['output']} ({o['mime'] or '?'}) at {width}px"
        if o["overflow"] > 1:
            found.append(f"{where}: scrolls horizontally ({o['overflow']:.0f} px hidden)")
        if o["past_cell"] > 1:
            found.append(f"{where}: reaches {o['past_cell']:.0f} px past the cell")
        if o["small"] and o["small"]["px"] < SMALL_TEXT_PX:
            found.append(f"{where}: text {o['small']['px']} px ({o['small']['text']!r})")
        if o["width"] < 1 or o["height"] < 1:
            found.append(f"{where}: empty ({o['width']:.0f}x{o['height']:.0f})")
        if any(s < 0.49 for s in o["scales"]):  # 0.5: drawn at twice the pixels, for sharpness
            found.append(f"{where}: image drawn at {min(o['scales'])} of its size")
    return found


def screenshot(page: Any, path: Path) -> None:
    """The whole notebook as one image: scrolled through one view at a time, the pieces pasted
    at their scroll offsets (JupyterLab paints only the cells in view)."""
    from PIL import Image

    page.evaluate(_SCROLLER, 0)
    page.wait_for_timeout(300)
    geometry = page.evaluate(_SCROLLER, None)
    box, view = geometry["box"], geometry["view"]
    pieces = []
    top = 0
    while True:
        geometry = page.evaluate(_SCROLLER, top)
        page.wait_for_timeout(150)  # two frames and the images of the cells now in view
        pieces.append((geometry["top"], path.with_suffix(f".{len(pieces)}.png")))
        page.screenshot(path=pieces[-1][1], clip=box)
        if geometry["top"] + view >= geometry["height"] - 1:
            break
        top = geometry["top"] + view
    height = pieces[-1][0] + view
    with Image.new("RGB", (round(box["width"]), round(height)), "white") as whole:
        for offset, piece in pieces:
            with Image.open(piece) as image:
                whole.paste(image, (0, round(offset)))
            piece.unlink()
        whole.save(path)


def _record_time(folder: Path, name: str, seconds: float, finished: dict[int, float]) -> None:
    """Print the Run All time and the slowest cells; add the time to lab_times.json."""
    ends = sorted((end, index) for index, end in finished.items())
    starts = [0.0] + [end for end, _ in ends[:-1]]
    took = [(end - begin, index) for (end, index), begin in zip(ends, starts, strict=True)]
    slowest = ", ".join(f"cell {n} {t:.1f} s" for t, n in sorted(took, reverse=True)[:3])
    print(f"\n{name}: Run All in JupyterLab {seconds:.1f} s (slowest {slowest})")
    if os.environ.get("QVIZ_SCREENSHOTS"):
        times = folder / "lab_times.json"
        recorded = json.loads(times.read_text()) if times.is_file() else {}
        recorded[name] = round(seconds, 2)
        times.write_text(json.dumps(recorded, indent=1, sort_keys=True))


def _cell_of(page: Any, selector: str) -> Any:
    """The code cell whose output holds ``selector``, scrolled into view."""
    cell = page.locator(f".jp-CodeCell:has({selector})").first
    cell.scroll_into_view_if_needed()
    return cell


def _accuracy(scores: str) -> float:
    """The accuracy in percent from notebook 05's ``scores(...)`` line."""
    return float(re.search(r"accuracy ([\d.]+)%", scores).group(1))


def _exercise_05(page: Any) -> None:
    """Notebook 05, its three exercises clicked as a learner does, each checked by the number
    the notebook's check cell prints: the dashboard's red layer fallen back (accuracy back to
    the float model's), the editor's per-channel weight for it (the same, every layer int8),
    the explorer's entropy ranges for every observer (the glitched calibration survived)."""
    name, run = "05_interactive_quantization", Lab.kernel_json
    dash = _cell_of(page, "table.qviz-dash-history")
    red = graph_group(dash, "node", "conv2d_4")
    assert red.count(), f"{name}: the dashboard's graph has no conv2d_4 box"
    red.first.locator("text").first.click()
    Lab.wait_kernel(page, "dash.state.selected", "conv2d_4", timeout_s=30)
    history = _press(page, dash, "fallback this layer", len(_history(dash)))
    assert run(page, "dash.history[-1]['metric']") > 0.99, f"{name}: fallback history {history}"

    editor = _cell_of(page, "label.widget-label:text-is('qscheme')")
    editor.locator("input.qviz-graph-search").fill("conv2d_4")  # centres the box in the pane
    graph_group(editor, "node", "conv2d_4").first.locator("text").first.click()
    # the click's refresh resets the controls: choose only once the kernel holds the selection
    Lab.wait_kernel(page, "editor.selection", "conv2d_4", timeout_s=30)
    labelled(editor, "widget-dropdown", "edit").locator("select").select_option(
        label="conv2_0_weight -> conv2d_4"
    )
    labelled(editor, "widget-dropdown", "qscheme").locator("select").select_option(
        "per_channel_symmetric"
    )
    chosen = "[editor.view.controls[k].value for k in ('target', 'qscheme')]"
    Lab.wait_kernel(page, chosen, ["conv2_0_weight -> conv2d_4", "per_channel_symmetric"], 30)
    editor.get_by_role("button", name="Apply").click()
    edit = {"conv2_0_weight -> conv2d_4": {"qscheme": "per_channel_symmetric"}}
    Lab.wait_kernel(page, "editor.overrides", edit, timeout_s=30)
    assert _accuracy(run(page, "scores(quantize(editor.quantizer))")) > 99, f"{name}: editor"

    explorer = _cell_of(page, "button:text-is('Apply to all')")
    toggles = explorer.locator(".widget-toggle-buttons button")
    toggles.filter(has_text=re.compile("^entropy$")).click()
    explorer.get_by_role("button", name="Apply to all").click()
    Lab.wait_kernel(page, "sorted(set(explorer.choices.values()))", ["entropy"], timeout_s=30)
    measured = run(page, "scores(qviz.convert_pt2e(prepared))")
    assert _accuracy(measured) > 99, f"{name}: the explorer's entropy ranges give {measured}"


#: The fill colours of the graph's nodes in a cell, joined.
_FILLS = """(cell) => [...cell.querySelectorAll('.qviz-graph svg g.node [fill]')]
  .map((e) => e.getAttribute('fill')).join()"""


def _exercise_11(page: Any) -> None:
    """Notebook 11, PrecisionExplorer: click another point of the Pareto plot; the point's line,
    the table and the graph's colours change; "use this" says which point is in use."""
    cell = _cell_of(page, ".qviz-pareto")
    line = cell.locator(".qviz-precision-point").first
    current = re.match(r"point (\d+)", line.inner_text())
    assert current, f"11_mixed_precision: the explorer names no point: {line.inner_text()!r}"
    points = cell.locator(".qviz-pareto [id^='qviz-point-']").count()
    target = 0 if int(current.group(1)) != 0 else points - 1
    table = cell.locator("table.qviz-precision-table").first.inner_text()
    fills = cell.evaluate(_FILLS)
    point = cell.locator(f".qviz-pareto #qviz-point-{target}").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    assert box is not None, f"11_mixed_precision: Pareto point {target} is not drawn"
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    line.locator(f"text=/^point {target}\\b/").wait_for(timeout=30_000)
    page.wait_for_function(
        f"([cell, before]) => ({_FILLS})(cell) !== before",
        arg=[cell.element_handle(), fills],
        timeout=30_000,
    )
    after = cell.locator("table.qviz-precision-table").first.inner_text()
    assert after != table, f"11_mixed_precision: the table did not change for point {target}"
    cell.get_by_role("button", name="use this").click()
    cell.locator(f"text=using point {target}").first.wait_for(timeout=30_000)


def _history(cell: Any) -> list[list[str]]:
    text = cell.locator("table.qviz-dash-history").first.inner_text()
    return [line.split("\t") for line in text.splitlines() if re.match(r"\d", line)]


def _press(page: Any, cell: Any, button: str, rows: int) -> list[list[str]]:
    """Click ``button`` in ``cell``; wait until the history has more than ``rows`` rows."""
    cell.locator("button", has_text=re.compile(rf"^\s*{button}\s*$")).click()
    page.wait_for_function(
        "([cell, rows]) => cell.querySelectorAll('table.qviz-dash-history tr').length > rows + 1",
        arg=[cell.element_handle(), rows],
        timeout=120_000,
    )
    return _history(cell)


def _exercise_10(page: Any) -> None:
    """Notebook 10, NumericDashboard of a RepairSession: "undo" takes the applied remedy back
    (the output SQNR is the first run's again); "apply" applies it again (the same SQNR)."""
    cell = _cell_of(page, "table.qviz-dash-history")
    before = _history(cell)
    assert len(before) >= 2, f"10_repair: the dashboard's history has no applied remedy: {before}"
    undone = _press(page, cell, "undo", len(before))
    assert undone[-1][1].startswith("undo"), f"10_repair: the undo row is {undone[-1]}"
    assert undone[-1][2] == before[-2][2], f"10_repair: undo did not restore: {undone}"
    again = _press(page, cell, "apply", len(undone))
    assert again[-1][1] == before[-1][1], f"10_repair: apply ran {again[-1]}, not {before[-1]}"
    assert again[-1][2] == before[-1][2], f"10_repair: the same remedy measured {again}"


#: Per notebook (its stem): the clicks its exercise asks for, with the visible result checked.
EXERCISES: dict[str, Callable[[Any], None]] = {
    "05_interactive_quantization": _exercise_05,
    "10_repair": _exercise_10,
    "11_mixed_precision": _exercise_11,
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_in_jupyterlab(path: Path, lab: Any, screenshots: Path) -> None:
    name = path.stem
    page = lab.open_notebook_file(path)
    _record_time(screenshots, name, *run_all(page, name))
    cpu = Lab.kernel_json(page, CPU_SECONDS)
    nb = _executed(page)
    _check_errors(nb, name)
    check_executed(nb, path.name)
    check_time(nb, path.name, cpu)
    save_executed(nb, path.name)  # the docs site renders it (make docs does not run it again)
    _check_solutions_folded(page, nb, name)
    _wait_for_widgets(page, name)
    _check_hover_reasons(page, name)
    layout = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": SHOT_HEIGHT})
        page.wait_for_timeout(500)  # JupyterLab lays the notebook out again
        rendered = _check_rendered(page, nb, name)
        if SHOTS:  # the stitched picture is for a person: about 5 s a notebook, so on request
            screenshot(page, screenshots / f"{name}_{width}.png")
        layout[width] = {"findings": _findings(rendered, width), "outputs": rendered}
        for finding in layout[width]["findings"]:
            print(f"  {name}: {finding}")
    for outputs in (layout[w]["outputs"] for w in WIDTHS):
        for output in outputs:
            output["text"] = output["text"][:200]
    (screenshots / f"{name}_layout.json").write_text(json.dumps(layout, indent=1))
    if name in EXERCISES:
        EXERCISES[name](page)
    assert lab.blocked == [], f"{name}: requests left 127.0.0.1: {lab.blocked}"
    assert lab.errors == [], f"{name}: the page raised: {lab.errors}"
