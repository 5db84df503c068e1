"""Load a 1 GiB checkpoint four ways and compare wall time and peak memory.

    python benchmarks/checkpoint_loading.py [--size-mib 1024]

Each strategy runs in its own process on the same file (see
devcourse/loadbench.py). The course's loader should need at most 1.2 times
the checkpoint's size in extra peak memory, where plain loading into a built
model needs about 2 times; the script says whether it does and exits 1 if
not. Prints the machine it ran on, since the numbers are that machine's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

from devcourse.loadbench import compare_loading, format_table

from page import WRITE_PAGE_HELP, write_row

TARGET_RATIO = 1.2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size-mib", type=int, default=1024, help="checkpoint size in MiB (default 1024)"
    )
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}; torch"
        f" {torch.__version__}"
    )
    results = compare_loading(args.size_mib)
    print(format_table(results))
    by_name = {m.strategy: m for m in results}
    ours, plain = by_name["devcourse"], by_name["plain"]
    result = (
        f"devcourse.load_model: {ours.ratio:.2f}x the checkpoint size in extra peak memory "
        f"(target at most {TARGET_RATIO}x); plain loading: {plain.ratio:.2f}x; "
        f"memory saved against plain: {plain.extra_peak_mib / ours.extra_peak_mib:.2f}x"
    )
    print(f"\n{result}")
    if args.write_page:
        write_row(__file__, result)
    return 0 if ours.ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
