"""What ``grade`` prints after its table: how to read it, who the demo students are, what to open next (the
checkout's pages and make targets when run from the course's repository, commands on PATH when installed)."""

from __future__ import annotations

from pathlib import Path

from autograder.course.paths import checkout
from autograder.course.roster import WHO
from autograder.settings import Result

HOW_TO_READ = ("How to read the table: a row per student, a column per assignment, each cell score/maximum; "
               "'-' not handed in or not graded; 'withheld' waits for your review; the notes say why a notebook "
               "stopped or lost its score.")


def shown(results: list[Result], assignments: tuple[str, ...], students: tuple[str, ...]) -> list[Result]:
    """The results the table shows: of the assignments and students chosen, where some were (students who handed
    in none of the assignments chosen left out)."""
    chosen = [r for r in results if (not assignments or r.assignment in assignments)
              and (not students or r.student in students)]
    handed_in = {r.student for r in chosen if r.note != "not submitted"}
    return [r for r in chosen if not assignments or r.student in handed_in]


def guide(results: list[Result], workdir: Path, demo: bool, whole_class: bool) -> list[str]:
    """The lines after the table of ``results``: how to read it; with ``demo``, who each of its demo students is;
    what to open next."""
    lines = ["", HOW_TO_READ]
    students = sorted({r.student for r in results})
    if demo:
        lines += ["", "The demo class (each student shows one thing the grader does):",
                  *(f"  {name}: {WHO[name]}" for name in students if name in WHO)]
    pages = sorted((workdir / "feedback").glob("*/*/*.html"))
    page = next((p for p in pages if p.parts[-3] == "grace"), pages[0] if pages else None)
    withheld = next((r for r in results if r.withheld), None)
    lines += ["", "Next:"]
    if page is not None:
        lines.append(f"  open {page} (the feedback page {page.parts[-3]} gets)")
    lines.append(f"  read {workdir / 'report.txt'} (this run: limits, table and notes)")
    if withheld is not None:
        lines.append(f"  python -m autograder review {withheld.student}/{withheld.assignment} --release "
                     f"(or --confirm): the instructor's decision on a withheld score")
    if checkout() is not None:  # run from the course's repository: its pages and make targets are here
        lines.append("  formgrader, nbgrader's pages for grading by hand and reviewing: docs/instructors.md, in a "
                     "term's course directory (make course-dir)")
        if demo and not whole_class:
            lines.append("  make grade ALL=1: the whole demo class, every assignment")
    else:  # installed from a wheel: what that gives, commands on PATH
        lines.append("  nbgrader formgrader, in the course directory: nbgrader's pages for grading by hand and "
                     "reviewing, the grades this run recorded included")
        lines.append("  autograder --help: every verb (feedback again, a course directory for a term, a Dask worker)")
    return lines
