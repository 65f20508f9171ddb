"""The README's Python code runs as written: every ```python block, in order, in one process
after a plain ``import qviz`` (the blocks build on each other, as a reader's session does).

The distributed block runs as a one-rank gloo group on 127.0.0.1; files the blocks write
(the Model Explorer data, an ONNX file) go to a temporary folder.
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
    """The bodies of the README's ```python fences, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_has_python_blocks_that_use_the_public_api():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 10
    assert any("qviz.numeric.compare" in b for b in blocks)  # after a plain `import qviz`
    assert any("qviz.viz.graph" in b for b in blocks)


@pytest.mark.slow
def test_every_python_block_of_the_readme_runs_in_order(tmp_path):
    blocks = python_blocks(README.read_text())
    script = "\n".join(
        f"print('--- README block {i}', flush=True)\n{block}" for i, block in enumerate(blocks, 1)
    )
    (tmp_path / "readme.py").write_text(script)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
    }
    out = subprocess.run(
        [sys.executable, "readme.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"--- README block {len(blocks)}" in out.stdout
    assert (tmp_path / "model.onnx").is_file()
