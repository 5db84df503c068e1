"""Every op of PyTorch's own OpInfo database gives the CPU's values on the simulated device, or is refused in its
own words, over its first float32 samples (benchmarks/simdevice_ops.py runs the same sweep with more samples and
writes the figure to docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

import devcourse.simdevice as sim

pytest.importorskip("torch.testing._internal.common_methods_invocations", reason="needs expecttest")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "simdevice_ops.py"
SAMPLES = 2  # per op: the whole database in seconds


def _sweep_module():
    spec = importlib.util.spec_from_file_location("simdevice_ops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep():
    sim.enable(2)
    return _sweep_module()


def test_every_op_of_pytorchs_database_agrees_or_is_refused(sweep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcomes = [sweep.run_op(op, SAMPLES) for op in sweep.op_database()]
    counted = [o for o in outcomes if o.kind != "no samples"]
    assert len(counted) >= 600 and sum(o.kind == "agrees" for o in counted) >= 0.95 * len(counted)
    assert [(o.name, o.detail) for o in counted if o.kind == "fails"] == []


def test_the_sweep_tells_a_wrong_value_and_a_foreign_error_from_agreement(sweep):
    """The sweep can fail: a value off by one, and an error the CPU does not raise, are failures."""
    assert sweep._same(torch.ones(2), torch.ones(2, device="sim:0")) == ""
    assert sweep._same(torch.ones(2), torch.ones(2, device="sim:0") + 1).startswith("other values")
    assert sweep._same(torch.ones(2), torch.ones(3, device="sim:0")).startswith("(3,)")
    assert sweep._same(float("nan"), float("nan")) == ""

    class Broken:
        name, dtypes = "broken", {torch.float32}

        def sample_inputs(self, device, dtype, requires_grad=False):
            from torch.testing._internal.opinfo.core import SampleInput

            return [SampleInput(torch.ones(2))]

        def __call__(self, tensor):
            if tensor.device.type == "sim":
                raise ValueError("not on this device")
            return tensor

    outcome = sweep.run_op(Broken(), 1)
    assert outcome.kind == "fails" and outcome.detail == "ValueError: not on this device"
