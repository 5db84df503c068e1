"""JupyterLab as ``make lab`` starts it, on a port, token and settings of its own, for the browser
tests."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from autograder.run.executors.cluster import stop_group
from autograder.run.sandbox import tethered
from support.servers import free_port, tail

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the course's own environment (.venv/bin under make)
ARTIFACTS = ROOT / "build" / "browser"
# with DOCS_SCREENSHOTS=1 (make screenshots), the tests' pictures that the docs show land here
DOCS = ROOT / "docs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing that reaches out to the network on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SETTINGS = {
    # No news pop-up on the first load.
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    # Keep every cell in the page, so that cells out of view can be read too.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}
CELLS = ".jp-NotebookPanel .jp-Notebook .jp-Cell"
# make lab puts it first on JUPYTER_CONFIG_PATH, its data on JUPYTER_PATH
STUDENT_LAB = ROOT / "jupyter" / "student-lab"
COURSE = ROOT / "course"
SECOND = 1000  # Playwright counts in milliseconds


# ---- the server and the browser ------------------------------------------------


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # the server's root folder: each test copies its notebooks in here

    def api(self, method: str, path: str) -> object:
        request = urllib.request.Request(
            f"{self.url}/api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


def start_lab(home: Path) -> tuple[subprocess.Popen, Lab]:
    """Start JupyterLab from this environment in ``home``, as ``make lab`` does, on its own port,
    token and settings.

    The server gets SIGTERM (and stops its kernels) when the process that started it ends, however
    it ends: a test run that is killed leaves no server behind.
    """
    root = home / "notebooks"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
    for name in (
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_DATA_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTERLAB_SETTINGS_DIR",
        "JUPYTERLAB_WORKSPACES_DIR",
    ):
        env[name] = str(home / name.lower())
        os.makedirs(env[name])
    for plugin, values in SETTINGS.items():
        path = Path(env["JUPYTERLAB_SETTINGS_DIR"], f"{plugin}.jupyterlab-settings")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    # kernels and nbgrader's validator: this Python
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["JUPYTER_CONFIG_PATH"] = str(STUDENT_LAB)
    env["JUPYTER_PATH"] = str(STUDENT_LAB / "data")  # the prebuilt plugin for Validate's message

    port, token = free_port(), secrets.token_hex(24)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / "jupyterlab.log"
    command = [
        str(BIN / "jupyter"),
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    # Validate reads nbgrader_config.py from the server's working folder, as under `make lab`.
    shutil.copy(ROOT / "nbgrader_config.py", root)
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            tethered(command, signal.SIGTERM),
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            pytest.fail(
                f"JupyterLab exited with {server.returncode}:\n{tail(log_path)}", pytrace=False
            )
        try:
            Lab(url, token, root).api("GET", "status")
            return server, Lab(url, token, root)
        except OSError:
            if time.monotonic() > deadline:
                stop_lab(server)
                pytest.fail(
                    f"JupyterLab did not answer within 60 s:\n{tail(log_path)}", pytrace=False
                )
            time.sleep(0.2)


def stop_lab(server: subprocess.Popen) -> None:
    """Stop a server of :func:`start_lab`: it stops its kernels on SIGTERM; its whole process group
    goes if not."""
    stop_group(server)


def keep_for_docs(picture: Path) -> None:
    """With ``DOCS_SCREENSHOTS=1`` (``make screenshots``), copy a test's screenshot into ``docs/``
    under its name."""
    if os.environ.get("DOCS_SCREENSHOTS") == "1":
        shutil.copy(picture, DOCS / picture.name)


@contextlib.contextmanager
def chromium():
    """Debian's Chromium under Playwright, closed on leaving; a clear failure, never a skip, where
    it cannot start. While Playwright's synchronous API is started, its event loop counts as running
    in this thread: a later test of the same process that runs one of its own (asyncio.run) would be
    refused, so it is held no longer than this."""
    from support.system import missing

    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        pytest.fail(f"Playwright is not installed ({err}): run `make install`", pytrace=False)
    if not Path(CHROMIUM).exists():
        missing(
            f"no Chromium at {CHROMIUM}: run `make browser` (it installs Debian's chromium"
            " package), or point CHROMIUM at a Chromium binary"
        )
    playwright = sync_playwright().start()
    try:
        try:  # launch() gives the browser a fresh, temporary profile of its own
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60 * SECOND
            )
        except Exception as err:  # noqa: BLE001 - any launch failure ends the same way: say why, and fail
            pytest.fail(f"Chromium at {CHROMIUM} could not be started:\n{err}", pytrace=False)
        try:
            yield browser
        finally:
            browser.close()
    finally:
        playwright.stop()
