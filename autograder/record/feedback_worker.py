"""Students' feedback pages made by a process of their own while the grader goes on
(``--feedback-apart``)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder.inside import launcher
from autograder.record.feedback import page_notes
from autograder.record.gradebook import grading_environment, nbgrader_api

# a FeedbackApart's page not made by then: its process is ended, the grader makes the pages
PAGE_TIMEOUT_S = 300


class FeedbackApart:
    """Students' feedback pages made by a process of their own while the grader goes on.

    On a cluster, the grader's machine runs no notebook: its own handling of each finished job
    (judging, nbgrader's autograde) and then the job's feedback page, one after the other, set the
    pace of the whole class. Here the pages are made by a second process (``python -m
    autograder.record.feedback_worker``, one request and one answer a line) while the grader goes
    on: :meth:`hand_on` never waits, :meth:`deliver` passes each made page's pair to the grader's
    ``record``, waiting (never with the signals held) while more than ``keep`` pairs wait. A pair
    leaves the line only once recorded, so a stopped run that delivers what is handed on reports
    each pair graded with its page, as when the grader makes them itself. The process has a session
    of its own (a terminal's Ctrl-C is the grader's to handle) and ends with the grader. Should it
    die or stick (:data:`PAGE_TIMEOUT_S`), the page it owes and each after it are made by
    ``in_line(pair)`` in the grader, under ``hold()``. Same pages, same notes as
    :func:`write_feedback`; on a CPU-only machine no different.
    """

    def __init__(self, workdir: Path, db_url: str, in_line, depth: int = 2):
        self.in_line, self.depth = in_line, depth
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autograder.record.feedback_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.answers: queue.Queue = queue.Queue()
        self.waiting: list[tuple[str, str]] = []  # handed on, oldest first (answered in that order)
        # answered, not recorded (None: in line)
        self.ready: dict[tuple[str, str], list[str] | None] = {}
        self.broken = False
        self.seconds = 0.0  # the process's own time for the pages it made
        try:
            # The gradebook's URL may hold a password: on the pipe, not the command line.
            self._send({"workdir": str(workdir), "db_url": db_url, "parent": os.getpid()})
            self.reader = threading.Thread(target=self._read, name="feedback-apart", daemon=True)
            self.reader.start()
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _read(self) -> None:
        try:
            for line in self.process.stdout:
                self.answers.put(json.loads(line))
        except ValueError:  # not an answer: the process is not what it should be
            pass
        finally:
            self.answers.put(None)  # no more answers

    def hand_on(self, pair: tuple[str, str], hidden: set[str]) -> None:
        """Queue ``pair``'s page (never waits: see :meth:`deliver`)."""
        if not self.broken:
            try:
                self._send({"pair": list(pair), "hidden": sorted(hidden)})
            except OSError:  # the process is gone
                self.broken = True
        if self.broken:
            self.ready[pair] = None
        self.waiting.append(pair)

    def deliver(self, record, hold, keep: int = 0) -> None:
        """``record(pair, notes)`` for each pair whose page is made, oldest first, under ``hold()``:
        waiting for pages while more than ``keep`` pairs wait, then taking those already made. A
        pair whose page the grader must make is made under ``hold()`` too."""
        while self.waiting:
            pair = self.waiting[0]
            if pair not in self.ready:
                if len(self.waiting) <= keep and not self.broken and self.answers.empty():
                    return
                self.ready[pair] = self._answer()
            with hold():
                notes = self.ready[pair]
                record(pair, self.in_line(pair) if notes is None else notes)
                del self.ready[pair]
                self.waiting.pop(0)

    def _answer(self) -> list[str] | None:
        """The notes of the oldest page handed on, or None if the grader is to make it."""
        answer = None
        if not self.broken:
            try:
                answer = self.answers.get(timeout=PAGE_TIMEOUT_S)
            except queue.Empty:  # stuck: a page takes a second or so
                self.process.kill()
                self.process.wait()
        if answer is None:  # the process is gone: this page and the rest in the grader
            self.broken = True
            return None
        self.seconds += answer["seconds"]
        return answer["notes"]

    def close(self) -> list[tuple[str, str]]:
        """End the process; return the pairs handed on and not recorded."""
        left = list(self.waiting)
        self.waiting.clear()
        self.ready.clear()
        if left:  # mid-page (a second Ctrl-C): it ends with the run, its pairs not graded
            self.process.kill()
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # it ends at the end of its input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(timeout=10)
        return left


def serve(lines, answer) -> None:
    """The process of a :class:`FeedbackApart`: the work folder first, then one page per line of
    ``lines``."""

    first = json.loads(next(lines))
    # Killed when the grader ends (Linux), even mid-page; elsewhere it ends at its input's end.
    launcher.die_with_parent(first["parent"], signal.SIGKILL)
    workdir = Path(first["workdir"])
    with grading_environment():
        api = nbgrader_api(workdir, first["db_url"])
        for line in lines:
            request, began = json.loads(line), time.process_time()
            notes = page_notes(api, workdir, tuple(request["pair"]), set(request["hidden"]))
            answer(json.dumps({"notes": notes, "seconds": time.process_time() - began}))


if __name__ == "__main__":  # a FeedbackApart's process, not for people
    # The answers have the standard output to themselves: anything printed on the way goes to
    # stderr.
    _answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def _answer(text: str) -> None:
        _answers.write(text + "\n")
        _answers.flush()

    serve(iter(sys.stdin), _answer)
