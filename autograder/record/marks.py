"""Marks in nbgrader's gradebook for formgrader: what waits for a person, and the withheld scores to
review."""

from __future__ import annotations


def hand_graded_points_left(submission) -> float:
    """The points of a graded submission's written answers that nobody has graded yet."""
    return sum(
        grade.max_score
        for notebook in submission.notebooks
        for grade in notebook.grades
        if awaits_a_grader(grade)
    )


def awaits_a_grader(grade) -> bool:
    """A written answer nobody has graded: nbgrader gives it no automatic score (an unchanged one
    gets 0 at once), and until a grader enters one in formgrader it counts as 0."""
    return grade.auto_score is None and grade.manual_score is None


def flag_for_review(
    db_url: str, course_id: str, pair: tuple[str, str], findings: dict[str, list[str]]
) -> None:
    """Show a withheld submission in formgrader as needing manual grading, with the scan's findings
    as comments."""
    mark_review(
        db_url,
        course_id,
        pair,
        {
            notebook: "Score withheld by the grader for review: " + "; ".join(found[:3])
            for notebook, found in findings.items()
        },
        needs_manual_grade=True,
    )


def mark_review(
    db_url: str,
    course_id: str,
    pair: tuple[str, str],
    comments: dict[str, str],
    needs_manual_grade: bool,
) -> None:
    """Set the formgrader flag of each named notebook's grades, and its first cell's comment to
    ``comments[notebook]``."""
    from nbgrader.api import Gradebook, MissingEntry

    student, name = pair
    with Gradebook(db_url, course_id) as gradebook:
        for notebook, text in comments.items():
            try:
                graded = gradebook.find_submission_notebook(notebook, name, student)
            except MissingEntry:
                continue
            for grade in graded.grades:  # a written answer nobody has graded yet stays listed
                grade.needs_manual_grade = needs_manual_grade or awaits_a_grader(grade)
            for comment in graded.comments[:1]:
                comment.manual_comment = text
        gradebook.db.commit()
