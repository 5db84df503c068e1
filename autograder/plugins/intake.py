"""Submissions downloaded from an LMS: an nbgrader collector plugin that reads Canvas's and Moodle's
file names.

``nbgrader zip_collect ASSIGNMENT`` asks a collector plugin, for each file an instructor put in
``downloaded/ASSIGNMENT/archive/``, whose it is and which notebook it is;
:class:`LmsCollectorPlugin` (selected by ``c.ZipCollectApp.collector_plugin``) knows the names each
LMS of :mod:`autograder.plugins.lms` gives, where nbgrader's own needs a regex.
"""

from __future__ import annotations

import importlib
import os

from nbgrader.plugins import FileNameCollectorPlugin

from autograder.course.paths import RENAMED
from autograder.plugins.lms import FORMATS


def parse(path: str) -> dict[str, str] | None:
    """{'student_id', 'file_id', 'late'} from an LMS's name for a downloaded file, or None if it is
    no LMS's.

    Each LMS of :data:`autograder.plugins.lms.FORMATS` says its names: Canvas's ``<lastfirst>_<user
    id>_<submission id>_<file>``, ``_LATE`` after the name for a late one
    (``hoppergrace_LATE_12345_678901_00_environment.ipynb``); Moodle's ``<Full Name>_<participant
    id>_assignsubmission_file_/<file>``, or that prefix before the file's name (a name that matches
    with an empty file part is a folder's: the file is the one inside). The student id is the LMS's
    number for the student: use those as nbgrader's ids, or the LMS export cannot be matched back. A
    renamed copy (``00_environment (1).ipynb``, ``00_environment-1.ipynb``) is the notebook
    ``00_environment.ipynb``.
    """
    name, folder = os.path.basename(path), os.path.basename(os.path.dirname(path))
    patterns = [
        p for module in FORMATS.values() for p in importlib.import_module(module).DOWNLOAD_NAMES
    ]
    found = next((m for m in (p.match(name) for p in patterns) if m and m.group("file")), None)
    file = found.group("file") if found else None
    if found is None:  # a folder per student: the prefix is the folder's name
        found = next(
            (
                m
                for m in (p.match(folder + ("" if folder.endswith("_") else "_")) for p in patterns)
                if m and not m.group("file")
            ),
            None,
        )
        file = name if found else None
    if found is None or not file:
        return None
    stem, ext = os.path.splitext(file)
    renamed = RENAMED.match(stem)
    return {
        "student_id": found.group("student_id"),
        "file_id": (renamed.group("stem") if renamed else stem) + ext,
        "late": "late" if found.groupdict().get("late") else "",
    }


class LmsCollectorPlugin(FileNameCollectorPlugin):
    """Canvas's and Moodle's download names -> the student's LMS id and the course's notebook name
    (:func:`parse`).

    Neither LMS puts the submission time in the file name, so nbgrader applies no late penalty to
    these files (Canvas's ``_LATE`` mark is logged): lateness is the LMS's to apply, or the course
    uses nbgrader's exchange, which keeps each submission's time.
    """

    def collect(self, submitted_file: str) -> dict | None:
        if os.path.splitext(submitted_file)[1] not in self.valid_ext:
            return None
        info = parse(submitted_file)
        if info is None:
            self.log.warning(
                "Not a name an LMS (%s) gives a submission, skipped: %s",
                ", ".join(FORMATS),
                submitted_file,
            )
            return None
        if info.pop("late"):
            self.log.warning(
                "%s is marked late in its name, which holds no time: no late penalty applies here",
                os.path.basename(submitted_file),
            )
        return info
