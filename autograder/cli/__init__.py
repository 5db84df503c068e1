"""``python -m autograder VERB ...``: the grader's one command line, a thin face per verb over the layers below."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Callable, NoReturn

# verb -> (module whose main(argv) runs it, what it does)
VERBS = {
    "grade": ("autograder.cli.grade", "autograde a class: sandboxed, in parallel, with limits"),
    "review": ("autograder.cli.review", "release or confirm a score the grader withheld"),
    "feedback": ("autograder.cli.feedback", "make an assignment's feedback again from the gradebook"),
    "course": ("autograder.cli.course", "make a course directory for a term, or set its due dates"),
    "worker": ("autograder.cli.worker", "start a Dask worker for the grader"),
    "build": ("autograder.cli.build", "this course: run solutions, make student versions, check both ways"),
    "demo": ("autograder.cli.demo", "this course: rebuild the demo class's submissions"),
    "gpu-check": ("autograder.cli.gpucheck", "this course on a CUDA machine: notebooks, grading, DDP, AMP, loading"),
    "slurm-check": ("autograder.cli.slurmcheck", "grade part of the demo class through Slurm jobs"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    return "\n".join(["usage: autograder VERB [options]   (autograder VERB --help; also python -m autograder VERB)", "",
                      *(f"  {verb:<{width}}  {what}" for verb, (_, what) in VERBS.items())])


def main(argv: list[str] | None = None) -> int:
    """Run the verb ``argv[0]`` with the rest of ``argv``; its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    verb, *rest = argv
    if verb not in VERBS:
        print(f"autograder: unknown verb {verb!r}; the verbs are {', '.join(VERBS)}", file=sys.stderr)
        return 2
    return importlib.import_module(VERBS[verb][0]).main(rest)


def run(entry: Callable[[], int]) -> NoReturn:
    """Run ``entry`` as this process's program and exit with its code, without Python's teardown of every module
    it imported (torch's, nbgrader's), which would run after the report is written.

    Python ends as usual (threads that are not daemons joined, every exit handler run, temporary folders'
    finalizers too); only the exit handler registered here, before any other and so run after all of them,
    then ends the process at once with the code.
    """
    from autograder.run.startup import skip_unused_imports

    skip_unused_imports()
    code = [1]  # an exception that escapes ``entry`` is printed by Python as usual, and exits 1

    def end_now() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code[0])

    atexit.register(end_now)
    try:
        code[0] = entry()
    except SystemExit as stop:  # argparse's errors and --help: their code, their message
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code[0] = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    raise SystemExit(code[0])


def console() -> NoReturn:
    """The ``autograder`` command that installing the grader puts on PATH: ``python -m autograder``'s program."""
    run(main)
