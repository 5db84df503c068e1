"""The gradebook on a real PostgreSQL server: two graders write into it at once.

The server is Debian's ``postgresql`` package (``make postgres`` installs it;
``make test`` does so before the tests). Each test session starts its own
cluster in a temporary folder on a free port, with password authentication
over TCP as several graders would use it, and stops it afterwards.
"""

import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from support.servers import PASSWORD, free_port

from autograder.cli import grade
from devcourse.instructor import demo
from autograder.course.config import course_config
from devcourse.instructor.paths import DEMO_CLASS
from autograder.record.gradebook import GradebookLock, grading_environment
from autograder.run import sandbox
from autograder.run.watch import alive
from autograder.settings import GRADEBOOK_ENV

ASSIGNMENT = "00_environment"
STUDENTS = {"grader_a": ["ada", "grace"], "grader_b": ["linus", "margaret"]}
ROOT = Path(__file__).resolve().parents[3]


def _class_of(students: list[str], folder: Path, rename: dict[str, str] | None = None) -> Path:
    """A class of some demo students' submissions of ASSIGNMENT, each under its own (or a new)
    name."""
    for student in students:
        shutil.copytree(
            DEMO_CLASS / student / ASSIGNMENT,
            folder / (rename or {}).get(student, student) / ASSIGNMENT,
        )
    return folder


def _expected() -> dict[str, str]:
    with demo.EXPECTED_SCORES.open() as handle:
        return {
            row["student"]: row["score"]
            for row in csv.DictReader(handle)
            if row["assignment"] == ASSIGNMENT
        }


