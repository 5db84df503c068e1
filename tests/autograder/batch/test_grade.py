"""make grade: the demo class gets the scores it should, cheats earn nothing, bad input is reported,
not fatal."""

import contextlib
import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from support.gradebooks import table_dump
from traitlets.utils.importstring import import_item

from autograder.cli import grade
from autograder.course import config
from devcourse.instructor import demo, paths
from autograder.course.cells import (
    grade_ids_of,
    hidden_test_lines,
    is_answer,
    is_test,
    nbgrader_meta,
)
from devcourse.instructor.paths import DEMO_CLASS
from autograder.prepare import scan, submission
from autograder.prepare.job import strict_comparisons
from autograder.record.state import STATE
from autograder.run import bytecode, cgroups, sandbox
from autograder.settings import Limits, Settings

# the looping student costs this much; every honest cell of the course is far quicker
CELL_TIMEOUT_S = 45
# The assignments every kind of demo student hands in (04 and 06-09 have only ada's solution and the
# forger's attack, whose grading make grade ALL=1 shows; the mistakes' test grades a correct answer
# of each).
GRADED = (
    "00_environment",
    "01_device_placement",
    "02_cross_device_errors",
    "03_saving_and_loading",
    "05_module_prefix",
)
CHOSEN = [argument for name in GRADED for argument in ("--assignment", name)]


KERNEL_LOG = "ada-01-kernel.log"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Grade the demo class through the command line, as an instructor would."""
    tmp = tmp_path_factory.mktemp("grade")
    workdir = tmp / "work"
    assert (
        grade.main(
            ["--workdir", str(workdir), "--cell-timeout", str(CELL_TIMEOUT_S), "--quiet", *CHOSEN]
        )
        == 0
    )
    # a real kernel's log, kept beside the work folder: a later test removes the jobs' folders
    shutil.copy(
        workdir / "jobs" / "ada" / "01_device_placement" / "01_device_placement" / "kernel.log",
        tmp / KERNEL_LOG,
    )
    with (workdir / "scores.csv").open() as handle:
        rows = {(row["student"], row["assignment"]): row for row in csv.DictReader(handle)}
    return workdir, rows


def _expected():
    """The rows of expected_scores.csv of the assignments graded here."""
    with demo.EXPECTED_SCORES.open() as handle:
        return [row for row in csv.DictReader(handle) if row["assignment"] in GRADED]


def test_demo_class_gets_its_expected_scores(run):
    _, rows = run
    expected = _expected()
    assert len({row["student"] for row in expected}) >= 6
    for row in expected:
        got = rows[row["student"], row["assignment"]]
        assert (got["score"], got["max_score"]) == (row["score"], row["max_score"]), (
            row,
            got["note"],
        )


def test_no_note_says_a_disk_filled_that_nobody_filled(run):
    """No demo student fills the disk; before a sandbox mounts its own /tmp, the grader's /tmp is
    not theirs."""
    _, rows = run
    assert [key for key, row in rows.items() if "filled the disk" in row["note"]] == []


def test_nothing_a_submission_wrote_stays_after_grading(run):
    workdir, _ = run
    jobs = [path for path in (workdir / "jobs").glob("*/*/*") if path.is_dir()]
    assert jobs and all((job / "out.ipynb").is_file() for job in jobs), (
        "every job keeps what the grader wrote"
    )
    assert [job for job in jobs if (job / "work").exists()] == [], "a working copy was left behind"


def test_expected_scores_cover_every_student_and_assignment(run):
    _, rows = run
    assert {(row["student"], row["assignment"]) for row in _expected()} == {
        pair for pair in rows if pair[1] in GRADED
    }


def test_the_correct_student_gets_full_marks_everywhere(run):
    """Every test's points; 00's written answer (Exercise 4) waits for a grader, and the note says
    so."""
    _, rows = run
    for (student, assignment), row in rows.items():
        if student == "ada" and assignment in GRADED:
            by_hand = re.search(r"([\d.]+) points of written answers to grade by hand", row["note"])
            assert bool(by_hand) == (assignment == "00_environment"), row
            left = float(by_hand.group(1)) if by_hand else 0.0
            assert float(row["score"]) + left == float(row["max_score"]) and row["score"] != "0", (
                row
            )


@pytest.mark.parametrize("student", ["mallory", "eve", "trudy", "linus"])
def test_cheats_and_empty_submissions_earn_nothing(run, student):
    _, rows = run
    scores = [
        row["score"] for (who, _), row in rows.items() if who == student and row["score"] != ""
    ]
    # withheld: nothing until reviewed
    assert scores and all(score in ("0", "withheld") for score in scores), scores


def test_crash_loop_and_memory_hog_keep_what_they_earned_before(run):
    _, rows = run
    assert float(rows["hal", "01_device_placement"]["score"]) > 0
    assert "the kernel died" in rows["hal", "01_device_placement"]["note"]
    assert float(rows["tony", "02_cross_device_errors"]["score"]) > 0
    tony = rows["tony", "02_cross_device_errors"]["note"]
    assert f"time limit of {CELL_TIMEOUT_S:g} s of processor time per cell" in tony
    mia = rows["mia", "03_saving_and_loading"]
    assert 0 < float(mia["score"]) < float(mia["max_score"])


def test_bad_notebooks_get_a_line_and_the_batch_goes_on(run):
    _, rows = run
    assert rows["oscar", "00_environment"]["score"] == ""
    assert "not a valid notebook" in rows["oscar", "00_environment"]["note"]
    assert (
        "is the notebook of 02_cross_device_errors" in rows["oscar", "01_device_placement"]["note"]
    )
    assert rows["margaret", "01_device_placement"]["note"] == "not submitted"


def test_report_names_devices_and_limits(run):
    workdir, rows = run
    report = (workdir / "report.txt").read_text()
    assert "Devices every submission is checked on: cpu" in report
    assert "No compiled bytecode" not in report, "an environment pip installed has it"
    assert "processor time: enforced" in report and "memory: enforced" in report
    isolation = sandbox.probe()
    assert ("network: enforced" in report) == isolation.namespaces
    assert cgroups.find().describe() in report, (
        "the report says whether Linux enforces the limits in cgroups"
    )
    assert rows["ada", "00_environment"]["devices"].startswith("cpu")
    assert (workdir / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _calls(monkeypatch, owner, name: str, pick=lambda first, *_, **__: first) -> list:
    """Make ``owner.name`` record ``pick(*args, **kwargs)`` of each call (its first argument by
    default), then do what it did; return the record."""
    done, seen = getattr(owner, name), []

    def recording(*args, **kwargs):
        seen.append(pick(*args, **kwargs))
        return done(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return seen


def test_feedback_templates_are_compiled_once_per_process_and_the_pages_stay_the_same(
    tmp_path, monkeypatch
):
    """nbgrader makes a new exporter for each student's assignment; the templates are compiled for
    the first only."""
    import jinja2
    from nbconvert.exporters import HTMLExporter
    from nbconvert.exporters.templateexporter import TemplateExporter

    from autograder.record import feedback, gradebook

    nb = nbformat.read(DEMO_CLASS / "ada" / "00_environment" / "00_environment.ipynb", as_version=4)
    plain = HTMLExporter().from_notebook_node(nb)[0]
    compiled = _calls(
        monkeypatch,
        jinja2.Environment,
        "compile",
        lambda environment, source, name=None, *_, **__: name,
    )
    monkeypatch.setattr(feedback.TEMPLATES, "codes", {})
    rendered = _calls(monkeypatch, TemplateExporter, "from_notebook_node")
    first = feedback.FeedbackExporter().from_notebook_node(nb)[0]
    assert compiled, "the first page compiles the templates"
    assert "jp-Notebook" in first and len(rendered) == 1, (
        "a page with JupyterLab's cells rendered twice"
    )
    compiled.clear()
    assert feedback.FeedbackExporter().from_notebook_node(nb)[0] == first == plain
    assert compiled == [], "a second page compiled them again"
    api = gradebook.nbgrader_api(tmp_path)  # nbgrader's exporter is named by its import string
    assert import_item(api.config.GenerateFeedback.exporter_class) is feedback.FeedbackExporter


def test_feedback_highlights_each_cell_source_once_and_its_pages_are_nbconverts(monkeypatch):
    """Two students' pages of one assignment: a source both show is highlighted once, for the first
    page; each page reads as nbconvert's own."""
    from nbconvert.exporters import HTMLExporter
    from nbconvert.filters import highlight

    from autograder.record import feedback

    monkeypatch.setattr(feedback, "_HIGHLIGHTED", {})
    highlighted = _calls(monkeypatch, highlight, "_pygments_highlight")
    pages = {
        student: nbformat.read(
            DEMO_CLASS / student / "00_environment" / "00_environment.ipynb", as_version=4
        )
        for student in ("ada", "grace")
    }
    ours = {
        student: feedback.FeedbackExporter().from_notebook_node(nb)[0]
        for student, nb in pages.items()
    }
    sources = [
        [c.source or " " for c in nb.cells if c.cell_type == "code"] for nb in pages.values()
    ]
    shared = set(sources[0]) & set(sources[1])
    assert len(shared) >= 10, "the two pages have few cells in common"
    assert sorted(highlighted) == sorted(set(sources[0]) | set(sources[1])), (
        "a source highlighted twice, or never"
    )
    for student, nb in pages.items():
        assert ours[student] == HTMLExporter().from_notebook_node(nb)[0]


