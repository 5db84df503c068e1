"""Which device a lesson runs on.

Notebooks never write a bare ``"cuda"``: they ask :func:`best_device`, so the
same cell runs on a laptop, a CUDA box, a Mac and CI.
"""

from __future__ import annotations

import torch

from simdevice import NAME as _SIMULATED

# Accelerators asked for by name where ``torch.accelerator`` is missing (torch
# before 2.6) or answers for the course's simulated device, which takes its
# place while it is on.
_BY_NAME = ("cuda", "xpu", "mps")


def best_device() -> torch.device:
    """Return the fastest device this machine has, with its index.

    The current device of the machine's accelerator as ``torch.accelerator``
    reports it (``cuda:0`` on a CUDA machine, ``mps:0`` on Apple silicon,
    ``xpu:0`` on an Intel GPU), else ``cpu``. The index is always there, so
    the result equals the ``.device`` of a tensor created on it (``mps`` and
    ``mps:0`` are not equal). The course's simulated accelerator never
    counts: it is no faster than the CPU. On a CPU-only machine it returns
    ``torch.device('cpu')``, simulated device on or off; it never returns a
    device that cannot hold a tensor here.

    Introduced in 00_environment.
    """
    accelerator = hardware_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator, _current_index(accelerator))


def hardware_accelerator() -> str | None:
    """The device type of this machine's accelerator (``"cuda"``, ``"mps"``, ``"xpu"`` ...), or
    ``None``.

    Asks ``torch.accelerator`` first; by name (CUDA, XPU, MPS) where it is
    missing or names the simulated device. ``None`` on a CPU-only machine.
    """
    api = getattr(torch, "accelerator", None)
    if api is not None:
        current = api.current_accelerator()
        if current is not None and current.type != _SIMULATED:
            return current.type if api.is_available() else None
    for name in _BY_NAME:
        if name == "mps":
            backend = getattr(torch.backends, "mps", None)
            available = backend is not None and backend.is_available()
        else:
            module = getattr(torch, name, None)
            available = module is not None and module.is_available()
        if available:
            return name
    return None


def accelerator_or_simulated(index: int = 1) -> torch.device:
    """A device that is not the CPU: the machine's own accelerator where it has one, else
    ``sim:index``.

    On a CPU-only machine it turns the simulated accelerator on, as the
    grader's device matrix does (:func:`devcourse.stand_ins.simulated_devices`),
    shows it to ``torch.accelerator`` from then on (the matrix alone leaves it
    hidden, see :func:`simdevice.show`), and returns ``sim:index``
    (0 or 1). On a machine with CUDA, an Apple GPU
    (MPS) or an Intel GPU it returns :func:`best_device` and leaves the
    simulated accelerator off: turned on beside a real accelerator, it becomes
    PyTorch's accelerator for the rest of the process (PyTorch's
    ``DeviceAccelerator.cpp``), and every backward pass through CUDA then fails
    inside PyTorch's autograd engine (``docs/gpu-report.md``;
    pytorch/pytorch#161129). MPS
    and XPU go through the same choice of accelerator; that they fail alike
    was not run.

    Introduced in 06_mixed_precision.
    """
    if hardware_accelerator() is not None:
        return best_device()
    import simdevice
    from devcourse.stand_ins import simulated_devices

    devices = simulated_devices()
    simdevice.show()  # the lesson's accelerator from now on, as torch.accelerator names it
    return devices[index]


def _current_index(accelerator: str) -> int:
    api = getattr(torch, "accelerator", None)
    current = api.current_accelerator() if api is not None else None
    if current is not None and current.type == accelerator:
        return api.current_device_index()
    if accelerator == "mps":
        return 0  # one MPS device
    return getattr(torch, accelerator).current_device()


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` name the same device once an index is filled in.

    ``torch.device("mps") != torch.device("mps:0")``, though tensors on
    either sit on ``mps:0``; this compares the type and the index, taking
    the current device of that type for a missing one. On a CPU-only machine
    ``cpu`` equals ``cpu`` and nothing else; a missing index of an
    accelerator type the machine lacks is read as 0.
    """
    return _resolved(torch.device(a)) == _resolved(torch.device(b))


def _resolved(device: torch.device) -> torch.device:
    if device.type == "cpu":
        return torch.device("cpu")  # one CPU device, "cpu" and "cpu:0" alike
    if device.index is not None:
        return device
    try:
        index = _current_index(device.type)
    except (AttributeError, RuntimeError, AssertionError):
        index = 0
    return torch.device(device.type, index)
