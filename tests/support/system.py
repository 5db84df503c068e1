"""What a test does when a Debian package it needs (Chromium, PostgreSQL, Slurm) is missing on this
machine."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

WITHOUT = "COURSE_WITHOUT_SYSTEM_PACKAGES"  # set to 1 by make test-lite


def missing(what: str) -> NoReturn:
    """Fail naming ``what`` is missing and how to install it; with
    ``COURSE_WITHOUT_SYSTEM_PACKAGES=1``, skip with that line instead (pytest's summary lists
    it)."""
    if os.environ.get(WITHOUT) == "1":
        pytest.skip(f"{what} (skipped: {WITHOUT}=1)")
    pytest.fail(what, pytrace=False)
