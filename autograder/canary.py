"""Before a class is graded, the instructor's solution runs in the same sandbox: the canary and the reference.

A grader whose environment is broken (a virtual environment the sandbox
cannot see, a package missing, limits too tight for PyTorch to start) would
otherwise run every student's notebook into the same wall and report a
table of zeros, with the cause in a log file. The canary runs the solution
notebook through exactly the path a submission takes (assembly, scan,
sandbox, guard, both phases); unless every test passes, grading stops
before any student is graded, with the reason in :class:`CanaryFailed`'s
first line.

The same run is the reference every submission is judged against: the
solution's probes (:mod:`autograder.probe`) record the expected side of
every value comparison, which never enters a student's kernel, and each
must hold against the solution's own values. The records are kept in
``reference/ASSIGNMENT/NOTEBOOK.json`` in the work folder; a stopped run
that is resumed reuses them.

The notebooks of each assignment that has submissions to grade are run
(``graded``, the default: grading needs their references); ``--canary all``
runs every assignment's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat

from autograder import sandbox
from autograder.job import Job, RunContext, prepare
from autograder.probe import notebook_sites, self_check
from autograder.submission import is_test, nbgrader_meta
from autograder.verdict import judge, observations_of

STUDENT = "(canary)"


class CanaryFailed(RuntimeError):
    """The instructor's solution did not pass in the grading sandbox; the message's first line says why."""


def references(notebooks: list[tuple[str, str, nbformat.NotebookNode]], workdir: Path,
               run: RunContext) -> dict[str, dict[str, dict]]:
    """Run each ``(assignment, notebook, source)`` solution as a submission, with the instructor's probes.

    Returns assignment -> notebook -> grade_id -> the reference's records; raises CanaryFailed unless every
    test passes. Notebooks whose reference is already in the work folder are not run again.
    """
    found: dict[str, dict[str, dict]] = {}
    jobs = []
    for name, notebook, source in notebooks:
        kept = reference_of(workdir, name, notebook)
        if kept is not None:
            found.setdefault(name, {})[notebook] = kept
            continue
        job = Job(STUDENT, name, notebook, workdir / "jobs" / STUDENT / name / notebook)
        shutil.rmtree(job.folder, ignore_errors=True)  # left by a run stopped before its reference was kept
        path = prepare(job, source, source, workdir / "source" / name, run, reference=True)
        jobs.append((job, path, source))
    for future in [run.executor.submit(path) for _, path, _ in jobs]:
        future.result()
    for job, _, source in jobs:
        problem = _problem(job, source)
        if problem:
            raise CanaryFailed(f"grading stopped: the instructor's solution of {job.assignment}/{job.notebook} "
                               f"does not pass in the grading sandbox: {problem}")
        records = observations_of(job)
        path = workdir / "reference" / job.assignment / f"{job.notebook}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records))
        found.setdefault(job.assignment, {})[job.notebook] = records
    return found


def reference_of(workdir: Path, assignment: str, notebook: str) -> dict | None:
    """The reference a run in ``workdir`` keeps for a notebook, or None."""
    try:
        kept = json.loads((workdir / "reference" / assignment / f"{notebook}.json").read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def _problem(job: Job, source: nbformat.NotebookNode) -> str | None:
    if job.findings:
        return "the scan flags it: " + "; ".join(job.findings[:3])
    executed = judge(job, source, reference=None)
    records = observations_of(job)
    sites = notebook_sites([cell.source for cell in source.cells if is_test(cell)])
    for cell in executed.cells:
        if not is_test(cell):
            continue
        grade_id = nbgrader_meta(cell)["grade_id"]
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            first = errors[0]
            problem = f"test {grade_id}: {first.ename}: {sandbox.last_line(first.evalue) or first.evalue}"
        else:
            why = self_check(records.get(grade_id), sites)
            problem = f"test {grade_id}, run again with its hidden checks: {why}" if why else None
        if problem:
            said = _last_words(job)
            return problem + (f" (the kernel's last words: {said})" if said else "")
    if not (job.folder / "status.json").exists():
        return "the runner did not finish: " + (_last_words(job) or "no log")
    return None


def _last_words(job: Job) -> str:
    """The last line the runner and its kernel wrote to the job's log, or ``""``."""
    log = job.folder / "runner.log"
    return sandbox.last_line(log.read_text(errors="replace")) if log.exists() else ""