def test_feedback_made_apart_is_the_page_the_grader_makes_itself(tmp_path, monkeypatch):
    """--feedback-apart yes (what a cluster's grader does by itself): a process of its own makes
    each page while the grader goes on. The grader never calls write_feedback, and each page is the
    one it makes itself."""
    from autograder.record import feedback
    from autograder.record.gradebook import grading_environment, nbgrader_api

    for student in ("ada", "grace"):
        shutil.copytree(
            demo.SUBMITTED / student / "00_environment",
            tmp_path / "submitted" / student / "00_environment",
        )
    in_grader = _calls(monkeypatch, feedback, "write_feedback", lambda api, workdir, pair, *_: pair)
    settings = Settings(
        jobs=1, limits=Limits(cell_timeout_s=CELL_TIMEOUT_S), progress=False, feedback_apart=True
    )
    grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
    workdir = tmp_path / "work"
    assert in_grader == []
    state = json.loads((workdir / "state.json").read_text())
    assert sorted(state["graded"]) == ["ada/00_environment", "grace/00_environment"]
    assert state["last_run"]["feedback_apart_s"] > 0
    pages = {
        student: workdir / "feedback" / student / "00_environment" / "00_environment.html"
        for student in ("ada", "grace")
    }
    made_apart = {student: page.read_text() for student, page in pages.items()}
    hidden = set().union(
        *(
            hidden_test_lines(nbformat.read(path, as_version=4))
            for path in (workdir / "source" / "00_environment").glob("*.ipynb")
        )
    )
    with grading_environment():
        api = nbgrader_api(workdir, f"sqlite:///{workdir / 'gradebook.db'}")
        for student in pages:
            feedback.write_feedback(api, workdir, (student, "00_environment"), hidden, {})
    assert {student: page.read_text() for student, page in pages.items()} == made_apart
    # Made from copies: the graded notebooks (formgrader's view) keep the errors as they ran,
    # whatever becomes of the process that makes a page.
    assert not (workdir / feedback.TAUGHT).exists()
    graded = workdir / "autograded" / "grace" / "00_environment" / "00_environment.ipynb"
    as_graded = graded.read_text()
    killed_mid_page = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import os
from pathlib import Path
from autograder.record.feedback import write_feedback
class API:  # nbgrader's, ended in the middle of making the page
    class coursedir:
        autograded_directory = "autograded"
    def generate_feedback(self, *args, **kwargs):
        os._exit(9)
write_feedback(API(), Path({str(workdir)!r}), ("grace", "00_environment"), set(), {{}})
""",
        ]
    )
    assert killed_mid_page.returncode == 9
    assert graded.read_text() == as_graded, (
        "the page's process ended mid-page, and the graded notebook changed"
    )
    # nbgrader leaves graded notebooks read-only to their owner too (444): a grader that is not root
    # (here root without the right to pass over a file's mode) makes the page all the same.
    if shutil.which("setpriv"):
        not_root = subprocess.run(
            [
                "setpriv",
                "--bounding-set",
                "-dac_override,-dac_read_search",
                sys.executable,
                "-c",
                f"""
from pathlib import Path
from autograder.record.feedback import write_feedback
from autograder.record.gradebook import grading_environment, nbgrader_api
workdir, notes = Path({str(workdir)!r}), {{}}
with grading_environment():
    write_feedback(nbgrader_api(workdir, "sqlite:///" + str(workdir / "gradebook.db")), workdir,
                   ("grace", "00_environment"), set(), notes)
