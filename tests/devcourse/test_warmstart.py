"""Processes forked from a server that has imported torch look, to the script they run, like fresh
ones."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.run.watch import alive
from devcourse import warmstart

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux only")

REPORT = """
import json, os, random, sys
import torch

if __name__ == "__main__":
    json.dump(
        {
            "argv": sys.argv,
            "path0": sys.path[0],
            "path": sys.path[1:],
            "cwd": os.getcwd(),
            "file": __file__,
            "name": __name__,
            "env": os.environ.get("COURSE_PROBE"),
            "spec": getattr(__spec__, "name", None),
            "package": __package__,
            "main": sys.modules["__main__"].__dict__ is globals(),
            "seed": torch.initial_seed(),
            "random": random.random(),
            "threads": torch.get_num_threads(),
            "sid_is_pid": os.getsid(0) == os.getpid(),
            "stdin": sys.stdin.read(),
            "cmdline": open("/proc/self/cmdline").read().split(chr(0))[:2],
        },
        open(sys.argv[1], "w"),
    )
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
                code = subprocess.run(
                    command,
                    env=run_env,
                    cwd=tmp_path,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                ).returncode
        else:
            code = _ran(starter.start(command, run_env, tmp_path, log))
        assert code == 0, log.read_text()
        seen[how] = json.loads(out.read_text())
        assert log.read_text() == "to the log\n"
    fresh, forked = seen["fresh"], seen["forked"]
    for key in (
        "path0",
        "path",
        "cwd",
        "file",
        "name",
        "spec",
        "package",
        "main",
        "threads",
        "sid_is_pid",
        "stdin",
        "cmdline",
    ):
        assert forked[key] == fresh[key], key
    assert forked["argv"][0] == fresh["argv"][0] and forked["argv"][1].endswith("forked.json")
    # what ps shows
    assert forked["env"] == "forked" and forked["cmdline"] == [sys.executable, str(script)]
    # seeded afresh in every process, as a new one is
    assert (
        len({seen[how]["seed"] for how in seen}) == 3
        and len({seen[how]["random"] for how in seen}) == 3
    )


def test_a_forked_module_sees_what_python_dash_m_gives_it(server, tmp_path):
    """`python -m MODULE` (torchrun's launcher is one): the module's file in argv[0], the working
    folder first on the path, __main__ with the module's spec, and the module run even when the
    server had imported it."""
    starter, env = server
    package = tmp_path / "probes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "report.py").write_text(REPORT)
    seen = {}
    for how in ("fresh", "forked"):
        out, log = tmp_path / f"{how}.json", tmp_path / f"{how}.log"
        command = [sys.executable, "-m", "probes.report", str(out)]
        if how == "fresh":
            code = subprocess.run(
                command,
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                start_new_session=True,
            ).returncode
        else:
            code = _ran(starter.start(command, env, tmp_path, log))
            assert log.read_text() == "to the log\n"
        assert code == 0
        seen[how] = json.loads(out.read_text())
    fresh, forked = seen["fresh"], seen["forked"]
    for key in (
        "path0",
        "path",
        "cwd",
        "file",
        "name",
        "spec",
        "package",
        "main",
        "sid_is_pid",
        "cmdline",
    ):
        assert forked[key] == fresh[key], key
    assert forked["argv"][0] == fresh["argv"][0] and forked["argv"][1].endswith("forked.json")
    assert fresh["argv"][0] == str(package / "report.py") and fresh["name"] == "__main__"
    assert fresh["cmdline"] == [sys.executable, "-m"]


def test_a_module_the_server_had_imported_runs_as_main_all_the_same_and_quietly(tmp_path):
    """The server imports torch.distributed's modules; torchrun's launcher is one of their kind.
    runpy runs a module that is already imported, but warns that it was (RuntimeWarning), which a
    fresh process never prints."""
    package = tmp_path / "probes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("print('ran as', __name__)\n")
    code = (
        "import sys, probes.main\nfrom devcourse import warmstart\n"
        "sys.exit(warmstart._main(warmstart._run_module, 'probes.main'))"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(warmstart.__file__).parents[1]), str(tmp_path)]),
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "ran as probes.main\nran as __main__\n",
        "",
    )


