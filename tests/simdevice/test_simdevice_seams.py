"""The private parts of PyTorch that simdevice stands on, pinned.

The simulated device uses PyTorch's experimental Python backend for
PrivateUse1 and a few private functions. torch is pinned to one release;
each test here fails, saying what moved, when a new torch changes one of
them, before any lesson or grade can silently change.
"""

from __future__ import annotations

import inspect
import mmap
import os

import torch

from simdevice import _tablegen


def test_the_python_privateuse1_backend_is_there_with_the_arguments_used():
    from torch.utils import backend_registration

    setup = getattr(backend_registration, "_setup_privateuseone_for_python_backend", None)
    assert setup is not None, "torch no longer has _setup_privateuseone_for_python_backend"
    params = list(inspect.signature(setup).parameters)
    assert params == [
        "rename",
        "backend_module",
        "hook",
        "device_guard",
    ], f"its arguments changed: {params}"
    for name in (
        "DeviceGuard",
        "PrivateUse1Hooks",
        "register_python_privateuseone_hook",
        "register_python_privateuseone_device_guard",
    ):
        assert hasattr(torch._C._acc, name), f"torch._C._acc.{name} is gone"


def test_the_tensor_and_dispatch_hooks_used_are_there():
    assert hasattr(torch.Tensor, "_make_wrapper_subclass")
    assert hasattr(torch._C, "_disabled_torch_function_impl")
    assert hasattr(torch.library, "fallthrough_kernel")
    assert hasattr(torch._C.DispatchKey, "AutocastPrivateUse1")
    assert hasattr(torch.ops.aten.embedding.default, "_op_dk"), (
        "OpOverload._op_dk is gone (used to run composites)"
    )
    assert "tensor_contents" in inspect.signature(torch._tensor_str._str).parameters
    assert list(inspect.signature(torch._tensor_str._tensor_str).parameters) == ["self", "indent"]


def test_checkpoint_loading_still_goes_through_rebuild_tensor_and_the_package_registry():
    source = inspect.getsource(torch._utils._rebuild_tensor_v2)
    assert "_rebuild_tensor(storage, storage_offset, size, stride)" in source, (
        "_rebuild_tensor_v2 no longer calls _rebuild_tensor: loading onto sim must be rewired"
    )
    assert list(inspect.signature(torch._utils._rebuild_tensor).parameters) == [
        "storage",
        "storage_offset",
        "size",
        "stride",
    ]
    assert hasattr(torch.serialization, "register_package")
    assert "location_tag(storage)" in inspect.getsource(torch.serialization._save)


def test_the_device_check_table_matches_the_installed_torch():
    stored = _tablegen.TABLE.read_text()
    assert stored == _tablegen.render(_tablegen.build()), (
        "device_checks.json differs from what torchgen of the installed torch generates: "
        "run python -m simdevice._tablegen and review the diff"
    )


def test_the_error_templates_are_pytorchs_own():
    """The two same-device messages the simulated device writes, and the dispatcher's words for an
    operator without a kernel for the backend, are in libtorch, word for word."""
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for piece in (
            b"Expected all tensors to be on the same device, but got ",
            b", different from other tensors on ",
            b" (when checking argument in method ",
            b"Expected all tensors to be on the same device, but found at least two devices, ",
            b"Could not run '",
            b"' with arguments",
            b" from the '",
            b"' backend. This could be because the operator doesn't exist for this backend, or was"
            b" omitted during ",
            b"the selective/custom build process (if using custom build).",
        ):
            assert data.find(piece) != -1, f"{piece!r} is not in libtorch_cpu.so any more"


def test_a_python_device_guard_keeps_the_current_device_at_0():
    """Why the simulated device keeps its own current device and fills in the index of a bare
    ``sim``."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from torch.utils import backend_registration
        backend_registration._setup_privateuseone_for_python_backend("seam")
        torch._C._accelerator_setDeviceIndex(1)
        print(torch._C._accelerator_getDeviceIndex())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0"], (
        "a Python PrivateUse1 guard now keeps the index it is given: the simulated device could"
        f" leave the current device to PyTorch (printed {done.stdout!r})"
    )
