import pytest
import torch

from devcourse.grading import (
    assert_tensor,
    check_on_devices,
    device_matrix,
    has_values,
    simulated_cuda,
    simulated_mps,
)
from simdevice import SimTensor

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="describes a machine without CUDA")
def test_matrix_without_gpu_is_the_cpu_and_two_simulated_devices():
    for kind in ("tensor", "module"):
        entries = device_matrix(kind)
        assert [str(d.device) for d in entries] == ["cpu", "sim:0", "sim:1"]
        assert [d.stand_in for d in entries] == ["", "sim", "sim"]


def test_matrix_with_two_gpus_lists_each_real_gpu_and_no_stand_in():
    with simulated_cuda(2):
        for kind in ("tensor", "module"):
            entries = device_matrix(kind)
            assert [str(d.device) for d in entries] == ["cpu", "cuda:0", "cuda:1"]
            assert all(d.real for d in entries)


def test_matrix_with_one_gpu_is_that_gpu():
    with simulated_cuda(1):
        assert [str(d.device) for d in device_matrix("module")] == ["cpu", "cuda:0"]


def test_simulated_mps_is_found_by_name_and_given_its_index():
    from devcourse.devices import best_device

    with simulated_cuda(0), simulated_mps():
        assert torch.backends.mps.is_available() and torch.backends.mps.is_built()
        assert best_device() == torch.device("mps", 0)
    with simulated_mps(False):
        assert not torch.backends.mps.is_available() and not torch.backends.mps.is_built()


def test_a_simulated_mac_answers_through_every_public_api():
    """torch.mps.is_available() answers from torch.mps's own device_count, not torch.backends.mps: a
    correct answer written with it lost a point on the simulated Mac when only torch.backends.mps
    was patched."""
    with simulated_mps():
        assert torch.mps.is_available() and torch.mps.device_count() == 1
        assert (
            torch.accelerator.current_accelerator() == torch.device("mps")
            and not torch.cuda.is_available()
        )
    with simulated_mps(False):
        assert not torch.mps.is_available() and torch.mps.device_count() == 0
    # PyTorch with MPS on a macOS that cannot run it
    with simulated_mps(available=False, built=True):
        assert torch.backends.mps.is_built() and not torch.backends.mps.is_available()
        assert not torch.mps.is_available() and not torch.cuda.is_available()
        assert torch.accelerator.device_count() == 0


def test_matrix_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        device_matrix("gpu")


def test_simulated_devices_say_what_they_are():
    with simulated_cuda(0):
        labels = [str(d) for d in device_matrix("tensor")]
    assert labels[0] == "cpu"
    assert labels[1] == "sim:0 (simulated device: real values in host memory)"


def test_check_on_devices_runs_the_check_once_per_device_with_values():
    seen = []

    def check(device):
        t = torch.arange(3.0, device=device) * 2
        seen.append((t.device, t.tolist()))

    with simulated_cuda(0):
        checked = check_on_devices(check)
    assert [str(d.device) for d in checked] == ["cpu", "sim:0", "sim:1"]
    assert seen == [(torch.device(d), [0.0, 2.0, 4.0]) for d in ("cpu", "sim:0", "sim:1")]


def test_a_failing_check_names_the_device_and_keeps_the_cause():
    def check_mixes_devices(device):
        torch.nn.Linear(2, 2).to(device)(torch.ones(1, 2))  # the batch left on the CPU

    with simulated_cuda(0), pytest.raises(AssertionError) as err:
        check_on_devices(check_mixes_devices, kind="module")
    message = str(err.value)
    assert message.startswith("check_mixes_devices failed on sim:0 (simulated device")
    assert (
        "RuntimeError: Expected all tensors to be on the same device, but got mat1 is on cpu"
        in message
    )
    assert isinstance(err.value.__cause__, RuntimeError)


def test_token_ids_left_on_the_cpu_fail_the_matrix():
    """The classic bug that meta let through: embedding weights on the device, ids on the CPU."""

    def check_embeds(device):
        torch.nn.Embedding(5, 2).to(device)(torch.tensor([1, 2]))

    with (
        simulated_cuda(0),
        pytest.raises(AssertionError, match="failed on sim:0 .*index is on cpu"),
    ):
        check_on_devices(check_embeds, kind="module")


