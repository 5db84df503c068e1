"""nbgrader's side of grading: its API set up for this course, the gradebook's URL, and a lock for
shared gradebooks.

The gradebook is nbgrader's SQLite file in the work folder, or a PostgreSQL
database shared by several graders (``--db-url`` or ``$COURSE_GRADEBOOK_URL``),
whose writes :class:`GradebookLock` keeps to one grader at a time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from pathlib import Path
from typing import Iterator

from autograder.course.config import config_of, course_directory, tools_on_path
from autograder.run import sandbox
from autograder.settings import GRADEBOOK_ENV, Settings

# the grader's executed notebooks, which nbgrader's autograde reads (not the submissions)
EXECUTED = "executed"


def nbgrader_api(workdir: Path, db_url: str | None = None):
    """nbgrader's API on a work folder, for the grader: ``autograde`` reads the executed notebooks
    (``executed/``), and neither clears nor runs them; every other folder is nbgrader's usual
    one."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        DeduplicateIds,
        LimitOutput,
        OverwriteCells,
        OverwriteKernelspec,
        SaveAutoGrades,
    )
    from traitlets.config import Config

    config = config_of(workdir)
    overrides = Config()
    overrides.CourseDirectory.root = str(Path(workdir).resolve())
    overrides.CourseDirectory.source_directory = "source"
    overrides.CourseDirectory.release_directory = "release"
    overrides.CourseDirectory.submitted_directory = EXECUTED
    overrides.CourseDirectory.db_url = db_url or course_directory(workdir).db_url
    # The notebooks arrive executed by the sandboxed runner: nbgrader must neither clear nor re-run
    # them.
    overrides.Autograde.sanitize_preprocessors = [
        DeduplicateIds,
        OverwriteKernelspec,
        OverwriteCells,
        CheckCellMetadata,
    ]
    overrides.Autograde.autograde_preprocessors = [
        LimitOutput,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]
    overrides.GenerateFeedback.exporter_class = "autograder.record.feedback.FeedbackExporter"
    # nbconvert validates the notebook once, after the last preprocessor, not after each of them
    overrides.Exporter.optimistic_validation = True
    config.merge(overrides)
    return NbGraderAPI(config=config)


@contextlib.contextmanager
def grading_environment() -> Iterator[None]:
    """For the block: nbgrader finds ``alembic`` (it starts it by name) and its warning on every
    submission (SQLAlchemy's, of nbgrader's own sessions) is not shown."""
    from sqlalchemy.exc import SAWarning

    with tools_on_path(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)
        yield


def ready_gradebook(db_url: str) -> None:
    """Make the gradebook at ``db_url`` as nbgrader's ``Gradebook`` makes a new one (its tables,
    stamped with the head of its migrations), unless it has tables already.

    nbgrader reads that head by starting the ``alembic heads`` command, a new process; here it is
    read in this process (:func:`alembic_head`). nbgrader offers no way to give it: made ahead, the
    gradebook is one nbgrader finds made.
    """
    import sqlalchemy
    from nbgrader.api import Base

    engine = sqlalchemy.create_engine(db_url)
    try:
        if sqlalchemy.inspect(engine).get_table_names():
            return
        Base.metadata.create_all(bind=engine)
        with engine.begin() as connection:
            connection.execute(
                sqlalchemy.text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            )
            connection.execute(
                sqlalchemy.text("INSERT INTO alembic_version (version_num) VALUES (:head)"),
                {"head": alembic_head()},
            )
    finally:
        engine.dispose()


def load_nbgrader() -> None:
    """Import nbgrader's API and read its gradebook's head revision now, as every grading does
    later: for a caller that waits on another process meanwhile."""
    import nbgrader.apps  # noqa: F401

    alembic_head()


@functools.lru_cache(maxsize=1)
def alembic_head() -> str:
    """The head revision of nbgrader's gradebook migrations: what ``alembic heads`` prints, without
    its process."""
    import nbgrader
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(Path(nbgrader.__file__).parent / "alembic"))
    return ScriptDirectory.from_config(config).get_current_head()


class GradebookLock:
    """One grader at a time writes a shared PostgreSQL gradebook (a PostgreSQL advisory lock).

    nbgrader creates assignments, notebooks and students with "update or
    create", which two graders doing it at once turn into a duplicate-key
    error. Any other database (SQLite in the work folder) has one grader: no lock.
    """

    KEY = 0x6E626772  # any number the graders of one course agree on

    def __init__(self, url: str):
        from sqlalchemy.engine import make_url

        self.engine = None
        if make_url(url).get_backend_name() == "postgresql":
            import sqlalchemy

            self.engine = sqlalchemy.create_engine(url)

    def __enter__(self) -> "GradebookLock":
        return self

    def __exit__(self, *_exc) -> None:
        if self.engine is not None:
            self.engine.dispose()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self.engine is None:
            yield
            return
        from sqlalchemy import text

        with self.engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self.KEY})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.KEY})


def gradebook_url(settings: Settings, workdir: Path) -> str:
    """``--db-url``, else ``$COURSE_GRADEBOOK_URL``, else a course directory's own gradebook, else
    nbgrader's SQLite file in the work folder."""
    if settings.db_url or os.environ.get(GRADEBOOK_ENV):
        return settings.db_url or os.environ[GRADEBOOK_ENV]
    if (Path(workdir) / "nbgrader_config.py").is_file():
        return course_directory(workdir).db_url
    return f"sqlite:///{Path(workdir).resolve() / 'gradebook.db'}"


def failure_of(outcome: dict) -> str:
    """Why one of nbgrader's API calls failed, in one line: the last of its error, else of its
    log."""
    return sandbox.last_line(outcome.get("error") or outcome.get("log") or "") or "unknown error"
