"""``python -m autograder VERB ...``: the grader's one command line, a thin face per verb over the
layers below."""

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
    "feedback": (
        "autograder.cli.feedback",
        "make an assignment's feedback again from the gradebook",
    ),
    "course": ("autograder.cli.course", "make a course directory for a term, or set its due dates"),
    "worker": ("autograder.cli.worker", "start a Dask worker for the grader"),
}
# Verbs an installed course adds (its build, its checks): entry points of this group, each a
# main(argv) -> code whose docstring's first line says what it does.
PLUGIN_VERBS = "autograder.verbs"


def added_verbs() -> dict:
    """The verbs installed courses add: name -> entry point (:data:`PLUGIN_VERBS`), none shadowing
    the grader's."""
    from importlib.metadata import entry_points

    return {
        point.name: point for point in entry_points(group=PLUGIN_VERBS) if point.name not in VERBS
    }


def usage() -> str:
    added = added_verbs()
    described = {
        **{verb: what for verb, (_, what) in VERBS.items()},
        **{verb: _summary(point) for verb, point in added.items()},
    }
    width = max(map(len, described))
    return "\n".join(
        [
            (
                "usage: autograder VERB [options]   (autograder VERB --help; also python -m"
                " autograder VERB)"
            ),
            "",
            *(f"  {verb:<{width}}  {what}" for verb, what in described.items()),
        ]
    )


def _summary(point) -> str:
    """An added verb's line in the usage: its docstring's first line, or where it comes from."""
    try:
        return ((point.load().__doc__ or "").strip().splitlines() or [point.value])[0]
    except Exception as error:  # noqa: BLE001 - a broken plugin is named in the usage, not a crash of it
        return f"(cannot be loaded from {point.value}: {type(error).__name__}: {error})"


def main(argv: list[str] | None = None) -> int:
    """Run the verb ``argv[0]`` with the rest of ``argv``; its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    verb, *rest = argv
    if verb in VERBS:
        return importlib.import_module(VERBS[verb][0]).main(rest)
    added = added_verbs()
    if verb not in added:
        print(
            f"autograder: unknown verb {verb!r}; the verbs are {', '.join([*VERBS, *added])}",
            file=sys.stderr,
        )
        return 2
    return added[verb].load()(rest)


def run(entry: Callable[[], int]) -> NoReturn:
    """Run ``entry`` as this process's program and exit with its code, without Python's teardown of
    every module it imported (torch's, nbgrader's), which would run after the report is written.

    Python ends as usual (threads that are not daemons joined, every exit handler run, temporary
    folders' finalizers too); only the exit handler registered here, before any other and so run
    after all of them, then ends the process at once with the code.
    """
    from autograder.run.startup import collect_young_less, skip_unused_imports

    skip_unused_imports()
    collect_young_less()
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
    """The ``autograder`` command that installing the grader puts on PATH: ``python -m
    autograder``'s program."""
    run(main)
