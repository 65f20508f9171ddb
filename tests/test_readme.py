"""The README's Python code runs as written: every ```python block, in order, in one process
(the blocks build on each other, as a reader's session does).

The README is the front door: one example that quantizes the embedded digits model, measures it
with the numeric suite and draws its graph; the manual's code is run by tests/test_docs.py
with the helpers below (``python_blocks``, ``run_blocks``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of a Markdown text's ```python fences, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_blocks(blocks: list[str], cwd: Path, label: str) -> subprocess.CompletedProcess[str]:
    """Run ``blocks`` in order as one script in a fresh interpreter, in ``cwd``.

    A ``--- {label} block {i}`` line is printed before block ``i`` (1-based), so the output says
    how far it got. A distributed block runs as a one-rank gloo group on 127.0.0.1; files the
    blocks write land in ``cwd``.
    """
    script = "\n".join(
        f"print('--- {label} block {i}', flush=True)\n{block}" for i, block in enumerate(blocks, 1)
    )
    (cwd / "blocks.py").write_text(script)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "MPLCONFIGDIR": str(cwd / "mpl"),
    }
    return subprocess.run(
        [sys.executable, "blocks.py"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_ran(out: subprocess.CompletedProcess[str], blocks: list[str], label: str) -> None:
    """The script exited 0 after reaching its last block."""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"--- {label} block {len(blocks)}" in out.stdout


def test_the_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) < 200, "the manual belongs in docs/, the README stays short"
    first_screen = "\n".join(text.splitlines()[:40])
    assert "make run" in first_screen and "make test" in first_screen
    assert "docs/_build/html" in text


def test_the_readme_has_python_blocks_that_use_the_public_api():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 1
    assert any("qviz.numeric.compare" in b for b in blocks)  # after a plain `import qviz`
    assert any("qviz.viz.graph" in b for b in blocks)


def test_the_readme_links_resolve():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text)
    local = [t for t in targets if "://" not in t]
    assert local
    missing = [t for t in local if not (README.parent / t).exists()]
    assert not missing, f"the README links to missing files: {missing}"


@pytest.mark.slow
def test_every_python_block_of_the_readme_runs_in_order(tmp_path):
    blocks = python_blocks(README.read_text())
    assert_ran(run_blocks(blocks, tmp_path, "README"), blocks, "README")
