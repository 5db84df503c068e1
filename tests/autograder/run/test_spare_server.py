"""A process server asked for inside a grading kernel forked warm: the sandbox's init forks it
(autograder/run/forked.py, run_server_here), ready-imported, and what it starts looks like what a
server started fresh starts.

One submission of 00 gets a cell of its own that starts ``devcourse.warmstart``'s server twice in
its sandbox: as the course asks for it (the init's, forked warm), and with an environment the init's
cannot serve (``MALLOC_ARENA_MAX``, which glibc reads as a process starts), which starts one fresh.
A script each server forks reports what it sees, and so does the same script started as a plain
process; the cell prints it all, and the test compares.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from devcourse.instructor.demo import SUBMITTED
from autograder.run import zygote
from autograder.run.watch import RUN_MARKER, processes_of

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "00_environment"
pytestmark = pytest.mark.skipif(zygote.usable() != "", reason=f"no zygote here: {zygote.usable()}")

SCRIPT = r"""
import io, json, os, sys
if __name__ == "__main__":
    json.dump({
        "path": sys.path, "cwd": os.getcwd(), "argv": sys.argv[1:], "name": __name__,
        "cmdline": open("/proc/self/cmdline").read().split(chr(0))[:2],
        "ids": [os.getuid(), os.getgid()], "cgroup": open("/proc/self/cgroup").read(),
        "sid_is_pid": os.getsid(0) == os.getpid(), "probe": os.environ.get("COURSE_PROBE"),
        "stdout": [type(sys.stdout.buffer).__name__, sys.stdout.write_through,
                   sys.stdout.line_buffering, sys.stderr.line_buffering],
        "grader modules": sorted(m for m in sys.modules if m.split(".")[0] == "autograder"),
    }, open(sys.argv[1], "w"))
"""

CELL = r"""
import json as _json, os as _os, subprocess as _subprocess, sys as _sys, tempfile as _tempfile
from devcourse import warmstart as _warmstart

def _stat(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {"ppid": int(fields[1]),
            "cpu_s": (int(fields[11]) + int(fields[12])) / _os.sysconf("SC_CLK_TCK")}

_folder = _tempfile.mkdtemp()
_script = _os.path.join(_folder, "report.py")
open(_script, "w").write(SCRIPT)
_env = dict(_os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
_said = {"kernel": _os.getpid()}
for _how, _extra in (("spare", {}), ("fresh", {"MALLOC_ARENA_MAX": "2"})):
    _server = _warmstart.WarmStarter({**_env, **_extra})
    _process = _server.server.process
    _said[_how] = {**_stat(_process.pid), "output": list(_server.server.output)}
    _out = _os.path.join(_folder, f"{_how}.json")
    _log = _os.path.join(_folder, f"{_how}.log")
    _run_env = {**_env, **_extra, "COURSE_PROBE": _how}
    _code = _server.start([_sys.executable, _script, _out], _run_env, _folder, _log).wait(60)
    _said[_how]["report"] = _json.load(open(_out)) if _code == 0 else open(_log).read()
    _server.close()
_out = _os.path.join(_folder, "plain.json")
_subprocess.run([_sys.executable, _script, _out], env={**_env, "COURSE_PROBE": "plain"},
                cwd=_folder, stdin=_subprocess.DEVNULL, start_new_session=True, check=True)
_said["plain"] = {"report": _json.load(open(_out))}
print("SPARE " + _json.dumps(_said).replace(_folder, "FOLDER"))
""".replace("SCRIPT", repr(SCRIPT))


@pytest.fixture(scope="module")
def said(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("spare")
    nb = nbformat.read(SUBMITTED / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CELL))
    (base / "submitted" / "ann" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(nb, base / "submitted" / "ann" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    mark = f"spare-server-{os.getpid()}"
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", "--submitted", str(base / "submitted"),
         "--workdir", str(base / "work"), "--jobs", "1", "--no-feedback", "--quiet",
         "--cell-timeout", "120"],
        cwd=ROOT, env={**os.environ, RUN_MARKER: mark}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    executed = nbformat.read(
        base / "work" / "executed" / "ann" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    text = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    found = re.search(r"^SPARE (.*)$", text, re.M)
    assert found, executed.cells[-1].outputs
    return {**json.loads(found[1]), "left": processes_of(mark)}


def test_the_init_forks_the_server_ready_imported(said):
    spare, fresh = said["spare"], said["fresh"]
    assert spare["ppid"] == 1 and fresh["ppid"] == said["kernel"], said
    # a fresh one imports torch and the distributed packages; the init's only those the zygote had
    # not imported (FSDP's)
    assert spare["cpu_s"] * 2 < fresh["cpu_s"], said
    assert fresh["output"] == ["the sandbox's server: its environment differs in MALLOC_ARENA_MAX"]


def test_what_it_starts_sees_what_a_fresh_servers_processes_and_a_plain_one_see(said):
    reports = {how: said[how]["report"] for how in ("spare", "fresh", "plain")}
    assert all(isinstance(report, dict) for report in reports.values()), reports
    for key in ("path", "cwd", "name", "cmdline", "ids", "cgroup", "sid_is_pid", "stdout"):
        assert reports["spare"][key] == reports["fresh"][key] == reports["plain"][key], key
    assert reports["spare"]["stdout"][:2] == ["FileIO", True]  # PYTHONUNBUFFERED, as python -u
    assert reports["spare"]["grader modules"] == reports["fresh"]["grader modules"]
    assert [reports[how]["probe"] for how in reports] == ["spare", "fresh", "plain"]


def test_nothing_of_it_outlives_the_grading(said):
    assert said["left"] == {}
