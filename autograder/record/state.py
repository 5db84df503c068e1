"""What a work folder remembers of the runs graded in it: ``state.json``, and a journal line per
pair graded since.

A run writes the state whole at its steps (under a new journal mark) and adds one line per pair it
grades; a run killed outright leaves both, and the next run, or a review, reads them together
(:func:`read_state`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autograder.prepare.submission import write_whole
from autograder.settings import fields_of

STATE = "state.json"
JOURNAL = "state.journal"  # the pairs graded since state.json was last written whole, a line each


EARLIER = ("graded", "rows", "withheld", "reviewed")  # what state.json keeps of each graded pair


class StateError(ValueError):
    """A state.json that cannot be read: its path and what is wrong with it."""


@dataclass
class WorkState:
    """What a work folder remembers (``state.json``, with its journal's pairs added); pairs by their
    key."""

    course: str = ""  # the fingerprint of the course's notebooks its runs graded against
    intake: str | None = None  # the submissions folder the work folder mirrors, if one
    finished: bool = True  # False from a run's start until it ends (a stopped run leaves it so)
    # pair -> its submission folder's fingerprint when graded
    graded: dict = field(default_factory=dict)
    # pair -> its row of scores.csv beyond the score (note, devices, ...)
    rows: dict = field(default_factory=dict)
    # pair -> notebook -> the scan's findings: waiting for review
    withheld: dict = field(default_factory=dict)
    # pair -> the instructor's decision ("released", "confirmed")
    reviewed: dict = field(default_factory=dict)
    # assignment -> the source's fingerprint its release came from
    generated: dict = field(default_factory=dict)
    # what the last run did: jobs, times, references checked
    last_run: dict = field(default_factory=dict)
    # the mark state.json was written under: the journal's lines of another are old
    journal: str | None = None

    def earlier(self, key: str) -> bool:
        """Whether the state keeps anything of the pair ``key``."""
        return any(key in getattr(self, kept) for kept in EARLIER)

    def forget(self, key: str) -> None:
        for kept in EARLIER:
            getattr(self, kept).pop(key, None)


def read_state(workdir: Path) -> WorkState | None:
    """What earlier runs in ``workdir`` graded (``state.json`` and its journal); None where no run
    wrote one.

    A state.json that cannot be read (corrupt, or of another shape) raises :class:`StateError`; keys
    another version wrote that this one does not know are passed over.
    """
    path = workdir / STATE
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise StateError(f"{path} cannot be read: {type(error).__name__}: {error}") from None
    try:
        state = WorkState(**fields_of(WorkState, found, "a work folder's state"))
    except ValueError as error:
        raise StateError(f"{path} {error}") from None
    replay_journal(workdir, state)
    return state


def write_state(workdir: Path, state: WorkState) -> None:
    """``state`` whole, under a new journal mark; the journal of the old mark goes.

    Whole, a run stopped here leaves the old state or the new; stopped between the two steps, the
    journal left holds lines of the old mark only, which the new state already has
    (:func:`replay_journal` passes over them). One entry a line without indentation, which json
    writes with its C encoder.
    """
    state.journal = secrets.token_hex(8)
    write_whole(workdir / STATE, json.dumps(asdict(state), separators=(",\n", ": ")))
    with contextlib.suppress(FileNotFoundError):
        (workdir / JOURNAL).unlink()


def journal_pair(workdir: Path, state: WorkState, key: str) -> None:
    """That pair ``key`` is graded (its fingerprint, row and withheld notebooks, as ``state`` has
    them), as one line added to the journal: the same cost whatever the class's size, where writing
    state.json whole after each pair grows with the class (benchmarks/state_growth.py). ``state``
    has been written whole (:func:`write_state`) by this run first, which gives it its mark."""
    entry = {
        "mark": state.journal,
        "pair": key,
        "graded": state.graded[key],
        "row": state.rows[key],
    }
    if key in state.withheld:
        entry["withheld"] = state.withheld[key]
    with open(workdir / JOURNAL, "a") as journal:
        journal.write(json.dumps(entry) + "\n")


def replay_journal(workdir: Path, state: WorkState) -> None:
    """Add to ``state`` (read from state.json) the pairs its journal says were graded after it was
    written.

    Only lines of the mark state.json carries count; a last line cut short (the run was killed while
    writing it) is passed over, as is any line that is not an entry.
    """
    mark = state.journal
    try:
        lines = (workdir / JOURNAL).read_text().splitlines() if mark is not None else []
    except (OSError, ValueError):
        return
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (
            not isinstance(entry, dict)
            or entry.get("mark") != mark
            or not isinstance(entry.get("pair"), str)
        ):
            continue
        state.graded[entry["pair"]] = entry.get("graded")
        state.rows[entry["pair"]] = entry.get("row")
        if "withheld" in entry:
            state.withheld[entry["pair"]] = entry["withheld"]
