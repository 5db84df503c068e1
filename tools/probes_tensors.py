"""Device-semantics probes on tensors: factories, indexing, random numbers, host reads, copies,
mixing devices.

Each probe takes two devices of one accelerator type (index 0 and 1) and returns a small JSON-able
summary or raises; ``device_probes.py`` runs them and ``tests/simdevice/device_probes.json`` holds
CUDA's outcomes.
"""

from __future__ import annotations

import torch

from probe_registry import probe, where

# --- every new_* factory from a tensor on index 1 lands on index 1 ---


@probe(two=True)
def new_tensor_on_index_1(d0, d1):
    return where(torch.ones(2, device=d1).new_tensor([1.0, 2.0]))


@probe(two=True)
def new_empty_on_index_1(d0, d1):
    return where(torch.ones(2, device=d1).new_empty(3))


@probe(two=True)
def new_zeros_on_index_1(d0, d1):
    made = torch.ones(2, device=d1).new_zeros(3)
    return [where(made), made.cpu().tolist()]


@probe(two=True)
def new_ones_on_index_1(d0, d1):
    made = torch.ones(2, device=d1).new_ones(2)
    return [where(made), made.cpu().tolist()]


@probe(two=True)
def new_full_on_index_1(d0, d1):
    made = torch.ones(2, device=d1).new_full((2,), 3.0)
    return [where(made), made.cpu().tolist()]


@probe(two=True)
def new_with_data_on_index_1(d0, d1):
    return where(torch.ones(2, device=d1).new([1.0, 2.0]))


@probe(two=True)
def new_with_size_on_index_1(d0, d1):
    return where(torch.ones(2, device=d1).new(2, 3))


@probe(two=True)
def new_empty_strided_on_index_1(d0, d1):
    return where(torch.ones(2, device=d1).new_empty_strided((2,), (1,)))


@probe()
def new_tensor_keeps_dtype(d0, d1):
    return str(torch.ones(2, dtype=torch.float16, device=d0).new_tensor([1, 2]).dtype)


# --- indexing ---


@probe(two=True)
def device_tensor_indexed_with_cpu_indices(d0, d1):
    got = torch.arange(4.0, device=d1)[torch.tensor([0, 3])]
    return [where(got), got.cpu().tolist()]


@probe()
def cpu_tensor_indexed_with_device_indices(d0, d1):
    return where(torch.arange(4.0)[torch.tensor([0, 1], device=d0)])


@probe(two=True)
def device_indices_on_another_index(d0, d1):
    return where(torch.arange(4.0, device=d0)[torch.tensor([0, 1], device=d1)])


@probe()
def device_tensor_indexed_with_cpu_mask(d0, d1):
    got = torch.arange(4.0, device=d0)[torch.tensor([True, False, True, False])]
    return [where(got), got.cpu().tolist()]


@probe()
def index_select_with_cpu_index(d0, d1):
    return where(torch.arange(4.0, device=d0).index_select(0, torch.tensor([0, 1])))


@probe()
def indexed_with_0_dim_device_tensor(d0, d1):
    return torch.arange(4.0, device=d0)[torch.tensor(2, device=d0)].item()


@probe()
def embedding_with_cpu_token_ids(d0, d1):
    return where(torch.nn.Embedding(5, 2).to(d0)(torch.tensor([1, 2])))


# --- random numbers ---


@probe()
def randn_with_cpu_generator(d0, d1):
    return where(torch.randn(2, device=d0, generator=torch.Generator()))


@probe()
def generator_on_the_device(d0, d1):
    return str(torch.Generator(device=d0).device)


@probe()
def manual_seed_repeats_device_randoms(d0, d1):
    torch.manual_seed(3)
    first = torch.randn(4, device=d0).cpu()
    torch.manual_seed(3)
    return torch.equal(first, torch.randn(4, device=d0).cpu())


@probe(two=True)
def fork_rng_restores_the_device_state(d0, d1):
    kind = torch.device(d0).type
    torch.manual_seed(5)
    torch.randn(2, device=d1)
    expected = torch.randn(3, device=d1).cpu()
    torch.manual_seed(5)
    torch.randn(2, device=d1)
    with torch.random.fork_rng(devices=[0, 1], device_type=kind):
        torch.randn(7, device=d1)
    return torch.equal(torch.randn(3, device=d1).cpu(), expected)


