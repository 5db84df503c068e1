"""Where students' code relies on how CUDA behaves, the simulated device behaves the same way.

Parameters keep their identity through moves, errors take CUDA's forms, and
events and streams time work on the device's simulated clock. Without a GPU
here, CUDA's side of each comparison is the CPU's (values) or PyTorch's own
source (wording), named in each test.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import simdevice as sim

SAME = "Expected all tensors to be on the same device, "


@pytest.fixture(scope="module", autouse=True)
def two_devices():
    return sim.enable(2)


class _Tied(torch.nn.Module):
    """A language model's shape: the output layer shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 4)
        self.hidden = torch.nn.Linear(4, 4)
        self.decoder = torch.nn.Linear(4, 7)
        self.decoder.weight = self.embed.weight

    def forward(self, tokens):
        return self.decoder(torch.tanh(self.hidden(self.embed(tokens))))


@pytest.mark.parametrize("device", ["sim:0", "sim:1"])
def test_a_move_keeps_each_parameter_object_and_weight_ties(device):
    torch.manual_seed(0)
    model = _Tied()
    before = list(model.parameters())
    weight = model.hidden.weight
    assert model.to(device) is model
    assert model.hidden.weight is weight and weight.device == torch.device(device)
    assert isinstance(weight, torch.nn.Parameter)
    assert model.decoder.weight is model.embed.weight
    assert [p is q for p, q in zip(model.parameters(), before)] == [True] * len(before)
    # every direction (.sim() like .cuda()), a dtype
    model.sim(1 - torch.device(device).index).cpu().double()
    assert model.decoder.weight is model.embed.weight and model.hidden.weight is weight
    assert weight.device.type == "cpu" and weight.dtype == torch.float64


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x.new_tensor([1.0, 2.0]),
        lambda x: x.new([1.0, 2.0]),
        lambda x: x.new(3),
        lambda x: x.new(2, 2),
        lambda x: x.new_zeros(2),
        lambda x: x.new_ones(2),
        lambda x: x.new_empty(2),
        lambda x: x.new_full((2,), 3.0),
        lambda x: x.new_empty_strided((2,), (1,)),
    ],
    ids=[
        "new_tensor",
        "new(data)",
        "new(size)",
        "new(sizes)",
        "new_zeros",
        "new_ones",
        "new_empty",
        "new_full",
        "new_empty_strided",
    ],
)
def test_new_tensors_land_on_their_tensors_index_as_on_cuda(make):
    """CUDA's ``x.new_*`` land on ``x``'s device (PyTorch builds ``new_tensor`` and ``new`` from the
    device type, with the current device's index): public style-transfer code failed on ``sim:1``
    with a false two-device error, as would any DDP rank above 0."""
    for index in (0, 1):
        assert make(torch.ones(2, device=f"sim:{index}")).device == torch.device(f"sim:{index}")
    assert make(torch.ones(2)).device == torch.device("cpu")


def test_indices_on_another_device_are_refused_as_indexs_meta_function_refuses_them():
    """``check_indices_on_cpu_or_selfdevice`` (aten/src/ATen/native/TensorAdvancedIndexing.cpp), in
    ``index``'s meta function, which every device type runs: indices on the CPU or on the indexed
    tensor's device only."""
    values = torch.arange(4.0)
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
        ),
    ):
        values[torch.tensor([0, 1], device="sim:0")]
    with pytest.raises(RuntimeError, match=re.escape("indexed tensor (sim:0)")):
        values.to("sim:0")[torch.tensor([0, 1], device="sim:1")]
    assert values.to("sim:1")[torch.tensor([0, 1])].device == torch.device("sim:1"), (
        "CPU indices are fine"
    )


def test_a_cpu_generator_is_refused_for_the_device_as_cuda_refuses_it():
    """``check_generator`` (aten/src/ATen/core/DistributionsHelper.h): "Expected a 'cuda' device
    type for generator but found 'cpu'" on CUDA."""
    with pytest.raises(
        RuntimeError, match="Expected a 'sim' device type for generator but found 'cpu'"
    ):
        torch.randn(2, device="sim:0", generator=torch.Generator())
    assert torch.randn(2, generator=torch.Generator().manual_seed(0)).to(
        "sim:0"
    ).device == torch.device("sim:0")


