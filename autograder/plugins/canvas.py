"""Canvas: the names of its "Download Submissions" files, and its gradebook import's CSV (an
nbgrader export plugin).

Part of :mod:`autograder.plugins.lms`; ``nbgrader export
--exporter=autograder.plugins.canvas.CanvasExportPlugin``.
"""

from __future__ import annotations

import re

from traitlets import Unicode

from autograder.plugins.lms import LmsExportPlugin

# <lastfirst>_<user id>_<submission id>_<file>, _LATE after the name for a late one
DOWNLOAD_NAMES = [
    re.compile(
        r"^(?P<name>[^_]+?)(?P<late>_LATE)?_(?P<student_id>\d+)_(?P<submission_id>\d+)_"
        r"(?P<file>.+)$"
    )
]


class CanvasExportPlugin(LmsExportPlugin):
    """Canvas's gradebook export columns (``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``
    holding nbgrader's student id, ``Section``), one column per assignment and a ``Points Possible``
    row first. A new column creates a new assignment in Canvas: to fill an existing one, name its
    column as Canvas's export does (``name (id)``) in ``columns``."""

    name = "canvas"
    section = Unicode("", help="the value of the Section column").tag(config=True)

    def head(self, header: list[str], max_scores: list[str]) -> list[list[str]]:
        return [
            ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *header],
            ["    Points Possible", "", "", "", "", *max_scores],
        ]

    def row(self, student, scores: list[str]) -> list[str]:
        name = (
            ", ".join(part for part in (student.last_name, student.first_name) if part)
            or student.id
        )
        return [name, "", "", student.id, self.section, *scores]


EXPORT = CanvasExportPlugin
