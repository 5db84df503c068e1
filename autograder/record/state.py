"""What a work folder remembers of the runs graded in it: ``state.json``, and a journal line per pair graded since.

A run writes the state whole at its steps (under a new journal mark) and adds one line per pair it grades; a run
killed outright leaves both, and the next run, or a review, reads them together (:func:`read_state`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from pathlib import Path

from autograder.prepare.submission import write_whole

STATE = "state.json"
JOURNAL = "state.journal"  # the pairs graded since state.json was last written whole, a line each


EARLIER = ("graded", "rows", "withheld", "reviewed")  # what state.json keeps of each graded pair


def read_state(workdir: Path) -> dict | None:
    """What earlier runs in ``workdir`` graded (``state.json`` and its journal), or None."""
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("graded"), dict):
        return None
    replay_journal(workdir, state)
    return state


def write_state(workdir: Path, state: dict) -> None:
    """``state`` whole, under a new journal mark; the journal of the old mark goes.

    Whole, a run stopped here leaves the old state or the new; stopped between the two steps, the journal
    left holds lines of the old mark only, which the new state already has (:func:`replay_journal`
    passes over them). One entry a line without indentation, which json writes with its C encoder.
    """
    state["journal"] = secrets.token_hex(8)
    write_whole(workdir / STATE, json.dumps(state, separators=(",\n", ": ")))
    with contextlib.suppress(FileNotFoundError):
        (workdir / JOURNAL).unlink()


def journal_pair(workdir: Path, state: dict, key: str) -> None:
    """That pair ``key`` is graded (its fingerprint, row and withheld notebooks, as ``state`` has them), as one
    line added to the journal: the same cost whatever the class's size, where writing state.json whole after each
    pair grows with the class (benchmarks/state_growth.py).
    ``state`` has been written whole (:func:`write_state`) by this run first, which gives it its mark."""
    entry = {"mark": state["journal"], "pair": key, "graded": state["graded"][key], "row": state["rows"][key]}
    if key in state.get("withheld", {}):
        entry["withheld"] = state["withheld"][key]
    with open(workdir / JOURNAL, "a") as journal:
        journal.write(json.dumps(entry) + "\n")


def replay_journal(workdir: Path, state: dict) -> None:
    """Add to ``state`` (read from state.json) the pairs its journal says were graded after it was written.

    Only lines of the mark state.json carries count; a last line cut short (the run was killed while
    writing it) is passed over, as is any line that is not an entry.
    """
    mark = state.get("journal")
    try:
        lines = (workdir / JOURNAL).read_text().splitlines() if mark is not None else []
    except (OSError, ValueError):
        return
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("mark") != mark or not isinstance(entry.get("pair"), str):
            continue
        state.setdefault("graded", {})[entry["pair"]] = entry.get("graded")
        state.setdefault("rows", {})[entry["pair"]] = entry.get("row")
        if "withheld" in entry:
            state.setdefault("withheld", {})[entry["pair"]] = entry["withheld"]
