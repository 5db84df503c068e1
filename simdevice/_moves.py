"""Module moves to and from the simulated device that keep each ``Parameter`` object, as CUDA's do.

:func:`apply_keeping_parameters` takes the place of ``torch.nn.Module._apply`` once the device is on
(:func:`simdevice.enable`); on a CPU-only machine it changes nothing for a module that never meets
the simulated device.
"""

from __future__ import annotations

import copyreg

import torch

from simdevice._tensor import SimTensor

_original_apply = torch.nn.Module._apply


def apply_keeping_parameters(self, fn, recurse=True):
    """``Module._apply`` (``to``, ``sim``, ``half`` ...) that keeps each ``Parameter`` object when a
    simulated device is involved, as CUDA's does."""
    future = torch.__future__
    # on already: the caller's choice, or an outer call's
    if future.get_swap_module_params_on_conversion():
        return _original_apply(self, fn, recurse)
    involved = any(type(t) is SimTensor for t in (*self.parameters(), *self.buffers()))
    if not involved:
        try:
            # the conversion's target, tried on nothing
            involved = type(fn(torch.empty(0))) is SimTensor
        except Exception:  # noqa: BLE001 - a function for other tensors: no simulated device involved
            involved = False
    if not involved:
        return _original_apply(self, fn, recurse)
    # CUDA keeps each Parameter object through a move by ``param.data = moved``; C++ refuses that
    # between a CPU tensor and a Python backend's (what _has_compatible_shallow_copy_type answers),
    # swapping does not. Only for these conversions: load_state_dict keeps copying in place, as on
    # CUDA.
    future.set_swap_module_params_on_conversion(True)
    swap, torch.utils.swap_tensors = torch.utils.swap_tensors, _swap_held
    try:
        return _original_apply(self, fn, recurse)
    finally:
        torch.utils.swap_tensors = swap
        future.set_swap_module_params_on_conversion(False)


def _swap_held(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """``torch.utils.swap_tensors`` for a move to or from the simulated device, also of a tensor
    something else holds: the autograd graph of a forward pass kept in a variable, or a weak
    reference.

    PyTorch's refuses those (``_apply(): Couldn't swap``), where CUDA's ``param.data = moved`` moves
    them. The holder keeps the tensor it held (the graph its CPU values), as after ``param.data =
    moved``; the Python object, the one a weak reference or an optimizer holds, gets the moved
    tensor.
    """
    if type(t1) is not SimTensor and type(t2) is not SimTensor:
        return _original_swap(t1, t2)
    # a graph made before the move accumulates into what it held: refused
    if t1.requires_grad and t1.is_leaf:
        torch.autograd.graph.get_gradient_edge(t1).node.register_prehook(_moved_since)
    slots = set(copyreg._slotnames(t1.__class__)) | set(copyreg._slotnames(t2.__class__))
    t1.__class__, t2.__class__ = t2.__class__, t1.__class__
    t1.__dict__, t2.__dict__ = t2.__dict__, t1.__dict__
    for slot in slots:
        first, second = getattr(t1, slot, _missing), getattr(t2, slot, _missing)
        for tensor, value in ((t1, second), (t2, first)):
            if value is _missing:
                if hasattr(tensor, slot):
                    delattr(tensor, slot)
            else:
                setattr(tensor, slot, value)
    torch._C._swap_tensor_impl(t1, t2)


def _moved_since(_grads):
    raise RuntimeError(
        "backward through a graph made before its module's parameters moved to or from the"
        " simulated device: run the forward pass again after the move (PyTorch says the same of a"
        " module whose parameters it swapped,"
        " torch.__future__.set_swap_module_params_on_conversion)"
    )


_original_swap = torch.utils.swap_tensors
_missing = object()
