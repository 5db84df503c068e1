"""What ``grade`` prints after its table: how to read it, who the demo students are, what to open
next (the course's profile names its pages and commands:
:meth:`~autograder.course.profile.CourseProfile.next_steps`)."""

from __future__ import annotations

from pathlib import Path

from autograder.course.profile import CourseProfile, DemoClass
from autograder.settings import Result

HOW_TO_READ = (
    "How to read the table: a row per student, a column per assignment, each cell score/maximum;"
    " '-' not handed in or not graded; 'withheld' waits for your review; the notes say why a"
    " notebook stopped or lost its score."
)


def shown(
    results: list[Result], assignments: tuple[str, ...], students: tuple[str, ...]
) -> list[Result]:
    """The results the table shows: of the assignments and students chosen, where some were
    (students who handed in none of the assignments chosen left out)."""
    chosen = [
        r
        for r in results
        if (not assignments or r.assignment in assignments)
        and (not students or r.student in students)
    ]
    handed_in = {r.student for r in chosen if r.note != "not submitted"}
    return [r for r in chosen if not assignments or r.student in handed_in]


def guide(
    results: list[Result],
    workdir: Path,
    profile: CourseProfile,
    demo: DemoClass | None,
    whole_class: bool,
) -> list[str]:
    """The lines after the table of ``results``: how to read it; where they are of the ``demo``
    class, who each of its students is; what to open next."""
    lines = ["", HOW_TO_READ]
    students = sorted({r.student for r in results})
    who = demo.who if demo is not None else {}
    if who:
        lines += [
            "",
            "The demo class (each student shows one thing the grader does):",
            *(f"  {name}: {who[name]}" for name in students if name in who),
        ]
    page = _instructive_page(results, workdir)
    withheld = next((r for r in results if r.withheld), None)
    lines += ["", "Next:"]
    if page is not None:
        lines.append(f"  open {page} (the feedback page {page.parts[-3]} gets)")
    lines.append(f"  read {workdir / 'report.txt'} (this run: limits, table and notes)")
    if withheld is not None:
        lines.append(
            f"  python -m autograder review {withheld.student}/{withheld.assignment} --release "
            "(or --confirm): the instructor's decision on a withheld score"
        )
    lines += [f"  {step}" for step in profile.next_steps(demo is not None, whole_class)]
    return lines


def _instructive_page(results: list[Result], workdir: Path) -> Path | None:
    """A feedback page to open first: of a graded submission that earned some points and lost the
    largest share (its page shows passed and failed tests together), else the first there is."""
    pages = sorted((workdir / "feedback").glob("*/*/*.html"))
    lost = sorted(
        (r.score / r.max_score, r.student, r.assignment)
        for r in results
        if r.score is not None and not r.withheld and 0 < r.score < r.max_score
    )
    chosen = [
        p
        for _, student, assignment in lost
        for p in pages
        if p.parts[-3:-1] == (student, assignment)
    ]
    return chosen[0] if chosen else pages[0] if pages else None
