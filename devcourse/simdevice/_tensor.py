"""The tensor type of the simulated device, and what happens to each operator.

A tensor on ``sim:N`` is a :class:`SimTensor`: a ``torch.Tensor`` subclass
(PyTorch's "wrapper subclass", the way out-of-tree devices are prototyped in
Python) whose device is ``sim:N`` and whose values live in a plain CPU tensor
inside it. Autograd, ``nn.Module``, optimizers and ``torch.save`` see an
ordinary tensor on another device. Every operator on such tensors comes to
:meth:`SimTensor.__torch_dispatch__`, which

1. checks devices the way CUDA would (:func:`check_devices`) and raises
   PyTorch's own message for the operator, with ``cuda`` read as the
   simulated device's name;
2. runs the operator on the CPU values;
3. puts the results on the device the operator would have put them on.

Random numbers on the simulated device come from the CPU generator, so
``torch.manual_seed`` seeds them; a real GPU has a generator of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from devcourse.simdevice import _memory

_DATA = json.loads(Path(__file__).with_name("device_checks.json").read_text())
_TABLE: dict[str, list] = _DATA["checks"]
# Operators (without overload) that have a CUDA kernel of their own.
_CUDA_KERNELS = frozenset(_DATA["cuda_kernels"])

# Operators that move data between devices (or only look at metadata): no check.
_TRANSFERS = frozenset(
    {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "set_", "lift_fresh",
     "lift_fresh_copy", "_has_compatible_shallow_copy_type", "is_same_size", "_pin_memory",
     "is_pinned", "_to_cpu", "detach", "alias"}
)
# Operators whose index tensors may stay on the CPU, as on CUDA (``x[cpu_index]``).
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"})

_SAME_DEVICE = "Expected all tensors to be on the same device, "


class SimTensor(torch.Tensor):
    """A tensor on a simulated device; its values are the CPU tensor ``_values``."""

    _values: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, values: torch.Tensor, device: torch.device, requires_grad: bool = False):
        tensor = torch.Tensor._make_wrapper_subclass(
            cls, values.size(), strides=values.stride(), storage_offset=values.storage_offset(),
            dtype=values.dtype, layout=values.layout, device=device, requires_grad=requires_grad,
        )
        tensor._values = values
        _memory.hold(tensor, device.index, values.untyped_storage(), device.type)
        return tensor

    def __repr__(self, *, tensor_contents=None):
        # PyTorch's own printer, fed the values (it cannot read them through a subclass).
        contents = torch._tensor_str._tensor_str(self._values.detach(), len("tensor("))
        text = torch._tensor_str._str(self, tensor_contents=contents)
        # Printed as CUDA tensors are: tensor(..., device='sim:0').
        return "tensor(" + text[len(type(self).__name__) + 1 :]

    def tolist(self):
        return self._values.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __format__(self, spec):
        # torch.Tensor formats 0-dim tensors by value only when its type is exactly Tensor.
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, protocol):
        # Pickle exactly as a CPU tensor would, from the CPU values, so that
        # torch.save writes a normal checkpoint; the storage is tagged with
        # this tensor's device by the serialization hooks (see _backend).
        from devcourse.simdevice import _backend

        _backend.tag_storage(self._values.untyped_storage(), self.device)
        rebuild, args = self._values.__reduce_ex__(protocol)
        args = list(args)
        args[4] = self.requires_grad  # _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, ...)
        return rebuild, tuple(args)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if check_devices(func, args, kwargs) == "decompose":
            return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
        return run(func, args, kwargs)


def run(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the CPU values and place its results like a device would."""
    from devcourse.simdevice import _backend

    target = None
    inputs: dict[int, SimTensor] = {}

    def unwrap(x):
        nonlocal target
        if isinstance(x, SimTensor):
            inputs[id(x._values)] = x
            if target is None:
                target = x.device
            return x._values
        return x

    args, kwargs = tree_map(unwrap, (args, kwargs))
    if "device" in kwargs and kwargs["device"] is not None:
        target = torch.device(kwargs["device"])
        if target.type == _backend.name():
            target = _backend.resolve(target)
            kwargs["device"] = torch.device("cpu")
    if "pin_memory" in kwargs:
        kwargs["pin_memory"] = False
    try:
        out = func(*args, **kwargs)
    except NotImplementedError as exc:
        raise NotImplementedError(
            f"the simulated device cannot run {func}: it runs each operator with PyTorch's CPU kernel, "
            f"and the CPU has none for it ({exc.args[0].splitlines()[0] if exc.args else exc})"
        ) from None
    if target is None or target.type != _backend.name():
        return out

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, SimTensor):
            same = inputs.get(id(x))
            if same is not None and same._values is x and same.device == target:
                return same  # in-place and out= operators return their argument
            return SimTensor(x, target)
        return x

    return tree_map(wrap, out)


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
        plan = (name, entry[0] if entry else None, checked)
        _plans[func] = plan
    return plan


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def check_devices(func, args: tuple, kwargs: dict) -> str | None:
    """Raise PyTorch's same-device error where CUDA would raise it for ``func``.

    Operators with a CUDA kernel that PyTorch generates a device check for
    raise ``... but got <arg> is on <device>, different from other tensors on
    <device> (when checking argument in method wrapper_<BACKEND>_<name>)``,
    checking the arguments in the generated order. Operators without it
    (elementwise ones go through TensorIterator) raise ``... but found at
    least two devices, <a> and <b>!``, where a 0-dim CPU tensor is allowed,
    as CUDA allows it. Returns ``"decompose"`` when an operator that CUDA
    would run as a composite of others mixes devices: the caller then runs
    the composite, whose parts raise what they raise on CUDA.
    """
    from devcourse.simdevice import _backend

    name, method, checked = _plan(func)
    if name in _TRANSFERS:
        return None
    if checked is not None:
        common = None
        for arg, position in checked:
            value = kwargs.get(arg) if position is None or position >= len(args) else args[position]
            for tensor in _tensors(value):
                if common is None:
                    common = tensor.device
                elif tensor.device != common:
                    raise RuntimeError(
                        f"{_SAME_DEVICE}but got {arg} is on {tensor.device}, different from other "
                        f"tensors on {common} (when checking argument in method "
                        f"{method.format(_backend.name().upper())})"
                    )
        return None
    if name in _INDEXING:  # index tensors are exempt; check self and values only
        flat = [args[0]] + [a for a in args[2:] if isinstance(a, torch.Tensor)]
    else:
        flat = [t for t in tree_flatten((kwargs.get("out"), args, kwargs))[0] if isinstance(t, torch.Tensor)]
    common = None
    for tensor in flat:
        if not isinstance(tensor, torch.Tensor):
            continue
        device = tensor.device
        if device.type == "cpu" and tensor.dim() == 0:
            continue
        if common is None:
            common = device
        elif device != common:
            if _plan(func)[0] not in _CUDA_KERNELS and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeExplicitAutograd"
            ):
                return "decompose"
            raise RuntimeError(f"{_SAME_DEVICE}but found at least two devices, {common} and {device}!")
    return None
