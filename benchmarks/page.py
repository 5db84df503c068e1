"""The table of docs/benchmarks.md, written by the benchmark scripts themselves.

Each script's row sits between two marker comments, ``<!-- benchmark:NAME -->`` and ``<!--
/benchmark:NAME -->``, NAME being the script's file name without ``.py``. Given ``--write-page``, a
script calls ``write_row`` at its end with the result line it printed; the row then holds that line
and the machine it ran on, and the rest of the page is left as it was. A script whose figures need
more than a line also writes them whole with ``write_block``, between ``<!-- benchmark-block:NAME
-->`` and ``<!-- /benchmark-block:NAME -->``, each on a line of its own.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
WRITE_PAGE_HELP = (
    "write the result line and this machine into the script's row of docs/benchmarks.md"
)


class MarkerMissing(LookupError):
    """The page has no row, or no complete row, for the script."""


def machine() -> str:
    """This machine as the table names it: platform, CPU count and the PyTorch installed here."""
    try:
        torch = f"PyTorch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "no PyTorch"
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, {torch}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def write_row(script: str, result: str, page: Path = PAGE, ran_on: str | None = None) -> None:
    """Replace the row of ``script`` (a file name in benchmarks/, with or without ``.py``) in
    ``page``.

    The row keeps its first two cells (the script and what it compares) and gets ``result`` and
    ``ran_on`` (by default, this machine). Raises MarkerMissing, naming the script, when the page
    lacks either marker.
    """
    name = Path(script).stem
    start, end = f"<!-- benchmark:{name} -->", f"<!-- /benchmark:{name} -->"
    text = page.read_text()
    found = re.search(re.escape(start) + r"(.*?)" + re.escape(end), text)
    if found is None:
        raise MarkerMissing(
            f"{page.name} has no row for benchmarks/{name}.py: "
            f"the markers {start} and {end} must stand in one table row"
        )
    cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", found.group(1))]
    compares = cells[1] if len(cells) > 1 else ""
    row = f" `benchmarks/{name}.py` | {compares} | {_cell(result)} | {_cell(ran_on or machine())} "
    page.write_text(text[: found.start(1)] + row + text[found.end(1) :])


def write_block(script: str, text: str, page: Path = PAGE) -> None:
    """Replace the lines between the block markers of ``script`` in ``page`` with ``text``
    (Markdown, naming the machine it ran on); raises MarkerMissing as :func:`write_row` does."""
    name = Path(script).stem
    start, end = f"<!-- benchmark-block:{name} -->", f"<!-- /benchmark-block:{name} -->"
    lines = page.read_text().split("\n")
    if start not in lines or end not in lines or lines.index(end) < lines.index(start):
        raise MarkerMissing(
            f"{page.name} has no block for benchmarks/{name}.py: "
            f"the markers {start} and {end} must stand on lines of their own, in that order"
        )
    first, last = lines.index(start), lines.index(end)
    body = ["", *text.strip("\n").split("\n"), ""]
    page.write_text("\n".join([*lines[: first + 1], *body, *lines[last:]]))
