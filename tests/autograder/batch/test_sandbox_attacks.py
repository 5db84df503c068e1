"""Attacks on the sandbox, one class of hole each, graded together in one run of another course's
assignment.

``tests/fixtures/stats101`` is graded as an instructor of another course would (no torch in its
kernels, so it is quick). Each attacker hands in alice's answers (5 points) or alice's answers less
``squares`` (3 points), with code of its own that reaches for something a submission must not have;
its names are built at run time, as a determined student's would be, so that the answer scan flags
nothing and the sandbox alone must hold:

* ``ipc_keeper`` leaves its ``squares`` in System V shared memory, a message queue and a semaphore
  set, all kept after its kernel ends; ``ipc_reader`` has no ``squares`` of its own and runs the one
  it finds there;
* ``hider`` ignores ``SIGCHLD``, so that Linux reaps the workers it forks, whose processor time then
  reaches no parent's count, and burns far more than a cell's limit that way;
* ``shouter`` writes to the kernel's own standard output and error, below Jupyter's messages: a
  forged line of the grader's and megabytes after it;
* ``peeker`` has alice's ``squares``, which prints, in base64, the source of each cell that first
  calls it, as ``linecache`` holds it: a hidden check's, when the grader runs the test again;
* ``mimic`` has alice's ``squares``, which has IPython display an empty record of the checks' type
  after each cell that calls it: a display that is not the check's own, and must not count against
  her;
* ``crowd`` hands in 600 more empty code cells, ``bloat`` a notebook of 33 MiB, and ``hoarder``'s
  ``squares`` takes the token of the check that calls it from the check's code and has IPython
  display a record of 600 KiB with it after the check: each is past a limit per notebook (code
  cells, size, recorded values: 1 MiB in this run).

Apart from that run, a run killed outright while a kernel holds System V shared memory leaves
neither.
"""

import base64
import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.run import sandbox
from autograder.run.watch import RUN_MARKER, processes_of

COURSE = Path(__file__).resolve().parents[2] / "fixtures" / "stats101"
ASSIGNMENT = "ps1"
CELL_LIMIT_S = 4
ALICE, WITHOUT_SQUARES = "5", "3"  # alice's score, and hers without the two tests of squares
# A key for this run's System V objects: another run of the test at the same time uses another.
IPC_KEY = secrets.randbelow(1 << 30) + (1 << 29)

SQUARES = """\
def squares(n):
    if n < 1:
        raise ValueError("n must be at least 1")
    return [i * i for i in range(1, n + 1)]
"""

IPC_WRITER = f"""\
import importlib
_c = importlib.import_module("ctyp" + "es")
_libc = _c.CDLL(None, use_errno=True)
_libc.shmat.restype = _c.c_void_p
_answer = {SQUARES!r}.encode()
# IPC_CREAT, readable by every user
_segment = getattr(_libc, "shm" + "get")({IPC_KEY}, 4096, 0o1666)
_c.memmove(_libc.shmat(_segment, None, 0), _answer, len(_answer))
getattr(_libc, "msg" + "get")({IPC_KEY}, 0o1666)
getattr(_libc, "sem" + "get")({IPC_KEY}, 1, 0o1666)
"""

IPC_READER = f"""\
def squares(n):
    raise NotImplementedError()

import importlib, time
_c = importlib.import_module("ctyp" + "es")
_libc = _c.CDLL(None, use_errno=True)
_libc.shmat.restype = _c.c_void_p
_waited = time.monotonic()
while time.monotonic() - _waited < 8:  # the keeper may be graded at the same time, or later
    _segment = getattr(_libc, "shm" + "get")({IPC_KEY}, 0, 0)
    if _segment >= 0:
        _found = _c.string_at(_libc.shmat(_segment, None, 0)).decode()
        getattr(importlib.import_module("built" + "ins"), "ex" + "ec")(_found)
        break
    time.sleep(0.2)
"""