@pytest.fixture(scope="module")
def graded(server, tmp_path_factory):
    """Two graders, each with half of the class, grade at the same time into the one gradebook."""
    tmp = tmp_path_factory.mktemp("graders")
    env = {**os.environ, GRADEBOOK_ENV: server["url"]}
    graders = {}
    for name, students in STUDENTS.items():
        submitted = _class_of(students, tmp / name / "submitted")
        graders[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autograder",
                "grade",
                "--submitted",
                str(submitted),
                "--workdir",
                str(tmp / name / "work"),
                "--jobs",
                "1",
                "--quiet",
                "--no-feedback",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    outputs = {}
    for name, process in graders.items():
        outputs[name] = process.communicate(timeout=600)[0]
        assert process.returncode == 0, outputs[name]
    return tmp, outputs


def test_both_graders_scores_land_in_the_postgresql_gradebook(server, graded):
    from nbgrader.api import Gradebook

    expected = _expected()
    with Gradebook(server["url"], course_config().CourseDirectory.course_id) as gradebook:
        scores = {s.student.id: s.score for s in gradebook.assignment_submissions(ASSIGNMENT)}
    everyone = [student for students in STUDENTS.values() for student in students]
    assert sorted(scores) == sorted(everyone)
    assert {student: f"{scores[student]:g}" for student in everyone} == {
        s: expected[s] for s in everyone
    }
    assert len(set(scores.values())) > 1, "the class should not all score the same"


def test_graders_write_the_gradebook_one_at_a_time(server):
    """nbgrader's "update or create" from two graders at once is a duplicate-key error: the lock
    prevents it."""
    import psycopg

    with (
        GradebookLock(server["url"]) as lock,
        psycopg.connect(server["url"], autocommit=True) as other,
    ):

        def free() -> bool:
            taken = other.execute(
                "SELECT pg_try_advisory_lock(%s)", (GradebookLock.KEY,)
            ).fetchone()[0]
            if taken:
                other.execute("SELECT pg_advisory_unlock(%s)", (GradebookLock.KEY,))
            return taken

        assert free()
        with lock.held():
            assert not free(), "another grader could write while this one holds the lock"
        assert free()
    assert GradebookLock("sqlite:///gradebook.db").engine is None


def test_no_sqlite_gradebook_when_postgresql_is_set(graded):
    tmp, _ = graded
    for name in STUDENTS:
        assert not list((tmp / name / "work").glob("*.db")), f"{name} wrote a SQLite gradebook"


def test_report_names_the_gradebook_without_its_password(server, graded):
    tmp, outputs = graded
    for name in STUDENTS:
        report = (tmp / name / "work" / "report.txt").read_text()
        assert f"127.0.0.1:{server['port']}/gradebook" in report
        assert PASSWORD not in report and PASSWORD not in outputs[name]


def test_a_course_directory_keeps_its_gradebook_in_postgresql(server, tmp_path):
    import psycopg
    from nbgrader.api import Gradebook

    from autograder.cli import course

    with psycopg.connect(
        server["url"].replace("/gradebook", "/postgres"), autocommit=True
    ) as admin:
        admin.execute("CREATE DATABASE term")
    url = server["url"].replace("/gradebook", "/term")
    folder = tmp_path / "course"
    assert (
        course.main(
            ["init", str(folder), "--db-url", url, "--due", f"{ASSIGNMENT}=2026-09-07 17:00 UTC"]
        )
        == 0
    )
    assert not (folder / "gradebook.db").exists()
    assert (folder / "nbgrader_config.py").stat().st_mode & 0o077 == 0, (
        "the password is readable by others"
    )
    with grading_environment(), Gradebook(url, course_config().CourseDirectory.course_id) as book:
        assert {a.name for a in book.assignments} == {p.name for p in (folder / "source").iterdir()}
        assert str(book.find_assignment(ASSIGNMENT).duedate) == "2026-09-07 17:00:00"


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_gradebook_made_ahead_is_nbgraders_own_without_starting_alembic(
    database, tmp_path, request
):
    """nbgrader stamps a new gradebook with what the ``alembic heads`` command prints; the grader
    makes it ahead, with the head read in its own process, and nbgrader finds it made: it starts no
    command and stamps nothing."""
    import subprocess
    from unittest import mock

    import nbgrader.api
    import psycopg
    import sqlalchemy

    from autograder.course.config import tools_on_path
    from autograder.record.gradebook import ready_gradebook

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    if database == "postgresql":
        server = request.getfixturevalue("server")
        with psycopg.connect(
            server["url"].replace("/gradebook", "/postgres"), autocommit=True
        ) as admin:
            admin.execute("CREATE DATABASE ahead")
        url = server["url"].replace("/gradebook", "/ahead")
    with tools_on_path():
        printed = nbgrader.api.get_alembic_version()  # nbgrader's way: the command
    ready_gradebook(url)
    with mock.patch.object(
        subprocess, "check_output", side_effect=AssertionError("alembic started")
    ):
        with nbgrader.api.Gradebook(url) as book:
            book.add_student("ada")
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        assert list(
            connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version"))
        ) == [(printed,)]
    engine.dispose()
    ready_gradebook(url)  # made already: left as it is
    with nbgrader.api.Gradebook(url) as book:
        assert [student.id for student in book.students] == ["ada"]


def test_unreachable_gradebook_is_a_clear_error_before_grading(tmp_path, capsys):
    port = free_port()  # nothing listens there
    url = f"postgresql://grader:{PASSWORD}@127.0.0.1:{port}/gradebook"
    submitted = _class_of(["ada"], tmp_path / "submitted")
    with pytest.raises(SystemExit) as stop:
        grade.main(
            [
                "--submitted",
                str(submitted),
                "--workdir",
                str(tmp_path / "work"),
                "--db-url",
                url,
                "--quiet",
            ]
        )
    assert stop.value.code == 2
    message = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in message and "cannot open the gradebook" in message
    assert PASSWORD not in message
    assert not (tmp_path / "work").exists(), "nothing should have been graded"


def test_student_kernel_cannot_reach_the_gradebook_server(server, tmp_path):
    """A submission that knows the server's address and password still cannot write a score."""
    if not sandbox.probe().namespaces:
        pytest.fail(
            f"the network namespace is not available here ({sandbox.probe().reason}); "
            "run the tests as root on Linux"
        )
    submitted = _class_of(["linus"], tmp_path / "submitted", rename={"linus": "intruder"})
    notebook = submitted / "intruder" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    attack = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {server['port']}), timeout=2).close()\n"
        "    print('REACHED THE GRADEBOOK')\n"
        "except OSError as error:\n"
        "    print('no way through:', error)\n"
    )
    answer = next(cell for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("solution"))
    answer.source = attack + answer.source
    nbformat.write(nb, notebook)
    workdir = tmp_path / "work"
    assert (
        grade.main(
            [
                "--submitted",
                str(submitted),
                "--workdir",
                str(workdir),
                "--db-url",
                server["url"],
                "--quiet",
                "--no-feedback",
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    executed = nbformat.read(
        workdir / "executed" / "intruder" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    printed = "".join(
        o.get("text", "")
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    assert "no way through" in printed and "REACHED THE GRADEBOOK" not in printed


def test_the_server_stops_when_the_test_process_is_killed():
    """A test run that is killed outright (SIGKILL) leaves no PostgreSQL server running."""
    child_code = f"""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from support.servers import postgres_binaries, postgres_cluster
# kept: a generator dropped would stop the server
cluster = postgres_cluster(postgres_binaries(), Path(sys.argv[1]))
info = next(cluster)
print(info["pid"], info["port"], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    with tempfile.TemporaryDirectory(prefix="course-postgres-") as folder:
        child = subprocess.run(
            [sys.executable, "-c", child_code, folder],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        pid, port = map(int, child.stdout.split())
        deadline = time.monotonic() + 20
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the PostgreSQL server outlived the process that started it"
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, (
                "something still listens on the server's port"
            )