assert not notes, notes
""",
            ],
            capture_output=True,
            text=True,
        )
        assert not_root.returncode == 0, not_root.stderr[-2000:]
        assert graded.stat().st_mode & 0o777 == 0o444 and graded.read_text() == as_graded


def test_feedback_apart_without_a_process_to_be_had_is_made_by_the_grader(tmp_path, monkeypatch):
    """No process can be started for the pages (a limit on processes): the grader makes them, and
    grades on."""
    from autograder.batch import classrun
    from autograder.record import feedback

    def no_process(*_args, **_kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(classrun, "FeedbackApart", no_process)
    shutil.copytree(
        demo.SUBMITTED / "ada" / "00_environment", tmp_path / "submitted" / "ada" / "00_environment"
    )
    in_grader = _calls(monkeypatch, feedback, "write_feedback", lambda api, workdir, pair, *_: pair)
    settings = Settings(
        jobs=1, limits=Limits(cell_timeout_s=CELL_TIMEOUT_S), progress=False, feedback_apart=True
    )
    results = grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
    assert [(r.student, r.score) for r in results if r.assignment == "00_environment"] == [
        ("ada", 8)
    ]
    assert in_grader == [("ada", "00_environment")]
    assert (
        tmp_path / "work" / "feedback" / "ada" / "00_environment" / "00_environment.html"
    ).is_file()


def test_feedback_apart_whose_process_dies_has_the_grader_make_the_pages(tmp_path):
    """The process has a session of its own (a terminal's Ctrl-C is the grader's to handle). Killed,
    each page handed on and each after it is made by the grader, held, in the order handed on; none
    is lost or made twice, and a pair leaves the line only once recorded."""
    import os

    from autograder.record.feedback_worker import FeedbackApart

    held = []

    @contextlib.contextmanager
    def hold():
        held.append(True)
        yield
        held.append(False)

    apart = FeedbackApart(
        tmp_path, "sqlite://", lambda pair: [f"made by the grader: {pair[0]}, held {held[-1]}"]
    )
    assert os.getsid(apart.process.pid) == apart.process.pid != os.getsid(0)
    apart.process.kill()
    recorded = []
    for student in ("ada", "bob", "cy"):
        apart.hand_on((student, "00"), set())
        apart.deliver(lambda *made: recorded.append(made), hold, keep=apart.depth - 1)
    apart.deliver(lambda *made: recorded.append(made), hold)
    assert recorded == [
        ((student, "00"), [f"made by the grader: {student}, held True"])
        for student in ("ada", "bob", "cy")
    ]
    assert held == [True, False] * 3 and apart.close() == []


def test_feedback_apart_leaves_a_pair_in_line_until_it_is_recorded(tmp_path):
    """A Ctrl-C as a made page's pair is being recorded: the pair stays handed on (close() names
    it), not lost."""
    from autograder.record.feedback_worker import FeedbackApart

    apart = FeedbackApart(tmp_path, "sqlite://", lambda pair: ["made by the grader"])
    apart.process.kill()
    apart.hand_on(("ada", "00"), set())

    def interrupted(_pair, _notes):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        apart.deliver(interrupted, contextlib.nullcontext)
    assert apart.close() == [("ada", "00")]


def test_feedback_pages_without_nbconverts_second_pass_read_as_the_same_document():
    """nbgrader's feedback template has no JupyterLab cells: its pages skip nbconvert's
    BeautifulSoup pass.

    The classic template stands in for it (nbgrader's needs a gradebook's scores); 08 has a picture,
    and a cell adds what a text edit could get wrong: an attribute with ">", an upper-case tag with
    its alt, tags inside a script and a comment, a self-closing tag, an attribute whose name ends in
    "alt"."""
    from bs4 import BeautifulSoup
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    from autograder.record.feedback import NO_ALT, FeedbackExporter

    nb = nbformat.read(
        paths.SOLUTIONS / "08_portable_models_and_memory" / "08_portable_models_and_memory.ipynb",
        as_version=4,
    )
    tricky = (
        '<img src="a.png" title="x > y"><IMG SRC="b.png" ALT="b"><script>var s = "<img'
        ' src=c.png>";</script><!-- <img src="d.png"> --><img src=e.png /><img data-alt="no">'
    )
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "", outputs=[nbformat.v4.new_output("display_data", data={"text/html": tricky})]
        )
    )
    config = Config()
    config.HTMLExporter.template_name = "classic"
    ours = FeedbackExporter(config=config).from_notebook_node(nb)[0]
    theirs = HTMLExporter(config=config).from_notebook_node(nb)[0]
    assert "jp-Notebook" not in ours and ours != theirs, "the page took the text path"
    assert str(BeautifulSoup(ours, features="html.parser")) == theirs
    assert ours.count(NO_ALT) == 4  # 08's picture, a.png, e.png, the data-alt one


def test_feedback_has_no_hidden_tests(run):
    workdir, _ = run
    pages = list((workdir / "feedback").rglob("*.html"))
    assert len(pages) >= 20
    for page in pages:
        text = page.read_text()
        if page.parts[-3] != "eve":  # eve's own code searches for the marker
            assert "BEGIN HIDDEN TESTS" not in text, page
        assert "simulated_cuda(8)" not in text, page  # a line of a hidden test of notebook 01
    mallory = (
        workdir / "feedback" / "mallory" / "01_device_placement" / "01_device_placement.html"
    ).read_text()
    assert "own == or !=" in mallory


def test_feedback_pages_have_no_colour_codes_or_machine_paths_and_name_each_failed_exercise(run):
    workdir, _ = run
    pages = list((workdir / "feedback").rglob("*.html"))
    for page in pages:
        text = page.read_text()
        assert "\x1b[" not in text and "\\u001b[" not in text and "[0;31m" not in text, page
        for path in (str(workdir), str(paths.ROOT), "/tmp/", "site-packages"):
            assert path not in text, (page, path)
        assert "_grader_" not in text, (
            f"{page}: the grader's rewrite of a test shown to the student"
        )
        assert "operator.eq(" not in text and "operator.ne(" not in text, (
            f"{page}: a test's check as the grader ran it"
        )
    empty = (
        workdir / "feedback" / "linus" / "02_cross_device_errors" / "02_cross_device_errors.html"
    )
    failed = (
        re.findall(
            r"Failed: (Exercise \d+ \(\d+ points?\): [^<]*?) -- this test \((\w+)\) is worth",
            empty.read_text(),
        )
        if empty.exists()
        else []
    )
    assert failed, "no failed test names its exercise"
    # grace keeps Standardize's statistics in plain attributes: on sim:1 they meet the input from
    # the CPU
    grace = (
        workdir / "feedback" / "grace" / "02_cross_device_errors" / "02_cross_device_errors.html"
    ).read_text()
    assert "Two tensors on different devices met in one operation" in grace, (
        "no hint for a cross-device error"
    )
    assert 'href="#1.-Reproduce-the-error"' in grace and 'id="1.-Reproduce-the-error"' in grace


def test_a_feedback_page_in_a_browser_gives_the_scores_then_each_failed_test_with_why(run):
    """What a student opens: the page's top gives the notebook's score and each test's; a failed
    test says its exercise, what it is worth and why, naming the device it failed on."""
    from support.lab import ARTIFACTS, SECOND, chromium, keep_for_docs

    workdir, _ = run
    grace = (
        workdir / "feedback" / "grace" / "02_cross_device_errors" / "02_cross_device_errors.html"
    )
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(grace.as_uri())
        # the summary, before the notebook's title
        top = page.locator("body").inner_text().split("\n02 · ")[0]
        # 2 points, less 0.4 for a late hand-in
        assert "02_cross_device_errors (Score: 1.6 / 7.0)" in top, top
        assert (
            top.count("Test cell (Score: 1.0 / 1.0)") == 2
            and top.count("Test cell (Score: 0.0 / 1.0)") == 5
        ), top
        failed = page.get_by_text("this test (standardize_moves_with_the_module) is worth 1 point")
        failed.scroll_into_view_if_needed(timeout=10 * SECOND)
        page.mouse.wheel(0, -250)  # the test's source above its error, in view
        cell = failed.locator(
            "xpath=ancestor::div[contains(concat(' ', @class, ' '), ' cell ')][1]"
        )
        said = cell.inner_text()
        assert "Exercise 2 (2 points)" in said and "failed on sim:0 (simulated device" in said, said
        # the test as written: its lines that its hidden tests repeat are not redacted, its == not
        # the guard's
        assert "-> 8     assert norm.mean.device == device and norm.std.device == device" in said, (
            said
        )
        assert "redacted" not in said and "operator" not in said, said
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "students-feedback.png")
    keep_for_docs(ARTIFACTS / "students-feedback.png")


def _pair_rows(workdir) -> dict[tuple[str, str], list[tuple]]:
    """Each (student, assignment)'s grades and comments, by cell, without the rows' ids."""
    query = """SELECT sa.student_id, a.name, nb.name, bc.name, g.auto_score, g.manual_score,
                      g.needs_manual_grade, c.auto_comment, c.manual_comment, sa.timestamp,
                      sn.late_submission_penalty
               FROM grade g JOIN submitted_notebook sn ON g.notebook_id = sn.id
               JOIN submitted_assignment sa ON sn.assignment_id = sa.id
               JOIN assignment a ON sa.assignment_id = a.id
               JOIN notebook nb ON sn.notebook_id = nb.id JOIN base_cell bc ON g.cell_id = bc.id
               LEFT JOIN comment c ON c.notebook_id = sn.id AND c.cell_id = g.cell_id"""
    rows: dict[tuple[str, str], list[tuple]] = {}
    with sqlite3.connect(workdir / "gradebook.db") as db:
        for row in db.execute(query):
            rows.setdefault(row[:2], []).append(row[2:])
    return {pair: sorted(cells, key=repr) for pair, cells in rows.items()}


def test_grading_again_grades_nothing_and_a_regrade_replaces_only_its_own_rows(run):
    workdir, rows = run
    before, pairs = table_dump(workdir), _pair_rows(workdir)
    feedback = {p: p.read_bytes() for p in (workdir / "feedback").rglob("*.html")}
    started = time.monotonic()
    assert grade.main(["--workdir", str(workdir), "--quiet", *CHOSEN]) == 0
    assert time.monotonic() - started < 60, "the second run graded again"
    assert table_dump(workdir) == before, "grading again changed the gradebook"
    with (workdir / "scores.csv").open() as handle:
        again = {(row["student"], row["assignment"]): row for row in csv.DictReader(handle)}
    assert {k: r["score"] for k, r in again.items()} == {k: r["score"] for k, r in rows.items()}
    assert "graded by an earlier run" in again["ada", "00_environment"]["note"]
    assert {p: p.read_bytes() for p in (workdir / "feedback").rglob("*.html")} == feedback

    # Spoil one cell's score of ada's 00 and one of mia's 03: the regrade of ada's 00 mends its own
    # only.
    pick = """SELECT g.id, g.auto_score FROM grade g
              JOIN submitted_notebook sn ON g.notebook_id = sn.id
              JOIN submitted_assignment sa ON sn.assignment_id = sa.id
              JOIN assignment a ON sa.assignment_id = a.id
              WHERE sa.student_id = ? AND a.name = ? AND g.auto_score > 0 ORDER BY g.id LIMIT 1"""
    with sqlite3.connect(workdir / "gradebook.db") as db:
        spoilt = [
            db.execute(pick, pair).fetchone()
            for pair in (("ada", "00_environment"), ("mia", "03_saving_and_loading"))
        ]
        db.executemany("UPDATE grade SET auto_score = -1 WHERE id = ?", [(i,) for i, _ in spoilt])
    try:
        assert (
            grade.main(
                [
                    "--workdir",
                    str(workdir),
                    "--quiet",
                    "--regrade",
                    "--student",
                    "ada",
                    "--assignment",
                    "00_environment",
                    "--cell-timeout",
                    str(CELL_TIMEOUT_S),
                ]
            )
            == 0
        )
        after = _pair_rows(workdir)
        mia = after.pop(("mia", "03_saving_and_loading"))
        assert after == {p: r for p, r in pairs.items() if p != ("mia", "03_saving_and_loading")}
        assert sum(cell[2] == -1 for cell in mia) == 1, "the regrade of ada's 00 touched mia's 03"
    finally:
        # the other tests read the gradebook as graded
        with sqlite3.connect(workdir / "gradebook.db") as db:
            db.executemany(
                "UPDATE grade SET auto_score = ? WHERE id = ? AND auto_score = -1",
                [(score, i) for i, score in spoilt],
            )
    assert _pair_rows(workdir) == pairs
    with (workdir / "scores.csv").open() as handle:
        notes = {(row["student"], row["assignment"]): row["note"] for row in csv.DictReader(handle)}
    assert (
        "earlier run" not in notes["ada", "00_environment"]
        and "earlier run" in notes["ada", "01_device_placement"]
    )


def test_a_late_submission_carries_its_penalty_into_nbgraders_export_and_the_lms_one(run):
    workdir, rows = run
    grace = rows["grace", "02_cross_device_errors"]
    assert re.search(r"late by 1\.1 days: -0\.4 points", grace["note"]), grace["note"]
    db = f"--CourseDirectory.db_url=sqlite:///{workdir / 'gradebook.db'}"
    exports = {}
    for name, options in (
        ("nbgrader", []),
        (
            "canvas",
            ["--exporter=autograder.plugins.lms.LmsExportPlugin", "--LmsExportPlugin.lms=canvas"],
        ),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nbgrader",
                "export",
                db,
                f"--to={workdir / name}.csv",
                *options,
            ],
            cwd=workdir,
            env=config.tool_env(),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        with open(workdir / f"{name}.csv", newline="") as handle:
            exports[name] = list(csv.DictReader(handle))
    [row] = [
        r
        for r in exports["nbgrader"]
        if (r["student_id"], r["assignment"]) == ("grace", "02_cross_device_errors")
    ]
    assert (
        float(row["raw_score"]),
        float(row["late_submission_penalty"]),
        float(row["score"]),
    ) == (2.0, 0.4, 1.6)
    on_time = [r for r in exports["nbgrader"] if r["student_id"] == "ada"]
    assert on_time and all(float(r["late_submission_penalty"]) == 0 for r in on_time)
    [canvas] = [r for r in exports["canvas"] if r["SIS Login ID"] == "grace"]
    assert float(canvas["02_cross_device_errors"]) == 1.6


@pytest.mark.skipif(not sandbox.probe().namespaces, reason="needs the sandbox's namespaces (Linux)")
def test_sandbox_keeps_hidden_tests_and_others_files_out_of_reach(run):
    workdir, _ = run
    eve = nbformat.read(
        workdir / "autograded" / "eve" / "00_environment" / "00_environment.ipynb", as_version=4
    )
    printed = "".join(o.get("text", "") for c in eve.cells for o in c.get("outputs", []))
    assert "files found" in printed, "eve's search ran"
    assert "hidden tests in" not in printed.replace("hidden tests in " + str(workdir), ""), printed[
        :2000
    ]
    assert "cannot patch the course's code" in printed
    for line in printed.splitlines():
        if line.startswith("wrote "):
            assert "/jobs/eve/" in line, line
    assert (
        "eve was here"
        not in (demo.SUBMITTED / "ada" / "00_environment" / "00_environment.ipynb").read_text()
    )


def test_grader_in_a_user_namespace_keeps_eve_in_her_own_copy(tmp_path):
    """What a grader that is not root gets: the same view of the disk, from a user namespace."""
    if not sandbox.probe(user_namespace=True).namespaces:
        pytest.skip(f"no user namespaces here: {sandbox.probe(user_namespace=True).reason}")
    for student in ["ada", "eve"]:
        shutil.copytree(
            demo.SUBMITTED / student / "00_environment",
            tmp_path / "submitted" / student / "00_environment",
        )
    settings = Settings(
        jobs=2,
        limits=Limits(cell_timeout_s=CELL_TIMEOUT_S),
        progress=False,
        feedback=False,
        user_namespace=True,
    )
    assert "user namespace" in " ".join(sandbox.isolation_of(settings).describe(1, 1, 1))
    results = {
        r.student: r
        for r in grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
        if r.assignment == "00_environment"
    }
    assert (results["ada"].score, results["eve"].score) == (8, 0)
    eve = nbformat.read(
        tmp_path / "work" / "executed" / "eve" / "00_environment" / "00_environment.ipynb",
        as_version=4,
    )
    printed = "".join(o.get("text", "") for c in eve.cells for o in c.get("outputs", []))
    assert "files found" in printed and "cannot patch the course's code" in printed
    for line in printed.splitlines():
        if line.startswith(("hidden tests in ", "wrote ")):
            assert "/jobs/eve/" in line, line


def _as_a_user(
    uid: int, command: list[str], reach: list[Path], views: list[Path], covered: Path
) -> list[str]:
    """``command`` run by root as user ``uid``, no capability, in a mount namespace of its own where
    ``reach`` (the machine's Python, the course, the grader's folders) can be reached: a folder on
    the way to one that only its owner may enter (Python under /root, pytest's folders) shows there
    as a folder others may pass through, holding only what leads to them (a folder of ``views``, for
    the caller to remove). And ``covered``, a folder in the course, has a tmpfs of its own over it,
    as a Slurm node's work folder has (tools/practice-slurm.sh). Nothing else changes for the rest
    of the machine."""
    blocked: dict[Path, set[str]] = {}
    for path in reach:
        parts = Path(path).resolve().parts
        for depth in range(1, len(parts)):
            folder = Path(*parts[:depth])
            if not folder.stat().st_mode & 0o001:
                blocked.setdefault(folder, set()).add(parts[depth])
    if any(a != b and b.is_relative_to(a) for a in blocked for b in blocked):
        pytest.skip(
            f"folders others cannot pass through lie within each other: {sorted(map(str, blocked))}"
        )
    steps = [f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(covered))}"]
    for folder, names in blocked.items():
        view = Path(tempfile.mkdtemp(prefix="view-"))
        views.append(view)
        view.chmod(0o711)
        for name in names:
            (view / name).mkdir() if (folder / name).is_dir() else (view / name).touch()
            steps.append(
                f"mount --bind {shlex.quote(str(folder / name))} {shlex.quote(str(view / name))}"
            )
        steps.append(f"mount --rbind {shlex.quote(str(view))} {shlex.quote(str(folder))}")
    user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        " && ".join([*steps, "exec " + shlex.join(user)]),
    ]


def test_a_grader_that_is_not_root_grades_in_its_sandbox_and_keeps_eve_in_her_copy(tmp_path):
    """The grader run by a user, not root, as most instructors run it: sandboxed in a user
    namespace, with the disk limit's tmpfs (a user's namespace could not remount it read-only: the
    canary's kernel died), the same scores, eve kept in her copy, and the feedback pages made from
    notebooks nbgrader leaves read-only. A shared reference cache of root's, which it cannot write,
    is said so and left as it was (the grading stopped with a PermissionError after the canary had
    run). A mount inside the course's folder, which the sandbox binds back read-only (a Slurm
    node's, as a user's worker met it: the bind failed), is bound with it, read-only too."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "setpriv")):
        pytest.skip(
            "becoming another user for one command needs root and util-linux's unshare and setpriv"
        )
    uid = 61017  # no one's: a user namespace needs no name for it
    folder, views = Path(tempfile.mkdtemp(prefix="not-root-")), []
    (paths.ROOT / "build").mkdir(exist_ok=True)
    covered = Path(tempfile.mkdtemp(prefix="covered-", dir=paths.ROOT / "build"))
    try:
        for student in ["ada", "eve"]:
            shutil.copytree(
                demo.SUBMITTED / student / "00_environment",
                folder / "submitted" / student / "00_environment",
            )
        (folder / "home").mkdir()
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, uid, uid)
        shared = folder / "shared"  # root's, as another instructor's would be
        shared.mkdir(mode=0o755)
        command = _as_a_user(
            uid,
            [
                "env",
                f"HOME={folder / 'home'}",
                sys.executable,
                "-m",
                "autograder",
                "grade",
                "--submitted",
                str(folder / "submitted"),
                "--workdir",
                str(folder / "work"),
                "--jobs",
                "2",
                "--cell-timeout",
                str(CELL_TIMEOUT_S),
                "--rerun-canary",
                "--reference-cache",
                str(shared),
            ],
            [Path(sys.executable).resolve(), Path(sys.prefix), paths.ROOT, folder],
            views,
            covered,
        )
        done = subprocess.run(command, cwd=paths.ROOT, capture_output=True, text=True, timeout=300)
        unenforced = [line for line in done.stdout.splitlines() if "files: NOT enforced" in line]
        if unenforced and "cannot enter namespaces" in unenforced[0]:
            pytest.skip("this Linux lets no user but root make namespaces: " + unenforced[0])
        assert not unenforced, (
            "the sandbox could not be built for a user that is not root: " + unenforced[0]
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "files: enforced" in done.stdout and "in a user namespace" in done.stdout
        assert f"References are not kept in {shared} this run" in done.stderr and not any(
            shared.iterdir()
        )
        with (folder / "work" / "scores.csv").open() as handle:
            scores = {
                row["student"]: row["score"]
                for row in csv.DictReader(handle)
                if row["assignment"] == "00_environment"
            }
        assert scores == {"ada": "8", "eve": "0"}
        assert (
            folder / "work" / "feedback" / "ada" / "00_environment" / "00_environment.html"
        ).stat().st_uid == uid
        eve = nbformat.read(
            folder / "work" / "executed" / "eve" / "00_environment" / "00_environment.ipynb",
            as_version=4,
        )
        printed = "".join(o.get("text", "") for c in eve.cells for o in c.get("outputs", []))
        assert "files found" in printed
        for line in printed.splitlines():
            if line.startswith(("hidden tests in ", "wrote ")):
                assert "/jobs/eve/" in line, line
    finally:
        for made in [folder, covered, *views]:
            shutil.rmtree(made, ignore_errors=True)


MEMORY_HOG = """\
import subprocess, sys

_holders = [
    subprocess.Popen(
        [sys.executable, "-c", "import time; block = b'x' * (350 << 20); time.sleep(30)"]
    )
    for _ in range(3)
]
for _holder in _holders:
    _holder.wait()
"""


def _submit(tmp_path, student: str, answers: dict, based_on: str = "ada") -> None:
    """A 00_environment submission: ``based_on``'s notebook with answer cells changed (grade_id ->
    new source)."""
    nb = nbformat.read(
        demo.SUBMITTED / based_on / "00_environment" / "00_environment.ipynb", as_version=4
    )
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id](cell.source)
    folder = tmp_path / "submitted" / student / "00_environment"
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "00_environment.ipynb")