HIDER = """\
import importlib, os, time
_signals = importlib.import_module("sig" + "nal")
# Linux reaps the workers: no one's cutime
getattr(_signals, "sig" + "nal")(_signals.SIGCHLD, _signals.SIG_IGN)
_began = time.monotonic()
while time.monotonic() - _began < 12:
    for _ in range(2):
        if os.fork() == 0:
            _spun = time.process_time()
            while time.process_time() - _spun < 0.3:
                pass
            getattr(os, "_ex" + "it")(0)
    time.sleep(0.3)
print("never stopped")
"""


SHOUTER = """\
import os, sys
_forged = b"GradingError: the grader stopped; every test of this notebook passed\\n"
# ipykernel's copy of the kernel's standard stream, below its capture
_saved = "_original_stdstream_" + "copy"
for _fd in (getattr(sys.stdout, _saved, 1), getattr(sys.stderr, _saved, 2)):
    for _ in range(40):
        os.write(_fd, _forged + b"x" * (100 << 10) + b"\\n")
"""
KERNEL_LOG_LIMIT = 1 << 20

PEEKER = (
    SQUARES
    + """
import base64, importlib, linecache

_answer, _callers = squares, set()


def squares(n):
    caller = getattr(importlib.import_module("sys"), "_get" + "frame")(1).f_code.co_filename
    if caller not in _callers:
        _callers.add(caller)
        print(
            "PEEK",
            base64.b64encode("".join(linecache.getlines(caller)).encode()).decode(),
            flush=True,
        )
    return _answer(n)
"""
)
MIMIC = (
    SQUARES
    + """
import importlib
_answer = squares
_shell = getattr(importlib.import_module("IPy" + "thon"), "get_" + "ipython")()
_publish = getattr(importlib.import_module("IPy" + "thon.display"), "publish_display_data")

def _record_of_nothing(*_):
    _publish({"application/vnd.course.probe+json": {"events": []}})

def squares(n):
    if _record_of_nothing not in _shell.events.callbacks["post_run_cell"]:
        # after the cell: after a check's own record
        _shell.events.register("post_run_cell", _record_of_nothing)
    return _answer(n)
"""
)
HOARDER = (
    SQUARES
    + """
import importlib, re
_answer = squares
_shell = getattr(importlib.import_module("IPy" + "thon"), "get_" + "ipython")()
_publish = getattr(importlib.import_module("IPy" + "thon.display"), "publish_display_data")

def _hoard(result):
    # the check's own token
    for token in re.findall(r"end\\('([0-9a-f]{32})'\\)", result.info.raw_cell or ""):
        record = {"events": [["x" * (600 << 10)]], "token": token}
        _publish({"application/vnd.course.probe+json": record})

def squares(n):
    if _hoard not in _shell.events.callbacks["post_run_cell"]:
        _shell.events.register("post_run_cell", _hoard)
    return _answer(n)
"""
)
RECORDED_LIMIT_MIB = 1
HIDDEN_LINE = "for bad in (0, -3):"  # problem1's hidden check: in no notebook a student has


def _hand_in(
    course: Path,
    student: str,
    first_cell: str = "",
    answer: str | None = None,
    cells: int = 0,
    markdown: str = "",
) -> None:
    """alice's submission for ``student``: ``first_cell`` before problem1's cells, ``answer`` in
    place of her ``squares`` (its answer cell's source), ``cells`` empty code cells and a
    ``markdown`` cell after them."""
    folder = course / "submitted" / student / ASSIGNMENT
    shutil.copytree(COURSE / "submissions" / "alice" / ASSIGNMENT, folder)
    path = folder / "problem1.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell("") for _ in range(cells)]
    if markdown:
        nb.cells.append(nbformat.v4.new_markdown_cell(markdown))
    if answer is not None:
        cell = next(
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "squares"
        )
        cell.source = answer
    if first_cell:
        nb.cells.insert(0, nbformat.v4.new_code_cell(first_cell))
    nbformat.write(nb, path)


