"""A process the fork server forks ends as Python ends a program: its threads joined, its atexit
handlers run once."""

import os
import sys
import textwrap

import pytest

from autograder.run import forkclient, forkserver

pytestmark = pytest.mark.skipif(
    forkserver.usable() != "", reason=f"no fork server here: {forkserver.usable()}"
)

PRELOADED = """
import atexit, os
atexit.register(lambda: open(os.environ["ENDS"], "a").write(f"preloaded {os.getpid()}\\n"))
"""

SCRIPT = """
import atexit, os, sys, threading, time
def said(what):
    open(os.environ["ENDS"], "a").write(f"{what} {os.getpid()}\\n")
atexit.register(said, "script")
threading.Thread(target=lambda: (time.sleep(0.3), said("thread"))).start()
if sys.argv[1:] == ["fork"]:
    child = os.fork()
    if child == 0:
        atexit.register(said, "grandchild")
        sys.exit(5)
    said(f"grandchild ended {os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}")
sys.exit(3)
"""


@pytest.fixture()
def server(tmp_path):
    (tmp_path / "registers.py").write_text(PRELOADED)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        ENDS=str(tmp_path / "ends"),
    )
    handle = forkclient.ForkServer(env, preload=["registers", "devcourse.warmstart"], name="test")
    yield handle, env
    handle.close()


def _run(server, tmp_path, *args):
    handle, env = server
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = handle.fork(
            "devcourse.warmstart:run_script",
            {
                "command": [sys.executable, str(tmp_path / "script.py"), *args],
                "env": env,
                "cwd": str(tmp_path),
            },
            [null, log, log],
        )
    finally:
        os.close(null)
        os.close(log)
    return process.wait(60), process.pid


def test_a_childs_atexit_handlers_run_once_after_its_threads(server, tmp_path):
    code, pid = _run(server, tmp_path)
    assert code == 3, (tmp_path / "log").read_text()
    assert (tmp_path / "ends").read_text().splitlines() == [
        f"thread {pid}",
        f"script {pid}",
        f"preloaded {pid}",
    ]
    assert (tmp_path / "log").read_text() == ""


def test_a_process_the_child_forks_ends_as_python_ends_it_too(server, tmp_path):
    code, pid = _run(server, tmp_path, "fork")
    assert code == 3, (tmp_path / "log").read_text()
    lines = (tmp_path / "ends").read_text().splitlines()
    grandchild = [line.split()[1] for line in lines if line.startswith("grandchild ")][0]
    assert grandchild != str(pid)
    mine = [line for line in lines if line.endswith(f" {pid}")]
    theirs = [line for line in lines if line.endswith(f" {grandchild}")]
    assert mine == [
        f"grandchild ended 5 {pid}",
        f"thread {pid}",
        f"script {pid}",
        f"preloaded {pid}",
    ], lines
    # the thread belongs to the process that started it; the handlers each process registered run in
    # it, once
    assert theirs == [
        f"grandchild {grandchild}",
        f"script {grandchild}",
        f"preloaded {grandchild}",
    ], lines