def test_numpy_force_copies_to_the_host_and_tensor_reads_0_dim_device_tensors():
    """``Tensor.numpy(force=True)`` copies a device tensor to the host (torch/_tensor.py's docs, as
    for CUDA); ``torch.tensor`` of a list of 0-dim device tensors reads each value (CUDA copies each
    to the host)."""
    values = torch.arange(3.0, device="sim:1", requires_grad=True)
    assert values.numpy(force=True).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError, match="can't convert sim:1 device type tensor to numpy"):
        values.detach().numpy()
    made = torch.tensor([values[0].detach(), values[2].detach()])
    assert made.device == torch.device("cpu") and made.tolist() == [0.0, 2.0]


class _MaskNotABuffer(torch.nn.Module):
    """Causal attention's mask kept as a plain attribute, not a buffer: ``Module.to`` leaves it on
    the CPU (the mistake of a public tutorial, whose CUDA run prints "expected self and mask to be
    on the same device, but got mask on cpu and self on cuda:0")."""

    def __init__(self):
        super().__init__()
        self.scores = torch.nn.Linear(4, 4)
        self.mask = torch.triu(torch.ones(4, 4), diagonal=1).bool()

    def forward(self, x):
        return self.scores(x).masked_fill(self.mask, float("-inf"))


def test_masked_fill_with_the_mask_left_on_the_cpu_raises_cudas_error():
    """``masked_fill__cuda`` (aten/src/ATen/native/cuda/Indexing.cu) checks self and mask for one
    device."""
    model = _MaskNotABuffer().to("sim:0")
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "expected self and mask to be on the same device, but got mask on cpu and self on sim:0"
        ),
    ):
        model(torch.ones(4, 4, device="sim:0"))
    model.mask = model.mask.to("sim:0")
    assert model(torch.ones(4, 4, device="sim:0")).device == torch.device("sim:0")


def test_conjugate_and_negative_views_are_read_as_what_they_stand_for():
    """A conjugate view (``conj()``) and a negative one (``conj().imag``) hold a bit, not other
    values: an operator that reads them gives what the CPU gives (found by
    benchmarks/simdevice_ops.py: fft.hfftn differed)."""
    z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    there = z.to("sim:1").conj()
    assert torch.equal((there * 1).cpu(), z.conj() * 1)
    assert torch.allclose(torch.fft.fft(there).cpu(), torch.fft.fft(z.conj()))
    assert torch.equal(there.conj().cpu(), z) and torch.equal(
        (there.imag + 0).cpu(), z.conj().imag + 0
    )
    # torch.conj's docs: a view with the conjugate bit, which resolve_conj materializes (a tensor
    # without it)
    assert there.is_conj() and not there.resolve_conj().is_conj() and not there.conj().is_conj()
    assert (
        torch.equal(there.resolve_conj().cpu(), z.conj().resolve_conj())
        and there.resolve_neg() is there
    )


def test_fork_rng_for_the_device_gives_back_the_random_state_it_found():
    """``torch.random.fork_rng(device_type=...)`` saves and restores the device's generator through
    its device module (torch/random.py); the simulated device's random numbers come from the CPU's
    generator."""
    torch.manual_seed(0)
    first, second = torch.randn(3, device="sim:0"), torch.randn(3, device="sim:0")
    torch.manual_seed(0)
    assert torch.equal(torch.randn(3, device="sim:0").cpu(), first.cpu())
    with torch.random.fork_rng(devices=[0, 1], device_type="sim"):
        torch.randn(5, device="sim:1")
    assert torch.equal(torch.randn(3, device="sim:0").cpu(), second.cpu())


