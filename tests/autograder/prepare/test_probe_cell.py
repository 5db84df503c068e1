"""A probe's cell keeps in linecache only what is sent to other processes as it stands: its DDP
ranks' functions."""

import ast

from autograder.prepare.job import probe_cell
from autograder.prepare.probes import probe_source

TEST = """
def report(outdir):
    assert dist.is_initialized(), "runs in another process"
    return 1

results = run_functions([answer], report)
assert results == [1, 1]
### BEGIN HIDDEN TESTS
assert answer(3) == 9
### END HIDDEN TESTS
"""


def test_a_probe_forgets_its_source_but_the_functions_its_ranks_run():
    code, _ = probe_source(TEST, "_rec")
    cell = probe_cell(TEST, code, "_guard", "import torch")
    first, *rest = cell.splitlines()
    keep = ast.literal_eval(first.removeprefix("_guard.forget(").removesuffix(")"))
    kept = [
        line
        for number, line in enumerate(cell.splitlines(), 1)
        if any(a <= number <= b for a, b in keep)
    ]
    # inside the probe's try
    assert kept[0].strip() == "def report(outdir):" and "return 1" in kept[-1], kept
    assert not any("answer(3)" in line for line in kept), "a hidden check stays out of linecache"
    assert probe_cell("assert answer(3) == 9", code, "_guard", "").startswith("_guard.forget([])\n")
