"""The machines a check can stand for, and the errors it can raise, as PyTorch has them.

* a Mac (``devcourse.mac``, ``device_matrix(machines=("mac",))``): MPS's device names, one
  device, no float64, MPS's out-of-memory errors, each text as PyTorch's source writes it;
* every backend's out-of-memory error and errors that only sound like one (``devcourse.memory``);
* another index of the same device type (``other_index``); machines with fewer GPUs than a
  checkpoint was saved with, and none (``simulated_cuda``'s generators);
* checks that cannot run here say so; whatever an answer raises becomes feedback that names it.

Seconds, in this process; the notebooks' hidden tests that use these run in the mistakes' grading.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from devcourse import best_device, grading
from devcourse.memory import MemoryHungry, is_out_of_memory, not_memory_errors, out_of_memory_errors

needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the simulated Mac needs a machine without CUDA"
)


@needs_no_cuda
def test_a_mac_resolves_to_mps0_and_its_gpu_holds_values():
    from devcourse.mac import simulated_mac

    with simulated_mac() as gpu:
        assert best_device() == torch.device("mps", 0)
        assert (
            torch.accelerator.current_accelerator() == torch.device("mps")
            and not torch.cuda.is_available()
        )
        assert torch.device("mps") != torch.device("mps", 0), "names stay names, as on a Mac"
        on_mac = nn.Linear(2, 3).to(best_device())
        assert on_mac.weight.device == gpu and torch.ones(2, device="mps").device == gpu
        with pytest.raises(RuntimeError, match="one MPS device"):
            torch.zeros(2, device="mps:1")
    assert best_device() == torch.device("cpu"), "the Mac ends with its block"


@needs_no_cuda
def test_a_mac_refuses_float64_in_mps_own_words(tmp_path):
    """The text of MPS_ERROR_DOUBLE_NOT_SUPPORTED, aten/src/ATen/mps/EmptyTensor.cpp, raised as
    TORCH_CHECK_TYPE."""
    from devcourse.mac import MPS_FLOAT64, simulated_mac

    assert (
        MPS_FLOAT64
        == "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support "
        "float64. Please use float32 instead."
    )
    torch.save({"w": torch.ones(2, dtype=torch.float64)}, tmp_path / "float64.pt")
    with simulated_mac():
        with pytest.raises(TypeError, match="doesn't support float64"):
            torch.ones(2, dtype=torch.float64).to("mps")
        with pytest.raises(TypeError, match="doesn't support float64"):
            torch.load(tmp_path / "float64.pt", map_location="mps")
        loaded = (
            torch.load(tmp_path / "float64.pt", map_location="cpu")["w"].float().to(best_device())
        )
        assert loaded.dtype == torch.float32


@needs_no_cuda
def test_a_mac_runs_histogram_which_mps_has_and_cuda_lacks():
    """``native_functions.yaml``: ``histogram`` dispatches to ``CPU, MPS``; the simulated CUDA
    refuses it, the simulated Mac runs it."""
    from devcourse.mac import simulated_mac

    x = torch.tensor([0.0, 1.0, 2.0])
    with simulated_mac() as gpu:
        assert torch.histogram(x.to(gpu), bins=2).hist.tolist() == [1.0, 2.0]
    with pytest.raises(NotImplementedError, match="from the 'SIM' backend"):
        torch.histogram(x.to(gpu), bins=2)


@needs_no_cuda
def test_a_mac_runs_out_of_memory_in_mps_own_words():
    from devcourse.mac import simulated_mac

    with simulated_mac() as gpu:
        model = MemoryHungry(limit=1).to(gpu)
        with pytest.raises(RuntimeError) as raised:
            model(torch.ones(4, 8, device=gpu))
    assert (
        type(raised.value) is RuntimeError
        and str(raised.value) == "Invalid buffer size: 1048576.00 GiB"
    )
    assert is_out_of_memory(raised.value)


@needs_no_cuda
def test_the_matrix_ends_with_the_mac_where_asked():
    plain, with_mac = (
        grading.device_matrix("module"),
        grading.device_matrix("module", machines=("mac",)),
    )
    assert with_mac[:-1] == plain and with_mac[-1].stand_in == "mac" and "Mac" in str(with_mac[-1])
    seen = []
    grading.check_on_devices(
        lambda device: seen.append(torch.backends.mps.is_available()), machines=("mac",)
    )
    assert seen == [False] * len(plain) + [True]


def test_a_check_that_cannot_run_here_says_so(monkeypatch, capsys):
    """On a machine with CUDA the Mac is not checked, and the cell's output and NOT_CHECKED say
    so."""
    monkeypatch.setattr(grading, "NOT_CHECKED", [])
    calls = []
    with grading.simulated_cuda(1):
        assert grading.check_on_a_mac(calls.append) == [] and calls == []
    said = (
        "append: not checked on a simulated Mac: stood for on the simulated device, which is not"
        " turned on beside CUDA"
    )
    assert said in capsys.readouterr().out
    assert grading.NOT_CHECKED == [said]


def test_every_backends_out_of_memory_error_is_one_and_the_look_alikes_are_not():
    forms = out_of_memory_errors(3 * 2**30)
    assert set(forms) == {"cuda", "xpu", "cpu", "mps", "mps_buffer"}
    assert type(forms["cuda"]) is torch.OutOfMemoryError and str(forms["cuda"]).startswith(
        "CUDA out of memory. Tried to allocate 3.00 GiB"
    )
    assert type(forms["xpu"]) is torch.OutOfMemoryError and str(forms["xpu"]).startswith(
        "XPU out of memory."
    )
    assert type(
        forms["cpu"]
    ) is RuntimeError and "DefaultCPUAllocator: can't allocate memory" in str(forms["cpu"])
    assert type(forms["mps"]) is RuntimeError and str(forms["mps"]).startswith(
        "MPS backend out of memory ("
    )
    assert str(forms["mps_buffer"]) == "Invalid buffer size: 3.00 GiB"
    assert all(is_out_of_memory(error) for error in forms.values())
    others = not_memory_errors()
    assert not any(is_out_of_memory(error) for error in others.values())
    assert all(
        any(word in str(error) for word in ("CUDA", "cuda", "memory", "alloc"))
        for error in others.values()
    )
    assert isinstance(others["illegal_address"], torch.AcceleratorError)
    real = []
    try:  # the real CPU allocator's words, here
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as err:
        real.append(str(err))
    assert (
        real
        and real[0].split("tried to allocate")[0] == str(forms["cpu"]).split("tried to allocate")[0]
    )


def test_memory_hungry_raises_the_error_it_is_given():
    error = out_of_memory_errors()["mps"]
    model = MemoryHungry(limit=2, error=error)
    with pytest.raises(RuntimeError) as raised:
        model(torch.ones(3, 8))
    assert raised.value is error and model.calls == [3]
    assert MemoryHungry(limit=2, error=error)(torch.ones(2, 8)).shape == (2, 4)


def test_another_index_of_the_same_type():
    devices = [entry.device for entry in grading.device_matrix()]
    assert grading.other_index("cpu") is None
    for device in devices[1:]:
        sibling = grading.other_index(device)
        assert sibling is not None and sibling.type == device.type and sibling != device


def test_generators_of_fewer_gpus_than_saved_and_of_none():
    saved = [torch.full((16,), value, dtype=torch.uint8) for value in (3, 4)]
    with grading.simulated_cuda(2):
        torch.cuda.set_rng_state_all(saved)
        assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), saved))
    with grading.simulated_cuda(1), pytest.raises(IndexError):
        # as torch.cuda.default_generators[1] on a one-GPU machine
        torch.cuda.set_rng_state_all(saved)
    with grading.simulated_cuda(0):
        torch.cuda.set_rng_state_all(saved)  # queued by PyTorch until CUDA starts: nothing happens
        assert torch.cuda.get_rng_state_all() == []


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("no text")


@pytest.mark.parametrize(
    "error", [SystemExit(3), GeneratorExit(), _Unprintable(), RuntimeError("plain")]
)
def test_whatever_an_answer_raises_becomes_feedback_naming_it(error):
    def check_answer(device):
        raise error

    with pytest.raises(AssertionError) as raised:
        grading.check_on_devices(check_answer)
    assert str(raised.value).startswith("check_answer failed on cpu: ") and type(
        error
    ).__name__ in str(raised.value)


def test_keyboard_interrupt_still_stops_a_check():
    def check_answer(device):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grading.check_on_devices(check_answer)
