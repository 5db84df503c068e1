"""nbgrader's settings of a course, and the environment nbgrader's commands need to find their
tools."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from autograder.course.paths import config_in, course_folder


def tool_env() -> dict[str, str]:
    """The environment for nbgrader and jupyter: this interpreter's bin first on PATH.

    nbgrader creates a gradebook by running ``alembic`` by name, and kernels
    start ``python`` by name, so both must resolve to this environment.
    """
    env = dict(os.environ)
    here = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != here:  # the same however often it is applied
        env["PATH"] = here + os.pathsep + env.get("PATH", "")
    return env


@contextlib.contextmanager
def tools_on_path():
    """This interpreter's bin first on ``PATH`` for the block (see :func:`tool_env`), as it was
    after it."""
    before = os.environ.get("PATH")
    os.environ["PATH"] = tool_env()["PATH"]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def course_config():
    """The nbgrader settings of the course's folder the grader runs from
    (:func:`~autograder.course.paths.course_folder`), a traitlets ``Config``; none (nbgrader's
    defaults) elsewhere."""
    from traitlets.config import Config

    folder = course_folder()
    return config_in(folder) if folder is not None else Config()


def config_of(workdir: Path):
    """The nbgrader settings of a work folder: a course directory's own ``nbgrader_config.py``
    (:mod:`autograder.course.directory`), else those of the course's folder the grader runs from."""
    if (Path(workdir) / "nbgrader_config.py").is_file():
        return config_in(workdir)
    return course_config()


# What nbgrader's ClearSolutions writes into an answer cell by default: the code stub, then the text
# stub.
DEFAULT_STUBS = ("# YOUR CODE HERE\nraise NotImplementedError()", "YOUR ANSWER HERE")


def answer_stubs(workdir: Path) -> tuple[str, str]:
    """What nbgrader writes into the student versions' answer cells, as the work folder's course
    sets it."""
    from nbgrader.preprocessors import ClearSolutions

    clear = ClearSolutions(config=config_of(workdir))
    return clear.code_stub.get("python", DEFAULT_STUBS[0]), clear.text_stub


def course_directory(workdir: Path):
    """nbgrader's ``CourseDirectory`` of a work folder: its settings (:func:`config_of`), rooted
    there, with nbgrader's defaults for what they leave out (a course id of "", a gradebook
    ``gradebook.db`` in the folder). A course directory's own ``root`` setting wins, as nbgrader has
    it."""
    from nbgrader.coursedir import CourseDirectory

    config = config_of(workdir)
    own_root = (Path(workdir) / "nbgrader_config.py").is_file() and "root" in config.get(
        "CourseDirectory", {}
    )
    return (
        CourseDirectory(config=config)
        if own_root
        else CourseDirectory(config=config, root=str(Path(workdir).resolve()))
    )


def shown_url(url: str) -> str:
    """The gradebook URL as the report prints it: the password replaced by ``***``."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def gradebook_problem(url: str) -> str | None:
    """Why the gradebook at ``url`` cannot be opened (server down, wrong password...), or None if it
    can."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as error:  # noqa: BLE001 - any reason is reported to the instructor, in one line
        reason = str(getattr(error, "orig", None) or error)
        return (
            " ".join(line.strip() for line in reason.splitlines() if line.strip())
            or type(error).__name__
        )
    return None
