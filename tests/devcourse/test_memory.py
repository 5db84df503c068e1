"""devcourse.memory: resident memory, telling out-of-memory errors apart, a model that runs out."""

import gc
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from devcourse import memory


def test_rss_grows_with_a_written_tensor_and_shrinks_when_it_is_freed():
    # In a fresh process: in this one, an earlier test's freed memory can still be resident, and a
    # new tensor reuses it without growing anything.
    code = textwrap.dedent("""
        import torch
        from devcourse import memory
        size = 128 * 2**20
        before = memory.rss_mib()
        block = torch.ones(size, dtype=torch.uint8)  # written, so its pages are resident
        grown = memory.rss_mib() - before
        del block
        print(grown / (size / 2**20), (memory.rss_mib() - before) / (size / 2**20))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    grown, shrunk = map(float, done.stdout.split())
    assert grown > 0.9
    assert shrunk < 0.5


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
        # what MPS raises for IMPOSSIBLE_BYTES (MPSAllocator.mm: "Invalid buffer size: ",
        # format_size(size))
        (RuntimeError("Invalid buffer size: 1048576.00 GiB"), True),
        (RuntimeError("Invalid buffer size: 1048576.00 GB"), True),  # format_size of older releases
        (ValueError("Invalid buffer size: 1048576.00 GiB"), False),
        (RuntimeError("DataLoader: Invalid buffer size for the batch"), False),
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
    assert torch.equal(
        model(x), torch.nn.functional.linear(x, model.linear.weight, model.linear.bias)
    )
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


def test_memory_profile_records_allocations_without_the_profilers_log_lines():
    """A snapshot for the memory viewer; kineto's profiler_start/stop lines are written to fd 2
    without it."""
    code = textwrap.dedent("""
        import sys
        import torch
        from torch.cuda._memory_viz import _profile_to_snapshot
        from torch.profiler import ProfilerActivity, profile
        from devcourse.memory import memory_profile

        if sys.argv[1] == "plain":
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                         with_stack=True) as prof:
                kept = torch.ones(2**20)
        else:
            with memory_profile() as prof:
                kept = torch.ones(2**20)
                print("inside the block, stderr works", file=sys.stderr, flush=True)
        trace = _profile_to_snapshot(prof)["device_traces"][-1]
        print(sum(e["size"] for e in trace if e["action"] == "alloc"))
    """)
    runs = {
        how: subprocess.run(
            [sys.executable, "-c", code, how], capture_output=True, text=True, timeout=120
        )
        for how in ("plain", "quiet")
    }
    for done in runs.values():
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout.split()[-1]) >= 4 * 2**20  # the 4 MiB tensor was recorded
    # what the helper is for (fails if torch stops logging it)
    assert "profiler_start" in runs["plain"].stderr
    assert (
        "profiler_start" not in runs["quiet"].stderr and "profiler_stop" not in runs["quiet"].stderr
    )
    assert "inside the block, stderr works" in runs["quiet"].stderr


def test_memory_profile_drops_older_pytorchs_warning_about_cycles_only(monkeypatch):
    """PyTorch 2.11 warned "Profiler clears events ..." on starting any profile (seen on a GPU
    machine); made to here."""
    from torch.profiler import profiler

    original = profiler._KinetoProfile.prepare_trace

    def prepare_trace_of_2_11(self):
        warnings.warn(
            "Warning: Profiler clears events at the end of each cycle.Only events from the current "
            "cycle will be reported.To keep events across cycles, set acc_events=True.",
            UserWarning,
        )
        return original(self)

    monkeypatch.setattr(profiler._KinetoProfile, "prepare_trace", prepare_trace_of_2_11)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with memory.memory_profile():
            torch.ones(8)
            warnings.warn("the block's own warning", UserWarning)
    assert [str(w.message) for w in caught] == ["the block's own warning"]
    # the patch does warn: without the helper it shows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            pass
    assert any("clears events" in str(w.message) for w in caught)


def _entry(action, size):
    return {"action": action, "addr": 0, "size": size}


def test_held_over_time_adds_allocs_and_subtracts_completed_frees_only():
    trace = [
        _entry("alloc", 100),
        _entry("alloc", 50),
        _entry("free_requested", 100),
        _entry("segment_alloc", 4096),
        _entry("free_completed", 100),
        _entry("oom", 0),
    ]
    assert memory.held_over_time(trace) == [100, 150, 150, 150, 50, 50]
    assert memory.held_over_time([]) == []


def test_plot_memory_timeline_writes_a_png(tmp_path):
    traces = {
        "kept": [_entry("alloc", 2**20), _entry("alloc", 2**20)],
        "freed": [_entry("alloc", 2**20), _entry("free_completed", 2**20)],
    }
    path = memory.plot_memory_timeline(traces, tmp_path / "timeline.png")
    assert path == tmp_path / "timeline.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000