def _ipc_objects() -> list[tuple[str, list[str]]]:
    """This machine's System V IPC objects with this run's key, as /proc lists them: (kind, the
    row's fields) of shared memory (shm), message queues (msg) and semaphore sets (sem)."""
    rows = [
        (kind, line.split())
        for kind in ("shm", "msg", "sem")
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    ]
    return [(kind, fields) for kind, fields in rows if fields and int(fields[0]) == IPC_KEY]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The attackers graded in one run: (scores.csv's rows by student, the course folder)."""
    if not sandbox.probe().namespaces:
        pytest.skip(f"no namespaces on this machine: {sandbox.probe().reason}")
    tmp = tmp_path_factory.mktemp("sandbox-attacks")
    course = tmp / "course"
    shutil.copytree(COURSE / "course", course)
    _hand_in(course, "alice")
    _hand_in(course, "ipc_keeper", first_cell=IPC_WRITER)
    _hand_in(course, "ipc_reader", answer=IPC_READER)
    _hand_in(course, "hider", first_cell=HIDER)
    _hand_in(course, "shouter", first_cell=SHOUTER)
    _hand_in(course, "peeker", answer=PEEKER)
    _hand_in(course, "mimic", answer=MIMIC)
    _hand_in(course, "crowd", cells=600)
    _hand_in(course, "bloat", markdown="x" * (33 << 20))
    _hand_in(course, "hoarder", answer=HOARDER)
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
            "--recorded-limit-mib",
            str(RECORDED_LIMIT_MIB),
            "--quiet",
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(course / "scores.csv", newline="") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    yield rows, course
    for kind, fields in _ipc_objects():  # what a failed run left, for the next
        subprocess.run(
            ["ipcrm", {"shm": "-m", "msg": "-q", "sem": "-s"}[kind], fields[1]], capture_output=True
        )


def test_alice_keeps_her_score(graded):
    rows, _ = graded
    assert rows["alice"]["score"] == ALICE, rows["alice"]


def test_no_ipc_object_outlives_its_kernel(graded):
    """System V IPC belongs to the IPC namespace: each sandbox has its own, gone with its kernel."""
    assert _ipc_objects() == [], "a submission's System V IPC objects outlived its kernel"


def test_a_submission_reaches_no_other_through_ipc(graded):
    rows, _ = graded
    assert rows["ipc_keeper"]["score"] == ALICE, rows["ipc_keeper"]
    assert rows["ipc_reader"]["score"] == WITHOUT_SQUARES, rows["ipc_reader"]


def test_processor_time_of_reaped_workers_is_counted(graded):
    """Workers that Linux reaped itself count as much as any: the cgroup counts them, which no
    process can leave."""
    rows, course = graded
    note = rows["hider"]["note"]
    assert f"time limit of {CELL_LIMIT_S:g} s of processor time per cell" in note, note
    executed = nbformat.read(
        course / "executed" / "hider" / ASSIGNMENT / "problem1.ipynb", as_version=4
    )
    assert "never stopped" not in json.dumps(executed.cells[0].outputs)
    # stopped at its first cell: problem1's tests too
    assert rows["hider"]["score"] == WITHOUT_SQUARES, rows["hider"]


def test_a_kernel_writes_nothing_into_the_graders_log(graded):
    """What a kernel writes below Jupyter's messages goes to a file of its own, capped per
    notebook."""
    rows, course = graded
    assert rows["shouter"]["score"] == ALICE, rows["shouter"]
    folder = course / "jobs" / "shouter" / ASSIGNMENT / "problem1"
    runner_log = (folder / "runner.log").read_text(errors="replace")
    assert "GradingError" not in runner_log and len(runner_log) < 64 << 10, (
        len(runner_log),
        runner_log[-300:],
    )
    kernel_log = (folder / "kernel.log").read_bytes()
    assert b"GradingError" in kernel_log, "the attack reached the kernel's own output"
    assert (
        len(kernel_log) <= KERNEL_LOG_LIMIT + 200
        and b"more bytes of the kernel's output not kept" in kernel_log
    )


def test_a_hidden_check_is_not_in_linecache_while_it_runs(graded):
    """The peeker's prints during the probes reach only the instructor's probes.log; none holds the
    hidden check."""
    rows, course = graded
    assert rows["peeker"]["score"] == ALICE, rows["peeker"]
    log = (course / "jobs" / "peeker" / ASSIGNMENT / "problem1" / "probes.log").read_text()
    peeked = [
        base64.b64decode(line.split()[1]).decode()
        for line in log.splitlines()
        if line.startswith("PEEK ") and len(line.split()) == 2
    ] + ["" for line in log.splitlines() if line == "PEEK "]
    assert peeked, "the peeker ran during the probes"
    assert not any(HIDDEN_LINE in text for text in peeked), [
        text for text in peeked if HIDDEN_LINE in text
    ]


def test_a_display_of_the_records_type_that_is_not_the_checks_own_is_ignored(graded):
    rows, course = graded
    assert rows["mimic"]["score"] == ALICE, rows["mimic"]
    executed = nbformat.read(
        course / "executed" / "mimic" / ASSIGNMENT / "problem1.ipynb", as_version=4
    )
    assert "application/vnd.course.probe+json" in json.dumps(
        [c.get("outputs") for c in executed.cells]
    ), "the attack displayed its records"


@pytest.mark.parametrize(
    "student, limit",
    [
        ("crowd", "over the limit of 500 per notebook"),
        ("bloat", "over the limit of 32 MiB per notebook"),
        ("hoarder", f"limit of {RECORDED_LIMIT_MIB} MiB of recorded values per notebook"),
    ],
)
def test_a_notebook_past_a_limit_gets_0_points_with_a_note_naming_it(graded, student, limit):
    """problem1 is past the limit: 0 points for it; problem2, alice's, keeps its 3."""
    rows, _ = graded
    assert rows[student]["score"] == WITHOUT_SQUARES, rows[student]
    assert limit in rows[student]["note"] and "0 points for it" in rows[student]["note"], rows[
        student
    ]["note"]


KEEPER_THAT_WAITS = (
    IPC_WRITER.replace("4096", str(64 << 20))
    + """
import time
while True:  # until the run is killed
    time.sleep(1)
"""
)


def _ipc_namespaces() -> dict[int, str]:
    """Every process of this machine: pid -> its IPC namespace."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(entry)] = os.readlink(f"/proc/{entry}/ns/ipc")
        except OSError:
            continue
    return found


def test_a_killed_run_leaves_no_process_and_no_ipc_object(tmp_path):
    """The grader killed outright while a kernel holds 64 MiB of System V shared memory: every
    process of the run ends, and with the last one the kernel's IPC namespace, whose objects go with
    it."""
    if not sandbox.probe().namespaces:
        pytest.skip(f"no namespaces on this machine: {sandbox.probe().reason}")
    course = tmp_path / "course"
    shutil.copytree(COURSE / "course", course)
    _hand_in(course, "keeper", first_cell=KEEPER_THAT_WAITS)
    mark = f"killed-with-ipc-{os.getpid()}"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            "--course",
            str(course),
            "--jobs",
            "1",
            "--quiet",
            "--no-feedback",
        ],
        cwd=tmp_path,
        env={**os.environ, RUN_MARKER: mark},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    namespace, deadline = None, time.monotonic() + 120
    try:
        while namespace is None:
            assert run.poll() is None and time.monotonic() < deadline, (
                "the keeper's kernel never held its memory"
            )
            for pid in processes_of(mark):
                try:
                    if "SYSV" in Path(f"/proc/{pid}/maps").read_text():
                        namespace = os.readlink(f"/proc/{pid}/ns/ipc")
                except OSError:
                    continue
            time.sleep(0.2)
        assert namespace != os.readlink("/proc/self/ns/ipc"), (
            "the kernel shares the grader's IPC namespace"
        )
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        deadline = time.monotonic() + 15
        while processes_of(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(mark) == {}, "a process of the killed run is left"
        assert namespace not in _ipc_namespaces().values(), (
            "the kernel's IPC namespace, and its objects, are left"
        )
    finally:
        if run.poll() is None:
            run.kill()
