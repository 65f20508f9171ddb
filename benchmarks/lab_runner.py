"""Run All in JupyterLab, in headless Chromium, timed: the driver of ``notebooks.py --lab``.

One ``jupyter lab`` on 127.0.0.1 (every Jupyter, IPython and matplotlib folder in a temporary
directory, kernel ``python3`` pinned to this interpreter) and one Chromium; each notebook is
copied into the server's root, opened in a fresh browser context (requests leaving 127.0.0.1
are aborted), and timed from "run all cells" until no cell is queued or running. The set-up is
that of the browser tests (tests/widgets/e2e/conftest.py), written again here so that a
benchmark does not import the test suite.

Example::

    with LabRunner() as lab:
        seconds = lab.run_all(Path("notebooks/06_backend_config.ipynb"))
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _machine import Stopwatch

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_DIRS = (
    "IPYTHONDIR",
    "MPLCONFIGDIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "JUPYTER_PATH",
    "JUPYTERLAB_SETTINGS_DIR",
    "JUPYTERLAB_WORKSPACES_DIR",
)
#: Per code cell: "running" while it is queued or running, and its execution count. A queued
#: cell's state is idle until the kernel starts it; its prompt says ``[*]:`` at once.
_STATES = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .filter((c) => c.model.type === 'code')
  .map((c) => [(c.node.querySelector('.jp-InputArea-prompt') || {}).textContent || '', c])
  .map(([prompt, c]) => [
    c.model.executionState === 'running' || /\\*/.test(prompt) ? 'running' : 'idle',
    c.model.executionCount])"""
#: A round trip to the kernel: once it answers, a Run All request is not lost.
_PING = """async () => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  await kernel.requestExecute({ code: '0', store_history: false }).done;
}"""
#: "Run all cells", not waiting for the command's promise (it resolves when all cells ran).
_RUN_ALL = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
_STARTED = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
  .some((p) => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""


def _environment(base: Path) -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg")
    for var in _DIRS:
        (base / var.lower()).mkdir(parents=True)
        env[var] = str(base / var.lower())
    spec = Path(env["JUPYTER_PATH"]) / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"})
    )
    settings = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    news = {"fetchNews": "false", "checkForUpdates": False}
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(news))
    return env


class LabRunner:
    """A JupyterLab server and a Chromium, started on ``__enter__`` and stopped on exit."""

    def __init__(self, timeout_s: float = 900) -> None:
        self.timeout_s = timeout_s
        self.blocked: list[str] = []

    def __enter__(self) -> LabRunner:
        from playwright.sync_api import sync_playwright

        self._base = Path(tempfile.mkdtemp(prefix="qviz-lab-"))
        self.root = self._base / "notebooks"
        self.root.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.token, self.url = secrets.token_hex(16), f"http://127.0.0.1:{port}"
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
        ] + (["--allow-root"] if os.geteuid() == 0 else [])
        log = (self._base / "lab.log").open("wb")
        self._server = subprocess.Popen(
            command,
            env=_environment(self._base),
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self._wait_for_server()
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        return self

    def _wait_for_server(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer in 60 s; see {self._base / 'lab.log'}")

    def __exit__(self, *exc: object) -> None:
        self._browser.close()
        self._playwright.stop()
        self._server.terminate()
        self._server.wait(timeout=15)
        shutil.rmtree(self._base, ignore_errors=True)

    def _route(self, route: Any) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def run_all(self, path: Path, width: int = 1280) -> float:
        """Seconds from "run all cells" until every code cell of ``path`` has run."""
        (self.root / path.name).write_bytes(path.read_bytes())
        context = self._browser.new_context(viewport={"width": width, "height": 1000})
        context.route("**/*", self._route)
        try:
            page = context.new_page()
            page.goto(f"{self.url}/lab/tree/{path.name}?token={self.token}")
            status = page.locator("#jp-main-statusbar").get_by_text("Idle").first
            status.wait_for(timeout=120_000)
            page.evaluate(_PING)
            with Stopwatch() as watch:
                page.evaluate(_RUN_ALL)
                page.wait_for_function(_STARTED, timeout=60_000)
                while watch.elapsed < self.timeout_s:
                    states = page.evaluate(_STATES)
                    if all(state != "running" for state, _ in states):
                        seconds = watch.elapsed
                        if any(count is None for _, count in states):
                            print(
                                f"  {path.name}: some cells did not run (an error stopped Run All)"
                            )
                        return seconds
                    page.wait_for_timeout(100)
            raise RuntimeError(f"{path.name}: Run All did not finish in {self.timeout_s} s")
        finally:
            context.close()
            self._forget()

    def _forget(self) -> None:
        """Shut the kernels down, delete the saved workspaces (the next page opens one tab)."""
        auth = {"Authorization": f"token {self.token}"}

        def call(method: str, path: str) -> Any:
            request = urllib.request.Request(f"{self.url}{path}", method=method, headers=auth)
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")

        for session in call("GET", "/api/sessions"):
            call("DELETE", f"/api/sessions/{session['id']}")
        for space in call("GET", "/lab/api/workspaces")["workspaces"]["ids"]:
            call("DELETE", f"/lab/api/workspaces/{space}")
