"""Processes forked from a server that has imported torch look, to the script they run, like fresh ones."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.runner import alive
from devcourse import warmstart

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux only")

REPORT = """
import json, os, random, sys
import torch
if __name__ == "__main__":
    json.dump({"argv": sys.argv, "path0": sys.path[0], "path": sys.path[1:], "cwd": os.getcwd(),
               "file": __file__, "name": __name__, "env": os.environ.get("COURSE_PROBE"),
               "seed": torch.initial_seed(), "random": random.random(), "threads": torch.get_num_threads(),
               "sid_is_pid": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(),
               "cmdline": open("/proc/self/cmdline").read().split(chr(0))[:2]},
              open(sys.argv[1], "w"))
    print("to the log")
"""


@pytest.fixture(scope="module")
def server():
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    starter = warmstart.WarmStarter(env)
    yield starter, env
    starter.close()


def _ran(process, timeout=60):
    return process.wait(timeout)


def test_a_forked_script_sees_what_a_fresh_one_sees(server, tmp_path):
    starter, env = server
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    seen = {}
    for how in ("fresh", "forked", "forked again"):
        out, log = tmp_path / f"{how}.json", tmp_path / f"{how}.log"
        command = [sys.executable, str(script), str(out)]
        run_env = dict(env, COURSE_PROBE=how)
        if how == "fresh":
            with open(log, "w") as handle:
                code = subprocess.run(command, env=run_env, cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True).returncode
        else:
            code = _ran(starter.start(command, run_env, tmp_path, log))
        assert code == 0, log.read_text()
        seen[how] = json.loads(out.read_text())
        assert log.read_text() == "to the log\n"
    fresh, forked = seen["fresh"], seen["forked"]
    for key in ("path0", "path", "cwd", "file", "name", "threads", "sid_is_pid", "stdin", "cmdline"):
        assert forked[key] == fresh[key], key
    assert forked["argv"][0] == fresh["argv"][0] and forked["argv"][1].endswith("forked.json")
    assert forked["env"] == "forked" and forked["cmdline"] == [sys.executable, str(script)]  # what ps shows
    # seeded afresh in every process, as a new one is
    assert len({seen[how]["seed"] for how in seen}) == 3 and len({seen[how]["random"] for how in seen}) == 3


@pytest.mark.parametrize("body, code, output", [
    ("import sys\nsys.exit(3)", 3, ""),
    ("import sys\nsys.exit('went wrong')", 1, "went wrong\n"),
    ("def f():\n    raise ValueError('no')\nf()", 1, "ValueError: no"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
    ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
])
def test_exit_codes_and_errors_are_pythons(server, tmp_path, body, code, output):
    starter, env = server
    script = tmp_path / "end.py"
    script.write_text(body + "\n")
    fresh = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    log = tmp_path / "log"
    assert _ran(starter.start([sys.executable, str(script)], env, tmp_path, log)) == fresh.returncode == code
    assert output in log.read_text() and output in fresh.stderr
    if "Traceback" in fresh.stderr:  # the same traceback: the server's own frames left out
        assert log.read_text() == fresh.stderr


def test_only_python_scripts_are_forked(server, tmp_path):
    starter, env = server
    with pytest.raises(ValueError):
        starter.start(["/bin/true"], env, tmp_path, tmp_path / "log")
    with pytest.raises(ValueError):
        starter.start([sys.executable, "-c", "pass"], env, tmp_path, tmp_path / "log")


def test_a_server_that_dies_ends_its_processes_and_another_takes_its_place(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="a server of its own")
    first = warmstart.starter(env)
    assert first is not None and warmstart.starter(env) is first
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    sleeper = first.start([sys.executable, str(script)], env, tmp_path, tmp_path / "log")
    first._server.kill()
    assert sleeper.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while alive(sleeper.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper.pid), "the dead server's process was left running"
    with pytest.raises(RuntimeError, match="ended"):
        first.start([sys.executable, str(script)], env, tmp_path, tmp_path / "log")
    second = warmstart.starter(env)
    assert second is not None and second is not first and second.alive
    other = warmstart.starter(dict(env, COURSE_PROBE="another environment"))  # replaces it
    assert other is not second and second._server.wait(10) is not None
    other.close()


def test_no_server_where_it_is_turned_off(monkeypatch):
    monkeypatch.setenv("DEVCOURSE_NO_WARMSTART", "1")
    assert warmstart.starter(dict(os.environ)) is None


def test_an_idle_server_ends_but_not_while_its_processes_run(monkeypatch, tmp_path):
    monkeypatch.setattr(warmstart, "IDLE_S", 0.5)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="an idle server")
    starter = warmstart.starter(env)
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(2)\n")
    sleeper = starter.start([sys.executable, str(script)], env, tmp_path, tmp_path / "log")
    time.sleep(1.2)
    assert starter.alive and sleeper.poll() is None, "the server ended while its process ran"
    assert sleeper.wait(30) == 0
    starter._server.wait(10)
    assert not starter.alive
    assert warmstart.starter(env) is not starter
    warmstart.starter(env).close()


def test_one_server_serves_runs_that_hide_the_gpus_and_each_process_sees_its_own_value(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="hidden GPUs")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    hidden = dict(env, CUDA_VISIBLE_DEVICES="")
    starter = warmstart.starter(env)
    assert warmstart.starter(hidden) is starter
    script = tmp_path / "visible.py"
    script.write_text("import os, sys, torch\nprint(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), torch.cuda.device_count())\n")
    for run_env, log in ((hidden, tmp_path / "hidden"), (env, tmp_path / "shown")):
        assert starter.start([sys.executable, str(script)], run_env, tmp_path, log).wait(60) == 0
    fresh = subprocess.run([sys.executable, str(script)], env=hidden, capture_output=True, text=True).stdout
    assert (tmp_path / "hidden").read_text() == fresh == "'' 0\n"
    assert (tmp_path / "shown").read_text().startswith("None ")
    starter.close()


GUARDED = r'''
import os
from autograder.runner import GUARD_SOURCE
exec(GUARD_SOURCE)
install("_guard_for_test")
from devcourse import warmstart
env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="a graded notebook")
first = warmstart.starter(env)
_guard_for_test()  # what the grader runs before each test cell: the course's modules put back as they were
print(first is not None and first.alive, warmstart.starter(env) is first)
first.close()
'''


def test_the_server_outlives_the_graders_guard_between_tests():
    """A grading kernel runs the guard before each test; 07's and 09's tests start runs. The server must stay the
    one in use, not be forgotten (left running, holding the submission's memory) and started again (a torch import)."""
    done = subprocess.run([sys.executable, "-c", GUARDED], cwd=Path(warmstart.__file__).parents[1],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stdout + done.stderr
