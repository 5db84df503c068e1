"""The course's late policy, as an nbgrader late-submission plugin: a share of the points per day
late.

nbgrader's own plugin offers no penalty or a zero; :class:`PercentPerDay`, named in
``nbgrader_config.py`` (``c.AssignLatePenalties.plugin_class``), is applied by nbgrader's
``AssignLatePenalties`` when a submission is graded. The gradebook keeps score and penalty apart;
the exports (:mod:`autograder.plugins.lms`) subtract it.
"""

from __future__ import annotations

import math

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float

DAY_S = 24 * 3600


class PercentPerDay(LateSubmissionPlugin):
    """``percent_per_day`` of the notebook's score per started day late, at most ``max_percent``.

    The due date lives in the gradebook (``python -m autograder course init --due``, or ``nbgrader
    db assignment add NAME --duedate``); the submission time is ``timestamp.txt``, written by
    ``nbgrader submit`` and kept by ``collect``.
    """

    percent_per_day = Float(10.0, help="Percent of the score taken for each started day late.").tag(
        config=True
    )
    max_percent = Float(100.0, help="The most that is taken, in percent of the score.").tag(
        config=True
    )

    def late_submission_penalty(
        self, student_id: str, score: float, total_seconds_late: float
    ) -> float | None:
        if total_seconds_late <= 0:
            return None
        days = math.ceil(total_seconds_late / DAY_S)
        percent = min(self.max_percent, days * self.percent_per_day)
        self.log.info("%s is %d day(s) late: %g%% of %g points", student_id, days, percent, score)
        return round(score * percent / 100, 6)
