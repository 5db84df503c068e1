"""``python -m autograder demo``: rebuild the demo class's submissions after a notebook changed."""

from __future__ import annotations

import argparse

from autograder.course.demo import build
from autograder.course.paths import ROOT


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m autograder demo",
                            description="Rebuild the demo class's submissions (demo_class/submitted) "
                                        "from the student versions in course/.").parse_args(argv)
    for path in build():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0
