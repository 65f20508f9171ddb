"""Real-browser tests: JupyterLab on 127.0.0.1 driven by Debian's Chromium through playwright.

Set-up, once per session: a ``jupyter lab`` server (token, free port, every Jupyter, IPython and
matplotlib folder in a temporary directory, the news toast switched off, kernel ``python3``
pinned to this interpreter) and Chromium with a fixed set of flags. Each test gets a fresh
browser context that lets nothing leave 127.0.0.1: other requests are aborted and recorded in
``lab.blocked``, so a test proves the page needs no network.

Skip policy: ``QVIZ_SKIP_BROWSER=1`` skips these tests; otherwise a missing Chromium, playwright
or JupyterLab is a failure that says how to install it (``make test`` installs Chromium).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.test_notebooks import KERNEL_THREADS, install_solution_guard

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KERNEL_NAME = "python3"
SERVER_START_S = 60
KERNEL_IDLE_MS = 60_000
RUN_ALL_MS = 120_000
RUN_ALL_ATTEMPTS = 4
_LOCAL_HOSTS = {"127.0.0.1"}
_ENV_DIRS = (
    "IPYTHONDIR",
    "MPLCONFIGDIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "JUPYTER_PATH",
    "JUPYTERLAB_SETTINGS_DIR",
    "JUPYTERLAB_WORKSPACES_DIR",
)
#: The JavaScript that runs code on the notebook's kernel (outside any cell) and returns stdout.
_KERNEL_RUN = """
async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({ code, store_history: false });
  let out = "", err = "";
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === "stream") out += msg.content.text;
    if (msg.header.msg_type === "error") err += `${msg.content.ename}: ${msg.content.evalue}`;
  };
  await future.done;
  return { out, err };
}
"""
_NO_NEWS = {"fetchNews": "false", "checkForUpdates": False}
_PROMPT_DONE = re.compile(r"^\[\d+\]:$")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives JupyterLab in headless Chromium (QVIZ_SKIP_BROWSER=1 skips)"
    )


def _missing_tools() -> list[str]:
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append(
            f"Chromium at {CHROMIUM}: run `make test` (it installs Debian's chromium as root) "
            f"or `sudo apt-get install chromium`"
        )
    for module, package in (("playwright", "playwright"), ("jupyterlab", "jupyterlab")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"the {package} package: pip install -e '.[test]' (or `make test`)")
    return missing


@pytest.fixture(scope="session")
def browser_tools() -> None:
    """Skip on QVIZ_SKIP_BROWSER=1; fail, saying what to install, when a tool is missing."""
    if os.environ.get("QVIZ_SKIP_BROWSER") == "1":
        pytest.skip("browser tests skipped: QVIZ_SKIP_BROWSER=1")
    missing = _missing_tools()
    if missing:
        pytest.fail(
            "the browser tests need " + "; ".join(missing) + " (or set QVIZ_SKIP_BROWSER=1 to "
            "skip them locally)",
            pytrace=False,
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _isolated_env(base: Path) -> dict[str, str]:
    """Jupyter, IPython and matplotlib folders under ``base``; kernel python3 = this Python."""
    env = dict(os.environ)
    for var in _ENV_DIRS:
        folder = base / var.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[var] = str(folder)
    env["MPLBACKEND"] = "Agg"
    # the notebooks' checks, as tests/test_notebooks.py's kernels have them: one thread (the
    # kernel's CPU time is compared with the time a notebook states) and the solution guard
    env["OMP_NUM_THREADS"] = KERNEL_THREADS
    install_solution_guard(Path(env["IPYTHONDIR"]))
    spec_dir = Path(env["JUPYTER_PATH"]) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (qviz tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    settings = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(_NO_NEWS))
    return env


def _wait_for_server(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"jupyter lab did not answer in {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


@dataclass
class LabServer:
    """A running ``jupyter lab``: its base URL, token and root folder."""

    url: str
    token: str
    root: Path


@pytest.fixture(scope="session")
def lab_server(
    browser_tools: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabServer]:
    base = tmp_path_factory.mktemp("jupyter")
    root = base / "notebooks"
    root.mkdir()
    env = _isolated_env(base)
    port, token = _free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = base / "jupyter-lab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(proc, f"{url}/api/status?token={token}", log)
        yield LabServer(url, token, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def chromium(browser_tools: None) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


@dataclass
class Lab:
    """One test's browser context on the server.

    ``blocked`` lists the requests aborted for leaving 127.0.0.1, ``errors`` the pages'
    uncaught JavaScript errors.
    """

    server: LabServer
    context: Any
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _route(self, route: Any) -> None:
        url = route.request.url
        if urlsplit(url).hostname in _LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    @staticmethod
    def kernel_json(page: Any, expression: str) -> Any:
        """``expression`` evaluated in the open notebook's kernel, sent back as JSON."""
        code = f"import json as _json\nprint(_json.dumps({expression}))"
        result = page.evaluate(_KERNEL_RUN, code)
        assert not result["err"], f"the kernel raised on {expression!r}: {result['err']}"
        return json.loads(result["out"])

    @staticmethod
    def wait_kernel(page: Any, expression: str, expected: Any, timeout_s: float = 10) -> None:
        """Poll the kernel until ``expression`` equals ``expected`` (widget updates are
        batched, so a click's effect reaches the kernel a moment later)."""
        deadline = time.monotonic() + timeout_s
        while (value := Lab.kernel_json(page, expression)) != expected:
            assert time.monotonic() < deadline, f"{expression} = {value!r}, expected {expected!r}"
            page.wait_for_timeout(200)

    def open_notebook(self, cells: list[str], name: str = "e2e.ipynb") -> Any:
        """Write ``cells`` as a notebook, open it, run every cell; returns the page."""
        import nbformat

        nb = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(source) for source in cells],
            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3"}},
        )
        nbformat.write(nb, self.server.root / name)
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.goto(f"{self.server.url}/lab/tree/{name}?token={self.server.token}")
        wait_for_idle_kernel(page)
        run_all_cells(page, len(cells))
        return page

    def open_notebook_file(self, path: Path) -> Any:
        """Copy the notebook at ``path`` into the server's root and open it, idle, without
        running it; returns the page."""
        (self.server.root / path.name).write_bytes(path.read_bytes())
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.goto(f"{self.server.url}/lab/tree/{path.name}?token={self.server.token}")
        wait_for_idle_kernel(page)
        return page


