"""Grades for an LMS: an nbgrader export plugin that writes one row per student, one column per assignment.

nbgrader's own CSV (``nbgrader export``) has a row per student and
assignment. A learning management system imports the other shape: a row
per student with an identity it knows and a column per graded item. This
plugin writes that shape from the same gradebook, scores after nbgrader's
late penalty (``score - late_submission_penalty``, at least 0), in two
dialects:

- ``canvas`` (default): the columns of Canvas's own gradebook export,
  ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``, ``Section``, then
  one column per assignment, and a ``Points Possible`` row first. The
  nbgrader student id goes in ``SIS Login ID``. A new column creates a new
  assignment in Canvas; to fill an existing one, name its column as
  Canvas's export does (``name (id)``) in ``LmsExportPlugin.columns``.
- ``moodle``: ``Email address``, ``ID number`` and one column per
  assignment; Moodle's CSV grade import maps the identity column to a user
  field and each grade column to a grade item.

Like nbgrader's CSV, an assignment a student did not submit scores 0; a
student or assignment can be left out with ``--student``/``--assignment``.
Run it with nbgrader's own command::

    nbgrader export --exporter=autograder.plugins.lms.LmsExportPlugin --to=grades-canvas.csv
    nbgrader export --exporter=autograder.plugins.lms.LmsExportPlugin --LmsExportPlugin.lms=moodle \
        --to=grades-moodle.csv

(on the grader's gradebook add ``--CourseDirectory.db_url=sqlite:///build/grade/gradebook.db``).
"""

from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin
from traitlets import Dict, Enum, Unicode


class LmsExportPlugin(ExportPlugin):
    """One row per student, one column per assignment, in the shape Canvas or Moodle imports."""

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
