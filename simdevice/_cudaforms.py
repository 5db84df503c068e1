"""CUDA's error messages, as the simulated device must raise them.

It holds the table of device checks PyTorch generates for CUDA kernels (``device_checks.json``, from
``_tablegen``; :func:`wrapper_check`), and CUDA's words where they come from code the CPU never
runs: tensor type names (:func:`translate`) and convolution's checks (:func:`convolution_error`).
``_tensor`` raises them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from simdevice._state import NAME

_DATA = json.loads(Path(__file__).with_name("device_checks.json").read_text())
TABLE: dict[str, list] = _DATA["checks"]
# Operators (without overload) that have a CUDA kernel of their own.
CUDA_KERNELS = frozenset(_DATA["cuda_kernels"])
# Overloads ("histogram.bins_tensor") with a CPU kernel and no CUDA or composite kernel.
CPU_ONLY = frozenset(_DATA["cpu_only"])

SAME_DEVICE = "Expected all tensors to be on the same device, "
CONVOLUTIONS = frozenset({"convolution", "_convolution"})

_LEGACY = {
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.float64: "Double",
    torch.float32: "Float",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.int16: "Short",
    torch.float16: "Half",
}
_SIM_TYPE = re.compile(rf"\b{NAME}({'|'.join(_LEGACY.values())})Type\b")


def no_cuda_kernel(func) -> NotImplementedError:
    """What CUDA's dispatcher raises for an operator in :data:`CPU_ONLY`, before any check of its
    arguments (``reportError``, ``aten/src/ATen/core/dispatch/OperatorEntry.cpp``), with the
    simulated device's backend for CUDA's; the CPU kernel it has is not run."""
    overload = "" if func._overloadname == "default" else f".{func._overloadname}"
    return NotImplementedError(
        f"Could not run '{func._schema.name}{overload}' with arguments from the '{NAME.upper()}'"
        " backend. This could be because the operator doesn't exist for this backend, or was"
        " omitted during the selective/custom build process (if using custom build). The simulated"
        " device refuses it as CUDA does: CUDA has no kernel for it, only the CPU has."
    )


def translate(message: str) -> str:
    """``simFloatType`` in a message of PyTorch's C++ as ``torch.sim.FloatTensor``, as
    ``CUDAFloatType`` reads.

    PyTorch translates ``CUDAFloatType`` on its way to Python (``processErrorMsgInplace`` in
    ``torch/csrc/Exceptions.cpp``, for Byte, Char, Double, Float, Int, Long, Short and Half).
    """
    return _SIM_TYPE.sub(rf"torch.{NAME}.\1Tensor", message)


def type_name(tensor: torch.Tensor) -> str:
    """What PyTorch's messages call ``tensor``'s type: ``torch.FloatTensor``,
    ``torch.sim.HalfTensor``, ..."""
    on_cpu = tensor.device.type == "cpu"
    legacy = _LEGACY.get(tensor.dtype)
    if legacy is not None:
        return f"torch.{legacy}Tensor" if on_cpu else f"torch.{NAME}.{legacy}Tensor"
    scalar = tensor.type().rsplit(".", 1)[1][: -len("Tensor")]  # torch.BFloat16Tensor -> BFloat16
    return f"{'CPU' if on_cpu else NAME}{scalar}Type"


def wrapper_check(key: str, tensors: dict[str, torch.Tensor | None]) -> RuntimeError | None:
    """The error of CUDA's generated wrapper for operator ``key`` given its tensor arguments by
    name, or None."""
    method, names = TABLE[key]
    return first_mismatch(method, ((name, tensors.get(name)) for name in names))


def first_mismatch(method: str, named) -> RuntimeError | None:
    """The error of a generated wrapper (``method``, with ``{}`` for the backend) over its checked
    ``(argument, tensor)`` pairs in order (tensors that are None skipped): the first on another
    device than the first one's."""
    common = None
    for name, tensor in named:
        if tensor is None:
            continue
        if common is None:
            common = tensor.device
        elif tensor.device != common:
            return RuntimeError(
                f"{SAME_DEVICE}but got {name} is on {tensor.device}, different from other tensors"
                f" on {common} (when checking argument in method {method.format(NAME.upper())})"
            )
    return None


def convolution_error(args: tuple) -> RuntimeError | None:
    """What CUDA raises for ``convolution``/``_convolution`` with ``args`` when the input is on a
    CUDA device.

    ``_convolution`` (``aten/src/ATen/native/Convolution.cpp``) sends a CUDA input to cuDNN after
    ``check_input_same_type_as_parameters``, or, depthwise, to ``_conv_depthwise2d``; a simulated
    input would go to ``convolution_overrideable``, which no Python backend has.

    None when weight and bias match the input's device and dtype. Follows
    ``_convolution`` for a contiguous floating-point input: depthwise
    (groups equal to the input's channels) runs ``_conv_depthwise2d`` or
    ``conv_depthwise3d``, whose wrappers check devices; anything else checks
    device types and dtypes (not indices) and runs ``cudnn_convolution``,
    whose wrapper checks devices; a bias on another index then meets the
    output in ``add_``.
    """
    input, weight, bias = args[0], args[1], args[2]
    transposed, groups = args[6], args[8]
    if all(
        t is None or (t.device == input.device and t.dtype == input.dtype) for t in (weight, bias)
    ):
        return None
    if (
        not transposed
        and input.dim() in (3, 4, 5)
        and groups > 1
        and input.size(1) == groups
        and weight.size(0) % groups == 0
    ):
        key = "conv_depthwise3d" if input.dim() == 5 else "_conv_depthwise2d"
        return wrapper_check(key, {"self": input, "weight": weight, "bias": bias})
    for role, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None and (
            tensor.device.type != input.device.type or tensor.dtype != input.dtype
        ):
            return RuntimeError(
                f"Input type ({type_name(input)}) and {role} type ({type_name(tensor)}) should be"
                " the same"
            )
    key = "cudnn_convolution_transpose" if transposed else "cudnn_convolution"
    error = wrapper_check(key, {"self": input, "weight": weight})
    if error is None:
        error = RuntimeError(
            f"{SAME_DEVICE}but found at least two devices, {input.device} and {bias.device}!"
        )
    return error