def test_a_student_stub_fails_the_check():
    def check(device):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="failed on cpu: NotImplementedError"):
        check_on_devices(check)


def test_has_values_is_false_only_on_devices_without_values():
    assert has_values(torch.ones(1))
    assert has_values(torch.ones(1, device=device_matrix()[-1].device))
    assert not has_values(torch.ones(1, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not has_values(torch.ones(1, device="cuda:0"))


def test_assert_tensor_accepts_a_matching_tensor():
    assert_tensor(torch.arange(3), torch.arange(3), "cpu")
    sim1 = device_matrix()[-1].device
    assert_tensor(torch.arange(3).to(sim1), torch.arange(3), sim1)
    with pytest.raises(AssertionError, match="values differ"):
        assert_tensor(torch.arange(3).to(sim1) + 1, torch.arange(3), sim1)
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
            assert (
                torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype
                == torch.bfloat16
            )
    assert calls == [("meta", torch.bfloat16, True), ("cpu", torch.bfloat16, True)]
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'meta'"):
        torch.autocast("meta", dtype=torch.bfloat16)


class _Liar(torch.Tensor):
    """Says yes to every comparison a test might make."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.__eq__):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


class _SimLiar(SimTensor):
    """The same lie, on the simulated device (whose tensors are SimTensor)."""

    __torch_function__ = _Liar.__torch_function__


def test_a_lying_tensor_subclass_fails_on_every_device():
    expected = torch.arange(3.0)
    for entry in device_matrix("tensor"):
        zeros = torch.zeros(3).to(entry.device)
        liar = (
            _SimLiar(zeros._values, entry.device)
            if type(zeros) is SimTensor
            else zeros.as_subclass(_Liar)
        )
        assert torch.equal(liar, expected.to(entry.device))  # it lies to plain calls
        with pytest.raises(AssertionError, match="got a subclass: _(Sim)?Liar"):
            assert_tensor(liar, expected, entry.device)


def test_every_machine_answers_as_its_data_says():
    """Each machine of devcourse.machines answers through torch.accelerator as its data says, holds
    float64 where it says so, and a check on it is handed a device where its values live."""
    from devcourse.grading import GradingDevice
    from devcourse.machines import MACHINES

    assert set(MACHINES) >= {"laptop", "two-gpus", "mac", "mac-without-mps"}
    for machine in MACHINES.values():
        if machine.can_stand_here():
            continue
        entry = GradingDevice(machine.device(), machine)
        with entry.activate():
            current = torch.accelerator.current_accelerator()
            assert (None if current is None else current.type) == machine.accelerator, machine.name
            assert torch.accelerator.device_count() == machine.devices, machine.name
            assert torch.cuda.is_available() == (
                machine.accelerator == "cuda" and machine.devices > 0
            )
            float64 = torch.zeros(1, device=entry.device)
            if machine.float64:
                float64.double()
            else:
                with pytest.raises(TypeError, match="MPS framework doesn't support float64"):
                    float64.double()
        assert str(entry).startswith("mps:0 of" if machine.name == "mac" else f"{entry.device} of")


def test_a_laptop_cannot_pin_and_two_gpus_have_drawn_apart():
    """The laptop refuses to pin memory in PyTorch's words for a machine without an accelerator; the
    two GPUs' generators hold two states (seed, then offset), so saving only the current GPU's state
    loses one."""
    from devcourse.grading import device_matrix

    laptop, gpus = device_matrix("module", machines=("laptop", "two-gpus"))[-2:]
    assert (laptop.stand_in, gpus.stand_in) == ("laptop", "two-gpus")
    with laptop.activate():
        with pytest.raises(
            RuntimeError, match="^Cannot access accelerator device when none is available.$"
        ):
            torch.ones(2).pin_memory()
    with gpus.activate():
        first, second = torch.cuda.get_rng_state_all()
        assert not torch.equal(first, second) and torch.equal(torch.cuda.get_rng_state(), first)
        # seeded alike: only how much each drew differs
        assert first[:8].tolist() == second[:8].tolist()
    with pytest.raises(ValueError, match="no machine 'tpu': the machines are laptop, two-gpus"):
        device_matrix(machines=("tpu",))
