"""A sandbox never outlives what started it: SIGTERM at any level, or the death of its parent, ends
it all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autograder.run import sandbox
from autograder.run.watch import processes_of

# The "kernel": starts a grandchild (a student's subprocess), prints both pids, then waits.
KERNEL = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.getpid(), child.pid, flush=True)
time.sleep(600)
"""

# Starts a sandbox as its child, prints the launcher's pid, then waits (to be killed by the test).
PARENT = r"""
import subprocess, sys, time
from pathlib import Path
from autograder.run import sandbox

command = sandbox.wrap([sys.executable, "-c", sys.argv[2]], Path(sys.argv[1]))
launcher = subprocess.Popen(
    command, env={**__import__("os").environ, "SANDBOX_TEST_MARK": sys.argv[3]}
)
print(launcher.pid, flush=True)
time.sleep(600)
"""


def marked(mark: str) -> list[int]:
    """Pids of live processes whose environment holds SANDBOX_TEST_MARK=mark (zombies excluded)."""
    return sorted(processes_of(mark, variable="SANDBOX_TEST_MARK"))


def gone_within(mark: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _spec_path(namespaces: bool, workdir: Path) -> Path:
    """A sandbox spec for ``workdir``, with namespaces (skipped where the machine has none) or
    without."""
    if namespaces:
        isolation = sandbox.probe()
        if not isolation.namespaces:
            pytest.skip(f"no namespaces on this machine: {isolation.reason}")
        spec = sandbox.Spec(
            workdir=str(workdir),
            namespaces=True,
            user_namespace=isolation.user_namespace,
            read_only=sandbox.python_paths(),
            read_write=[str(workdir)],
        )
        if spec.as_nobody:
            os.chown(workdir, sandbox.NOBODY, sandbox.NOBODY)
    else:
        spec = sandbox.Spec(workdir=str(workdir))
    # beside the work folder, in pytest's own temporary folder (removed with it), outside the
    # sandbox's reach
    return spec.write(Path(tempfile.mkdtemp(prefix="spec-", dir=workdir.parent)) / "spec.json")


@pytest.fixture(params=["namespaces", "plain"])
def spec_path(request, tmp_path):
    return _spec_path(request.param == "namespaces", tmp_path)


def _start(spec_path: Path, mark: str) -> tuple[subprocess.Popen, int, int, int]:
    """A parent process holding a sandbox whose kernel holds a child: (parent, launcher, kernel,
    grandchild).

    The processes: the launcher, the init (with namespaces), the kernel and its child.
    """
    count = 4 if json.loads(spec_path.read_text())["namespaces"] else 3
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(spec_path), KERNEL, mark],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    launcher = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while len(marked(mark)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = sorted(set(marked(mark)) - {launcher})
    assert len(pids) >= 2, f"the sandbox did not start: {marked(mark)}"
    return parent, launcher, pids[-2], pids[-1]


def test_the_sandbox_dies_with_its_parent_even_by_sigkill(spec_path):
    mark = f"parent-{os.getpid()}-{time.monotonic_ns()}"
    parent, launcher, *_ = _start(spec_path, mark)
    parent.kill()
    parent.wait()
    assert gone_within(mark, 5) == [], (
        "processes of the sandbox outlived the process that started it"
    )


def _sigterm_ends_everything(spec_path: Path, level: str) -> None:
    mark = f"{level}-{os.getpid()}-{time.monotonic_ns()}"
    parent, launcher, kernel, grandchild = _start(spec_path, mark)
    try:
        init = sorted(set(marked(mark)) - {launcher, kernel, grandchild})
        target = {"launcher": launcher, "kernel": kernel}.get(level) or init[0]
        os.kill(target, signal.SIGTERM)
        assert gone_within(mark, 5) == [], (
            f"SIGTERM to the {level} left processes of the sandbox running"
        )
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("level", ["launcher", "kernel"])
def test_sigterm_at_any_level_ends_the_whole_sandbox(spec_path, level):
    _sigterm_ends_everything(spec_path, level)


def test_sigterm_to_the_namespace_init_ends_the_whole_sandbox(tmp_path):
    _sigterm_ends_everything(_spec_path(True, tmp_path), "init")
