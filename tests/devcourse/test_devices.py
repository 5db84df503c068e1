"""best_device() and same_device() on every kind of machine: real here, faked for CUDA, MPS and
XPU."""

from contextlib import ExitStack
from unittest import mock

import pytest
import torch

import simdevice
from devcourse import best_device
from devcourse.devices import hardware_accelerator, same_device
from devcourse.grading import simulated_cuda


def _accelerator(kind: str | None, count: int = 1, index: int = 0) -> ExitStack:
    """Make torch.accelerator answer as a machine with ``count`` devices of ``kind`` would."""
    stack = ExitStack()
    current = None if kind is None else torch.device(kind)
    stack.enter_context(
        mock.patch.object(torch.accelerator, "current_accelerator", lambda *args, **kwargs: current)
    )
    stack.enter_context(
        mock.patch.object(torch.accelerator, "is_available", lambda: kind is not None and count > 0)
    )
    stack.enter_context(
        mock.patch.object(torch.accelerator, "device_count", lambda: count if kind else 0)
    )
    stack.enter_context(mock.patch.object(torch.accelerator, "current_device_index", lambda: index))
    return stack


def test_best_device_is_the_first_gpu_when_there_is_one():
    with simulated_cuda(2):
        assert best_device() == torch.device("cuda", 0)


def test_best_device_falls_back_to_a_device_that_exists_here():
    with simulated_cuda(0):
        device = best_device()
    assert device.type in ("cpu", "mps")
    torch.zeros(1, device=device)  # a tensor can live there


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_best_device_is_indexed_for_every_accelerator(kind):
    with _accelerator(kind):
        device = best_device()
        assert hardware_accelerator() == kind
    assert device == torch.device(kind, 0) and device.index == 0, device


def test_a_mac_gets_mps_0_which_equals_a_tensors_device():
    # A tensor created on "mps" reports mps:0; mps is not equal to mps:0.
    assert torch.device("mps") != torch.device("mps:0")
    with _accelerator("mps"):
        assert best_device() == torch.device("mps:0")
        assert same_device("mps", "mps:0") and not same_device("mps:0", "cpu")


def test_a_mac_with_a_torch_older_than_torch_accelerator(monkeypatch):
    monkeypatch.delattr(torch, "accelerator")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert best_device() == torch.device("mps", 0)


def test_the_current_device_index_is_kept():
    with _accelerator("cuda", count=4, index=2):
        assert best_device() == torch.device("cuda", 2)
        assert same_device("cuda", "cuda:2") and not same_device("cuda", "cuda:0")


def test_the_simulated_device_is_never_the_best_device():
    simdevice.enable(2)
    assert torch.accelerator.current_accelerator().type == simdevice.NAME
    assert best_device() == torch.device("cpu") or torch.cuda.is_available()
    assert hardware_accelerator() in (None, "cuda", "mps", "xpu")


def test_same_device_compares_type_and_index():
    assert same_device("cpu", torch.device("cpu"))
    assert same_device("cpu", "cpu:0")
    assert not same_device("cpu", "meta")
    assert same_device("sim:1", torch.device("sim", 1)) and not same_device("sim:0", "sim:1")


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_beside_a_real_accelerator_the_simulated_one_stays_off(kind, monkeypatch):
    """Turned on beside CUDA, the simulated device makes every CUDA backward pass fail
    (pytorch#161129)."""
    from devcourse import accelerator_or_simulated

    def refuse(*args, **kwargs):
        raise AssertionError("the simulated device was turned on beside a real accelerator")

    monkeypatch.setattr(simdevice, "enable", refuse)
    with _accelerator(kind):
        assert accelerator_or_simulated() == torch.device(kind, 0)


def test_without_an_accelerator_it_is_the_simulated_second_device():
    from devcourse import accelerator_or_simulated

    if hardware_accelerator() is not None:
        pytest.skip("describes a machine without an accelerator")
    device = accelerator_or_simulated()
    assert device == torch.device(simdevice.NAME, 1) and simdevice.is_enabled()
    assert accelerator_or_simulated(0) == torch.device(simdevice.NAME, 0)
    torch.ones(2, device=device)  # it holds tensors
