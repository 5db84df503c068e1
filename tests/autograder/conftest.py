"""Fixtures of the grader's tests: a PostgreSQL server of a test module's own."""

import tempfile
from pathlib import Path

import pytest
from support.servers import postgres_binaries, postgres_cluster


@pytest.fixture(scope="module")
def server():
    """A PostgreSQL cluster of our own; yields the URL of an empty ``gradebook`` database."""
    binaries = postgres_binaries()
    # Not under pytest's temporary folder: that one is private to the user running the tests.
    with tempfile.TemporaryDirectory(prefix="course-postgres-") as folder:
        yield from postgres_cluster(binaries, Path(folder))
