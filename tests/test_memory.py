"""devcourse.memory: resident memory, telling out-of-memory errors apart, a model that runs out."""

import gc

import pytest
import torch

from devcourse import memory


def test_rss_grows_with_a_written_tensor_and_shrinks_when_it_is_freed():
    size = 128 * 2**20
    before = memory.rss_mib()
    block = torch.ones(size, dtype=torch.uint8)  # written, so its pages are resident
    grown = memory.rss_mib() - before
    del block
    shrunk = memory.rss_mib() - before
    assert grown > 0.9 * size / 2**20
    assert shrunk < 0.5 * size / 2**20


def test_a_failed_cpu_allocation_counts_as_out_of_memory():
    with pytest.raises(RuntimeError) as caught:
        torch.empty(memory.IMPOSSIBLE_BYTES, dtype=torch.uint8)
    assert not isinstance(caught.value, torch.OutOfMemoryError)  # the CPU allocator's own error
    assert memory.is_out_of_memory(caught.value)


@pytest.mark.parametrize(
    "error, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("MPS backend out of memory"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x4)"), False),
        (RuntimeError("Expected all tensors to be on the same device"), False),
        (NotImplementedError("out of memory"), False),
        (MemoryError(), False),
        (ValueError("can't allocate memory"), False),
    ],
)
def test_is_out_of_memory_tells_allocation_failures_from_other_errors(error, expected):
    assert memory.is_out_of_memory(error) is expected


def test_memory_hungry_runs_small_batches_like_a_linear_layer():
    model = memory.MemoryHungry(limit=4)
    x = torch.randn(4, 8)
    assert torch.equal(model(x), torch.nn.functional.linear(x, model.linear.weight, model.linear.bias))
    assert model.calls == [4] and model.alive_at_retry == [0]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_memory_hungry_runs_out_above_its_limit(device):
    model = memory.MemoryHungry(limit=2).to(device)
    with pytest.raises(Exception) as caught:
        model(torch.randn(3, 8, device=device))
    assert memory.is_out_of_memory(caught.value)
    if device == "cpu":
        assert "can't allocate memory" in str(caught.value)  # the CPU allocator's real error


def test_memory_hungry_sees_a_failed_attempt_kept_alive_and_one_let_go():
    model = memory.MemoryHungry(limit=2)
    batch = torch.randn(4, 8)
    try:
        model(batch)
    except RuntimeError:
        model(batch[:2])  # retried inside the except block: the failed frame is still alive
    assert model.alive_at_retry == [0, 1]

    model = memory.MemoryHungry(limit=2)
    gc.collect()
    failed = False
    try:
        model(batch)
    except RuntimeError:
        failed = True
    if failed:
        model(batch[:2])  # retried after the except block: nothing of the attempt is left
    assert model.alive_at_retry == [0, 0]
    assert model.calls == [4, 2]


def test_memory_hungry_keeps_the_exception_a_caller_stores():
    model = memory.MemoryHungry(limit=1)
    kept = []
    try:
        model(torch.randn(2, 8))
    except RuntimeError as exc:
        kept.append(exc)  # the traceback holds the frame, and the frame the activation
    model(torch.randn(1, 8))
    assert model.alive_at_retry[-1] == 1
