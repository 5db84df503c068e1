"""What a class run (:class:`~autograder.batch.classrun.ClassRun`) reads and keeps: the course it
grades against (:class:`Course`), and each pair of the class as the run finds and grades it
(:class:`Submission`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.course.cells import grade_ids_of, hidden_test_lines
from autograder.prepare.job import Job, course_imports
from autograder.settings import Pair


@dataclass(frozen=True)
class Course:
    """The work folder's copy of the course: its assignments, their source notebooks, and what each
    gives the jobs (grade ids, the lines of hidden tests, the imports their tests rely on)."""

    names: list[str] = field(default_factory=list)
    # assignment -> notebook
    sources: dict[str, dict[str, nbformat.NotebookNode]] = field(default_factory=dict)
    grade_ids: dict[str, set[str]] = field(default_factory=dict)
    hidden: dict[str, set[str]] = field(default_factory=dict)
    # assignment -> notebook -> import lines
    imports: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, source_dir: Path) -> Course:
        """The course in ``source_dir``: a folder per assignment, holding its notebooks."""
        names = sorted(
            p.name for p in source_dir.iterdir() if p.is_dir() and any(p.glob("*.ipynb"))
        )
        sources = {
            name: {
                p.stem: nbformat.read(p, as_version=4)
                for p in sorted((source_dir / name).glob("*.ipynb"))
            }
            for name in names
        }
        return cls(
            names,
            sources,
            {
                a: set().union(*(grade_ids_of(nb) for nb in nbs.values()))
                for a, nbs in sources.items()
            },
            {
                a: set().union(*(hidden_test_lines(nb) for nb in nbs.values()))
                for a, nbs in sources.items()
            },
            {
                a: {notebook: course_imports(nb) for notebook, nb in nbs.items()}
                for a, nbs in sources.items()
            },
        )


@dataclass
class Submission:
    """One pair of the class as this run finds and grades it: what it is, what the run does with it,
    what it got."""

    pair: Pair
    fingerprint: str | None = None  # its folder's, as this run found it; None: not handed in
    # graded by an earlier run, unchanged since (or not chosen): not graded again
    earlier: bool = False
    # to grade, and an earlier run left something of it: cleared once the canary passed
    before: bool = False
    cleared: bool = False  # what an earlier run kept of it is gone: graded afresh
    notes: list[str] = field(default_factory=list)  # what the instructor reads beside its score
    jobs: list[Job] = field(default_factory=list)  # one per notebook submitted to the executor
    remaining: int = 0  # of its jobs, those not judged yet
    # its scores and feedback are in (state.json says so), or an earlier run's are
    graded: bool = False


def longest_first(todo: list[Submission], costs: dict[str, float]) -> list[Submission]:
    """The pairs new to this run, then those an earlier run graded; each part the longest first, as
    ``costs`` (assignment -> its solutions' processor time, as the references kept say) has them,
    and in the order given where it says nothing. The last job to begin is then a short one: the
    cores are not left waiting for a long one at the end."""
    ordered = sorted(todo, key=lambda s: -costs.get(s.pair.assignment, 0.0))
    return [s for s in ordered if not s.before] + [s for s in ordered if s.before]
