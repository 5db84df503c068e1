"""Course-wide pytest hooks.

``make test`` runs the suite in two processes (pytest-xdist, ``--dist
loadfile``: every file stays in one process, so its fixtures start once).
Files start in the order collected (``--no-loadscope-reorder``: xdist would
otherwise start the files with the most tests first), so the longest ones
are put first and end on different processes instead of one after the other.

nbval compares a cell tagged ``raises-exception`` with its stored error only
when the cell's output is compared at all; under ``nbval-ignore-output`` a
cell that stopped raising would pass unnoticed. This hook makes every such
cell fail unless it really raised.

Every grading run of the suite shares one folder of canary references
(``$COURSE_REFERENCE_CACHE``, see :mod:`autograder.canary`): the instructor's
solution runs once per set of limits, not once per test. A test that needs
the canary itself names a cache of its own or ``--rerun-canary``.
"""

import os

import pytest

# The files that take longest (minutes each on two cores), longest first.
LONGEST_FIRST = [
    "tests/test_mistakes.py",
    "tests/test_grade.py",
    "tests/test_pipeline.py",
    "tests/test_browser.py",
    "tests/test_grade_attacks.py",
    "solutions/07_multi_device_training/07_multi_device_training.ipynb",
    "tests/test_term.py",
    "tests/test_grade_stopped.py",
    "tests/test_project.py",
    "tests/test_gradebook_postgres.py",
    "tests/test_cluster.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: order within a file kept
    ignore_simulated_outputs(items)


def ignore_simulated_outputs(items) -> list:
    """On a machine with a real accelerator, do not compare the outputs of cells tagged ``sim-output``.

    Such a cell shows the simulated device on a machine without a GPU (its
    stored output) and the machine's own accelerator where there is one
    (``devcourse.accelerator_or_simulated``), so its output is compared on the
    first kind of machine only; it still has to run without an error on both.
    Returns the items whose outputs are no longer compared.
    """
    tagged = [item for item in items
              if "sim-output" in (getattr(item, "cell", None) or {}).get("metadata", {}).get("tags", [])]
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
    """One reference cache for the whole run: with xdist, beside every worker's own temporary folder."""
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