@pytest.mark.parametrize(
    "body, code, output",
    [
        ("import sys\nsys.exit(3)", 3, ""),
        ("import sys\nsys.exit('went wrong')", 1, "went wrong\n"),
        ("def f():\n    raise ValueError('no')\nf()", 1, "ValueError: no"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, ""),
        ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_exit_codes_and_errors_are_pythons(server, tmp_path, body, code, output, as_module):
    starter, env = server
    script = tmp_path / "end.py"
    script.write_text(body + "\n")
    command = [sys.executable, *(["-m", "end"] if as_module else [str(script)])]
    fresh = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    log = tmp_path / "log"
    assert _ran(starter.start(command, env, tmp_path, log)) == fresh.returncode == code
    assert output in log.read_text() and output in fresh.stderr
    # the same traceback: the server's own frames left out, and runpy's
    if "Traceback" in fresh.stderr:
        assert log.read_text() == _without_runpy(fresh.stderr)
        assert "runpy" not in log.read_text()


def _without_runpy(stderr: str) -> str:
    """A traceback less its runpy frames (``python -m`` names two, which the warm start leaves
    out)."""
    return "".join(
        line
        for line in stderr.splitlines(keepends=True)
        if not line.startswith('  File "<frozen runpy>"')
    )


def test_a_module_that_is_not_there_fails_as_python_dash_m_does(server, tmp_path):
    starter, env = server
    command = [sys.executable, "-m", "no_such_module_here"]
    fresh = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    log = tmp_path / "log"
    assert _ran(starter.start(command, env, tmp_path, log)) == fresh.returncode == 1
    assert (
        log.read_text()
        == fresh.stderr
        == f"{sys.executable}: No module named no_such_module_here\n"
    )


def test_only_python_scripts_are_forked(server, tmp_path):
    starter, env = server
    with pytest.raises(ValueError):
        starter.start(["/bin/true"], env, tmp_path, tmp_path / "log")
    for command in (
        [sys.executable, "-c", "pass"],
        [sys.executable, "-m"],
        [sys.executable, "-m", "-c", "pass"],
    ):
        with pytest.raises(ValueError):
            starter.start(command, env, tmp_path, tmp_path / "log")


def test_a_server_that_dies_ends_its_processes_and_another_takes_its_place(tmp_path):
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="a server of its own"
    )
    first = warmstart.starter(env)
    assert first is not None and warmstart.starter(env) is first
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    sleeper = first.start([sys.executable, str(script)], env, tmp_path, tmp_path / "log")
    first.server.process.kill()
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
    assert other is not second and second.server.process.wait(10) is not None
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
    starter.server.process.wait(10)
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
    script.write_text(
        "import os, sys, torch\n"
        "print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), torch.cuda.device_count())\n"
    )
    for run_env, log in ((hidden, tmp_path / "hidden"), (env, tmp_path / "shown")):
        assert starter.start([sys.executable, str(script)], run_env, tmp_path, log).wait(60) == 0
    fresh = subprocess.run(
        [sys.executable, str(script)], env=hidden, capture_output=True, text=True
    ).stdout
    assert (tmp_path / "hidden").read_text() == fresh == "'' 0\n"
    assert (tmp_path / "shown").read_text().startswith("None ")
    starter.close()


GUARDED = r"""
import os
from autograder.inside import guard
from autograder.run.kernel import source_of
exec(source_of(guard))
from devcourse.instructor.profile import DeviceCourse
install("_guard_for_test", **DeviceCourse.kernel.as_dict())
from devcourse import warmstart
env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COURSE_PROBE="a graded notebook")
first = warmstart.starter(env)
# what the grader runs before each test cell: the course's modules put back as they were
_guard_for_test()
print(first is not None and first.alive, warmstart.starter(env) is first)
first.close()
"""


def test_the_server_outlives_the_graders_guard_between_tests():
    """A grading kernel runs the guard before each test; 07's and 09's tests start runs. The server
    must stay the one in use, not be forgotten (left running, holding the submission's memory) and
    started again (a torch import)."""
    done = subprocess.run(
        [sys.executable, "-c", GUARDED],
        cwd=Path(warmstart.__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], (
        done.stdout + done.stderr
    )
