"""A run's result for every pair of the class: its score from the gradebook, and the notes the
instructor reads."""

from __future__ import annotations

from autograder.batch.classrun import ClassRun
from autograder.course.cells import max_points
from autograder.course.profile import checked_on
from autograder.record.marks import hand_graded_points_left
from autograder.settings import Pair, Result


def results(run: ClassRun) -> list[Result]:
    """One Result per student and assignment, in order; the pairs this run did not grade say why."""
    from nbgrader.api import Gradebook

    devices = checked_on(run.settings)[0]
    with Gradebook(run.db_url, run.course_id) as gradebook:
        return [
            _result(run, gradebook, student, name, devices)
            for student in run.students
            for name in run.course.names
        ]


def _result(run: ClassRun, gradebook, student: str, name: str, devices: str) -> Result:
    from nbgrader.api import MissingEntry

    state = run.state
    # nbgrader's maximum, also of an assignment it has not generated
    max_score = sum(max_points(nb) for nb in run.course.sources[name].values())
    submission = run.submissions[Pair(student, name)]
    key = submission.pair.key
    notes = list(submission.notes)
    jobs = submission.jobs
    seconds = sum(j.status.seconds for j in jobs)
    if submission.earlier:
        row = state.rows.get(key, {})
        notes = [row["note"]] if row.get("note") else []
        changed = state.graded[key] != submission.fingerprint
        notes.append("graded by an earlier run" + (", changed since" if changed else ""))
        seconds = row.get("seconds", 0.0)
    score = None
    if submission.graded:
        try:
            entry = gradebook.find_submission(name, student)
        except MissingEntry:
            notes.append("not graded: no submission in the gradebook")
        else:
            score = entry.score
            if entry.late_submission_penalty:
                notes.append(
                    f"late by {late_text(entry.total_seconds_late)}: "
                    f"-{entry.late_submission_penalty:g} points"
                )
            by_hand = hand_graded_points_left(entry)
            if by_hand:
                notes.append(f"{by_hand:g} points of written answers to grade by hand (formgrader)")
    withheld = key in state.withheld and submission.graded
    if withheld:
        notes.append(
            f"review: python -m autograder review {key} --release (or --confirm), or in formgrader"
        )
    ran = any(j.status.seconds for j in jobs)
    return Result(
        student,
        name,
        score,
        max_score,
        "; ".join(notes),
        devices if ran else "",
        round(seconds, 1),
        withheld=withheld,
    )


def late_text(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours / 24:.1f} days" if hours >= 24 else f"{hours:.1f} hours"
