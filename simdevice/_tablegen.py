"""Build the table of device checks that CUDA's generated wrappers make, and of the operators CUDA
has no kernel for (``device_checks.json``).

For each operator whose wrapper checks that its tensors share a device, the table holds the
wrapper's name and its checked arguments in order, from PyTorch's own code generator (``torchgen``)
run over the installed torch's ``native_functions.yaml``; the simulated device raises the same error
for the same argument. Run ``python -m simdevice._tablegen`` after changing the pinned torch; a test
compares the stored table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("device_checks.json")


def build() -> dict[str, object]:
    """Return the table for the installed torch.

    An operator not marked ``device_check: NoCheck`` in ``native_functions.yaml`` raises, from its
    wrapper::

        Expected all tensors to be on the same device, but got <arg> is on <device>,
        different from other tensors on <device> (when checking argument in method
        wrapper_CUDA_<name>)

    The table writes the wrapper's name with ``CUDA`` left as ``{}``, so any backend name fits. It
    also names the operators with a CUDA kernel (``cuda_kernels``, without overload), and the
    overloads with a CPU kernel but neither a CUDA nor a composite one (``cpu_only``), which CUDA's
    dispatcher refuses (``Could not run ... from the 'CUDA' backend``).
    """
    import torch
    import torchgen
    from torchgen.api.types import DispatcherSignature, NativeSignature
    from torchgen.gen import parse_native_yaml
    from torchgen.model import DeviceCheckType, DispatchKey

    native = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(
        os.path.join(native, "native_functions.yaml"), os.path.join(native, "tags.yaml")
    )
    cuda = parsed.backend_indices[DispatchKey.CUDA]
    cpu = parsed.backend_indices[DispatchKey.CPU]
    by_name = {f.func.name: f for f in parsed.native_functions}
    checks: dict[str, list[object]] = {}
    cuda_kernels: set[str] = set()
    cpu_only: list[str] = []
    for f in parsed.native_functions:
        kernel_owner = by_name[f.structured_delegate] if f.structured_delegate is not None else f
        if cuda.get_kernel(kernel_owner) is None:
            if cpu.get_kernel(kernel_owner) is not None and not _composite(f):
                cpu_only.append(str(f.func.name))
            continue
        cuda_kernels.add(str(f.func.name.name))
        if f.device_check == DeviceCheckType.NoCheck:
            continue
        # The two naming schemes of torchgen/dest/register_dispatch_key.py.
        if f.structured or f.structured_delegate is not None:
            method = NativeSignature(f.func, symint=False, prefix="wrapper_{}_").name()
        else:
            prefix = f"wrapper_{{}}_{f.func.name.overload_name}_"
            method = DispatcherSignature.from_schema(f.func, symint=False, prefix=prefix).name()
        arguments = list(f.func.arguments.out) + list(f.func.arguments.flat_positional)
        names = [a.name for a in arguments if a.type.is_tensor_like()]
        # One tensor cannot mix devices, one list of tensors can.
        if len(names) > 1 or any(
            a.type.is_list_like() for a in arguments if a.type.is_tensor_like()
        ):
            checks[str(f.func.name)] = [method, names]
    return {
        "torch": torch.__version__.split("+")[0],
        "checks": dict(sorted(checks.items())),
        "cuda_kernels": sorted(cuda_kernels),
        "cpu_only": sorted(cpu_only),
    }


def _composite(f) -> bool:
    """Whether a composite kernel serves ``f`` on every backend, CUDA included."""
    return (
        f.has_composite_implicit_autograd_kernel
        or f.has_composite_explicit_autograd_kernel
        or f.has_composite_explicit_autograd_non_functional_kernel
    )


def render(table: dict[str, object]) -> str:
    """The table as JSON, one operator a line, so a diff reads per operator."""
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table["checks"].items())
    kernels, cpu_only = json.dumps(table["cuda_kernels"]), json.dumps(table["cpu_only"])
    return (
        f'{{"torch": {json.dumps(table["torch"])}, "cuda_kernels": {kernels},\n'
        f'"cpu_only": {cpu_only},\n"checks": {{\n{rows}\n}}}}\n'
    )


def main() -> int:
    TABLE.write_text(render(build()))
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