def test_pack_padded_sequence_with_lengths_on_the_device_raises_cudas_error():
    """``checkLongTensor`` (aten/src/ATen/native/PackedSequence.cpp) wants the lengths on the CPU on
    every device; on CUDA it reads "'lengths' argument should be a 1D CPU int64 tensor, but got 1D
    cuda:0 Long tensor" (a common public mistake)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    padded, lengths = torch.randn(3, 5, 4, device="sim:0"), torch.tensor([5, 3, 2])
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "'lengths' argument should be a 1D CPU int64 tensor, but got 1D sim:0 Long tensor"
        ),
    ):
        pack_padded_sequence(padded, lengths.to("sim:0"), batch_first=True)
    assert pack_padded_sequence(padded, lengths, batch_first=True).data.device == torch.device(
        "sim:0"
    )


def _train_with_optimizer_built_first(device, optimizer):
    torch.manual_seed(0)
    model = _Tied()
    # built on the CPU, before the move, as tutorials often do
    opt = optimizer(model.parameters(), lr=0.1)
    model.to(device)
    tokens = torch.randint(0, 7, (5,), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(4):
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits, tokens.roll(1).to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam], ids=lambda o: o.__name__)
def test_an_optimizer_built_before_the_move_trains_as_on_the_cpu(optimizer):
    cpu_losses, cpu_model = _train_with_optimizer_built_first("cpu", optimizer)
    losses, model = _train_with_optimizer_built_first("sim:1", optimizer)
    assert losses == cpu_losses
    assert losses[-1] < losses[0]
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in cpu_model.parameters()
    )
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach()), name


def test_load_state_dict_copies_in_place_as_on_cuda_while_ddp_holds_the_parameters(tmp_path):
    """Only moves swap parameters: loading copies into them, as on CUDA, so it works while
    DistributedDataParallel's reducer holds them (a swap refuses a tensor held elsewhere)."""
    import gc

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    model = None
    try:
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Linear(3, 2).to("sim:1"), device_ids=[1]
        )
        model(torch.ones(4, 3, device="sim:1")).sum().backward()
        weight = model.module.weight
        model.module.load_state_dict(
            {k: torch.full_like(v, 0.5).cpu() for k, v in model.module.state_dict().items()}
        )
        assert model.module.weight is weight and weight.tolist() == [[0.5] * 3] * 2
    finally:
        model = None  # before the group goes: see test_simdevice.py's collectives test
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "call, devices",
    [
        (lambda: torch.ones(2, 3, device="sim:1") + torch.ones(2, 3), "sim:1 and cpu"),
        (lambda: torch.ones(2, 3) + torch.ones(2, 3, device="sim:1"), "sim:1 and cpu"),
        (lambda: torch.ones(3).add_(torch.ones(3, device="sim:0")), "sim:0 and cpu"),
        (
            lambda: torch.addcmul(
                torch.ones(3), torch.ones(3, device="sim:1"), torch.ones(3, device="sim:0")
            ),
            "sim:1 and cpu",
        ),
        (lambda: torch.ones(2, device="sim:0") * torch.ones(2, device="sim:1"), "sim:0 and sim:1"),
    ],
    ids=["sim-first", "cpu-first", "cpu-in-place", "three-operands", "two-sims"],
)
def test_the_elementwise_error_names_the_first_device_that_is_not_the_cpu_first(call, devices):
    """TensorIterator takes the first operand not on the CPU as the common device and names it first
    (``TensorIteratorBase::compute_types`` in ``aten/src/ATen/TensorIterator.cpp``): ``cuda:0 and
    cpu`` in either operand order on CUDA."""
    with pytest.raises(RuntimeError) as info:
        call()
    assert str(info.value) == f"{SAME}but found at least two devices, {devices}!"


def _conv_error(
    weight_device, input_device, shape=(1, 3, 8, 8), groups=1, dtype=torch.float32, bias=True
):
    conv = torch.nn.Conv2d(3, 6, 3, groups=groups, bias=bias).to(device=weight_device, dtype=dtype)
    with pytest.raises(RuntimeError) as info:
        conv(torch.randn(shape, device=input_device))
    return str(info.value)


SMALL, LARGE = (1, 3, 8, 8), (8, 3, 32, 32)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["small", "large"])
def test_a_convolution_with_its_input_on_the_device_raises_cudas_errors(shape):
    """An input on a CUDA device takes cuDNN's path in ``_convolution`` whatever its size
    (``aten/src/ATen/native/Convolution.cpp``): ``check_input_same_type_as_parameters`` compares
    device types and dtypes, whose message PyTorch prints with ``torch.cuda.FloatTensor``
    (``processErrorMsgInplace`` in ``torch/csrc/Exceptions.cpp``); an input on another index then
    meets ``cudnn_convolution``'s generated device check; a depthwise convolution runs
    ``_conv_depthwise2d``, checked the same way."""
    assert (
        _conv_error("cpu", "sim:0", shape)
        == "Input type (torch.sim.FloatTensor) and weight type (torch.FloatTensor) should be the"
        " same"
    )
    assert (
        _conv_error("sim:0", "sim:1", shape)
        == "Expected all tensors to be on the same device, but got weight is on sim:0, different"
        " from other tensors on sim:1 (when checking argument in method"
        " wrapper_SIM__cudnn_convolution)"
    )
    assert (
        _conv_error("sim:0", "sim:1", shape, groups=3)
        == "Expected all tensors to be on the same device, but got weight is on sim:0, different"
        " from other tensors on sim:1 (when checking argument in method"
        " wrapper_SIM___conv_depthwise2d)"
    )
    assert (
        _conv_error("sim:1", "sim:1", shape, dtype=torch.float16, bias=False)
        == "Input type (torch.sim.FloatTensor) and weight type (torch.sim.HalfTensor) should be the"
        " same"
    )


