"""Moodle: the names of its "Download all submissions" files, and its CSV grade import (an nbgrader
export plugin).

Part of :mod:`autograder.plugins.lms`; ``nbgrader export
--exporter=autograder.plugins.moodle.MoodleExportPlugin``.
"""

from __future__ import annotations

import re

from autograder.plugins.lms import LmsExportPlugin

# <Full Name>_<participant id>_assignsubmission_file_/<file>, or that prefix before the file's name
DOWNLOAD_NAMES = [
    re.compile(
        r"^(?P<full_name>.+?)_(?P<student_id>\d+)_assign(?:submission|feedback)_[a-z]+_"
        r"(?P<file>.*)$"
    )
]


class MoodleExportPlugin(LmsExportPlugin):
    """``Email address``, ``ID number`` (nbgrader's student id) and one column per assignment."""

    name = "moodle"

    def head(self, header: list[str], max_scores: list[str]) -> list[list[str]]:
        return [["Email address", "ID number", *header]]

    def row(self, student, scores: list[str]) -> list[str]:
        return [student.email or "", student.id, *scores]


EXPORT = MoodleExportPlugin
