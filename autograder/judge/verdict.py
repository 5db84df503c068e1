"""Each test's verdict, decided in the grader: what phase A showed, and the probe against the
reference.

:func:`judge` (from :mod:`autograder.batch`) gives each failed test an error output saying why in
the grader's own words, so that nbgrader scores it 0 and the feedback shows the reason; a failed
hidden check is named only as hidden. Why a verdict cannot be forged:
:mod:`autograder.prepare.probes`.
"""

from __future__ import annotations

import json

import nbformat

from autograder.course.cells import is_test, nbgrader_meta
from autograder.judge.compare import compare
from autograder.prepare.job import Job
from autograder.prepare.probes import notebook_sites
from autograder.prepare.status import Status

AGAIN = "when the grader ran this test again, with its hidden checks, "


def verdict(
    job: Job,
    executed: nbformat.NotebookNode,
    source: nbformat.NotebookNode,
    reference: dict | None,
    observations: dict,
) -> nbformat.NotebookNode:
    """Decide every test of the executed notebook; ``reference`` None judges phase A alone (the
    canary).

    A test earns its points only when its cell ran in phase A and raised nothing, the notebook was
    not stopped while it ran, and its probe recorded the reference's sequence of checks, each value
    relating to the reference's expected value as the test's assertion says.
    """
    originals = {nbgrader_meta(c)["grade_id"]: c.source for c in source.cells if is_test(c)}
    sites = notebook_sites(list(originals.values())) if reference is not None else []
    stopped = job.status.stopped
    # the cell that was running when the notebook stopped
    running = job.status.cell if stopped else None
    for index, cell in enumerate(executed.cells):
        if not is_test(cell):
            continue
        grade_id = nbgrader_meta(cell)["grade_id"]
        cell.source = originals[grade_id]
        failed = any(o.output_type == "error" for o in cell.outputs)
        reason = None
        if job.findings:
            reason = (
                "score withheld for review: the submission reaches into the grading machinery ("
                + "; ".join(job.findings[:3])
                + ("; ..." if len(job.findings) > 3 else "")
                + ")"
            )
            cell.outputs = []
        elif index == running:
            reason = f"stopped while this test ran ({stopped}): it earns nothing"
        elif cell.execution_count is None:
            reason = f"not run: {stopped or 'the notebook stopped before this test'}"
        elif not failed and reference is not None:
            outcome = compare(observations.get(grade_id), reference[grade_id], sites)
            if not outcome.passed:
                reason = (
                    AGAIN
                    + outcome.reason
                    + (f" ({stopped})" if stopped and grade_id not in observations else "")
                )
        if reason:
            cell.outputs.append(
                nbformat.v4.new_output(
                    "error",
                    ename="GradingError",
                    evalue=reason,
                    traceback=[f"GradingError: {reason}"],
                )
            )
    return executed


def judge(job: Job, source: nbformat.NotebookNode, reference: dict | None) -> nbformat.NotebookNode:
    """Read what the runner left in the job's folder (status, executed notebook, probes) and decide
    every test.

    A runner that left no status (killed, or it never started), or one that cannot be read, counts
    as stopped (:meth:`autograder.prepare.status.Status.read`); a notebook that never ran is judged
    from its input, every test unrun.
    """
    job.status = Status.read(job.folder / "status.json")
    out = job.folder / "out.ipynb"
    executed = nbformat.read(out if out.exists() else job.folder / "in.ipynb", as_version=4)
    return verdict(job, executed, source, reference, observations_of(job))


def observations_of(job: Job) -> dict:
    """What the job's probes recorded (grade_id -> events), {} if nothing was."""
    try:
        found = json.loads((job.folder / "observations.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