def test_a_convolution_with_its_input_on_the_cpu_raises_what_cuda_raises_for_each_size():
    """With the input on the CPU, PyTorch picks the CPU's backend by the input's size
    (``use_mkldnn`` in ``aten/src/ATen/native/Convolution.cpp``), on a CUDA machine too: a large
    input goes to oneDNN, whose type check names ``torch.cuda.FloatTensor``; a small one to
    ``_slow_conv2d_forward``, whose CUDA wrapper checks devices. Both words are CUDA's, with
    ``sim``."""
    assert (
        _conv_error("sim:0", "cpu", LARGE)
        == "Input type (torch.FloatTensor) and weight type (torch.sim.FloatTensor) should be the"
        " same or input should be a MKLDNN tensor and weight is a dense tensor"
    )
    assert (
        _conv_error("sim:0", "cpu", SMALL)
        == "Expected all tensors to be on the same device, but got weight is on sim:0, different"
        " from other tensors on cpu (when checking argument in method"
        " wrapper_SIM___slow_conv2d_forward)"
    )


def test_type_names_and_parameters_print_as_cudas_do():
    assert torch.ones(2, device="sim:1").type() == "torch.sim.FloatTensor"
    weight = torch.nn.Linear(2, 2).to("sim:1").weight
    assert repr(weight).startswith("Parameter containing:\ntensor([[")
    assert repr(weight).endswith("]], device='sim:1', requires_grad=True)")


def _events_correct(fn, warmup=3, repeat=10):
    """The way PyTorch's documentation times device work: warm up, mark, run, mark, wait for the
    last mark."""
    for _ in range(warmup):
        fn()
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def _events_without_the_final_synchronize(fn, warmup=3, repeat=10):
    for _ in range(warmup):
        fn()
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    return start.elapsed_time(end) / repeat