def graph_group(root: Any, kind: str, title: str) -> Any:
    """The ``<g class=kind>`` of a qviz graph under ``root`` (the page, or a locator such as
    one notebook cell) whose SVG title is exactly ``title``."""
    page = getattr(root, "page", root)  # a locator's page; a page is its own (has= needs it)
    exact = page.locator("title", has_text=re.compile(f"^{re.escape(title)}$"))
    return root.locator(f".qviz-graph g.{kind}").filter(has=exact)


def labelled(root: Any, widget_class: str, description: str) -> Any:
    """The ipywidgets control of class ``widget_class`` (``widget-dropdown``...) under
    ``root`` whose label is exactly ``description``."""
    page = getattr(root, "page", root)
    exact = re.compile(f"^{re.escape(description)}$")
    label = page.locator("label.widget-label", has_text=exact)
    return root.locator(f".{widget_class}").filter(has=label)


def wait_for_idle_kernel(page: Any) -> None:
    """Wait until the notebook's cells exist and the status bar says the kernel is Idle."""
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=KERNEL_IDLE_MS)
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(timeout=KERNEL_IDLE_MS)


def _prompts(page: Any) -> list[str]:
    prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
    return [p.strip() for p in prompts]


def start_run_all(page: Any) -> None:
    """Send "run all cells" until the first prompt shows it started (``[*]:`` or ``[n]:``).

    The toolbar says idle about 1.5 s before the kernel is connected, and a request sent then is
    silently dropped.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(RUN_ALL_ATTEMPTS):
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        try:
            page.wait_for_function(
                "() => { const p = document.querySelector("
                "'.jp-Notebook .jp-CodeCell .jp-InputArea-prompt');"
                " return p && /\\[(\\*|\\d+)\\]/.test(p.textContent); }",
                timeout=3000,
            )
            break
        except PlaywrightTimeout:  # the request was lost: send it again
            continue
    else:
        pytest.fail(f"the cells never started running; prompts: {_prompts(page)}")


def run_all_cells(page: Any, count: int) -> None:
    """Run all cells; resend when the request was lost to the kernel-idle race; fail on errors.

    The toolbar says idle about 1.5 s before the kernel is connected, and a request sent then is
    silently dropped: after sending, the first prompt must turn ``[*]:`` or ``[n]:``.
    """
    start_run_all(page)
    deadline = time.monotonic() + RUN_ALL_MS / 1000
    while time.monotonic() < deadline:
        prompts = _prompts(page)
        if len(prompts) == count and all(_PROMPT_DONE.match(p) for p in prompts):
            break
        page.wait_for_timeout(200)
    else:
        pytest.fail(f"the cells did not finish in {RUN_ALL_MS / 1000} s; prompts: {_prompts(page)}")
    fail_on_traceback(page)


def fail_on_traceback(page: Any) -> None:
    stderr = page.locator('.jp-Cell-outputArea [data-mime-type="application/vnd.jupyter.stderr"]')
    texts = [t for t in stderr.all_inner_texts() if "Traceback" in t or "Error" in t]
    if texts:
        pytest.fail("a notebook cell raised:\n" + "\n".join(texts)[-4000:], pytrace=False)


def forget_sessions(server: LabServer) -> None:
    """Shut the server's kernels down and delete its saved workspaces, so that the next test's
    page does not reopen (and count the cells of) an earlier test's notebook."""
    auth = {"Authorization": f"token {server.token}"}

    def call(method: str, path: str) -> Any:
        request = urllib.request.Request(f"{server.url}{path}", method=method, headers=auth)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    for session in call("GET", "/api/sessions"):
        call("DELETE", f"/api/sessions/{session['id']}")
    for space in call("GET", "/lab/api/workspaces")["workspaces"]["ids"]:
        call("DELETE", f"/lab/api/workspaces/{space}")