# --- reading values on the host ---


@probe()
def numpy_of_a_device_tensor(d0, d1):
    return torch.ones(2, device=d0).numpy().tolist()


@probe()
def numpy_force_of_a_device_tensor(d0, d1):
    return torch.arange(3.0, device=d0, requires_grad=True).numpy(force=True).tolist()


@probe()
def numpy_array_of_a_device_tensor(d0, d1):
    import numpy as np  # here only: a GPU machine's torch may come without NumPy

    return np.asarray(torch.ones(2, device=d0)).tolist()


@probe()
def item_of_a_device_scalar(d0, d1):
    return torch.tensor(2.5, device=d0).item()


@probe()
def item_of_two_elements(d0, d1):
    return torch.ones(2, device=d0).item()


@probe(two=True)
def tolist_of_a_device_tensor(d0, d1):
    return torch.arange(4, device=d1).reshape(2, 2).tolist()


@probe()
def float_of_a_device_scalar(d0, d1):
    return float(torch.tensor(1.5, device=d0)) + int(torch.tensor(2, device=d0))


@probe()
def tensor_of_0_dim_device_tensors(d0, d1):
    made = torch.tensor([torch.tensor(1.0, device=d0), torch.tensor(2.0, device=d0)])
    return [where(made), made.tolist()]


@probe(two=True)
def tensor_of_0_dim_tensors_on_two_indices(d0, d1):
    made = torch.tensor([torch.tensor(1.0, device=d0), torch.tensor(2.0, device=d1)])
    return [where(made), made.tolist()]


@probe(two=True)
def as_tensor_of_a_device_tensor(d0, d1):
    return where(torch.as_tensor(torch.ones(2, device=d1)))


# --- copies between devices ---


@probe(two=True)
def copy_from_another_index(d0, d1):
    target = torch.zeros(2, device=d0)
    target.copy_(torch.tensor([1.0, 2.0], device=d1))
    return [where(target), target.cpu().tolist()]


@probe()
def copy_into_cpu_from_device(d0, d1):
    target = torch.zeros(2)
    target.copy_(torch.tensor([3.0, 4.0], device=d0))
    return target.tolist()


@probe(two=True)
def to_another_index(d0, d1):
    return where(torch.ones(2, device=d0).to(d1))


@probe()
def to_its_own_device_returns_itself(d0, d1):
    values = torch.ones(2, device=d0)
    return [values.to(d0) is values, values.to(d0, copy=True) is values]


@probe(two=True)
def get_device_of_index_1(d0, d1):
    return [torch.ones(1, device=d1).get_device(), torch.ones(1).get_device()]


@probe()
def bare_type_equals_indexed_device(d0, d1):
    kind = torch.device(d0).type
    return [
        torch.ones(1, device=kind).device.index,
        torch.device(kind) == torch.ones(1, device=kind).device,
    ]


# --- operators that mix devices ---


@probe(two=True)
def add_across_indices(d0, d1):
    return where(torch.ones(2, device=d0) + torch.ones(2, device=d1))


@probe()
def add_cpu_0_dim_tensor(d0, d1):
    return where(torch.ones(2, device=d0) + torch.tensor(1.0))


@probe()
def add_cpu_1_dim_tensor(d0, d1):
    return where(torch.ones(2, device=d0) + torch.ones(2))


@probe()
def mm_with_cpu_operand(d0, d1):
    return where(torch.ones(2, 2, device=d0) @ torch.ones(2, 2))


@probe()
def cat_with_a_cpu_tensor(d0, d1):
    return where(torch.cat([torch.ones(2, device=d0), torch.ones(2)]))


@probe()
def cross_entropy_with_cpu_targets(d0, d1):
    return torch.nn.functional.cross_entropy(
        torch.ones(2, 3, device=d0), torch.tensor([0, 1])
    ).item()


@probe()
def masked_fill_with_cpu_mask(d0, d1):
    return where(torch.ones(2, device=d0).masked_fill(torch.tensor([True, False]), 0.0))


