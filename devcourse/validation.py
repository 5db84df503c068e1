"""Validate a notebook and say what its hidden checks are worth, without showing them.

nbgrader's Validate says "Success!" when the visible tests pass, yet hidden checks can still cost
points. The student versions mark each test cell that has them
(``metadata["course"]["hidden_checks"]``, only the mark); :func:`hidden_points` reads the marks for
``python -m devcourse.validation NOTEBOOK`` and the students' Lab (:mod:`devcourse.labhints`).
Nothing here needs a GPU: it reads notebook metadata and runs nbgrader.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "course"


def _grading(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def hidden_points(nb) -> list[tuple[str, float, int]]:
    """(exercise, points, tests) for each exercise with tests that run hidden checks when graded."""
    # at first use: every grading kernel imports this module
    from autograder.course.cells import exercise_of

    titles, found = exercise_of(nb), {}
    for index, cell in enumerate(nb["cells"]):
        meta = _grading(cell)
        if (
            meta.get("grade")
            and not meta.get("solution")
            and cell.get("metadata", {}).get(MARK, {}).get("hidden_checks")
        ):
            title = titles[index] or "tests outside an exercise"
            points, tests = found.get(title, (0.0, 0))
            found[title] = (points + float(meta.get("points", 0)), tests + 1)
    return [(title, points, tests) for title, (points, tests) in found.items()]


def total_points(nb) -> float:
    """The notebook's points: its tests' and its written answers'."""
    return sum(float(_grading(c).get("points", 0)) for c in nb["cells"] if _grading(c).get("grade"))


def written_points(nb) -> list[tuple[str, float]]:
    """(exercise, points) for each written answer, which the instructor grades by hand."""
    from autograder.course.cells import exercise_of

    titles = exercise_of(nb)
    return [
        (titles[index] or "a written answer", float(_grading(cell).get("points", 0)))
        for index, cell in enumerate(nb["cells"])
        if _grading(cell).get("grade") and _grading(cell).get("solution")
    ]


def message(nb) -> list[str]:
    """The lines shown after a successful validation: what hidden checks are worth, per exercise.

    Written answers, which no test checks, get a line of their own.
    """
    found = hidden_points(nb)
    if not found:
        lines = [
            "No test of this notebook has hidden checks: what you validated is what is graded."
        ]
    else:
        at_stake = sum(points for _, points, _ in found)
        lines = [
            f"When graded, hidden checks also run (other inputs, other devices): {at_stake:g} of "
            f"{total_points(nb):g} points depend on them as well as on the tests you see."
        ]
        for title, points, tests in found:
            lines.append(
                f"  {title}: {points:g} point{'' if points == 1 else 's'} "
                f"in {tests} test{'' if tests == 1 else 's'}"
            )
        lines.append(
            "Passing Validate does not guarantee those points: make each answer correct in general."
        )
    for title, _ in written_points(nb):
        lines.append(
            f"{title}: a written answer, graded by hand after the deadline; Validate only checks "
            "that you wrote one."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Validate each notebook named; exit 1 if one fails its visible tests.

    Runs nbgrader's own validation (what the Validate button runs, on the CPU or whatever device the
    notebook picks), prints its result and, after a success, the points of the tests with hidden
    checks.
    """
    import nbformat
    from nbgrader.apps import NbGrader
    from nbgrader.validator import Validator

    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python -m devcourse.validation NOTEBOOK.ipynb [...]", file=sys.stderr)
        return 2

    class Remembering(Validator):  # nbgrader's own printout, and its results to decide on
        def validate(self, filename):
            self.results = super().validate(filename)
            return self.results

    app = NbGrader()
    app.load_config_file()
    failed = 0
    for path in paths:
        validator = Remembering(config=app.config)
        try:
            nb = nbformat.read(path, as_version=4)
            validator.validate_and_print(str(Path(path)))
        except (OSError, ValueError) as error:  # no such file, not JSON, not a notebook
            print(f"{path}: cannot validate: {type(error).__name__}: {error}", file=sys.stderr)
            failed += 1
            continue
        if validator.results:  # failed, changed or type_changed cells
            failed += 1
            continue
        for line in message(nb):
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