def _events_counting_the_warmup(fn, warmup=3, repeat=10):
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    start.record()
    for _ in range(warmup + repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeat


def test_event_timing_measures_the_devices_time_and_the_two_classic_mistakes_show():
    """As on CUDA: events time the device's queue; ``elapsed_time`` before the last event has
    completed raises ``c10/core/impl/InlineEvent.h``'s message; a first call's one-off costs inflate
    a timing that counts it."""
    x = torch.randn(8, 8, device="sim:1")
    with torch.accelerator.device_index(1):
        assert torch.Event(enable_timing=True).device.type == "sim"
        # no queue outside asynchronous: the host's time
        assert 0 <= _events_correct(lambda: x @ x) < 50
        # and the first call of an operator in the block 0.2 s more
        with sim.asynchronous(kernel_s=0.02):
            correct = _events_correct(lambda: x @ x)
        with sim.asynchronous(kernel_s=0.02):
            counted = _events_counting_the_warmup(lambda: x @ x)
        with sim.asynchronous(kernel_s=0.02):
            with pytest.raises(
                RuntimeError, match="^Both events must be completed before calculating elapsed"
            ):
                _events_without_the_final_synchronize(lambda: x @ x)
    assert 19.99 <= correct < 30, correct
    # 13 calls, and the first call's one-off cost
    assert counted >= 0.999 * (20 * 13 / 10 + 200 / 10), counted


def test_events_check_what_cuda_checks():
    start, end = (
        torch.Event(device="sim:1", enable_timing=True),
        torch.Event(device="sim:1", enable_timing=True),
    )
    with pytest.raises(
        ValueError, match="Both events must be recorded before calculating elapsed time"
    ):
        start.elapsed_time(end)
    start.record()
    end.record(torch.accelerator.current_stream(1))
    assert start.query() and end.device == torch.device("sim", 1) and start.elapsed_time(end) >= 0
    with pytest.raises(
        ValueError, match="Both events must be created with argument 'enable_timing=True'"
    ):
        start.elapsed_time(torch.accelerator.current_stream(1).record_event())
    with pytest.raises(
        RuntimeError, match="Event device index 1 does not match recording stream's device index 0"
    ):
        start.record(torch.accelerator.current_stream(0))
    # other devices' events are PyTorch's own
    assert isinstance(torch.Event(device="cpu"), torch.Event)
    with pytest.raises(RuntimeError):
        torch.Event(device="cpu", enable_timing=True).record()


def test_streams_run_side_by_side_until_one_waits_for_the_other():
    """Work on two streams of a device overlaps; ``wait_stream`` orders it; a device synchronize
    waits for all."""
    import time

    x = torch.randn(8, 8, device="sim:1")
    side = torch.Stream(device="sim:1")
    default = torch.accelerator.current_stream(1)
    assert side != default and side.device == torch.device("sim", 1) and default.stream_id == 0
    with sim.asynchronous(kernel_s=0.05, first_call_s=0):
        begin = default.record_event(torch.Event(device="sim:1", enable_timing=True))
        with side:
            assert torch.accelerator.current_stream(1) == side
            for _ in range(4):
                x @ x
            x.record_stream(side)
        for _ in range(4):
            x @ x
        assert torch.accelerator.current_stream(1) == default and not side.query()
        side_done = side.record_event(torch.Event(device="sim:1", enable_timing=True))
        overlapped = default.record_event(torch.Event(device="sim:1", enable_timing=True))
        default.wait_stream(side)
        x @ x
        ordered = default.record_event(torch.Event(device="sim:1", enable_timing=True))
        start = time.perf_counter()
        torch.accelerator.synchronize(1)
        assert time.perf_counter() - start >= 0.199  # both streams' work
        assert side.query() and ordered.query()
    # four products each, side by side: not 400 ms
    assert 199.9 <= begin.elapsed_time(overlapped) < 300
    assert 199.9 <= begin.elapsed_time(side_done) < 300
    # after the side stream's work
    assert begin.elapsed_time(ordered) >= begin.elapsed_time(side_done) + 49.9


def test_a_non_blocking_copy_to_pinned_memory_arrives_only_when_the_program_waits():
    """02's race, shown deterministically: a ``non_blocking`` copy from the device into pinned host
    memory returns before the values arrive; they are there once the program synchronizes with the
    stream that copies. CUDA's ``_to_copy`` (aten/src/ATen/native/TensorConversions.cpp,
    ``pin_out``) makes the new tensor pinned; a copy into pageable memory completes before it
    returns, as cudaMemcpyAsync to pageable memory does."""
    x = torch.arange(1.0, 4.0, device="sim:1")
    with sim.asynchronous(kernel_s=0.001):
        early = x.to("cpu", non_blocking=True)
        # read too early: not arrived
        assert early.is_pinned() and early.tolist() == [0.0, 0.0, 0.0]
        torch.accelerator.synchronize(1)
        assert early.tolist() == [1.0, 2.0, 3.0]

        buffer = torch.full((3,), 7.0).pin_memory()
        buffer.copy_(x * 2, non_blocking=True)
        assert buffer.tolist() == [7.0, 7.0, 7.0]  # what the buffer held before
        torch.Event(device="sim:0").synchronize()  # another device's event: not this copy's stream
        assert buffer.tolist() == [7.0, 7.0, 7.0]
        done = torch.Event(device="sim:1")
        done.record()
        done.synchronize()
        assert buffer.tolist() == [2.0, 4.0, 6.0]

        pageable = torch.zeros(3)
        pageable.copy_(x * 3, non_blocking=True)
        assert pageable.tolist() == [3.0, 6.0, 9.0]
        late = x.to("cpu", non_blocking=True)
        x.cpu()  # a blocking copy on the same stream waits for the one before it
        assert late.tolist() == [1.0, 2.0, 3.0]
        last = (x * 5).to("cpu", non_blocking=True)
    assert last.tolist() == [5.0, 10.0, 15.0]  # leaving the block waits for every device
    # outside it operators finish before returning
    assert x.to("cpu", non_blocking=True).tolist() == [1.0, 2.0, 3.0]


def test_pinning_on_a_machine_without_an_accelerator_fails_as_there():
    """Hidden, as on the device matrix's CPU of a CPU-only machine, pinning raises PyTorch's own
    error for a machine without an accelerator (a real CPU-only torch raises it; nanoGPT's pull
    request 120 met it), and a DataLoader asked to pin warns and hands out ordinary batches; shown,
    pinning works as on a GPU machine."""
    if torch.cuda.is_available():
        pytest.skip("a machine with CUDA pins with CUDA")
    with sim.shown_as_accelerator(False):
        with pytest.raises(
            RuntimeError, match="^Cannot access accelerator device when none is available.$"
        ):
            torch.ones(2).pin_memory()
        with pytest.warns(UserWarning, match="no accelerator is found"):
            batch = next(
                iter(torch.utils.data.DataLoader(torch.arange(4.0), batch_size=2, pin_memory=True))
            )
        assert not batch.is_pinned()
    with sim.shown_as_accelerator(True):
        assert torch.ones(2).pin_memory().is_pinned()


def _on_sim(*shape):
    return torch.ones(shape, device="sim:0")


def _cpu_scalar():
    return torch.tensor(2.0)


TWO_DEVICES = f"{SAME}but found at least two devices, sim:0 and cpu!"
TOO_MANY = "Trying to pass too many CPU scalars to non-CPU kernel!"


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: _on_sim(3) + _cpu_scalar(), None),
        (lambda: torch.add(_cpu_scalar(), _on_sim(3)), None),
        (lambda: torch.atan2(_on_sim(3), _cpu_scalar()), None),
        (lambda: torch.eq(_cpu_scalar(), _on_sim(3)), None),
        (lambda: torch.add(_cpu_scalar(), _cpu_scalar(), out=_on_sim()), TOO_MANY),
        (lambda: torch.sin(_cpu_scalar(), out=_on_sim()), TWO_DEVICES),
        (lambda: _cpu_scalar().add_(_on_sim()), TWO_DEVICES),
        (lambda: torch.addcdiv(_on_sim(3), _on_sim(3), _cpu_scalar()), TWO_DEVICES),
        (lambda: torch.addcmul(_on_sim(3), _on_sim(3), _cpu_scalar()), None),
        (
            lambda: torch.addcmul(_cpu_scalar(), _on_sim(3), _on_sim(3)),
            (
                "CPU Scalar support for self argument is not supported when calling addcmul on sim"
                " tensors."
            ),
        ),
        (
            lambda: torch.addcmul(_on_sim(3), _cpu_scalar(), _on_sim(3)),
            (
                "CPU Scalar support for tensor1 argument is not supported when calling addcmul on"
                " sim tensors. However, CPU Scalar support for tensor2 is supported, please swap"
                " your tensor1 and tensor2 terms."
            ),
        ),
        (lambda: _on_sim(3).addcmul_(_cpu_scalar(), _cpu_scalar()), TOO_MANY),
        (lambda: torch.lerp(_on_sim(3), _on_sim(3), _cpu_scalar()), None),
        (
            lambda: torch.lerp(_on_sim(3), _cpu_scalar(), _on_sim(3)),
            "argument 2: expected a SIM device but found cpu",
        ),
        (lambda: torch.where(_on_sim(3) > 0, _cpu_scalar(), _cpu_scalar()), None),
        (lambda: torch.where(torch.tensor(True), _on_sim(3), _cpu_scalar()), None),
        (lambda: torch.sum(_on_sim(3), dim=0, out=_cpu_scalar()), TWO_DEVICES),
    ],
    ids=[
        "add",
        "add-cpu-first",
        "binary-float",
        "comparison",
        "two-into-binary",
        "unary-out",
        "in-place-into-cpu",
        "addcdiv",
        "addcmul-tensor2",
        "addcmul-self",
        "addcmul-tensor1",
        "addcmul-two",
        "lerp-weight",
        "lerp-end",
        "where-two",
        "where-condition",
        "reduction-out",
    ],
)
def test_a_0_dim_cpu_tensor_is_taken_where_cudas_tensoriterator_and_kernel_take_it(call, error):
    """TensorIterator takes one 0-dim CPU input when its builder allows CPU scalars (binary,
    binary-float and comparison builders, addcmul's and lerp's meta functions) and raises for a
    second one or for any in another op (``compute_types``, aten/src/ATen/TensorIterator.cpp);
    CUDA's addcmul and lerp kernels then take it only as tensor2 or weight
    (cuda/PointwiseOpsKernel.cu, cuda/Lerp.cu, whose ``gpu_kernel`` asserts in Loops.cuh), and
    ``where_self_out`` moves 0-dim CPU inputs to the device first (TensorCompare.cpp)."""
    if error is None:
        assert call().device == torch.device("sim:0")
    else:
        with pytest.raises(RuntimeError) as info:
            call()
        assert error in str(info.value)