def test_processes_past_the_memory_limit_together_end_the_submission(tmp_path):
    """Three processes of 350 MiB each: each within the limit of 1024 MiB, together (with the
    kernel) over it."""
    _submit(tmp_path, "hog", {"list_devices": lambda answer: MEMORY_HOG + answer})
    settings = Settings(
        jobs=1, limits=Limits(cell_timeout_s=60, memory_mib=1024), progress=False, feedback=False
    )
    started = time.monotonic()
    [result] = [
        r
        for r in grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
        if r.assignment == "00_environment"
    ]
    assert "memory limit of 1024 MiB for all its processes together" in result.note, result.note
    assert time.monotonic() - started < 25, (
        "ended when the memory went over, not when the processes finished"
    )
    assert result.score == 0


FILL_DISK_AND_PLANT = """\
import os, sys, time

try:  # the kernel's connection file, in the grader's IPC folder, is on its command line
    with open(
        os.path.join(os.path.dirname(sys.argv[sys.argv.index("-f") + 1]), "planted.py"), "w"
    ) as _handle:
        _handle.write("print('planted')")
    print("IPC folder: written")
except OSError as _error:
    print("IPC folder:", _error.strerror)
_written = 0
try:
    while True:
        with open(f"fill-{_written}.bin", "wb") as _handle:
            _handle.write(b"x" * (1 << 20))
        _written += 1
except OSError as _error:
    print("disk:", _error.strerror, "after", _written, "MiB")
time.sleep(1)  # full for a while: the grader looks four times a second
"""

