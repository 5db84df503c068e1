"""What every process of the grader does first: leave unimported what none of them uses; and what
the grader does once it is set up: keep the garbage collector off what lives as long as it does.

Each process of the grader (the grader, its runners, the zygote, the feedback process) imports
nbformat, whose jsonschema builds a parser for the IRI format at import when ``rfc3987-syntax`` is
installed, a format no notebook, gradebook or job file uses; :func:`skip_unused_imports` makes that
import fail, and jsonschema skips the format. A kernel forked from the zygote gets its imports back
(:func:`autograder.run.forked.run_kernel_here`).
"""

from __future__ import annotations

import gc
import sys

SKIPPED_IMPORTS = ("rfc3987_syntax",)


def skip_unused_imports() -> None:
    """Make :data:`SKIPPED_IMPORTS` fail to import in this process, where nothing imported them
    yet."""
    sys.modules.update({name: None for name in SKIPPED_IMPORTS if name not in sys.modules})


# Young objects collected every this many allocations, not Python's 700: the grader allocates
# nbgrader's and SQLAlchemy's short-lived objects by the million
YOUNG_COLLECTED_EVERY = 10_000


def collect_young_less() -> None:
    """Have the garbage collector collect the young generation every
    :data:`YOUNG_COLLECTED_EVERY` allocations (a command of the grader, as it starts)."""
    gc.set_threshold(YOUNG_COLLECTED_EVERY, *gc.get_threshold()[1:])


def settled() -> None:
    """The grader is set up: what it has made so far (modules, nbgrader's and matplotlib's) lives as
    long as it does, so the collector leaves it (``gc.freeze``)."""
    gc.freeze()