def _cpu_kernel_answer(op) -> str | None:
    """What the installed torch's own CPU kernel for ``op`` (an ``out=`` overload) says when every
    tensor input is a 0-dim CPU tensor and the output is on the meta device: TensorIterator then
    takes meta as the common device and answers for its config ("too many" where it allows CPU
    scalars, "two devices" where not). None: no answer."""
    args = []
    for argument in op._schema.arguments:
        kind = str(argument.type)
        if argument.is_out:
            continue
        if kind == "Tensor":
            args.append(
                torch.tensor(True) if argument.name in ("condition", "mask") else torch.tensor(0.5)
            )
        elif kind == "Scalar" and not argument.has_default_value():
            args.append(1)
        elif not argument.has_default_value():
            return None
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if len(outs) != 1 or sum(isinstance(a, torch.Tensor) for a in args) < 2:
        return None
    try:
        op._op_dk(torch._C.DispatchKey.CPU, *args, **{outs[0]: torch.empty((), device="meta")})
    except Exception as error:  # noqa: BLE001 - any other error is no answer
        return (
            "too many"
            if TOO_MANY in str(error)
            else "two devices"
            if "at least two devices" in str(error)
            else None
        )
    return None


def test_the_ops_said_to_allow_a_cpu_scalar_are_those_tensoriterator_allows_in_this_torch():
    """The table of ``_iterrules`` is read from PyTorch's source; the installed torch's CPU kernels
    build the same TensorIterator configs as CUDA's (the meta functions are shared), so their
    answers check the table."""
    from simdevice._iterrules import ALLOW_CPU_SCALAR

    answers = {}
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.removeprefix("aten::").partition(".")
        if (
            name.startswith("aten::")
            and overload.endswith(("out", "_input", "OutTensor"))
            and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
        ):
            answer = _cpu_kernel_answer(getattr(getattr(torch.ops.aten, base), overload))
            if answer is not None:
                answers[base] = answer
    assert len(answers) >= 60
    assert {base for base, answer in answers.items() if answer == "too many"} <= ALLOW_CPU_SCALAR
    assert {
        base for base, answer in answers.items() if answer == "two devices"
    } & ALLOW_CPU_SCALAR == set()
    assert {"addcdiv", "where"} <= {
        base for base, answer in answers.items() if answer == "two devices"
    }


