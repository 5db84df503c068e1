"""Attacks on the grader, as a cheating student would write them: none earns a point or shows a
hidden test.

One class of attackers is graded in one run (one canary), each a 00_environment submission whose
code uses only names built at run time, so that the scan flags nothing and the verdict and the
feedback alone must hold:

* ``silencer`` has no answer: it prints every line of source it can reach and silences every
  error the kernel would show (the attack that earned 2 of 8 points when a test passed by
  printing a completion marker);
* ``forger`` (the demo class's, see ``devcourse.instructor.forger.FORGER``) has no answer either:
  its functions return an object that absorbs every use, and a thread of its rewrites the kernel's
  recorder so that every check records True and every value comparison records the expected side the
  notebook pairs with the same expression elsewhere; its errors are silenced too (every test passes
  in the notebook the student sees). The demo class has it hand in every assignment;
* ``leaker`` has the right answers, and dumps all it can reach (history, the frames of every thread
  but the installed libraries', ``linecache``, ``inspect``, the environment, ``/proc``, files) in
  base64, which no filter of the outputs would recognise, at the first call of an answer from each
  cell (tests included, and their probes, whose hidden checks it must not reach either), from a
  thread that keeps going, and through a display it updates later.
"""

import base64
import html
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.cli import grade
from autograder.course.cells import visible_source
from devcourse.instructor.paths import DEMO_CLASS
from autograder.settings import Limits, Settings

sys.path.insert(0, str(Path(__file__).parent))
from test_grade import CELL_TIMEOUT_S, _submit  # noqa: E402

SILENCER = """\
import importlib, linecache, sys

def _silence_and_print():
    frame = getattr(sys, "_get" + "frame")(1)
    while frame is not None:  # every line of every caller's source
        print("".join(linecache.getlines(frame.f_code.co_filename)), flush=True)
        frame = getattr(frame, "f_" + "back")
    shell = getattr(importlib.import_module("IPy" + "thon"), "get_" + "ipython")()
    for name in ("showtrace" + "back", "_showtrace" + "back"):
        setattr(shell, name, lambda *args, **kwargs: None)

def list_devices():
    _silence_and_print()
    return []
"""

LEAKER = """\
import base64, importlib, linecache, os, sys, threading, time

_seen = set()
_leaked_from = set()  # the cells (their code's file names) an answer dumped everything from

def _reachable():
    texts = []
    # Python's and the libraries' own files
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    for frame in getattr(sys, "_current_" + "frames")().values():
        while frame is not None:
            if not frame.f_code.co_filename.startswith(installed):
                texts.extend(linecache.getlines(frame.f_code.co_filename))
            frame = getattr(frame, "f_" + "back")
    main = vars(importlib.import_module("__main__"))
    for key in ("In", "_ih", "Out"):
        history = main.get(key) or []
        items = history.values() if isinstance(history, dict) else history
        texts.extend(str(item) for item in items)
    look = importlib.import_module("insp" + "ect")
    # the source of every function the notebook and its tests defined
    for value in list(main.values()):
        try:
            texts.append(look.getsource(value))
        except (TypeError, OSError):
            pass
    for record in getattr(look, "st" + "ack")():
        texts.extend(record.code_context or [])
    texts.extend(f"{key}={value}" for key, value in os.environ.items())
    for path in ("/proc/self/cmdline", "/proc/self/environ", "/proc/self/mountinfo"):
        try:
            texts.append(open(path, errors="replace").read().replace("\\0", "\\n"))
        except OSError:
            pass
    # a few seconds of files per dump: a checkout under /tmp is all in view
    deadline = time.monotonic() + 3
    for root in (os.getcwd(), os.path.expanduser("~"), "/tmp"):
        for folder, folders, files in os.walk(root):
            skipped = ("site-packages", "dist-packages", "__pycache__")
            folders[:] = [f for f in folders if f not in skipped]
            if folder.startswith(installed):  # the environment, mounted wherever the checkout is
                folders[:] = []
                continue
            if time.monotonic() > deadline:
                break
            for name in files:
                try:
                    if os.path.getsize(os.path.join(folder, name)) < 1 << 20:
                        texts.append(open(os.path.join(folder, name), errors="replace").read())
                except OSError:
                    pass
    lines = (line.strip() for text in texts for line in str(text).splitlines())
    return {line for line in lines if len(line) >= 12}

def _leak(new_only=False):
    found = _reachable()
    new = found - _seen
    # what it had not seen before last
    lines = sorted(new) if new_only else sorted(found & _seen) + sorted(new)
    _seen.update(found)
    return "\\n".join(base64.b64encode(line.encode()).decode() for line in lines)

print(_leak(), flush=True)
_display = importlib.import_module("IPy" + "thon.display")
_handle = _display.display("leaking", display_id=True)

def _keep_leaking():
    while True:
        text = _leak(new_only=True)
        if text:
            print(text, flush=True)
            _handle.update("\\n".join(sorted(_seen))[-100000:])
        time.sleep(0.5)

threading.Thread(target=_keep_leaking, daemon=True).start()
"""