@probe()
def promotion_int_device_with_cpu_0_dim_float(d0, d1):
    got = torch.ones(2, dtype=torch.int64, device=d0) + torch.tensor(1.5)
    return [where(got), str(got.dtype)]


@probe()
def promotion_float_device_with_cpu_0_dim_double(d0, d1):
    got = torch.ones(2, device=d0) * torch.tensor(2.0, dtype=torch.float64)
    return [where(got), str(got.dtype)]


@probe()
def promotion_device_0_dim_with_cpu_tensor(d0, d1):
    got = torch.tensor(2.0, device=d0) * torch.ones(2, dtype=torch.float16)
    return [where(got), str(got.dtype)]


@probe()
def where_with_cpu_python_scalar(d0, d1):
    values = torch.tensor([1.0, -1.0], device=d0)
    got = torch.where(values > 0, values, 0.0)
    return [where(got), got.cpu().tolist()]


@probe()
def where_with_cpu_0_dim_tensor(d0, d1):
    values = torch.tensor([1.0, -1.0], device=d0)
    got = torch.where(values > 0, values, torch.tensor(0.0))
    return [where(got), got.cpu().tolist()]


@probe()
def addcmul_with_cpu_0_dim_tensor(d0, d1):
    values = torch.ones(2, device=d0)
    return where(torch.addcmul(values, values, torch.tensor(2.0)))


# --- complex numbers and sparse layouts ---


@probe()
def conj_is_a_view_with_the_bit(d0, d1):
    z = torch.tensor([1 + 2j], device=d0)
    view = z.conj()
    return [view.is_conj(), view._is_view(), view.resolve_conj().cpu().imag.tolist()]


@probe()
def resolve_conj_clears_the_bit(d0, d1):
    resolved = torch.tensor([1 + 2j], device=d0).conj().resolve_conj()
    return [resolved.is_conj(), resolved.cpu().imag.tolist()]


@probe()
def view_as_real_on_the_device(d0, d1):
    got = torch.view_as_real(torch.tensor([1 + 2j], device=d0))
    return [where(got), list(got.shape), got.cpu().tolist()]


@probe()
def write_through_conjugate_view(d0, d1):
    z = torch.tensor([1 + 2j, 3 - 1j], device=d0)
    z.conj().mul_(2j)
    return [z.cpu().real.tolist(), z.cpu().imag.tolist()]


@probe()
def setitem_through_conjugate_view(d0, d1):
    z = torch.tensor([1 + 2j, 3 - 1j], device=d0)
    z.conj()[0] = 5 + 5j
    return [z.cpu().real.tolist(), z.cpu().imag.tolist()]


@probe()
def write_through_negative_view(d0, d1):
    z = torch.tensor([1 + 2j], device=d0)
    z.conj().imag.add_(1.0)
    return z.cpu().imag.tolist()


@probe()
def to_sparse_on_the_device(d0, d1):
    got = torch.tensor([0.0, 1.0], device=d0).to_sparse()
    return [where(got), str(got.layout)]


@probe()
def histogram_on_the_device(d0, d1):
    return torch.histogram(torch.tensor([0.0, 1.0, 2.0], device=d0), bins=2)


@probe()
def histc_on_the_device(d0, d1):
    got = torch.histc(torch.tensor([0.0, 1.0, 2.0], device=d0), bins=2)
    return [where(got), got.tolist()]


@probe()
def resize_grows_in_place(d0, d1):
    values = torch.ones(2, device=d0)
    values.resize_(6)
    return list(values.shape)


@probe()
def out_tensor_made_empty_grows(d0, d1):
    out = torch.empty(0, device=d0)
    torch.neg(torch.ones(3, device=d0), out=out)
    return [where(out), out.tolist()]


@probe()
def soft_margin_loss_with_cpu_target(d0, d1):
    return torch.nn.functional.soft_margin_loss(torch.zeros(2, device=d0), torch.ones(2))


@probe()
def data_ptr_is_an_address(d0, d1):
    return torch.ones(2, device=d0).data_ptr() != 0
