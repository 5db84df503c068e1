"""Grades for an LMS: an nbgrader export plugin that writes one row per student, one column per assignment.

nbgrader's own CSV has a row per student and assignment; an LMS imports a row per student with an identity it
knows. :class:`LmsExportPlugin` writes that shape (Canvas's or Moodle's) from the same gradebook, run by
``nbgrader export --exporter=autograder.plugins.lms.LmsExportPlugin``.
"""

from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin
from traitlets import Dict, Enum, Unicode


class LmsExportPlugin(ExportPlugin):
    """One row per student, one column per assignment, in the shape Canvas or Moodle imports.

    Scores are after nbgrader's late penalty (``score - late_submission_penalty``, at least 0); an assignment
    a student did not submit scores 0, as in nbgrader's CSV; ``--student``/``--assignment`` leave some out.
    ``canvas`` (default): Canvas's gradebook export columns (``Student``, ``ID``, ``SIS User ID``, ``SIS Login
    ID`` holding nbgrader's student id, ``Section``), one column per assignment and a ``Points Possible`` row
    first; a new column creates a new assignment in Canvas, so to fill an existing one name its column as
    Canvas's export does (``name (id)``) in ``columns``. ``moodle``: ``Email address``, ``ID number`` and one
    column per assignment, for Moodle's CSV grade import. On the grader's gradebook add
    ``--CourseDirectory.db_url=sqlite:///build/grade/gradebook.db``.
    """

    lms = Enum(["canvas", "moodle"], default_value="canvas", help="which LMS's import shape").tag(config=True)
    section = Unicode("", help="Canvas: the value of the Section column").tag(config=True)
    columns = Dict(help="assignment name -> the LMS's column header for it (default: the name)").tag(config=True)

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or f"grades-{self.lms}.csv"
        wanted = [str(a) for a in self.assignment]
        students = [str(s) for s in self.student]
        assignments = [a for a in gradebook.assignments if not wanted or a.name in wanted]
        header = [self.columns.get(a.name, a.name) for a in assignments]
        rows = []
        for student in sorted(gradebook.students, key=lambda s: s.id):
            if students and student.id not in students:
                continue
            scores = [_score(gradebook, a.name, student.id) for a in assignments]
            if self.lms == "canvas":
                name = ", ".join(part for part in (student.last_name, student.first_name) if part) or student.id
                rows.append([name, "", "", student.id, self.section, *scores])
            else:
                rows.append([student.email or "", student.id, *scores])
        self.log.info("Exporting %d students and %d assignments for %s to %s", len(rows), len(assignments),
                      self.lms, dest)
        with open(dest, "w", newline="") as handle:
            out = csv.writer(handle)
            if self.lms == "canvas":
                out.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *header])
                out.writerow(["    Points Possible", "", "", "", "", *(_number(a.max_score) for a in assignments)])
            else:
                out.writerow(["Email address", "ID number", *header])
            out.writerows(rows)


def _score(gradebook: Gradebook, assignment: str, student: str) -> str:
    """The score after the late penalty, as nbgrader's CSV computes it; 0 for no submission."""
    try:
        submission = gradebook.find_submission(assignment, student)
    except MissingEntry:
        return "0"
    return _number(max(0.0, submission.score - (submission.late_submission_penalty or 0.0)))


def _number(value: float) -> str:
    return f"{value:g}"
