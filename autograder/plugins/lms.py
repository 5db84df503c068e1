"""A learning platform's grades: the base of one nbgrader export plugin per LMS, and the LMSs the
course knows.

nbgrader's CSV has a row per student and assignment; an LMS imports a row per student with an
identity it knows. Each LMS is one module here (:data:`FORMATS`): the names its downloads give files
(read by :mod:`autograder.plugins.intake`) and an :class:`LmsExportPlugin` subclass for its import's
shape, run by ``nbgrader export --exporter=autograder.plugins.canvas.CanvasExportPlugin``. The base
picks one by ``lms``.
"""

from __future__ import annotations

import csv
import importlib

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin
from traitlets import Dict, Enum

# name -> module; each module has DOWNLOAD_NAMES (regular expressions) and EXPORT (its plugin's
# class)
FORMATS = {"canvas": "autograder.plugins.canvas", "moodle": "autograder.plugins.moodle"}


class LmsExportPlugin(ExportPlugin):
    """One row per student, one column per assignment, in the shape an LMS imports; as this class,
    the LMS that ``lms`` names.

    Scores are after nbgrader's late penalty (``score - late_submission_penalty``, at least 0); an
    assignment a student did not submit scores 0, as in nbgrader's CSV;
    ``--student``/``--assignment`` leave some out. On the grader's gradebook add
    ``--CourseDirectory.db_url=sqlite:///build/grade/gradebook.db``. A subclass gives :meth:`head`
    and :meth:`row`.
    """

    lms = Enum(list(FORMATS), default_value="canvas", help="which LMS's import shape").tag(
        config=True
    )
    columns = Dict(
        help="assignment name -> the LMS's column header for it (default: the name)"
    ).tag(config=True)
    name = ""  # a subclass's LMS

    def head(self, header: list[str], max_scores: list[str]) -> list[list[str]]:
        """The rows before the students': ``header`` holds a column name per assignment."""
        raise NotImplementedError

    def row(self, student, scores: list[str]) -> list[str]:
        """A student's row (an nbgrader ``Student``), ``scores`` one per assignment."""
        raise NotImplementedError

    def export(self, gradebook: Gradebook) -> None:
        # this class itself: the plugin of the LMS that lms names, configured as this one
        if not self.name:
            return (
                importlib.import_module(FORMATS[self.lms])
                .EXPORT(parent=self.parent)
                .export(gradebook)
            )
        dest = self.to or f"grades-{self.name}.csv"
        wanted = [str(a) for a in self.assignment]
        students = [str(s) for s in self.student]
        assignments = [a for a in gradebook.assignments if not wanted or a.name in wanted]
        rows = self.head(
            [self.columns.get(a.name, a.name) for a in assignments],
            [number(a.max_score) for a in assignments],
        )
        chosen = [
            s
            for s in sorted(gradebook.students, key=lambda s: s.id)
            if not students or s.id in students
        ]
        for student in chosen:
            rows.append(
                self.row(student, [_score(gradebook, a.name, student.id) for a in assignments])
            )
        self.log.info(
            "Exporting %d students and %d assignments for %s to %s",
            len(chosen),
            len(assignments),
            self.name,
            dest,
        )
        with open(dest, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)


def _score(gradebook: Gradebook, assignment: str, student: str) -> str:
    """The score after the late penalty, as nbgrader's CSV computes it; 0 for no submission."""
    try:
        submission = gradebook.find_submission(assignment, student)
    except MissingEntry:
        return "0"
    return number(max(0.0, submission.score - (submission.late_submission_penalty or 0.0)))


def number(value: float) -> str:
    return f"{value:g}"
