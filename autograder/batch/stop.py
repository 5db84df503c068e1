"""How a class-wide run stops: the signals it turns into KeyboardInterrupt, and what it says once
stopped."""

from __future__ import annotations

import contextlib
import signal


class GradingStopped(Exception):
    """A run that was stopped: which (student, assignment) pairs were graded, and which not."""

    def __init__(
        self,
        signum: int,
        graded: list[tuple[str, str]],
        not_graded: list[tuple[str, str]],
        reason: str = "",
    ):
        """``signum``: the signal that stopped it; 0 with ``reason`` for a cluster that could not
        run a job."""
        super().__init__(reason or f"grading was stopped by {signal.Signals(signum).name}")
        self.signum, self.graded, self.not_graded = signum, graded, not_graded


class ChoiceError(ValueError):
    """An assignment or student chosen that is not there, or no submissions to grade; the message
    says which."""


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, except while held."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.held = False
        self.pending = 0
        self.received = signal.SIGINT

    def _handle(self, signum, _frame):
        self.received = signum
        if self.held:
            self.pending = signum
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        """Handle the signals for the block (main thread only), then restore the previous
        handlers."""
        previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def holding(self):
        """A signal that arrives in the block takes effect at its end (the gradebook is never half
        written)."""
        self.held = True
        try:
            yield
        finally:
            self.held = False
            if self.pending:
                self.pending = 0
                raise KeyboardInterrupt


INTERRUPTS = Interrupts()
