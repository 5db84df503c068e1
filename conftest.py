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
"""

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    cell = getattr(item, "cell", None)
    if cell is not None and "raises-exception" in cell.get("metadata", {}).get("tags", []):
        outputs = getattr(item, "test_outputs", None) or []
        if not any(out.get("output_type") == "error" for out in outputs):
            raise AssertionError("this cell is tagged raises-exception but ran without raising")
    return result
