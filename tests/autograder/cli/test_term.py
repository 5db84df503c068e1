"""docs/instructors.md, played: an instructor and two students, from release to export, every
command as written.

Each fenced ``bash`` block of the page names who runs it (``instructor``,
``student=alice``, ``formgrader`` ...). The test runs them in order, each in a
fresh ``bash`` that first runs the page's ``settings`` block with this
checkout's paths put in (and temporary folders for the course directory and
the exchange), as that person: each has a home folder of their own, so
nbgrader's per-user state is theirs. Between blocks it does what the page
says happens by hand (the students answer: alice with ada's notebook from the
demo class, bob with margaret's, which earns 5 of 8; the instructor changes
in formgrader, in Chromium, the instructor grades both written answers of
Exercise 4 and gives bob the points of a test he failed) and checks what
each step left: two grading runs with identical gradebooks, the written
answers listed as left to grade by hand, bob's late penalty and the scores
given in formgrader in nbgrader's export and the LMS ones, feedback in each
student's folder.

Needs what the browser tests need (``make browser``). Screenshots and the
server's log go to ``build/browser/test_term/``.
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import shlex
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from support.gradebooks import table_dump
from support.lab import ARTIFACTS, SECOND, chromium, stop_lab
from support.servers import free_port, tail

from autograder.course.config import course_config
from devcourse.instructor.demo import SUBMITTED
from devcourse.instructor.paths import ROOT
from autograder.run.sandbox import tethered

DOC = ROOT / "docs" / "instructors.md"
BLOCK = re.compile(r"^```bash (?P<who>[^\n]+)\n(?P<body>.*?)^```\s*$", re.M | re.S)
SETTING = re.compile(r"^(?P<name>[A-Z_]+)=(?P<value>\S+)\s*(#.*)?$")
ASSIGNMENT = "00_environment"
ANSWERS = {"alice": "ada", "bob": "margaret"}  # who answers like whom in the demo class
WRITTEN = "reply_to_a_classmate"  # Exercise 4's written answer, graded by hand
WRITTEN_SCORES = {"alice": 2, "bob": 1}  # ada wrote the model answer; margaret's fix is wrong
MAX_SCORE = 10.0
ARTIFACT_DIR = ARTIFACTS / "test_term"


def doc_blocks() -> list[tuple[str, str]]:
    return [(m["who"].strip(), m["body"]) for m in BLOCK.finditer(DOC.read_text())]


class Term:
    """The people of the walk-through, each with a home folder, and the page's settings with this
    machine's paths."""

    def __init__(self, folder: Path, settings: str):
        self.folder = folder
        self.course = folder / "course"
        self.exchange = folder / "exchange"
        values = {"REPO": str(ROOT), "COURSE": str(self.course), "EXCHANGE": str(self.exchange)}
        lines, seen = [], set()
        for line in settings.splitlines():
            match = SETTING.match(line.strip())
            if match and match["name"] in values:
                line = f"{match['name']}={shlex.quote(values[match['name']])}"
            if match:
                seen.add(match["name"])
                if match["name"] == "COURSE_ID":
                    self.course_id = match["value"]
            lines.append(line)
        assert seen == {
            "REPO",
            "COURSE",
            "EXCHANGE",
            "COURSE_ID",
        }, f"the settings block sets {sorted(seen)}"
        self.settings = "\n".join(lines)
        if not (ROOT / ".venv" / "bin" / "activate").is_file():
            pytest.fail(
                "the page activates the course's environment: run `make install` first",
                pytrace=False,
            )

    def home(self, who: str) -> Path:
        home = self.folder / "home" / who
        home.mkdir(parents=True, exist_ok=True)
        return home

    def env(self, who: str) -> dict[str, str]:
        """A login of ``who``: their own home, no Jupyter, make or virtual environment settings of
        this process."""
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(
                ("JUPYTER", "JPY_", "MAKE", "MFLAGS", "VIRTUAL_ENV", "PYTEST", "COURSE_")
            )
        }
        bin_dir = str(ROOT / ".venv" / "bin")
        keep["PATH"] = os.pathsep.join(
            p for p in keep.get("PATH", "").split(os.pathsep) if p != bin_dir
        )
        return {**keep, "HOME": str(self.home(who)), "USER": who, "LOGNAME": who}

    def script(self, body: str) -> str:
        return "set -euo pipefail\n" + self.settings + "\n" + body

    def run(self, who: str, body: str) -> str:
        done = subprocess.run(
            ["bash", "-c", self.script(body)],
            cwd=self.home(who),
            env=self.env(who),
            capture_output=True,
            text=True,
            timeout=900,
        )
        output = done.stdout + done.stderr
        (ARTIFACT_DIR / "commands.log").open("a").write(f"--- {who}:\n{body}\n{output}\n")
        assert done.returncode == 0, (
            f"{who}'s block failed ({done.returncode}):\n{body}\n{output[-4000:]}"
        )
        return output


