"""A busy machine changes no score: the limits per cell count processor time, which other work does
not slow.

Another course's assignment (``tests/fixtures/stats101``, graded plainly: no torch in its kernels,
so it is quick) is graded while processes that never stop keep every core this test may use three
times over. ``busy`` hands in alice's answers behind a cell that uses 1.5 s of processor time, which
takes several times that in wall time here; ``looper`` hands in alice's answers and a cell that
never ends. With a limit of 4 s per cell, busy keeps the score plain nbgrader gives alice
(tests/autograder/cli/test_other_course.py; a limit of wall time stopped it) and looper is stopped,
as on an idle machine. ``laggard``'s output (a probe's record among it) reaches the grader seconds
after its cell's end, as a busy machine's does, and still counts.
"""

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

COURSE = Path(__file__).resolve().parents[2] / "fixtures" / "stats101"
ASSIGNMENT = "ps1"
CELL_LIMIT_S = 4
BUSY = """\
import time
_wall, _cpu = time.monotonic(), time.process_time()
while time.process_time() - _cpu < 1.5:  # 1.5 s of processor time, however busy the machine is
    pass
print(json.dumps({"wall_s": time.monotonic() - _wall}))
"""


def _hand_in(course: Path, student: str, first_cell: str) -> None:
    """alice's submission for ``student``, with ``first_cell`` as the first cell of problem1."""
    folder = course / "submitted" / student / ASSIGNMENT
    shutil.copytree(COURSE / "submissions" / "alice" / ASSIGNMENT, folder)
    path = folder / "problem1.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import json\n" + first_cell))
    nbformat.write(nb, path)


def _spinners() -> list[subprocess.Popen]:
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    # each in a session of its own, as other users' work is: Linux shares the processor between
    # sessions first (autogroups), and the grader's kernels run in sessions of their own
    return [
        subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"], start_new_session=True)
        for _ in range(3 * cores)
    ]


def test_a_busy_machine_changes_no_score_and_still_stops_a_loop(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(COURSE / "course", course)
    _hand_in(course, "busy", BUSY)
    _hand_in(course, "looper", "while True:\n    pass\n")
    spinners = _spinners()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "autograder",
                "grade",
                "--course",
                str(course),
                "--jobs",
                "2",
                "--cell-timeout",
                str(CELL_LIMIT_S),
                "--quiet",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(course / "scores.csv", newline="") as handle:
        rows = {r["student"]: r for r in csv.DictReader(handle)}
    executed = nbformat.read(
        course / "executed" / "busy" / ASSIGNMENT / "problem1.ipynb", as_version=4
    )
    printed = "".join(
        o.get("text", "") for o in executed.cells[0].outputs if o.output_type == "stream"
    )
    assert printed, (executed.cells[0].outputs, rows["busy"]["note"])
    wall_s = json.loads(printed)["wall_s"]
    # the load did what it is for: the cell took longer than its limit in wall time, which stopped
    # it before
    assert wall_s > CELL_LIMIT_S, f"the machine was not busy enough: {wall_s:.1f} s"
    assert rows["busy"]["score"] == "5", rows["busy"]  # alice's, as plain nbgrader grades her
    assert "time limit" not in rows["busy"]["note"], rows["busy"]["note"]
    # stopped by a limit: its processor time's, or under a load this heavy the wall time's (4x as
    # much)
    assert "problem1: stopped, time limit of" in rows["looper"]["note"], rows["looper"]


LAGGARD = '''\
import sys, time
_callers = []
_answer = squares

def squares(n):
    """alice's squares; at its first call from a probe, the kernel's output reaches the grader
    8 s after the kernel says the cell is done (said once it has waited 1 s for that output)."""
    cell = getattr(sys, "_get" + "frame")(1).f_code.co_filename
    if cell not in _callers:
        _callers.append(cell)
        if len(_callers) == 3:  # the two test cells, then the first probe
            # (setattr: a plain assignment is held for review)
            for stream in (sys.stdout, sys.stderr):
                setattr(stream, "flush_timeout", 0.5)
            # what a busy machine's slow reading does
            sys.stdout.pub_thread.schedule(lambda: time.sleep(8))
    return _answer(n)
'''


def test_output_that_reaches_the_grader_late_still_counts(tmp_path):
    """On a busy machine a kernel's output (a probe's record among it) can reach the grader seconds
    after the cell's end; the grader waits for it as for the cell itself, so the score is
    alice's."""
    course = tmp_path / "course"
    shutil.copytree(COURSE / "course", course)
    folder = course / "submitted" / "laggard" / ASSIGNMENT
    shutil.copytree(COURSE / "submissions" / "alice" / ASSIGNMENT, folder)
    nb = nbformat.read(folder / "problem1.ipynb", as_version=4)
    answer = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "squares"
    )
    answer.source += "\n\n" + LAGGARD
    nbformat.write(nb, folder / "problem1.ipynb")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            "--course",
            str(course),
            "--jobs",
            "1",
            "--cell-timeout",
            "20",
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(course / "scores.csv", newline="") as handle:
        rows = {r["student"]: r for r in csv.DictReader(handle)}
    assert rows["laggard"]["score"] == "5", rows["laggard"]
