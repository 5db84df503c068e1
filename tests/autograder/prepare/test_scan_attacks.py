"""The answer scan reads what IPython runs, and reviews an answer that tells the simulated device
apart by name.

Before, the scan blanked every ``%`` and ``!`` line and skipped a cell it could not parse as plain
Python (``x = !ls``), so code behind a magic, and every line of such a cell, went unread; and an
answer could be right only on the simulated device by testing ``device.type == "sim"``.
"""

import nbformat
import pytest

from devcourse.instructor.profile import DeviceCourse
from autograder.prepare import scan

STAND_INS = DeviceCourse.stand_ins


def answer(source: str, grade_id: str = "best_device"):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade_id": grade_id,
        "solution": True,
        "grade": False,
        "locked": False,
    }
    return cell


@pytest.mark.parametrize(
    "source",
    [
        "%time get_ipython().showtraceback = None",
        "%%time\nimport builtins\n",
        "%timeit -n 1 -r 1 __import__('os')",
        "listing = !ls /\nimport ctypes",  # a cell plain Python cannot parse
        "!python -c 'print(1)'",
        "%run helper.py",
        "%load_ext my_extension",
        "%%bash\ncat /proc/1/environ\n",
    ],
)
def test_what_a_magic_or_shell_line_runs_is_read(source):
    assert scan.scan([answer(source)]), source


@pytest.mark.parametrize(
    "source",
    [
        "%matplotlib inline\nimport torch\nx = torch.ones(2)",
        "%timeit -n 3 -r 2 torch.ones(2).sum()",
        "%%time\ntotal = sum(range(10))\n",
        "torch.ones?",
    ],
)
def test_honest_magics_are_not_flagged(source):
    assert scan.scan([answer(source)]) == [], source


def test_a_students_own_get_ipython_is_still_flagged():
    assert scan.scan([answer("shell = get_ipython()")]) == ["line 1 uses get_ipython"]


def test_a_line_behind_a_magic_is_named_by_its_own_line():
    assert scan.scan([answer("x = 1\n\n%time get_ipython()")]) == ["line 3 uses get_ipython"]


TELLS_APART = """
def best_device():
    for candidate in ("cuda", "mps"):
        pass
    return torch.device("cpu")

def move(batch, device):
    if device.type == "sim":
        return batch.to(device)
    return batch
"""


def test_naming_the_simulated_device_is_reviewed_where_the_exercise_does_not():
    [finding] = scan.scan([answer(TELLS_APART)], STAND_INS)
    assert finding.startswith("line 8 names the simulated device 'sim'"), finding
    assert scan.scan([answer("d = torch.device('sim:1')")], STAND_INS)
    assert (
        scan.scan(
            [answer(TELLS_APART, grade_id="load_on_sim")], STAND_INS, frozenset({"load_on_sim"})
        )
        == []
    )
    assert scan.scan([answer("name = 'simple'\nkind = 'similar:2'")], STAND_INS) == [], (
        "only the device's names"
    )
    assert scan.scan([answer(TELLS_APART)]) == [], (
        "a course with no simulated device has nothing to tell apart"
    )