def grades_of(course: Path, student: str) -> list[tuple]:
    """(submitted notebook id, cell name, auto score, manual score, max score, needs manual grade)
    of each grade."""
    query = """SELECT sn.id, bc.name, g.auto_score, g.manual_score, gc.max_score,
                      g.needs_manual_grade
               FROM grade g
               JOIN submitted_notebook sn ON g.notebook_id = sn.id
               JOIN submitted_assignment sa ON sn.assignment_id = sa.id
               JOIN base_cell bc ON g.cell_id = bc.id JOIN grade_cells gc ON gc.id = g.cell_id
               WHERE sa.student_id = ? ORDER BY bc.name"""
    with sqlite3.connect(course / "gradebook.db") as db:
        return list(db.execute(query, (student,)))


def raw_score(course: Path, student: str) -> float:
    return sum(g[3] if g[3] is not None else (g[2] or 0.0) for g in grades_of(course, student))


def _total(score: float) -> str:
    """The total as nbgrader's feedback page prints it."""
    return f"{ASSIGNMENT} (Score: {round(score, 2)} / {MAX_SCORE})"


def csv_rows(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _in_its_own_thread(function, *args) -> None:
    """Run ``function`` in a new thread and raise what it raised.

    Playwright's synchronous API refuses a thread with a running asyncio loop,
    which a test run earlier in the same process may have left in this one.
    """
    errors: list[BaseException] = []

    def target() -> None:
        try:
            function(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def _give_scores(url: str, token: str, scores: list[tuple[str, str, float]]) -> None:
    """In Chromium: log in, and for each (submitted notebook id, cell, points) open formgrader's
    page of it and type the points into the cell's score field."""
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(30 * SECOND)
        page = context.new_page()
        requests = ARTIFACT_DIR / "formgrader-requests.log"
        page.on("request", lambda r: requests.open("a").write(f"{r.method} {r.url}\n"))
        try:
            # the instructor logs in with the server's token, as a browser asks for it
            page.goto(f"{url}/login")
            page.locator("#password_input").fill(token)
            page.locator("#password_input").press("Enter")
            page.wait_for_url("**/lab**")
            for notebook_id, cell, points in scores:
                page.goto(f"{url}/formgrader/gradebook/{ASSIGNMENT}/{ASSIGNMENT}")
                with page.expect_response(lambda r: "/formgrader/api/grades?" in r.url):
                    page.locator(
                        f'a[href$="/formgrader/submissions/{notebook_id}"]:visible'
                    ).click()
                # formgrader's script has taken the fields over (it gives extra credit a
                # placeholder, and the score one only when there is an automatic score: a written
                # answer's field stays without)
                page.locator(f"input.extra-credit#{cell}_extra_credit[placeholder]").wait_for()
                score = page.locator(f"input.score#{cell}")
                with page.expect_response(
                    lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT"
                ) as saved:
                    score.fill(f"{points:g}")
                    score.press("Tab")
                assert saved.value.ok, saved.value.status
        finally:
            page.screenshot(path=ARTIFACT_DIR / "formgrader.png")
            context.close()


def review_in_formgrader(term: Term, body: str) -> dict[str, float]:
    """Start the page's formgrader command; there, grade both written answers and give bob full
    credit for one failed test. Return each student's raw score after it."""
    lines = body.strip().splitlines()
    assert lines[-1] == "jupyter lab", (
        "the formgrader block ends with the command that starts JupyterLab"
    )
    port, token = free_port(), secrets.token_hex(24)
    flags = [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
    ] + (["--allow-root"] if os.geteuid() == 0 else [])
    script = term.script("\n".join(lines[:-1] + ["exec jupyter lab " + " ".join(flags)]))
    log_path = ARTIFACT_DIR / "formgrader.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            tethered(["bash", "-c", script], signal.SIGTERM),
            cwd=term.home("instructor"),
            env=term.env("instructor"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"JupyterLab exited:\n{tail(log_path)}"
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, (
                    f"JupyterLab did not answer within 60 s:\n{tail(log_path)}"
                )
                time.sleep(0.2)
        scores = []
        # formgrader lists them as needing manual grading
        for student, points in WRITTEN_SCORES.items():
            [written] = [g for g in grades_of(term.course, student) if g[1] == WRITTEN]
            assert written[2] is None and written[5], (
                f"{student}'s written answer is not left to grade by hand"
            )
            scores.append((written[0], WRITTEN, points))
        failed = [g for g in grades_of(term.course, "bob") if g[2] is not None and g[2] < g[4]]
        assert failed, "bob failed no test: nothing to review"
        scores.append((failed[0][0], failed[0][1], failed[0][4]))
        _in_its_own_thread(_give_scores, url, token, scores)
    finally:
        stop_lab(server)
    for notebook_id, cell, points in scores:
        [given] = [
            g[3]
            for g in grades_of(term.course, "alice") + grades_of(term.course, "bob")
            if (g[0], g[1]) == (notebook_id, cell)
        ]
        assert given == points, f"formgrader's score for {cell} is not in the gradebook"
    return {student: raw_score(term.course, student) for student in ANSWERS}


def test_the_instructors_walkthrough_runs_from_release_to_export(tmp_path):
    shutil.rmtree(ARTIFACT_DIR, ignore_errors=True)
    ARTIFACT_DIR.mkdir(parents=True)
    blocks = doc_blocks()
    assert blocks[0][0] == "settings", "the page starts with its settings"
    term = Term(tmp_path, blocks[0][1])
    assert term.course_id == course_config().CourseDirectory.course_id, (
        "the page's course id is not the course's"
    )
    course = term.course
    grading_runs, raw, done = [], {}, []
    references_ahead = False
    for who, body in blocks[1:]:
        if who == "formgrader":
            raw = review_in_formgrader(term, body)
            done.append("formgrader")
            continue
        assert who == "instructor" or who.removeprefix("student=") in ANSWERS, (
            f"who runs this block? {who}"
        )
        output = term.run(
            "instructor" if who == "instructor" else who.removeprefix("student="), body
        )
        student = who.removeprefix("student=") if who.startswith("student=") else None
        if "make course-dir" in body:
            assert (course / "nbgrader_config.py").is_file() and (
                course / "release" / ASSIGNMENT
            ).is_dir()
        elif "student import" in body:
            with sqlite3.connect(course / "gradebook.db") as db:
                assert dict(db.execute("SELECT id, email FROM student")) == {
                    "alice": "alice@example.edu",
                    "bob": "bob@example.edu",
                }
        elif "release_assignment" in body:
            assert (term.exchange / term.course_id / "outbound" / ASSIGNMENT).is_dir()
        elif "fetch_assignment" in body:
            fetched = term.home(student) / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
            assert fetched.is_file(), output
            # The student answers in JupyterLab and saves: here, a demo student's answers are saved
            # over it.
            shutil.copy(SUBMITTED / ANSWERS[student] / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", fetched)
        elif re.search(r"nbgrader submit\b", body):
            assert list(
                (term.exchange / term.course_id / "inbound").glob(f"{student}+{ASSIGNMENT}+*")
            )
        elif "autograder course due" in body:
            assert ASSIGNMENT in output
        elif "nbgrader collect" in body:
            for name in ANSWERS:
                assert (course / "submitted" / name / ASSIGNMENT / "timestamp.txt").is_file()
        elif "--canary all" in body:
            # the references made while the students work, before any submission
            assert "No submissions to grade. References ready for: " + ASSIGNMENT in output, output
            assert [p.name for p in (course / "reference").iterdir()] == [ASSIGNMENT], (
                "only the chosen assignment's"
            )
            references_ahead = True
        elif "autograder grade" in body:
            # the first grading judges by the references made ahead: no canary runs
            if not grading_runs:
                assert (
                    references_ahead and f"not made again: {ASSIGNMENT}/{ASSIGNMENT}" in output
                ), output
            grading_runs.append(
                (
                    table_dump(course),
                    sorted((p, p.read_bytes()) for p in (course / "feedback").rglob("*.html")),
                )
            )
            rows = {
                r["student"]: r
                for r in csv_rows(course / "scores.csv")
                if r["assignment"] == ASSIGNMENT
            }
            assert (rows["alice"]["score"], rows["bob"]["score"]) == ("8", "5"), rows
            assert re.search(r"late by [\d.]+ (hours|days): -0\.5 points", rows["bob"]["note"]), (
                rows["bob"]
            )
            assert "late" not in rows["alice"]["note"]
            for name in ANSWERS:  # Exercise 4's 2 points, not graded yet
                assert "2 points of written answers to grade by hand" in rows[name]["note"], rows[
                    name
                ]
            assert "alice" in output and "bob" in output, "the table is not printed"
        elif "autograder feedback" in body:
            page = (course / "feedback" / "bob" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
            assert raw and _total(raw["bob"] - 0.5) in page, (
                "bob's feedback lacks formgrader's scores"
            )
            assert "Late submission penalty (Score: -0.5)" in page
        elif "fetch_feedback" in body:
            [page] = (term.home(student) / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
            assert f"{ASSIGNMENT}.html" in output
            if student == "bob":
                assert _total(raw["bob"] - 0.5) in page.read_text()
            else:
                assert _total(raw["alice"]) in page.read_text()
            assert "BEGIN HIDDEN TESTS" not in page.read_text()
        elif "nbgrader export" in body:
            [bob] = [
                r
                for r in csv_rows(course / "grades.csv")
                if (r["student_id"], r["assignment"]) == ("bob", ASSIGNMENT)
            ]
            assert (float(bob["raw_score"]), float(bob["late_submission_penalty"])) == (
                raw["bob"],
                0.5,
            ), bob
            assert float(bob["score"]) == raw["bob"] - 0.5
            [canvas] = [
                r for r in csv_rows(course / "grades-canvas.csv") if r["SIS Login ID"] == "bob"
            ]
            [moodle] = [
                r
                for r in csv_rows(course / "grades-moodle.csv")
                if r["Email address"] == "bob@example.edu"
            ]
            assert float(canvas[ASSIGNMENT]) == float(moodle[ASSIGNMENT]) == raw["bob"] - 0.5
            [alice] = [
                r
                for r in csv_rows(course / "grades.csv")
                if (r["student_id"], r["assignment"]) == ("alice", ASSIGNMENT)
            ]
            assert (float(alice["score"]), float(alice["late_submission_penalty"])) == (
                MAX_SCORE,
                0.0,
            ), alice
        done.append(body)
    assert len(done) == len(blocks) - 1
    assert len(grading_runs) == 2, "the page grades twice"
    assert grading_runs[0] == grading_runs[1], "grading again changed the gradebook or the feedback"
    assert raw and raw["bob"] > 5 and raw["alice"] == MAX_SCORE, (
        "the page has no review in formgrader"
    )