THREADS_BOMB = """\
import threading
_stop = threading.Event()
for _ in range(300):
    threading.Thread(target=_stop.wait, daemon=True).start()
_stop.wait(30)
"""


def test_disk_processes_and_ipc_folder_are_bounded_for_the_whole_submission(tmp_path):
    """Files past the disk limit fail, the grader's IPC folder takes no write, too many threads end
    the kernel; the note names each limit, the tests passed before keep their points and nothing
    written stays."""
    _submit(
        tmp_path,
        "hoarder",
        {
            "list_devices": lambda answer: answer + "\n" + FILL_DISK_AND_PLANT,
            "resolve_device": lambda answer: THREADS_BOMB + answer,
        },
    )
    settings = Settings(
        jobs=1,
        limits=Limits(cell_timeout_s=CELL_TIMEOUT_S, disk_mib=32, max_processes=200),
        progress=False,
        feedback=False,
    )
    [result] = [
        r
        for r in grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
        if r.assignment == "00_environment"
    ]
    assert "process limit of 200 processes and threads together" in result.note, result.note
    assert "filled the disk limit of 32 MiB" in result.note, result.note
    assert result.score == 2, "the two tests of list_devices ran before the limit ended the kernel"
    graded = nbformat.read(
        tmp_path / "work" / "executed" / "hoarder" / "00_environment" / "00_environment.ipynb", 4
    )
    [planting] = [c for c in graded.cells if "planted.py" in c.source]
    said = "".join(
        o.get("text", "") + str(o.get("ename", "")) + str(o.get("evalue", ""))
        for o in planting.outputs
    )
    assert (
        "IPC folder: Read-only file system" in said and "disk: No space left on device" in said
    ), said
    left = [p.name for p in tmp_path.rglob("*") if p.name.startswith(("fill-", "planted"))]
    assert left == [], left


def cells_of(*sources):
    return [nbformat.v4.new_code_cell(s) for s in sources]


def test_scan_flags_reaching_into_the_grader_and_not_honest_code():
    cells = cells_of
    assert scan.scan(cells("model.eval()\nx = torch.ones(2).to('cpu')")) == []
    assert scan.scan(cells("import torch\ntorch.allclose = lambda *a: True")) == [
        "line 2 changes torch.allclose"
    ]
    assert scan.scan(cells("get_ipython().showtraceback = None"))
    assert scan.scan(cells("import builtins"))
    assert scan.scan(cells("import torch", "setattr(torch, 'equal', min)"))


def test_strict_comparisons_refuse_rigged_equality():
    source = strict_comparisons("assert f() == 3\nassert g() != 4", "_guard")
    assert "_guard" in source and "==" not in source and "!=" not in source