def _leaking(name: str) -> str:
    """Code that makes ada's answer ``name`` dump all the leaker reaches, in full, at its first call
    from each cell (a test's cell included: what a test's code leaves reachable is there while any
    of its calls runs)."""
    return (
        f"\n\n_answer_{name} = {name}\n\ndef {name}(*args, **kwargs):\n"
        "    caller = getattr(sys, '_get' + 'frame')(1).f_code.co_filename\n"
        "    if caller not in _leaked_from:\n"
        "        _leaked_from.add(caller)\n"
        "        print(_leak(), flush=True)\n"
        f"    return _answer_{name}(*args, **kwargs)\n"
    )


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    _submit(tmp, "silencer", {"list_devices": lambda _: SILENCER}, based_on="linus")
    shutil.copytree(
        DEMO_CLASS / "forger" / "00_environment", tmp / "submitted" / "forger" / "00_environment"
    )
    _submit(
        tmp,
        "leaker",
        {
            "list_devices": lambda answer: LEAKER + "\n" + answer + _leaking("list_devices"),
            "resolve_device": lambda answer: answer + _leaking("resolve_device"),
        },
        based_on="ada",
    )
    settings = Settings(jobs=2, limits=Limits(cell_timeout_s=CELL_TIMEOUT_S), progress=False)
    results = {
        r.student: r
        for r in grade.grade(tmp / "submitted", tmp / "work", settings)
        if r.assignment == "00_environment"
    }
    return tmp / "work", results


@pytest.mark.parametrize("student", ["silencer", "forger"])
def test_an_attack_without_answers_earns_nothing(attacked, student):
    workdir, results = attacked
    result = results[student]
    assert "withheld" not in result.note, (
        f"the scan caught {student}; the verdict itself must hold: {result.note}"
    )
    assert result.score == 0, f"{student} earned {result.score} points with no answer"
    if student == "forger":  # the attack ran as meant: no error shown, every probe forged
        graded = nbformat.read(
            workdir / "executed" / student / "00_environment" / "00_environment.ipynb", as_version=4
        )
        tests = [
            c
            for c in graded.cells
            if c.metadata.get("nbgrader", {}).get("grade")
            and not c.metadata["nbgrader"].get("solution")
        ]
        shown = [o.ename for c in tests for o in c.get("outputs", []) if o.output_type == "error"]
        assert shown == ["GradingError"] * len(tests), shown
        forged = json.loads(
            (
                workdir
                / "jobs"
                / student
                / "00_environment"
                / "00_environment"
                / "observations.json"
            ).read_text()
        )
        assert len(forged) == 8 and all(
            event[2] is True
            for probe_record in forged.values()
            for event in probe_record["events"]
            if len(event) == 3 and isinstance(event[2], bool)
        )


def _hidden_only_lines(workdir: Path) -> set[str]:
    """Lines of the hidden tests that appear nowhere in the notebook the student has."""
    source = nbformat.read(
        workdir / "source" / "00_environment" / "00_environment.ipynb", as_version=4
    )
    release = (workdir / "release" / "00_environment" / "00_environment.ipynb").read_text()
    lines = set()
    for cell in source.cells:
        for block in re.findall(
            r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", cell.source, re.S
        ):
            lines.update(line.strip() for line in block.splitlines() if len(line.strip()) >= 12)
    return {line for line in lines if line not in release and html.escape(line) not in release}


def _encodings(line: str) -> list[str]:
    return [line, html.escape(line), base64.b64encode(line.encode()).decode()]


def test_no_hidden_test_reaches_what_the_student_sees(attacked):
    workdir, results = attacked
    assert results["leaker"].score == 8, results["leaker"].note
    hidden = _hidden_only_lines(workdir)
    assert len(hidden) >= 10, hidden
    graded = nbformat.read(
        workdir / "executed" / "leaker" / "00_environment" / "00_environment.ipynb", as_version=4
    )
    shown = "\n".join(
        nbformat.writes(
            nbformat.v4.new_notebook(
                cells=[
                    nbformat.v4.new_code_cell(outputs=c.get("outputs", [])) for c in graded.cells
                ]
            )
        )
        for _ in [0]
    )
    feedback = "\n".join(
        p.read_text() for p in (workdir / "feedback" / "leaker" / "00_environment").glob("*.html")
    )
    assert feedback, "feedback was written"
    # The leaker ran, and what it could reach while the notebook ran is there: a visible test's
    # source.
    visible = visible_source(
        next(c.source for c in graded.cells if "list_devices() must return" in c.source)
    )
    assert base64.b64encode(visible.splitlines()[0].strip().encode()).decode() in shown
    # ... and it ran while the probes ran, yet reached no hidden line there: a probe's source is not
    # in linecache, and what student code hooked into IPython is gone before IPython reads it
    log = (
        workdir / "jobs" / "leaker" / "00_environment" / "00_environment" / "probes.log"
    ).read_text()
    assert log.count("\n") > 20, "the leaker printed nothing while the probes ran"
    reached = [line for line in hidden if base64.b64encode(line.encode()).decode() in log]
    assert reached == [], f"the leaker read hidden lines while the probes ran: {reached}"
    for line in hidden:
        for text in _encodings(line):
            assert text not in shown, f"hidden test line in the graded notebook's outputs: {line}"
            assert text not in feedback, f"hidden test line in the feedback: {line}"
