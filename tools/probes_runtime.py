"""Device-semantics probes on the runtime: module moves, pinned memory, streams and events,
checkpoints, and ``torch.accelerator`` and the device module. Each takes devices index 0 and 1 of
one accelerator type and returns a small JSON-able summary or raises; ``device_probes.py`` runs
them.
"""

from __future__ import annotations

import io
import weakref

import torch

from probe_registry import probe, where


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.decoder = torch.nn.Linear(3, 5)
        self.decoder.weight = self.embed.weight


# --- modules ---


@probe(two=True)
def module_to_after_forward_with_output_kept(d0, d1):
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    out = model(torch.ones(1, 3))
    model.to(d1)
    return [where(model.weight), model.weight is weight, where(out), out.requires_grad]


@probe()
def module_to_with_weakref_to_parameter(d0, d1):
    model = torch.nn.Linear(3, 2)
    held = weakref.ref(model.weight)
    model.to(d0)
    return [held() is model.weight, where(held())]


@probe(two=True)
def module_to_keeps_tied_weights(d0, d1):
    model = _Tied().to(d1)
    return [model.decoder.weight is model.embed.weight, where(model.embed.weight)]


@probe()
def module_to_then_dtype_keeps_parameters(d0, d1):
    model = torch.nn.Linear(2, 2)
    weight = model.weight
    model.to(d0).double().cpu()
    return [model.weight is weight, str(weight.dtype), where(weight)]


@probe(two=True)
def optimizer_built_before_the_move_updates(d0, d1):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to(d1)
    before = model.weight.detach().cpu().clone()
    model(torch.ones(1, 2, device=d1)).sum().backward()
    opt.step()
    return [
        opt.param_groups[0]["params"][0] is model.weight,
        not torch.equal(before, model.weight.detach().cpu()),
    ]


@probe(two=True)
def buffers_move_with_the_module(d0, d1):
    norm = torch.nn.BatchNorm1d(2).to(d1)
    return [where(norm.running_mean), where(norm.num_batches_tracked)]


@probe()
def forward_with_cpu_input_on_moved_module(d0, d1):
    return where(torch.nn.Linear(2, 2).to(d0)(torch.ones(1, 2)))


# --- pinned memory and non_blocking copies ---


@probe()
def pin_memory_is_pinned(d0, d1):
    return [torch.ones(2).is_pinned(), torch.ones(2).pin_memory().is_pinned()]


@probe()
def empty_with_pin_memory_flag(d0, d1):
    return torch.empty(2, pin_memory=True).is_pinned()


@probe()
def device_tensor_is_not_pinned(d0, d1):
    return torch.ones(2, device=d0).is_pinned()


@probe()
def pin_memory_of_a_device_tensor(d0, d1):
    return torch.ones(2, device=d0).pin_memory().is_pinned()


@probe(two=True)
def non_blocking_copy_to_the_device(d0, d1):
    got = torch.arange(3.0).pin_memory().to(d1, non_blocking=True)
    torch.accelerator.synchronize(torch.device(d1))
    return [where(got), got.cpu().tolist()]


@probe()
def non_blocking_copy_to_the_host(d0, d1):
    got = torch.arange(3.0, device=d0).to("cpu", non_blocking=True)
    torch.accelerator.synchronize()
    return [where(got), got.tolist()]


# --- streams and events ---


@probe(two=True)
def stream_on_index_1(d0, d1):
    stream = torch.Stream(device=d1)
    return [str(stream.device), stream.device_index]


@probe()
def event_elapsed_time(d0, d1):
    start, end = (
        torch.Event(device=d0, enable_timing=True),
        torch.Event(device=d0, enable_timing=True),
    )
    start.record()
    torch.ones(64, device=d0).sum()
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    return [type(elapsed).__name__, elapsed >= 0.0, end.query()]


@probe()
def event_elapsed_time_without_timing(d0, d1):
    start, end = torch.Event(device=d0), torch.Event(device=d0)
    start.record()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


@probe()
def event_elapsed_time_before_record(d0, d1):
    start, end = (
        torch.Event(device=d0, enable_timing=True),
        torch.Event(device=d0, enable_timing=True),
    )
    return start.elapsed_time(end)


@probe()
def stream_query_after_synchronize(d0, d1):
    stream = torch.Stream(device=d0)
    with stream:
        torch.ones(8, device=d0).sum()
    stream.synchronize()
    return stream.query()


