"""nbgrader's side of grading: its API set up for this course, the gradebook's URL, and a lock for shared gradebooks.

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
from unittest import mock

from autograder.course.config import config_of, tool_env
from autograder.run import sandbox
from autograder.settings import GRADEBOOK_ENV, Settings

EXECUTED = "executed"  # the grader's executed notebooks, which nbgrader's autograde reads (not the submissions)


def nbgrader_api(workdir: Path, db_url: str | None = None):
    """nbgrader's API on a work folder, for the grader: ``autograde`` reads the executed notebooks
    (``executed/``), and neither clears nor runs them; every other folder is nbgrader's usual one."""
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
    overrides.CourseDirectory.db_url = db_url or config.CourseDirectory.db_url
    # The notebooks arrive executed by the sandboxed runner: nbgrader must neither clear nor re-run them.
    overrides.Autograde.sanitize_preprocessors = [DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                                  CheckCellMetadata]
    overrides.Autograde.autograde_preprocessors = [LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    overrides.GenerateFeedback.exporter_class = "autograder.record.feedback.FeedbackExporter"
    config.merge(overrides)
    return NbGraderAPI(config=config)


@contextlib.contextmanager
def grading_environment() -> Iterator[None]:
    """nbgrader runs ``alembic`` by name, warns on every submission, and opens a new database engine for
    every gradebook it opens; all three for this block only.

    A new gradebook is stamped with the head of nbgrader's migrations, which
    nbgrader finds by starting the ``alembic heads`` command (about 2 s); here it
    is read in this process, once (:func:`alembic_head`). Each of nbgrader's
    ``Gradebook`` objects makes its own SQLAlchemy engine, and an engine keeps the
    SQL it compiled to itself: nbgrader's autograde compiled each of its queries
    again for every submission (a quarter of its time). In the block, the
    gradebooks of one URL share one engine (closing a gradebook still returns its
    connections), disposed of at the block's end.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SAWarning

    engines: dict = {}

    def shared_engine(url, **options):
        key = (str(url), repr(sorted(options.items())))
        if key not in engines:
            engines[key] = create_engine(url, **options)
        return engines[key]

    try:
        with mock.patch.dict(os.environ, {"PATH": tool_env()["PATH"]}), warnings.catch_warnings(), \
                mock.patch("nbgrader.api.get_alembic_version", alembic_head), \
                mock.patch("nbgrader.api.create_engine", shared_engine):
            warnings.filterwarnings("ignore", category=SAWarning)
            yield
    finally:
        for engine in engines.values():
            engine.dispose()


@functools.lru_cache(maxsize=1)
def alembic_head() -> str:
    """The head revision of nbgrader's gradebook migrations: what ``alembic heads`` prints, without its process."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import _temp_alembic_ini

    with _temp_alembic_ini("sqlite://") as ini:
        return ScriptDirectory.from_config(Config(ini)).get_current_head()


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
    """``--db-url``, else ``$COURSE_GRADEBOOK_URL``, else a course directory's own gradebook, else nbgrader's
    SQLite file in the work folder."""
    if settings.db_url or os.environ.get(GRADEBOOK_ENV):
        return settings.db_url or os.environ[GRADEBOOK_ENV]
    if (Path(workdir) / "nbgrader_config.py").is_file():
        return config_of(workdir).CourseDirectory.db_url
    return f"sqlite:///{Path(workdir).resolve() / 'gradebook.db'}"


def failure_of(outcome: dict) -> str:
    """Why one of nbgrader's API calls failed, in one line: the last of its error, else of its log."""
    return sandbox.last_line(outcome.get("error") or outcome.get("log") or "") or "unknown error"
