"""Grade a whole class: every submission's notebooks run as jobs, judged, then nbgrader's gradebook
and feedback.

:func:`grade` (called by ``python -m autograder grade``) runs the phases of
:class:`~autograder.batch.classrun.ClassRun`, standing on :mod:`autograder.prepare`,
:mod:`autograder.run`, :mod:`autograder.judge` and :mod:`autograder.record`. A stopped run raises
:class:`GradingStopped`, and the work folder remembers what was graded
(:mod:`autograder.record.state`), so the next run grades only what is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path

from autograder.batch.classrun import ClassRun
from autograder.batch.results import results
from autograder.batch.stop import INTERRUPTS, ChoiceError, GradingStopped
from autograder.batch.workdir import open_workdir
from autograder.course.directory import is_course_dir
from autograder.course.paths import WORKDIR
from autograder.course.profile import profile_name_of, profile_named
from autograder.record.gradebook import GradebookLock, gradebook_url, grading_environment
from autograder.run.executors import ClusterError, executor_for
from autograder.run.ipc import ipc_folder
from autograder.run.process import RUNNERS
from autograder.settings import Result, Settings

__all__ = ["INTERRUPTS", "ChoiceError", "GradingStopped", "grade"]


def grade(
    submitted: Path | None, workdir: Path = WORKDIR, settings: Settings | None = None
) -> list[Result]:
    """Autograde every ``submitted/<student>/<assignment>/`` folder not graded yet; return one
    Result per pair.

    ``submitted`` is copied into ``workdir/submitted/`` first; None grades what
    a course directory's ``submitted/`` holds (``nbgrader collect``). What an
    earlier run graded and has not changed since is not graded again
    (``settings.regrade`` grades the chosen submissions anyway);
    ``settings.assignments`` and ``settings.students`` choose. A student who
    handed nothing in for an assignment gets ``score=None`` and a note; a
    notebook that cannot be graded (corrupt, from another assignment) gets a
    note with the reason, and the batch goes on.

    The phases, in order: read the course (assignments, notebooks, due dates); choose the pairs
    (student, assignment) new or changed since an earlier run; start the references
    (:mod:`autograder.judge.reference`); submit each notebook to the executor as soon as it is
    prepared; nbgrader's release of what this run grades; collect each finished job, judged, each
    finished pair autograded by nbgrader with its feedback; finish, and a row per pair for the
    report (:func:`~autograder.batch.results.results`). A run stopped (Ctrl-C, SIGTERM, SIGHUP; held
    back while the gradebook is written) ends every runner with its sandbox.
    """
    settings = settings or Settings()
    workdir = Path(workdir).resolve()
    # before the executor: its zygote imports what the profile's kernels import
    if settings.profile is None:
        settings = dataclasses.replace(settings, profile=profile_name_of(workdir))
    intake = Path(submitted).resolve() if submitted is not None else None
    if intake is None and not is_course_dir(workdir):
        raise ChoiceError(f"{workdir} is not a course directory: name the submissions folder")
    # Called as a library (gpu-check, slurm-check, a notebook) too: a Ctrl-C must wait for
    # nbgrader's calls to end, since nbgrader catches every exception there, KeyboardInterrupt too
    # (a bare except in its capture_log), and the pair would be recorded as not graded while the run
    # went on.
    main_thread = threading.current_thread() is threading.main_thread()
    with INTERRUPTS.installed() if main_thread else contextlib.nullcontext():
        # a cluster that does not answer stops here, before anything is written
        executor = executor_for(settings)
        try:
            state = open_workdir(workdir, intake)
            due = settings.due if settings.due is not None else _demo_due(settings.profile, intake)
            RUNNERS.stopping.clear()
            db_url = gradebook_url(settings, workdir)
            with grading_environment(), ipc_folder() as ipc_root, GradebookLock(db_url) as lock:
                run = ClassRun(workdir, db_url, settings, ipc_root, lock, state, executor)
                return _phases(run, due)
        finally:
            executor.close()


def _demo_due(profile: str, intake: Path | None) -> dict[str, str]:
    """The due dates of the course's demo class where ``intake`` is its submissions folder, else
    none."""
    demo = profile_named(profile).demo_class()
    return demo.due if demo is not None and intake == demo.submitted.resolve() else {}


def _phases(run: ClassRun, due: dict[str, str]) -> list[Result]:
    run.read_course(due)
    run.choose()
    run.start_references()
    run.open_feedback()
    try:
        run.submit()
        run.release()
        run.collect()
    except (KeyboardInterrupt, ClusterError) as error:
        raise run.stopped(error) from None
    except BaseException:
        run.failed()
        raise
    run.finish()
    return results(run)
