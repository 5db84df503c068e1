import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from devcourse.grading import (
    assert_tensor,
    check_on_devices,
    device_matrix,
    has_values,
    simulated_cuda,
)

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="describes a machine without CUDA")
def test_matrix_without_gpu_uses_meta_and_fake_cuda_stand_ins():
    tensor = device_matrix("tensor")
    assert [str(d.device) for d in tensor] == ["cpu", "meta", "cuda:0", "cuda:1"]
    assert [d.stand_in for d in tensor] == ["", "meta", "fake", "fake"]
    module = device_matrix("module")
    assert [str(d.device) for d in module] == ["cpu", "meta"]


def test_matrix_with_gpus_lists_each_real_gpu_and_no_stand_in():
    with simulated_cuda(2):
        for kind in ("tensor", "module"):
            entries = device_matrix(kind)
            assert [str(d.device) for d in entries] == ["cpu", "cuda:0", "cuda:1"]
            assert all(d.real for d in entries)


def test_matrix_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        device_matrix("gpu")


def test_stand_ins_say_what_they_are():
    with simulated_cuda(0):
        labels = [str(d) for d in device_matrix("tensor")]
    assert labels[0] == "cpu"
    assert "stand-in" in labels[1] and labels[1].startswith("meta")
    assert "FakeTensorMode" in labels[2] and labels[2].startswith("cuda:0")


def test_check_on_devices_runs_the_check_once_per_device():
    seen = []

    def check(device):
        t = torch.ones(2, device=device)
        seen.append((t.device, type(t)))

    with simulated_cuda(0):
        checked = check_on_devices(check)
    assert [str(d.device) for d in checked] == ["cpu", "meta", "cuda:0", "cuda:1"]
    assert [str(device) for device, _ in seen] == ["cpu", "meta", "cuda:0", "cuda:1"]
    # fake CUDA devices run inside FakeTensorMode
    assert seen[2][1] is FakeTensor and seen[0][1] is torch.Tensor


def test_a_failing_check_names_the_device_and_keeps_the_cause():
    def check_mixes_devices(device):
        torch.ones(2, device=device) + torch.ones(2)  # fails on any device but cpu

    with simulated_cuda(0), pytest.raises(AssertionError) as err:
        check_on_devices(check_mixes_devices)
    message = str(err.value)
    assert message.startswith("check_mixes_devices failed on meta")
    assert "RuntimeError" in message and "expected device meta" in message
    assert isinstance(err.value.__cause__, RuntimeError)


def test_fake_cuda_reproduces_the_cuda_device_mismatch_message():
    def check(device):
        torch.ones(2, device=device) + torch.ones(2)

    entry = device_matrix("tensor")[2] if NO_GPU else None
    if entry is None:
        pytest.skip("the fake devices exist only without CUDA")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"):
        with entry.activate():
            check(entry.device)


def test_a_student_stub_fails_the_check():
    def check(device):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="failed on cpu: NotImplementedError"):
        check_on_devices(check)


def test_has_values_is_false_only_on_stand_ins():
    assert has_values(torch.ones(1))
    assert not has_values(torch.ones(1, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not has_values(torch.ones(1, device="cuda:0"))


def test_assert_tensor_accepts_a_matching_tensor():
    assert_tensor(torch.arange(3), torch.arange(3), "cpu")
    assert_tensor(torch.ones(2, device="meta"), torch.zeros(2), "meta")  # no values on meta


@pytest.mark.parametrize(
    "actual, message",
    [
        ([0, 1, 2], "expected a tensor, got list"),
        (torch.arange(3, device="meta"), "tensor is on meta, expected cpu"),
        (torch.arange(3.0), "dtype torch.float32, expected torch.int64"),
        (torch.arange(4), r"shape \(4,\), expected \(3,\)"),
        (torch.tensor([0, 1, 5]), "values differ"),
    ],
)
def test_assert_tensor_says_what_is_wrong(actual, message):
    with pytest.raises(AssertionError, match=message):
        assert_tensor(actual, torch.arange(3), "cpu")


def test_simulated_cuda_reports_the_given_gpus_and_restores_the_real_ones():
    real = (torch.cuda.is_available(), torch.cuda.device_count())
    with simulated_cuda(3, name="Test GPU"):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 3
        assert torch.cuda.get_device_name(2) == "Test GPU 2"
        assert torch.cuda.get_device_name("cuda:1") == "Test GPU 1"
        with pytest.raises(RuntimeError, match="invalid device id 3"):
            torch.cuda.get_device_name(3)
    assert (torch.cuda.is_available(), torch.cuda.device_count()) == real


def test_simulated_cuda_rejects_a_negative_count():
    with pytest.raises(ValueError):
        with simulated_cuda(-1):
            pass


def test_recorded_autocast_records_calls_and_stands_in_for_meta():
    from devcourse.grading import recorded_autocast

    with recorded_autocast() as calls:
        with torch.autocast("meta", dtype=torch.bfloat16):  # raises without the recorder
            pass
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    assert calls == [("meta", torch.bfloat16, True), ("cpu", torch.bfloat16, True)]
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'meta'"):
        torch.autocast("meta", dtype=torch.bfloat16)
