"""What the grader pays to note each graded pair in its work folder, at the end of a term's grading;
print the ratio.

    python benchmarks/state_growth.py [--pairs 9000] [--repeat 200]

``state.json`` says what a work folder's runs graded (each pair's fingerprint and
row), so that a stopped run resumes where it stopped. The grader notes each pair
as it is graded, on its serial path. Written whole each time, the note grows with
the class; as a line added to ``state.journal`` (:func:`autograder.record.state.journal_pair`)
it does not. This builds the state of a class of ``--pairs`` graded pairs (1,000
students x 9 notebooks by default, fingerprints and rows as the grader writes
them), then times, in this one process, writing it whole
(:func:`autograder.record.state.write_state`) and adding one pair's line, each
``--repeat`` times, and reading it back with that many lines in the journal.
It prints both, their ratio, and what each would add up to over a run that
grades that many pairs (the whole write growing from nothing to that size).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path

# the autograder package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autograder.record.state import STATE, journal_pair, read_state, write_state
from page import WRITE_PAGE_HELP, write_row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs", type=int, default=9000, help="graded pairs in the state (default: %(default)s)"
    )
    parser.add_argument(
        "--repeat", type=int, default=200, help="writes timed each way (default: %(default)s)"
    )
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}")
    state = {
        "course": secrets.token_hex(32),
        "intake": None,
        "finished": False,
        "graded": {},
        "generated": {},
        "rows": {},
    }
    for index in range(args.pairs):
        key = f"student{index // 9:04d}/{index % 9:02d}_assignment"
        state["graded"][key] = secrets.token_hex(32)
        state["rows"][key] = {"note": "", "seconds": 5.1}
    with tempfile.TemporaryDirectory(prefix="state-growth-") as folder:
        folder = Path(folder)
        write_state(folder, state)
        started = time.perf_counter()
        for _ in range(args.repeat):
            write_state(folder, state)
        whole = (time.perf_counter() - started) / args.repeat
        started = time.perf_counter()
        for _ in range(args.repeat):
            journal_pair(folder, state, key)
        line = (time.perf_counter() - started) / args.repeat
        started = time.perf_counter()
        assert len(read_state(folder)["graded"]) == args.pairs
        read = time.perf_counter() - started
        size = (folder / STATE).stat().st_size
    print(f"state of {args.pairs} graded pairs: {size / 1e6:.2f} MB")
    result = (
        f"written whole: {whole * 1e3:.2f} ms a pair; a journal line: {line * 1e3:.3f} ms:"
        f" {whole / line:.0f}x"
    )
    print(result)
    print(
        f"over a run grading {args.pairs} pairs: about {whole * args.pairs / 2:.0f} s written whole"
        f" (growing from nothing), {line * args.pairs:.2f} s as journal lines"
    )
    print(f"read back with {args.repeat} journal lines: {read * 1e3:.1f} ms")
    if args.write_page:
        write_row(__file__, f"{args.pairs} pairs: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