@pytest.fixture
def lab(lab_server: LabServer, chromium: Any) -> Iterator[Lab]:
    """A fresh browser context on a server with no kernel or saved workspace left by an earlier
    test; it lets nothing leave 127.0.0.1."""
    forget_sessions(lab_server)
    context = chromium.new_context(viewport={"width": 1280, "height": 1000})
    session = Lab(lab_server, context)
    context.route("**/*", session._route)
    try:
        yield session
    finally:
        context.close()  # first, or the page saves its workspace again
        forget_sessions(lab_server)


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """A folder for a test's screenshots (``QVIZ_SCREENSHOTS`` picks another)."""
    folder = Path(os.environ.get("QVIZ_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Voila:
    """A running Voilà server rendering one notebook, and the browser context to open it."""

    url: str
    context: Any
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _route(self, route: Any) -> None:
        if urlsplit(route.request.url).hostname in _LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()


@pytest.fixture
def voila(browser_tools: None, chromium: Any, tmp_path: Path) -> Iterator[Any]:
    """``serve(cells) -> Voila``: render a notebook of ``cells`` with Voilà on 127.0.0.1."""
    import nbformat

    procs: list[subprocess.Popen[bytes]] = []
    contexts: list[Any] = []

    def serve(cells: list[str]) -> Voila:
        base = tmp_path / f"voila{len(procs)}"
        root = base / "notebooks"
        root.mkdir(parents=True)
        env = _isolated_env(base)
        nb = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(source) for source in cells],
            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3"}},
        )
        nbformat.write(nb, root / "app.ipynb")
        port = _free_port()
        # qviz's launcher, as the README says: Voila with qviz's template (no CDN stylesheets)
        command = [sys.executable, "-m", "qviz.apps.voila", "app.ipynb", "--no-browser",
                   "--Voila.ip=127.0.0.1", f"--port={port}"]  # fmt: skip
        log = base / "voila.log"
        with log.open("wb") as out:
            procs.append(subprocess.Popen(command, env=env, cwd=root, stdout=out, stderr=out))
        url = f"http://127.0.0.1:{port}"
        _wait_for_server(procs[-1], f"{url}/voila/static/index.css", log)
        context = chromium.new_context(viewport={"width": 1280, "height": 1000})
        contexts.append(context)
        session = Voila(url, context)
        context.route("**/*", session._route)
        return session

    try:
        yield serve
    finally:
        for context in contexts:
            context.close()
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
