"""The suite's second limit (conftest.py): a test stuck in C code holding the GIL ends with its
stacks shown, is not run again, and the tests after it run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUCK = textwrap.dedent("""
    import ctypes
    import signal


    def test_stuck_in_c_holding_the_gil():
        # As a deadlock inside a library's C++ would be: pytest-timeout's SIGALRM handler cannot
        # run.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        open("stuck-from", "w").close()
        ctypes.PyDLL(None).sleep(3600)  # a PyDLL call keeps the GIL


    def test_after_it():
        assert True
""")


def test_a_test_stuck_in_c_holding_the_gil_is_ended_with_its_stacks_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_TEST_WATCHDOG_GRACE_S": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    # The course's conftest as a plugin; one xdist worker, as make test runs them (three there).
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-n",
            "1",
            "--dist",
            "loadfile",
            "--timeout=1",
            "-q",
            "test_stuck.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # From the stuck test's start, not the run's: two pytest start-ups take most of a minute on a
    # busy machine.
    took = time.time() - (tmp_path / "stuck-from").stat().st_mtime
    said = done.stdout + done.stderr
    # it sleeps 1 h
    assert took < 300, f"the stuck test was not ended: the run took {took:.0f} s after it\n{said}"
    # faulthandler's own words, at the test's 1 s + the 1 s grace
    assert "Timeout (0:00:02)!" in said, said
    # its stack
    assert re.search(r'test_stuck\.py", line \d+ in test_stuck_in_c_holding_the_gil', said), said
    assert (
        "worker 'gw0' crashed while running 'test_stuck.py::test_stuck_in_c_holding_the_gil'"
        in said
    ), said
    # xdist hands the crashed test to the new worker again: it is not run again, and the next one
    # is.
    assert (
        "not run again: this test was running when an earlier process of this run ended" in said
    ), said
    assert "1 failed, 1 passed, 1 error in" in said, said
