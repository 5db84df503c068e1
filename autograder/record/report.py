"""What the instructor reads: progress while grading, then the table, ``scores.csv`` and
``scores.png``."""

from __future__ import annotations

import csv
import sys
import threading
import time
from pathlib import Path

from autograder.settings import Result, score_text


class Progress:
    """A one-line progress bar on a terminal, one line per notebook otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += 1
            width = 30
            filled = int(width * self.done / self.total)
            line = (
                f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} notebooks "
                f"{time.monotonic() - self.started:5.0f} s  {label}"
            )
            if self.tty:
                print(
                    "\r" + line[:120].ljust(120),
                    end="" if self.done < self.total else "\n",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                print(line, file=sys.stderr, flush=True)


def format_table(results: list[Result]) -> str:
    """Students by assignment, ``score/max`` in each cell, then the total; notes below."""
    names = sorted({r.assignment for r in results})
    students = sorted({r.student for r in results})
    by_pair = {(r.student, r.assignment): r for r in results}
    header = ["student", *names, "total"]
    rows = []
    for student in students:
        cells, total, total_max = [student], 0.0, 0.0
        for name in names:
            result = by_pair[student, name]
            total_max += result.max_score
            if result.withheld:
                cells.append(f"withheld/{result.max_score:g}")
            elif result.score is None:
                cells.append(f"-/{result.max_score:g}")
            else:
                total += result.score
                cells.append(f"{result.score:g}/{result.max_score:g}")
        cells.append(f"{total:g}/{total_max:g}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    notes = [
        f"{r.student} / {r.assignment}: {r.note}"
        for r in results
        if r.note and r.note != "not submitted"
    ]
    if notes:
        lines += ["", "Notes:", *(f"  {note}" for note in notes)]
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["student", "assignment", "score", "max_score", "devices", "seconds", "note"]
        )
        for r in results:
            writer.writerow(
                [
                    r.student,
                    r.assignment,
                    score_text(r),
                    f"{r.max_score:g}",
                    r.devices,
                    f"{r.seconds:g}",
                    r.note,
                ]
            )


def load_plotting() -> None:
    """Import what :func:`write_histogram` draws with (half a second), for a caller that waits on
    another process now: the histogram is drawn last, when the grading's other work is done."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def write_histogram(results: list[Result], path: Path) -> None:
    """A PNG histogram of each student's total, as a percentage of the points of the course."""
    load_plotting()
    import matplotlib.pyplot as plt

    totals: dict[str, list[float]] = {}
    for r in results:
        got, most = totals.setdefault(r.student, [0.0, 0.0])
        totals[r.student] = [got + (r.score or 0.0), most + r.max_score]
    percents = [100 * got / most if most else 0.0 for got, most in totals.values()]
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    axes.hist(
        percents,
        bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001],
        color="#4472c4",
        edgecolor="white",
    )
    axes.set_xlabel("total score (% of the course's points)")
    axes.set_ylabel("students")
    axes.set_title(f"Scores of {len(percents)} students")
    axes.yaxis.get_major_locator().set_params(integer=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
