"""Call a few hundred aten operators on simulated tensors; the process must survive every one.

Run by tests/simdevice/test_simdevice.py in a subprocess: ``python tests/simdevice/simdevice_fuzz.py
SEED COUNT``. Arguments are made from each operator's schema (small float tensors on ``sim:1``, ints
1, floats 0.5, ...). Any Python exception is fine; a crash is not. Prints one line per operator
before calling it, so a crash names it.
"""

from __future__ import annotations

import random
import sys

import torch

import simdevice as sim


def _value(argument, device):
    kind = str(argument.type)
    if "Tensor" in kind and "[]" in kind:
        return [torch.rand(2, 3, device=device), torch.rand(2, 3, device=device)]
    if "Tensor" in kind:
        return torch.rand(2, 3, device=device)
    if kind.startswith("Optional") or kind.endswith("?"):
        return None
    if kind in ("int", "SymInt"):
        return 1
    if kind in ("float",):
        return 0.5
    if kind == "bool":
        return False
    if kind in ("List[int]", "List[SymInt]", "int[]", "SymInt[]"):
        return [1]
    if kind == "Scalar":
        return 1.0
    if kind == "ScalarType":
        return torch.float32
    if kind == "str":
        return "none"
    raise TypeError(kind)


def operators(seed: int, count: int) -> list:
    names = sorted(
        n.split("::", 1)[1]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::") and not n.split("::", 1)[1].startswith("_")
    )
    ops = []
    for name in names:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            ops.append(op)
    random.Random(seed).shuffle(ops)
    return ops[:count]


def main(seed: int, count: int) -> int:
    sim.enable(2)
    device = torch.device("sim", 1)
    raised = ran = 0
    for op in operators(seed, count):
        try:
            args = [_value(a, device) for a in op._schema.arguments if not a.kwarg_only]
        except TypeError:
            continue
        print(op, flush=True)
        try:
            op(*args)
            ran += 1
        except Exception:  # noqa: BLE001 - any Python error is an acceptable answer; only a crash is not
            raised += 1
    print(f"survived {ran + raised} operators: {ran} ran, {raised} raised", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
