"""Course-wide pytest hooks.

nbval compares a cell tagged ``raises-exception`` with its stored error only
when the cell's output is compared at all; under ``nbval-ignore-output`` a
cell that stopped raising would pass unnoticed. This hook makes every such
cell fail unless it really raised.
"""

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    cell = getattr(item, "cell", None)
    if cell is not None and "raises-exception" in cell.get("metadata", {}).get("tags", []):
        outputs = getattr(item, "test_outputs", None) or []
        if not any(out.get("output_type") == "error" for out in outputs):
            raise AssertionError("this cell is tagged raises-exception but ran without raising")
    return result