@pytest.mark.parametrize(
    "call",
    [
        lambda: _on_sim(3).fill_(_cpu_scalar()),
        lambda: _on_sim(3).masked_fill(_on_sim(3) > 0, _cpu_scalar()),
        lambda: _on_sim(3).index_fill_(0, torch.tensor([0], device="sim:0"), _cpu_scalar()),
        lambda: torch._foreach_mul([_on_sim(3)], _cpu_scalar())[0],
        lambda: torch._foreach_add([_on_sim(3)], [_cpu_scalar()])[0],
    ],
    ids=["fill_", "masked_fill", "index_fill_", "foreach-scalar-tensor", "foreach-list"],
)
def test_a_0_dim_value_on_the_cpu_is_read_as_a_number_and_foreach_runs_tensor_by_tensor(call):
    """fill_ (Fill.cpp), masked_fill__cuda (cuda/Indexing.cu) and index_fill_
    (TensorAdvancedIndexing.cpp) read a 0-dim value on another device with ``item()``; a foreach
    operator over two devices leaves CUDA's fast route (``_check_tensors_share_device_and_dtype``,
    ForeachUtils.h) for one ``add``/``mul`` per tensor."""
    assert call().device == torch.device("sim:0")


def test_a_foreach_operator_over_two_devices_raises_what_its_per_tensor_operator_raises():
    with pytest.raises(RuntimeError, match=re.escape(TWO_DEVICES)):
        torch._foreach_add([_on_sim(3)], [torch.ones(3)])


