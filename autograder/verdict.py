"""Each test's verdict, decided in the grader from what the kernel printed and raised."""

from __future__ import annotations

import json

import nbformat

from autograder.job import Job
from autograder.submission import is_test, nbgrader_meta


def verdict(job: Job, executed: nbformat.NotebookNode, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Decide each test from the outside: it passed only if it printed its marker, raised nothing, and the
    notebook was not stopped while it ran.

    The last condition matters because the marker is in the test's source, which code the test calls can
    read: such code could print it and end the kernel before the test's checks fail. A test during which the
    kernel died, or a limit ended the notebook, earns nothing whatever it printed. Tests that failed get an
    error output saying why, so that nbgrader scores them 0 and the feedback shows the reason.
    """
    originals = {nbgrader_meta(c)["grade_id"]: c.source for c in source.cells if is_test(c)}
    stopped = job.status.get("stopped", "") or ""
    running = job.status.get("cell") if stopped else None  # the cell that was running when the notebook stopped
    for index, cell in enumerate(executed.cells):
        if not is_test(cell):
            continue
        grade_id = nbgrader_meta(cell)["grade_id"]
        token = job.markers[grade_id]
        cell.source = originals[grade_id]
        marked = False
        for output in cell.outputs:
            if output.output_type == "stream" and token in output.text:
                marked = True
                output.text = output.text.replace(token + "\n", "").replace(token, "")
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and not o.text)]
        failed = any(o.output_type == "error" for o in cell.outputs)
        reason = None
        if job.findings:
            reason = "score withheld for review: the submission reaches into the grading machinery (" + \
                     "; ".join(job.findings[:3]) + ("; ..." if len(job.findings) > 3 else "") + ")"
            cell.outputs = []
        elif index == running:
            reason = f"stopped while this test ran ({stopped}): it earns nothing"
        elif not failed and not marked:
            if cell.execution_count is None:
                reason = f"not run: {stopped or 'the notebook stopped before this test'}"
            else:
                reason = "the test did not report completion (its output or the kernel was tampered with)"
        if reason:
            cell.outputs.append(nbformat.v4.new_output("error", ename="GradingError", evalue=reason, traceback=[
                f"GradingError: {reason}"]))
    return executed


def judge(job: Job, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Read what the runner left in the job's folder (status, executed notebook) and decide every test.

    A runner that left no status (killed, or it never started) counts as
    stopped; a notebook that never ran is judged from its input, every test unrun.
    """
    status_path = job.folder / "status.json"
    job.status = json.loads(status_path.read_text()) if status_path.exists() else {
        "stopped": "the runner did not finish; see runner.log", "seconds": 0}
    out = job.folder / "out.ipynb"
    return verdict(job, nbformat.read(out if out.exists() else job.folder / "in.ipynb", as_version=4), source)