def test_assemble_restores_tests_and_keeps_answers():
    source = nbformat.read(
        paths.SOLUTIONS / "01_device_placement" / "01_device_placement.ipynb", as_version=4
    )
    student = nbformat.read(
        demo.SUBMITTED / "trudy" / "02_cross_device_errors" / "02_cross_device_errors.ipynb",
        as_version=4,
    )
    source02 = nbformat.read(
        paths.SOLUTIONS / "02_cross_device_errors" / "02_cross_device_errors.ipynb", as_version=4
    )
    built = submission.assemble(source02, student)
    tests = [c.source for c in built.cells if is_test(c)]
    assert tests == [c.source for c in source02.cells if is_test(c)], (
        "edited and deleted tests come back"
    )
    assert any("raise NotImplementedError" in c.source for c in built.cells if is_answer(c))
    with pytest.raises(submission.SubmissionError, match="notebook of 01_device_placement"):
        path = demo.SUBMITTED / "ada" / "01_device_placement" / "01_device_placement.ipynb"
        ids = {nbgrader_meta(c).get("grade_id") for c in source.cells} - {None}
        submission.read_submission(path, grade_ids_of(source02), {"01_device_placement": ids})


def test_corrupt_notebook_is_named(tmp_path):
    path = tmp_path / "x.ipynb"
    path.write_text('{"cells": [ this is not json')
    with pytest.raises(submission.SubmissionError, match="x.ipynb is not a valid notebook"):
        submission.read_submission(path, set(), {})


def test_help_describes_the_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        grade.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in ("--jobs", "--time-limit", "--memory-limit-mib", "--db-url", "--no-feedback"):
        assert option in text


def test_the_grader_ends_with_its_output_and_exit_handlers_and_its_code(tmp_path):
    """cli.run skips Python's teardown of the modules, not what the run still had to say or clean
    up."""
    script = (
        "import atexit, shutil, sys, tempfile, threading, time\nfrom autograder.cli import run\ndef"
        " main():\n    global folder\n    folder = tempfile.TemporaryDirectory(dir=sys.argv[1])\n  "
        "  atexit.register(lambda: print('handlers ran', file=sys.stderr))\n   "
        " threading.Thread(target=lambda: (time.sleep(0.5), print('thread ran',"
        " file=sys.stderr))).start()\n    print('x' * 100_000, end='')\n    return 3\nrun(main)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=paths.ROOT,
        timeout=120,
    )
    assert done.returncode == 3
    assert done.stdout == "x" * 100_000 and done.stderr.split() == [
        "thread",
        "ran",
        "handlers",
        "ran",
    ]
    assert list(tmp_path.iterdir()) == []  # a temporary folder's finalizer ran too
    said = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", "--no-such-option"],
        capture_output=True,
        text=True,
        cwd=paths.ROOT,
        timeout=120,
    )
    assert said.returncode == 2 and "unrecognized arguments: --no-such-option" in said.stderr


def test_status_files_say_why_a_notebook_stopped(run):
    workdir, _ = run
    status = json.loads(
        (
            workdir
            / "jobs"
            / "tony"
            / "02_cross_device_errors"
            / "02_cross_device_errors"
            / "status.json"
        ).read_text()
    )
    assert status["stopped"].startswith("time limit")
    # The pool started kernels ahead of their turn: their start is off the notebook's time and
    # limits.
    statuses = [json.loads(path.read_text()) for path in (workdir / "jobs").rglob("status.json")]
    warm = [found for found in statuses if found["warm"]]
    assert warm and all(found["start_s"] > 0 for found in warm), statuses
    shutil.rmtree(workdir / "jobs")  # the working copies are large; the graded notebooks stay


def test_nothing_the_course_teaches_is_flagged():
    # Every code cell of every solution notebook but the tests (answers and teaching cells alike),
    # as a student who copies the lessons into answers would hand it in.
    for path in sorted(paths.SOLUTIONS.glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code" and not is_test(c)]
        assert scan.scan(cells) == [], f"{path.name}: {scan.scan(cells)}"
    assert (
        scan.scan(
            cells_of("import gc\ngc.collect()", "import inspect\nprint(inspect.getsource(len))")
        )
        == []
    )
    assert scan.scan(cells_of("import gc\ngc.get_objects()")) == ["line 2 uses get_objects"]
    assert scan.scan(cells_of("import inspect\ninspect.currentframe().f_back")) != []
    assert scan.scan(cells_of("import inspect\nframes = inspect.stack()")) == [
        "line 2 uses inspect.stack"
    ]
    assert scan.scan(cells_of("import inspect as look\nframes = look.stack()")) == [
        "line 2 uses inspect.stack"
    ]
    assert scan.scan(cells_of("from inspect import stack")) == ["line 1 uses inspect.stack"]
    assert scan.scan(cells_of("import torch\ntorch.stack([torch.ones(1)])")) == []
    assert scan.scan(cells_of("from IPython.display import Image, display")) == []
    assert scan.scan(cells_of("from IPython import display")) == ["line 1 uses IPython"]
    assert scan.scan(cells_of("import IPython.display")) == ["line 1 uses IPython.display"]
    assert scan.scan(cells_of("from IPython.display import Image, get_ipython")) == [
        "line 1 uses IPython.display"
    ]


def test_a_broken_grading_environment_stops_before_any_student(tmp_path, capsys, monkeypatch):
    # PyTorch cannot start under a 64 MiB limit: the instructor's solution fails in the sandbox, so
    # grading stops with exit 3 and the reason on the first line, instead of a table of zeros.
    # And a package kernels import that came without bytecode is named in the header, with the fix.
    site = tmp_path / "site" / "uncompiled_pkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site.parent))
    monkeypatch.setattr(bytecode, "PACKAGES", (*bytecode.PACKAGES, "uncompiled_pkg"))
    submitted = tmp_path / "submitted" / "ada"
    shutil.copytree(DEMO_CLASS / "ada" / "00_environment", submitted / "00_environment")
    code = grade.main(
        [
            "--submitted",
            str(submitted.parent),
            "--workdir",
            str(tmp_path / "work"),
            "--quiet",
            "--no-feedback",
            "--memory-limit-mib",
            "64",
        ]
    )
    said = capsys.readouterr()
    first = said.err.splitlines()[0]
    assert (
        "First the instructor's solution of each assignment with submissions runs in the same"
        " sandbox" in said.out
    )
    assert "No compiled bytecode for uncompiled_pkg: every kernel compiles" in said.out
    assert f"-m compileall -q -j0 {site.parent}\n" in said.out
    assert code == 3
    assert first.startswith(
        "grading stopped: the instructor's solution of 00_environment/00_environment"
    ), first
    assert not (tmp_path / "work" / "jobs" / "ada").exists(), "no student is graded"


GUARDED_COMPARISONS = r"""
import sys, torch
from autograder.prepare.job import strict_comparisons
from autograder.inside import guard
from autograder.run.kernel import source_of
exec(source_of(guard))
from devcourse.instructor.profile import DeviceCourse
install("_guard_for_test", **DeviceCourse.kernel.as_dict())

class Lying(torch.Tensor):  # says yes to every comparison
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True

honest, lie = torch.ones(2), torch.zeros(2).as_subclass(Lying)
assert torch.equal(lie, honest) and torch.allclose(lie, honest), "it lies when nothing guards"
for test in ("assert torch.equal(lie, honest)", "assert torch.allclose(honest, lie)",
             "torch.testing.assert_close([lie], [honest])",
             "assert torch.isclose(lie, honest).all()"):
    try:
        exec(strict_comparisons(test, "_guard_for_test"))
    except AssertionError as error:
        assert "not trusted" in str(error), (test, error)
    else:
        sys.exit(f"passed: {test}")
exec(strict_comparisons("assert torch.equal(honest, torch.ones(2))\n"
                        "assert not torch.allclose(honest, 2 * honest)", "_guard_for_test"))
sim = torch.ones(2, device="sim:1")
exec(strict_comparisons("assert torch.equal(sim.cpu(), honest) "
                        "and torch.allclose(sim, torch.ones(2, device='sim:1'))",
                        "_guard_for_test"))
print("refused")
"""


def test_tensor_comparisons_in_tests_refuse_a_lying_subclass_and_take_plain_and_simulated_ones():
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_COMPARISONS],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("refused"), (
        done.stdout + done.stderr
    )


