"""Where an operator on the simulated device mixes devices, the error CUDA would raise, in PyTorch's
own words: :func:`check_devices`, called by :func:`simdevice._tensor.run` before every operator runs
on the CPU values."""

from __future__ import annotations

import torch

from simdevice import _cudaforms, _iterrules, _opchecks
from simdevice._cudaforms import CONVOLUTIONS, CPU_ONLY, CUDA_KERNELS
from simdevice._state import state
from simdevice._cudaforms import TABLE as _TABLE

# Operators that move data between devices (or only look at metadata): no check.
_TRANSFERS = frozenset(
    {
        "_to_copy",
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "set_",
        "lift_fresh",
        "lift_fresh_copy",
        "_has_compatible_shallow_copy_type",
        "is_same_size",
        "_pin_memory",
        "is_pinned",
        "_to_cpu",
        "detach",
        "alias",
    }
)

# Composite kernels have no generated device check (torchgen gives one to CUDA's own kernels only)
_COMPOSITES = tuple(
    getattr(torch._C.DispatchKey, name)
    for name in (
        "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional",
        "CompositeImplicitAutograd",
    )
)


_plans: dict[object, tuple] = {}


def _plan(func) -> tuple:
    plan = _plans.get(func)
    if plan is None:
        schema = func._schema
        name = schema.name.split("::", 1)[-1]
        key = name if func._overloadname == "default" else f"{name}.{func._overloadname}"
        entry = _TABLE.get(key)
        positions = {a.name: i for i, a in enumerate(schema.arguments) if not a.kwarg_only}
        checked = None if entry is None else [(n, positions.get(n)) for n in entry[1]]
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        plan = (name, entry[0] if entry else None, checked, writes, key in CPU_ONLY)
        _plans[func] = plan
    return plan


def _checked_tensors(checked, args: tuple, kwargs: dict):
    """(argument, tensor) of each tensor a generated check looks at, in its order (a list's tensors
    each)."""
    for arg, position in checked:
        value = kwargs.get(arg) if position is None or position >= len(args) else args[position]
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor):
                yield arg, tensor


def check_devices(func, args: tuple, kwargs: dict):
    """Raise PyTorch's same-device error where CUDA would raise it for ``func``; for an operator
    CUDA has no kernel for (``CPU_ONLY``), on one device or two, its dispatcher's error.

    Operators with a CUDA kernel that PyTorch generates a device check for raise ``... but got <arg>
    is on <device>, different from other tensors on <device> (when checking argument in method
    wrapper_<BACKEND>_<name>)``, checking the arguments in the generated order. Operators without it
    (elementwise ones go through TensorIterator) raise what ``_iterrules`` gives: ``... but found at
    least two devices, <a> and <b>!``, where ``<a>`` is the first device that is not the CPU, or a
    CPU scalar's error. Convolutions raise what CUDA's convolution raises (see ``_cudaforms``); some
    operators' own checks come first (``_opchecks``). Returns a composite dispatch key when an
    operator that CUDA would run as a composite of others mixes devices: the caller then runs the
    composite, whose parts raise what they raise on CUDA.
    """
    name, method, checked, _, cpu_only = _plan(func)
    # CUDA's dispatcher finds no kernel before any kernel checks a device
    if cpu_only and not state["cpu_only_runs"]:
        raise _cudaforms.no_cuda_kernel(func)
    if name in _TRANSFERS:
        return None
    # no device rule can raise: its own may
    if name not in CONVOLUTIONS and _iterrules.one_device(args, kwargs):
        return _opchecks.own_checks(name, func, args, kwargs)
    if checked is not None:
        error = _cudaforms.first_mismatch(method, _checked_tensors(checked, args, kwargs))
        if error is not None:
            raise error
        return None
    from simdevice._tensor import SimTensor  # here: _tensor imports this module as it loads

    if name in CONVOLUTIONS and type(args[0]) is SimTensor:
        error = _cudaforms.convolution_error(args)
        if error is not None:
            raise error
        return None
    _opchecks.own_checks(name, func, args, kwargs)
    error = _iterrules.error(name, func, args, kwargs)
    if error is not None:
        # a foreach operator over tensors on two devices runs one tensor at a time on CUDA, as its
        # composite does (the fast route wants one device: _check_tensors_share_device_and_dtype,
        # native/ForeachUtils.h)
        if name not in CUDA_KERNELS or name.startswith("_foreach_"):
            for key in _COMPOSITES:
                if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key):
                    return key
        raise error
    return None
