"""What every process of the grader does first: leave unimported what none of them uses.

Each process of the grader (the grader, its runners, the zygote, the feedback process) imports
nbformat, whose jsonschema builds a parser for the IRI format at import when ``rfc3987-syntax`` is
installed, a format no notebook, gradebook or job file uses; :func:`skip_unused_imports` makes that
import fail, and jsonschema skips the format. A kernel forked from the zygote gets its imports back
(:func:`autograder.run.forked.run_kernel_here`).
"""

from __future__ import annotations

import sys

SKIPPED_IMPORTS = ("rfc3987_syntax",)


def skip_unused_imports() -> None:
    """Make :data:`SKIPPED_IMPORTS` fail to import in this process, where nothing imported them
    yet."""
    sys.modules.update({name: None for name in SKIPPED_IMPORTS if name not in sys.modules})