def test_the_canary_grades_each_assignment_that_has_submissions_and_its_reference_is_kept(
    tmp_path, monkeypatch
):
    """By default the instructor's solution of every assignment being graded runs first, and of no
    other.

    Another work folder sharing the cache reuses both references, and hands the pool the longest
    notebooks first, as the references say; an edited solution is run again.
    """
    from autograder.run import executors

    for assignment in ("00_environment", "02_cross_device_errors"):
        shutil.copytree(
            DEMO_CLASS / "ada" / assignment, tmp_path / "submitted" / "ada" / assignment
        )
    assert Settings().canary == "graded"
    settings = Settings(
        jobs=2,
        limits=Limits(cell_timeout_s=CELL_TIMEOUT_S),
        progress=False,
        feedback=False,
        reference_cache=str(tmp_path / "cache"),
    )

    def graded(work):
        results = grade.grade(tmp_path / "submitted", tmp_path / work, settings)
        assert {
            (r.assignment, r.score) for r in results if r.student == "ada" and r.score is not None
        } == {("00_environment", 8), ("02_cross_device_errors", 7)}
        canary = tmp_path / work / "jobs" / "(canary)"
        return sorted(p.name for p in canary.iterdir()) if canary.is_dir() else []

    assert graded("work") == ["00_environment", "02_cross_device_errors"]
    kept = {path: json.loads(path.read_text()) for path in (tmp_path / "cache").glob("*.json")}
    assert len(kept) == 2 and all(reference["cpu_s"] > 0 for reference in kept.values())
    for path, reference in kept.items():  # 02 the longer, whatever this machine measured
        reference["cpu_s"] = 100.0 if reference["assignment"] == "02_cross_device_errors" else 1.0
        path.write_text(json.dumps(reference))
    order, submit = [], executors.LocalPool.submit

    def submitting(pool, job_file):
        order.append(job_file.parent.parent.name)
        return submit(pool, job_file)

    monkeypatch.setattr(executors.LocalPool, "submit", submitting)
    assert graded("again") == []
    assert order == ["02_cross_device_errors", "00_environment"]
    monkeypatch.undo()
    solution = (
        tmp_path / "again" / "source" / "02_cross_device_errors" / "02_cross_device_errors.ipynb"
    )
    nb = nbformat.read(solution, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("An instructor's afterthought."))
    nbformat.write(nb, solution)
    settings.regrade = True
    assert graded("again") == ["02_cross_device_errors"]


def test_the_key_of_a_reference_is_the_same_whichever_folder_the_grader_starts_in(tmp_path):
    """`make grade` starts in the repository's root, an instructor's own command may start
    elsewhere: the references kept on one day must serve the other (the root holds the course's
    metadata, found there a second time)."""
    code = (
        "from autograder.judge import reference; "
        "print(reference.this_machine('devcourse.instructor.profile.DeviceCourse'))"
    )
    root = Path(paths.ROOT)
    env = dict(os.environ, PYTHONPATH=str(root))
    keys = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for cwd in (root, tmp_path)
    ]
    assert keys[0] == keys[1] and len(keys[0].strip()) == 64


def test_a_run_with_no_submissions_names_only_the_references_it_checked(tmp_path):
    """A reference the work folder keeps from an older run (another solution, grader or machine) is
    not called ready.

    The real run that records what it checked is played in tests/autograder/cli/test_term.py
    (``--canary all`` before any submission).
    """
    from autograder.judge.reference import REFERENCES
    from autograder.record.state import WorkState, write_state

    for kept in ("00_environment", "03_saving_and_loading"):
        (tmp_path / REFERENCES / kept).mkdir(parents=True)
    state = WorkState(last_run={"jobs": 0, "grader_s": 0.0, "references": ["00_environment"]})
    write_state(tmp_path, state)
    said = grade.references_text(tmp_path, Settings())
    assert "References ready for: 00_environment (" in said and "03_saving" not in said, said
    state.last_run["references"] = []  # --canary graded with nothing to grade: no canary ran
    write_state(tmp_path, state)
    said = grade.references_text(tmp_path, Settings())
    assert "no reference was checked" in said and "ready for" not in said, said
    said = grade.references_text(tmp_path, Settings(dask_local=2))
    assert "runs it again each time" in said, said


def test_state_json_and_its_journal_say_what_was_graded_whatever_stopped_the_run(tmp_path):
    """Each graded pair is a line added to the journal; state.json is written whole at a run's
    steps. A line cut short, or one of a state.json written whole since, is passed over."""
    from autograder.record.state import (
        JOURNAL,
        STATE,
        WorkState,
        journal_pair,
        read_state,
        write_state,
    )

    state = WorkState(graded={"ada/00": "a"}, rows={"ada/00": {"note": ""}})
    write_state(tmp_path, state)
    for key, fingerprint in [("bob/00", "b"), ("eve/00", "e")]:
        state.graded[key], state.rows[key] = fingerprint, {"note": f"{key} noted"}
        state.withheld["eve/00"] = {"00": ["reads sys.modules"]}
        journal_pair(tmp_path, state, key)
    assert json.loads((tmp_path / STATE).read_text())["graded"] == {"ada/00": "a"}
    with (tmp_path / JOURNAL).open("a") as journal:
        # killed while writing
        journal.write('{"mark": "' + state.journal + '", "pair": "zed/00", "gra')
    found = read_state(tmp_path)
    assert found.graded == {"ada/00": "a", "bob/00": "b", "eve/00": "e"}
    assert found.rows["bob/00"] == {"note": "bob/00 noted"}
    assert found.withheld == {"eve/00": {"00": ["reads sys.modules"]}}
    # Written whole under a new mark, then stopped before the old journal went: its lines are passed
    # over.
    old_journal = (tmp_path / JOURNAL).read_text()
    del state.graded["bob/00"]  # regraded from scratch this run
    write_state(tmp_path, state)
    assert not (tmp_path / JOURNAL).exists()
    (tmp_path / JOURNAL).write_text(old_journal)
    assert "bob/00" not in read_state(tmp_path).graded


def test_each_job_goes_to_the_pool_as_soon_as_it_is_prepared(tmp_path, monkeypatch):
    """A class of a thousand has thousands of jobs: the first runs while the others are still being
    prepared."""
    from autograder.batch import classrun
    from autograder.run import executors

    for student in ("ada", "linus"):
        shutil.copytree(
            DEMO_CLASS / student / "00_environment",
            tmp_path / "submitted" / student / "00_environment",
        )
    events = []
    ready, submit = classrun.ready, executors.LocalPool.submit

    def preparing(job, *args, **kwargs):
        events.append(("prepared", job.student))
        return ready(job, *args, **kwargs)

    def submitting(pool, job_file):
        events.append(("submitted", job_file.parent.parent.parent.name))
        return submit(pool, job_file)

    monkeypatch.setattr(classrun, "ready", preparing)
    monkeypatch.setattr(executors.LocalPool, "submit", submitting)
    settings = Settings(
        jobs=1, limits=Limits(cell_timeout_s=CELL_TIMEOUT_S), progress=False, feedback=False
    )
    results = grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
    assert {(r.student, r.score) for r in results if r.score is not None} == {
        ("ada", 8),
        ("linus", 0),
    }
    students = [event for event in events if event[1] != "(canary)"]
    assert students == [
        ("prepared", "ada"),
        ("submitted", "ada"),
        ("prepared", "linus"),
        ("submitted", "linus"),
    ]


