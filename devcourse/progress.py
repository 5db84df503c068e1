"""A progress bar for the course's slow loops: a sign of life for steps that take seconds each.

:func:`steps` wraps an iterable in tqdm's bar: the notebook widget in a Jupyter kernel with
ipywidgets, with plain text brought up to date at the end for places that draw no widgets; tqdm's
text bar on stderr anywhere else. It does the same on a CPU-only machine as on a GPU one: it only
counts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _in_a_kernel_with_widgets() -> bool:
    """Whether this runs in a Jupyter kernel that can show ipywidgets (what ``tqdm.auto`` checks
    too)."""
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
    """Yield ``items`` one by one, with a bar labelled ``desc`` that advances after each.

    In a kernel with ipywidgets (JupyterLab, nbval, the grader) the output also carries the bar as
    plain text, updated when the loop ends ("100% 3/3"), so a stored notebook or feedback page shows
    no bar stuck at 0.
    """
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
