"""The documentation's Python code runs as written: every ```python block of each page of
docs/, in order, in one process per page (a page's blocks build on each other; each page that
needs the quantized digits model builds it in its first block).

The helpers are the README test's (tests/test_readme.py). The site itself is built by
``make docs`` (Sphinx, warnings as errors); these tests check what pytest can check cheaply:
the pages exist, the toctree names them, and their code runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_readme import assert_ran, python_blocks, run_blocks

DOCS = Path(__file__).parents[1] / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
PAGES_WITH_CODE = [p for p in PAGES if python_blocks(p.read_text())]
#: The README's former sections, each a guide page now.
GUIDES = {
    "quantize",
    "qat",
    "distributed",
    "model-explorer",
    "views",
    "numeric",
    "mixed-precision",
    "widgets",
    "backend-config",
    "tensor-toolkit",
    "onnx",
    "lowering",
    "repair",
    "calibration",
}


def _name(page: Path) -> str:
    return str(page.relative_to(DOCS).with_suffix(""))


def test_every_guide_is_a_page_with_its_code():
    assert {p.stem for p in PAGES if p.parent.name == "guides"} >= GUIDES
    assert len(PAGES_WITH_CODE) >= 10
    blocks = [b for p in PAGES_WITH_CODE for b in python_blocks(p.read_text())]
    for api in ("qviz.prepare_pt2e", "compare(", "graph(", "search_precision", "qviz.lower"):
        assert any(api in b for b in blocks), api


def test_every_page_is_in_a_toctree():
    toctrees = "\n".join(
        m for p in PAGES for m in re.findall(r"```\{toctree\}\n(.*?)```", p.read_text(), re.S)
    )
    listed = {_name(p) for p in PAGES if _name(p) != "index"}
    entries = set(re.findall(r"^([\w/-]+)$", toctrees, flags=re.M))
    missing = {n for n in listed if n not in entries and n.split("/")[-1] not in entries}
    assert not missing, f"pages no toctree names: {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_name)
def test_every_python_block_of_a_page_runs_in_order(page: Path, tmp_path: Path):
    blocks = python_blocks(page.read_text())
    label = _name(page)
    assert_ran(run_blocks(blocks, tmp_path, label), blocks, label)


def test_an_executed_notebook_from_jupyterlab_is_saved_for_the_site(tmp_path, monkeypatch):
    """JupyterLab's notebook model gives markdown cells ``"attachments": null``; the saved copy
    is a valid notebook with the outputs kept, and the test's own notebook is not changed."""
    import nbformat

    from tests.helpers import executed_notebooks

    monkeypatch.setattr(executed_notebooks, "EXECUTED_DIR", tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_code_cell("1 + 1")]
    nb.cells[0]["attachments"] = None
    out = nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)
    nb.cells[1].outputs = [out]
    saved = executed_notebooks.save_executed(nbformat.from_dict(nb), "lab.ipynb")
    back = nbformat.read(saved, as_version=4)
    nbformat.validate(back)
    assert back.cells[1].outputs[0]["data"]["text/plain"] == "2"
    assert "attachments" not in back.cells[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lab.ipynb"]  # no partial file left
