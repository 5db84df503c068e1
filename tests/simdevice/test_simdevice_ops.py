"""Every op of PyTorch's own OpInfo database gives the CPU's values on the simulated device, or is
refused in its own words, over its first float32 samples (benchmarks/simdevice_ops.py runs the same
sweep with more samples and writes the figure to docs/benchmarks.md); and, for a subset of ops, one
tensor left on the CPU raises or runs as CUDA's same-device rules predict
(benchmarks/simdevice_mismatch.py runs the whole database)."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

import simdevice as sim

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
    # the ops whose OpInfo lists no float32 for CUDA, refused as CUDA refuses them
    assert sorted(o.name for o in counted if o.kind == "as on CUDA") == ["histogram", "histogramdd"]


def test_the_sweep_tells_a_wrong_value_and_a_foreign_error_from_agreement(sweep):
    """The sweep can fail: a value off by one, and an error the CPU does not raise, are failures."""
    assert sweep._same(torch.ones(2), torch.ones(2, device="sim:0")) == ""
    assert sweep._same(torch.ones(2), torch.ones(2, device="sim:0") + 1).startswith("other values")
    assert sweep._same(torch.ones(2), torch.ones(3, device="sim:0")).startswith("(3,)")
    assert sweep._same(float("nan"), float("nan")) == ""

    class Broken:
        name, dtypes = "broken", {torch.float32}
        cuda = {torch.float32}

        def supported_dtypes(self, device_type):
            return self.cuda if device_type == "cuda" else self.dtypes

        def sample_inputs(self, device, dtype, requires_grad=False):
            from torch.testing._internal.opinfo.core import SampleInput

            return [SampleInput(torch.ones(2))]

        def __call__(self, tensor):
            if tensor.device.type == "sim":
                raise ValueError("not on this device")
            return tensor

    outcome = sweep.run_op(Broken(), 1)
    assert outcome.kind == "fails" and outcome.detail == "ValueError: not on this device"

    class CpuOnly(Broken):
        """An op CUDA cannot run (no float32 for CUDA in its OpInfo) that the device runs."""

        cuda = set()

        def __call__(self, tensor):
            return tensor

    outcome = sweep.run_op(CpuOnly(), 1)
    assert outcome.kind == "fails" and "CUDA refuses it" in outcome.detail
    outcome = sweep.run_op(type("Refused", (CpuOnly,), {"__call__": _histogram})(), 1)
    assert outcome.kind == "as on CUDA"
    outcome = sweep.run_op(type("CudaRuns", (Broken,), {"__call__": _histogram})(), 1)
    assert outcome.kind == "fails" and outcome.detail.startswith("CUDA runs it (OpInfo)")


def _histogram(self, tensor):
    return torch.histogram(tensor, bins=2)


MISMATCH = Path(__file__).resolve().parents[2] / "benchmarks" / "simdevice_mismatch.py"
# One op or more for each rule of the mismatch sweep's predictor: TensorIterator with and without a
# CPU scalar, addcmul's and lerp's kernels, where, the generated wrappers' check, indexing,
# masked_fill, cat, convolutions (oneDNN's type check, the slow kernels' and cuDNN's, an operator
# CUDA has no kernel for: slow_conv3d_forward), a composite that fills an empty out= tensor.
MISMATCH_OPS = (
    "add",
    "mul",
    "atan2",
    "eq",
    "addcmul",
    "addcdiv",
    "lerp",
    "where",
    "clamp",
    "matmul",
    "index_select",
    "index_put",
    "masked_fill",
    "cat",
    "nn.functional.mse_loss",
    "nn.functional.conv2d",
    "nn.functional.conv3d",
    "nn.functional.soft_margin_loss",
)


@pytest.fixture(scope="module")
def mismatch(sweep):
    spec = importlib.util.spec_from_file_location("simdevice_mismatch", MISMATCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mismatch_ops(mismatch):
    return {op.name: op for op in mismatch.op_database() if op.name in MISMATCH_OPS}


def test_one_tensor_left_on_the_cpu_raises_or_runs_as_cudas_rules_predict_for_a_subset(
    mismatch, mismatch_ops
):
    """The fast part of benchmarks/simdevice_mismatch.py: every variant of the first sample of ops
    that reach each rule (the script runs the whole database)."""
    assert sorted(mismatch_ops) == sorted(MISMATCH_OPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcomes = [mismatch.run_op(op, 1) for op in mismatch_ops.values()]
    assert [(o.name, o.detail) for o in outcomes if o.kind != "agrees"] == []
    assert sum(o.variants for o in outcomes) >= 50


def test_the_mismatch_sweep_catches_an_outcome_its_rules_do_not_predict(
    mismatch, mismatch_ops, monkeypatch
):
    """The predictor can fail: told that add takes no CPU scalar, it expects an error where the
    device runs add."""
    monkeypatch.setattr(mismatch, "ALLOW", mismatch.ALLOW - {"add"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = mismatch.run_op(mismatch_ops["add"], 1)
    assert (
        outcome.kind == "differs"
        and "ran; the rules predict Expected all tensors" in outcome.detail
    )


@pytest.mark.parametrize(
    "where, shape, groups, expected",
    [
        # a batch the CPU gives to oneDNN: its type check, with the device's tensor type
        ("weight", (16, 4, 12, 12), 1, "Raises:Input type (torch.FloatTensor) and weight type"),
        # one image: the CPU's slow kernel, whose parts are judged in turn
        ("weight", (1, 4, 5, 5), 1, "Composite"),
        # a device input: cuDNN's type check, or the depthwise kernel's generated device check
        ("input", (2, 4, 5, 5), 1, "Raises:Input type (torch.sim.FloatTensor) and weight type"),
        ("input", (2, 4, 5, 5), 4, "Raises:Expected all tensors to be on the same device, but got"),
    ],
)
def test_the_convolution_rule_follows_the_input_and_the_device_raises_it(
    mismatch, where, shape, groups, expected
):
    x, w = torch.randn(shape), torch.randn(4, 4 // groups, 3, 3)
    x, w = (x.to("sim:0"), w) if where == "input" else (x, w.to("sim:0"))
    guess = mismatch._convolution((x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], groups))
    kind, _, message = expected.partition(":")
    assert type(guess).__name__ == kind and guess.message.startswith(message) if message else True
    if kind == "Raises":
        with pytest.raises(RuntimeError) as info:
            torch.nn.functional.conv2d(x, w, groups=groups)
        assert str(info.value) == guess.message