@probe(two=True)
def current_stream_of_index_1(d0, d1):
    return str(torch.accelerator.current_stream(torch.device(d1)).device)


@probe()
def wait_stream_orders_work(d0, d1):
    side = torch.Stream(device=d0)
    main = torch.accelerator.current_stream(torch.device(d0))
    with side:
        made = torch.ones(4, device=d0) * 2
    main.wait_stream(side)
    return (made + 1).cpu().tolist()


# --- checkpoints ---


def _saved_on(device) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0, device=device)}, buffer)
    buffer.seek(0)
    return buffer


@probe(two=True)
def load_without_map_location(d0, d1):
    return where(torch.load(_saved_on(d1))["w"])


@probe(two=True)
def load_with_map_location_cpu(d0, d1):
    return where(torch.load(_saved_on(d1), map_location="cpu")["w"])


@probe(two=True)
def load_with_map_location_dict(d0, d1):
    return where(torch.load(_saved_on(d1), map_location={d1: d0})["w"])


@probe(two=True)
def load_with_map_location_device(d0, d1):
    return where(torch.load(_saved_on(d1), map_location=torch.device(d0))["w"])


@probe(two=True)
def load_with_map_location_lambda(d0, d1):
    return where(torch.load(_saved_on(d1), map_location=lambda storage, location: storage)["w"])


@probe()
def load_on_a_missing_index(d0, d1):
    kind = torch.device(d0).type
    return where(
        torch.load(_saved_on("cpu"), map_location=f"{kind}:{torch.accelerator.device_count() + 3}")[
            "w"
        ]
    )


@probe(two=True)
def load_state_dict_from_index_1_into_cpu_module(d0, d1):
    buffer = io.BytesIO()
    torch.save(torch.nn.Linear(2, 2).to(d1).state_dict(), buffer)
    buffer.seek(0)
    model = torch.nn.Linear(2, 2)
    model.load_state_dict(torch.load(buffer))
    return where(model.weight)


# --- torch.accelerator and the device module ---


@probe()
def accelerator_names_the_device_type(d0, d1):
    return [torch.accelerator.current_accelerator().type, torch.accelerator.is_available()]


@probe()
def accelerator_device_count_at_least_one(d0, d1):
    return torch.accelerator.device_count() >= 1


@probe(two=True)
def set_device_index_sets_where_bare_type_lands(d0, d1):
    kind = torch.device(d0).type
    previous = torch.accelerator.current_device_index()
    torch.accelerator.set_device_index(1)
    try:
        return [torch.accelerator.current_device_index(), where(torch.ones(1, device=kind))]
    finally:
        torch.accelerator.set_device_index(previous)


@probe(two=True)
def device_index_context(d0, d1):
    with torch.accelerator.device_index(1):
        inside = torch.accelerator.current_device_index()
    return [inside, torch.accelerator.current_device_index()]


@probe()
def accelerator_synchronize_returns_none(d0, d1):
    torch.ones(2, device=d0).sum()
    return torch.accelerator.synchronize() is None


@probe()
def accelerator_memory_allocated_counts(d0, d1):
    before = torch.accelerator.memory_allocated(0)
    held = torch.empty(1 << 18, device=d0)
    grew = torch.accelerator.memory_allocated(0) - before >= held.numel() * 4
    return grew


@probe()
def device_module_calls(d0, d1):
    module = torch.get_device_module(d0)
    return [
        module.is_available(),
        module.device_count() >= 1,
        module.current_device(),
        module.synchronize() is None,
        module is torch.get_device_module(torch.device(d0).type),
    ]


@probe()
def device_module_memory_allocated(d0, d1):
    module = torch.get_device_module(d0)
    held = torch.empty(1 << 16, device=d0)
    return module.memory_allocated(0) >= held.numel() * 4


@probe()
def autocast_matmul_dtype(d0, d1):
    kind = torch.device(d0).type
    with torch.autocast(kind):
        got = torch.ones(2, 2, device=d0) @ torch.ones(2, 2, device=d0)
    return str(got.dtype)


@probe()
def device_rng_state_is_a_cpu_byte_tensor(d0, d1):
    state = torch.get_device_module(d0).get_rng_state()
    return [where(state), str(state.dtype)]
