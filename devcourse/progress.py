"""A progress bar for the course's slow loops: a sign of life for steps that take seconds each.

:func:`steps` wraps an iterable in tqdm's bar. In a Jupyter kernel with
ipywidgets (JupyterLab, nbval, the grader) it is tqdm's notebook widget,
which Lab draws as a bar; the output also carries the bar as plain text, for
places that cannot draw widgets (a notebook viewed on the web, a feedback
page, nbval), and that text is brought up to date when the loop ends
("100% 3/3"), so a stored notebook does not show a bar stuck at 0. Anywhere
else (a terminal, a script, CI's log) it is tqdm's text bar on stderr.

It does the same on a CPU-only machine as on a GPU one: it only counts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _in_a_kernel_with_widgets() -> bool:
    """Whether this runs in a Jupyter kernel that can show ipywidgets (what ``tqdm.auto`` checks too)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None or "IPKernelApp" not in shell.config:
            return False
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def steps(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """Yield ``items`` one by one, with a bar labelled ``desc`` that advances after each."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if not _in_a_kernel_with_widgets():
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, total=total, file=sys.stderr, leave=True)
        return
    from IPython.display import display
    from tqdm.notebook import tqdm as notebook_tqdm

    bar = notebook_tqdm(total=total, desc=desc, display=False, leave=True)
    shown = display(bar.container, display_id=True)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()
        shown.update(bar.container)  # the output's text copy: the bar as it ended
