"""Course-wide pytest hooks.

``make test`` runs the suite in three processes (pytest-xdist, ``--dist
loadfile``: every file stays in one process, so its fixtures start once).
Files start in the order collected (``--no-loadscope-reorder``: xdist would
otherwise start the files with the most tests first), so the longest ones
are put first and end on different processes instead of one after the other.

nbval compares a cell tagged ``raises-exception`` with its stored error only
when the cell's output is compared at all; under ``nbval-ignore-output`` a
cell that stopped raising would pass unnoticed. This hook makes every such
cell fail unless it really raised.

Every grading run of the suite shares one folder of canary references
(``$COURSE_REFERENCE_CACHE``, see :mod:`autograder.judge.reference`): the instructor's
solution runs once per set of limits, not once per test. A test that needs
the canary itself names a cache of its own or ``--rerun-canary``.

pytest-timeout stops a test that runs past its limit by a signal, whose
handler is Python: a test stuck in C code that holds the GIL (a deadlock
in a library's threads, say) never runs it. A second limit, the test's
timeout plus ``$COURSE_TEST_WATCHDOG_GRACE_S`` (60 s), is kept by
faulthandler's own thread, which needs no GIL: past it, every thread's
stack is written to the process's real standard error and the process
exits (code 1). Under xdist the test is reported as its worker's crash,
and a new worker takes the rest. xdist (``--dist loadfile``) would give the
new worker the crashed test again, and up to four times; so every worker
notes each test it starts and ends in a file the run's workers share, and
a test that was started and never ended is not run again: it fails at its
setup, naming the crash.
"""

import faulthandler
import os
from pathlib import Path

import pytest

WATCHDOG_GRACE_S = float(os.environ.get("COURSE_TEST_WATCHDOG_GRACE_S", "60"))
_real_stderr = None  # standard error before any test's output is captured (see pytest_configure)

# The files that take longest (minutes each on two cores), longest first.
LONGEST_FIRST = [
    "tests/mistakes/test_mistakes.py",
    "tests/autograder/batch/test_grade.py",
    "tests/devcourse/instructor/test_build.py",
    "tests/devcourse/test_browser.py",
    "solutions/07_multi_device_training/07_multi_device_training.ipynb",
    "tests/autograder/cli/test_term.py",
    "tests/autograder/batch/test_grade_stopped.py",
    "tests/test_project.py",
    "tests/autograder/record/test_gradebook_postgres.py",
    "tests/autograder/run/test_cluster.py",
    "tests/test_distributions.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    # stable: order within a file kept
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
    ignore_simulated_outputs(items)


def ignore_simulated_outputs(items) -> list:
    """On a machine with a real accelerator, do not compare the outputs of cells tagged
    ``sim-output``.

    Such a cell shows the simulated device on a machine without a GPU (its
    stored output) and the machine's own accelerator where there is one
    (``devcourse.accelerator_or_simulated``), so its output is compared on the
    first kind of machine only; it still has to run without an error on both.
    Returns the items whose outputs are no longer compared.
    """
    tagged = [
        item
        for item in items
        if "sim-output" in (getattr(item, "cell", None) or {}).get("metadata", {}).get("tags", [])
    ]
    if not tagged:
        return []
    from devcourse.devices import hardware_accelerator

    if hardware_accelerator() is None:
        return []
    for item in tagged:
        item.options["check"] = False  # what the nbval-ignore-output tag sets
    return tagged


@pytest.fixture(scope="session", autouse=True)
def shared_references(tmp_path_factory, worker_id):
    """One reference cache for the whole run: with xdist, beside every worker's own temporary
    folder."""
    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent) / "references"
    previous = os.environ.get("COURSE_REFERENCE_CACHE")
    os.environ["COURSE_REFERENCE_CACHE"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("COURSE_REFERENCE_CACHE", None)
    else:
        os.environ["COURSE_REFERENCE_CACHE"] = previous


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    cell = getattr(item, "cell", None)
    if cell is not None and "raises-exception" in cell.get("metadata", {}).get("tags", []):
        outputs = getattr(item, "test_outputs", None) or []
        if not any(out.get("output_type") == "error" for out in outputs):
            raise AssertionError("this cell is tagged raises-exception but ran without raising")
    return result


def pytest_configure(config):
    global _real_stderr
    # pytest's capture is off while plugins are configured: fd 2 is the real one
    if _real_stderr is None:
        _real_stderr = os.fdopen(os.dup(2), "w")


def _timeout_s(item) -> float:
    """The limit pytest-timeout puts on ``item``: its ``timeout`` mark, else the run's (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        value = marker.args[0] if marker.args else marker.kwargs["timeout"]
    else:
        from pytest_timeout import get_env_settings

        value = get_env_settings(item.config).timeout
    return float(value or 0)


def _started_journal(config) -> Path | None:
    """Under xdist, the file the run's workers share: a line ``start NODEID`` or ``end NODEID`` per
    test."""
    workerinput = getattr(config, "workerinput", None)
    # not a worker; xdist gives each its basetemp
    if workerinput is None or not config.option.basetemp:
        return None
    return Path(config.option.basetemp).parent / f"tests-started-{workerinput['testrunuid']}.txt"


CRASHED_BEFORE = pytest.StashKey[bool]()


def _note(journal: Path, line: str) -> None:
    with open(journal, "a") as file:  # one short write, appended whole (O_APPEND)
        file.write(line + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    journal = _started_journal(item.config)
    if journal is not None:
        lines = journal.read_text().splitlines() if journal.exists() else []
        item.stash[CRASHED_BEFORE] = lines.count(f"start {item.nodeid}") > lines.count(
            f"end {item.nodeid}"
        )
        _note(journal, f"start {item.nodeid}")
    limit = _timeout_s(item)
    # one timer per process
    watched = limit > 0 and not float(item.config.getini("faulthandler_timeout") or 0)
    if watched:
        faulthandler.dump_traceback_later(limit + WATCHDOG_GRACE_S, exit=True, file=_real_stderr)
    try:
        return (yield)
    finally:
        if watched:
            faulthandler.cancel_dump_traceback_later()
        if journal is not None:
            _note(journal, f"end {item.nodeid}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.stash.get(CRASHED_BEFORE, False):
        pytest.fail(
            "not run again: this test was running when an earlier process of this run ended"
            " (reported as that process's crash; a stuck test's stacks are on standard error)",
            pytrace=False,
        )