def test_students_run_beside_the_canary_and_a_failed_canary_loses_no_earlier_grading(
    tmp_path, monkeypatch
):
    """New submissions start while the solution runs (no worker waits for the longest solution
    notebook).

    A regrade whose canary fails keeps what the earlier run graded: its scores, executed notebooks
    and job folders (a withheld score's review reads them), none of its jobs started."""
    from autograder.judge import reference
    from autograder.run import executors

    for student in ("ada", "linus"):
        shutil.copytree(
            DEMO_CLASS / student / "00_environment",
            tmp_path / "submitted" / student / "00_environment",
        )
    events = []
    submit, result = executors.LocalPool.submit, reference.Pending.result

    def submitting(pool, job_file):
        events.append(("submitted", job_file.parent.parent.parent.name))
        return submit(pool, job_file)

    def awaited(pending):
        events.append(("canary awaited", ""))
        return result(pending)

    monkeypatch.setattr(executors.LocalPool, "submit", submitting)
    monkeypatch.setattr(reference.Pending, "result", awaited)
    settings = Settings(
        jobs=2,
        limits=Limits(cell_timeout_s=CELL_TIMEOUT_S),
        progress=False,
        feedback=False,
        rerun_canary=True,
    )
    results = grade.grade(tmp_path / "submitted", tmp_path / "work", settings)
    assert {(r.student, r.score) for r in results if r.score is not None} == {
        ("ada", 8),
        ("linus", 0),
    }
    assert events[:4] == [
        ("submitted", "(canary)"),
        ("submitted", "ada"),
        ("submitted", "linus"),
        ("canary awaited", ""),
    ], events

    work = tmp_path / "work"
    kept = {
        path: path.read_bytes()
        for folder in (work / "executed", work / "jobs" / "ada", work / "jobs" / "linus")
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    graded = json.loads((work / STATE).read_text())["graded"]
    assert set(graded) == {"ada/00_environment", "linus/00_environment"} and kept
    events.clear()
    settings.regrade = True
    # PyTorch cannot start: the canary fails
    settings.limits = dataclasses.replace(settings.limits, memory_mib=64)
    with pytest.raises(reference.CanaryFailed):
        grade.grade(tmp_path / "submitted", work, settings)
    assert [who for what, who in events if what == "submitted"] == ["(canary)"], events
    assert json.loads((work / STATE).read_text())["graded"] == graded
    assert {path: path.read_bytes() for path in kept if path.is_file()} == kept, (
        "an earlier run's file is gone"
    )


def test_a_reference_being_made_is_locked_for_other_graders_until_its_maker_lets_go(tmp_path):
    from autograder.judge.reference import _KeyLock

    maker, other = _KeyLock(tmp_path, "key"), _KeyLock(tmp_path, "key")
    assert maker.acquire(wait=False)
    assert not other.acquire(wait=False)
    maker.release()
    assert other.acquire(wait=False)
    other.release()


def test_a_failed_canarys_message_quotes_what_the_kernel_said_after_its_banner_not_the_banner(
    run, tmp_path
):
    """Each kernel writes ipykernel's banner to its kernel.log, ending with its connection file's
    path: a canary whose check failed named that path as "the kernel's last words" (seen on a GPU
    machine). A real kernel's log from the demo class's grading (a student's: the canary's
    references may come from the cache and its jobs not run; kept by the fixture, since a test
    before this one removes the jobs' folders): silent after its banner, then with a line of its own
    after it."""
    from autograder.judge.reference import _last_words
    from autograder.prepare.job import Job

    workdir, _ = run
    kept = workdir.parent / KERNEL_LOG  # the run's kernel of ada's 01
    assert "--existing" in kept.read_text(), "the banner this test is about"
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(kept, folder / "kernel.log")
    job = Job("(canary)", "01_device_placement", "01_device_placement", folder)
    assert _last_words(job) == ""
    with (folder / "kernel.log").open("a") as log:
        log.write("Fatal Python error: Segmentation fault\n\n")
    assert _last_words(job) == "Fatal Python error: Segmentation fault"
    (folder / "kernel.log").write_text(
        "OSError: libtorch_cpu.so: failed to map segment from shared object\n"
    )
    # died before
    assert _last_words(job) == "OSError: libtorch_cpu.so: failed to map segment from shared object"
    (folder / "kernel.log").unlink()  # the sandbox could not start: the runner's own log says why
    (folder / "runner.log").write_text(
        "sandbox: cannot enter namespaces: unshare: Operation not permitted\n"
    )
    assert _last_words(job) == "sandbox: cannot enter namespaces: unshare: Operation not permitted"


@pytest.mark.parametrize(
    "written,says",
    [
        (None, "the runner did not finish; see runner.log"),
        ('{"stopped": "', "its status.json could not be read (JSONDecodeError: "),
        ("[1, 2]", "its status.json holds a list, not a status"),
        (
            '{"stopped": "", "cell": "3", "seconds": 1.5, "warm": 1}',
            "values of the wrong type (cell, warm)",
        ),
    ],
)
def test_a_status_file_missing_corrupt_or_foreign_stops_its_notebook_with_why(
    tmp_path, written, says
):
    """What the judge reads of a job's status.json: a file it cannot take is a stop that says why,
    its notebook's tests unrun when the notebook is missing too, and grading goes on; another
    version's extra keys are ignored."""
    from autograder.judge.verdict import judge
    from autograder.prepare.job import Job
    from autograder.prepare.status import Status

    source = nbformat.read(
        DEMO_CLASS / "ada" / "00_environment" / "00_environment.ipynb", as_version=4
    )
    for cell in source.cells:
        if cell.cell_type == "code":
            cell.execution_count, cell.outputs = None, []
    nbformat.write(source, tmp_path / "in.ipynb")
    if written is not None:
        (tmp_path / "status.json").write_text(written)
    job = Job("zed", "00_environment", "00_environment", tmp_path)
    judged = judge(job, source, None)
    assert job.status.stopped.startswith(says) or says in job.status.stopped, job.status
    assert job.status.seconds == 0 and job.status.cell is None
    errors = [
        o.evalue for c in judged.cells if is_test(c) for o in c.outputs if o.output_type == "error"
    ]
    assert errors and all(e.startswith("not run: ") and says.split(" (")[0] in e for e in errors), (
        errors
    )
    (tmp_path / "status.json").write_text(
        '{"stopped": "", "seconds": 2.5, "from_a_later_version": true}'
    )
    assert Status.read(tmp_path / "status.json") == Status(seconds=2.5)


@pytest.mark.parametrize(
    "written,says",
    [
        ('{"graded": {"ada/00_environment": "a"', "cannot be read: JSONDecodeError"),
        ('["ada/00_environment"]', "holds a list, not a work folder's state"),
        ('{"graded": ["ada/00_environment"], "rows": {}}', "has values of the wrong type (graded)"),
    ],
)
def test_a_corrupt_state_is_named_and_every_submission_graded_afresh(
    tmp_path, capsys, written, says
):
    """state.json corrupt, or of another shape: the run says which file and what is wrong, then
    grades as if for the first time; a review refuses with the same words."""
    from autograder.batch.workdir import open_workdir
    from autograder.record import review

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "state.json").write_text(written)
    state = open_workdir(workdir, None)
    assert f"{workdir / 'state.json'} {says}" in capsys.readouterr().err
    assert state.graded == {} and not state.finished and (workdir / "source").is_dir()
    (workdir / "state.json").write_text(written)
    with pytest.raises(review.ReviewError, match=re.escape(says)):
        review.confirm(workdir, "ada", "00_environment", f"sqlite:///{workdir / 'gradebook.db'}")


def test_every_limit_and_only_a_change_of_one_changes_the_reference_key(tmp_path):
    """The key hashes the limits whole: a change of any one of them (one added later too) runs the
    canary again; the same limits keep the key."""
    from autograder.judge.reference import reference_key
    from autograder.run import sandbox
    from autograder.run.jobfile import RunContext

    (tmp_path / "source").mkdir()

    def key(limits: Limits) -> str:
        settings = Settings(limits=limits)
        run = RunContext(settings, sandbox.isolation_of(settings), "_grader_0", tmp_path, {})
        return reference_key(
            "00_environment", "00_environment", tmp_path / "source", run, "machine"
        )

    base = key(Limits())
    assert key(Limits()) == base
    changed = {}
    for field in dataclasses.fields(Limits):
        changed[field.name] = key(
            dataclasses.replace(Limits(), **{field.name: getattr(Limits(), field.name) + 1})
        )
    assert base not in changed.values() and len(set(changed.values())) == len(changed), changed