def test_masked_fill_of_a_cpu_tensor_with_the_mask_on_the_device_raises_cudas_kernel_error():
    """A device mask sends a CPU self to ``masked_fill__cuda`` too (found by
    benchmarks/simdevice_mismatch.py)."""
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "expected self and mask to be on the same device, but got mask on sim:0 and self on cpu"
        ),
    ):
        torch.ones(3).masked_fill(torch.ones(3, device="sim:0") > 0, 0.0)


def test_a_scatter_without_a_cuda_kernel_runs_its_composite_over_two_devices_as_cuda_does():
    """diagonal_scatter and select_scatter have a CompositeExplicitAutogradNonFunctional kernel and
    no CUDA one; torchgen generates no device check for composite kernels (``device_guard`` is for
    CUDA's keys, torchgen/gen.py), so CUDA clones self and copies src into it: the result is on
    self's device (found by benchmarks/simdevice_mismatch.py)."""
    out = torch.diagonal_scatter(torch.zeros(3, 3), torch.ones(3, device="sim:0"))
    assert out.device == torch.device("cpu") and torch.equal(out, torch.eye(3))
    out = torch.select_scatter(torch.zeros(2, 3, device="sim:0"), torch.ones(3), 0, 1)
    assert out.device == torch.device("sim:0") and out.cpu().sum().item() == 3.0


def test_an_index_put_value_of_0_dims_is_moved_to_self_from_any_device():
    """_index_put_impl_ (native/TensorAdvancedIndexing.cpp) moves a 0-dim value to self's device,
    whichever it is."""
    x = torch.zeros(3, device="sim:0")
    x[torch.tensor([0, 2], device="sim:0")] = torch.tensor(5.0, device="sim:1")
    x.index_put_((torch.tensor([1]),), torch.tensor(7.0), accumulate=True)
    assert x.device == torch.device("sim:0") and x.cpu().tolist() == [5.0, 7.0, 5.0]


NO_KERNEL = (
    "Could not run '{}' with arguments from the 'SIM' backend. This could be because the operator"
    " doesn't exist for this backend, or was omitted during the selective/custom build process (if"
    " using custom build)."
)


def _refusal(call) -> str:
    with pytest.raises(NotImplementedError) as info:
        call()
    return str(info.value)


def test_an_operator_cuda_has_no_kernel_for_is_refused_in_its_dispatchers_words():
    """``native_functions.yaml`` gives ``histogram`` and ``_histogramdd_bin_edges`` a CPU kernel
    alone, and PyTorch's OpInfo database lists no CUDA dtypes for ``histogram`` and
    ``histogramdd``: CUDA's dispatcher raises before any device check (``reportError``,
    ``aten/src/ATen/core/dispatch/OperatorEntry.cpp``), also with the bins on the CPU. ``histc``
    has a CUDA kernel and runs."""
    x = torch.tensor([0.0, 1.0, 2.0], device="sim:1")
    assert _refusal(lambda: torch.histogram(x, bins=2)).startswith(
        NO_KERNEL.format("aten::histogram.bin_ct")
    )
    for bins in (torch.tensor([0.0, 1.0, 2.0], device="sim:1"), torch.tensor([0.0, 1.0, 2.0])):
        assert _refusal(lambda: torch.histogram(x, bins)).startswith(
            NO_KERNEL.format("aten::histogram.bins_tensor")
        )
    assert _refusal(lambda: torch.histogramdd(x.reshape(3, 1), bins=[2])).startswith(
        NO_KERNEL.format("aten::_histogramdd_bin_edges")
    )
    assert torch.histc(x, bins=2).tolist() == [1.0, 2.0]


def test_inside_runs_cpu_only_operators_they_give_the_cpus_values():
    x = torch.tensor([0.0, 1.0, 2.0])
    with sim.runs_cpu_only_operators():
        with sim.runs_cpu_only_operators():
            pass
        hist, edges = torch.histogram(x.to("sim:0"), bins=2)
    assert hist.device == torch.device("sim:0") and hist.tolist() == [1.0, 2.0]
    assert edges.tolist() == torch.histogram(x, bins=2).bin_edges.tolist()
    with pytest.raises(NotImplementedError):
        torch.histogram(x.to("sim:0"), bins=2)
