"""``python -m autograder demo``: rebuild the demo class's submissions after a notebook changed."""

from __future__ import annotations

from autograder.course.demo import build
from autograder.course.paths import ROOT

DESCRIPTION = 'The demo class: a few students whose submissions ``make grade`` grades'


def main() -> int:
    for path in build():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0
