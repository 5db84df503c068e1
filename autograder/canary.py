"""Before a class is graded, the instructor's own solution is graded in the same sandbox: a canary.

A grader whose environment is broken (a virtual environment the sandbox
cannot see, a package missing, limits too tight for PyTorch to start) would
otherwise run every student's notebook into the same wall and report a
table of zeros, with the cause in a log file. The canary runs the solution
notebook through exactly the path a submission takes (assembly, scan,
sandbox, guard, markers, verdict); unless every test passes, grading stops
before any student is graded, with the reason in :class:`CanaryFailed`'s
first line.

By default the notebooks of each assignment that has submissions to grade
are checked (``graded``), which costs one run of each; ``--canary first``
checks the first assignment's notebooks only, ``all`` every assignment's.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from autograder import sandbox
from autograder.job import Job, execute, prepare
from autograder.settings import Settings
from autograder.submission import is_test, nbgrader_meta
from autograder.verdict import judge

STUDENT = "(canary)"


class CanaryFailed(RuntimeError):
    """The instructor's solution did not pass in the grading sandbox; the message's first line says why."""


def check(notebooks: list[tuple[str, str, nbformat.NotebookNode]], workdir: Path, run: dict, settings: Settings) -> None:
    """Grade each ``(assignment, notebook, source)`` solution as a submission; raise CanaryFailed unless all pass.

    ``run`` holds what :func:`autograder.job.prepare` needs besides the job:
    ``secret``, ``guard_name``, ``isolation``, ``ipc_root``, ``imports``
    (assignment -> notebook -> import lines) and ``read_only``.
    """
    jobs = []
    for name, notebook, source in notebooks:
        job = Job(STUDENT, name, notebook, workdir / "jobs" / STUDENT / name / notebook)
        path = prepare(job, source, source, workdir / "source" / name, run["secret"], run["guard_name"], settings,
                       run["isolation"], run["ipc_root"], run["imports"][name][notebook], run["read_only"])
        jobs.append((job, path, source))
    with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        list(pool.map(lambda item: execute(item[1], settings), jobs))
    for job, _, source in jobs:
        problem = _problem(job, source)
        if problem:
            raise CanaryFailed(f"grading stopped: the instructor's solution of {job.assignment}/{job.notebook} "
                               f"does not pass in the grading sandbox: {problem}")


def _problem(job: Job, source: nbformat.NotebookNode) -> str | None:
    if job.findings:
        return "the scan flags it: " + "; ".join(job.findings[:3])
    executed = judge(job, source)
    for cell in executed.cells:
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if is_test(cell) and errors:
            first = errors[0]
            problem = f"test {nbgrader_meta(cell)['grade_id']}: {first.ename}: {sandbox.last_line(first.evalue) or first.evalue}"
            said = _last_words(job)
            return problem + (f" (the kernel's last words: {said})" if said else "")
    if not (job.folder / "status.json").exists():
        return "the runner did not finish: " + (_last_words(job) or "no log")
    return None


def _last_words(job: Job) -> str:
    """The last line the runner and its kernel wrote to the job's log, or ``""``."""
    log = job.folder / "runner.log"
    return sandbox.last_line(log.read_text(errors="replace")) if log.exists() else ""
