"""Run PyTorch's own operator database on the simulated device and the CPU; print how many ops
agree.

    python benchmarks/simdevice_ops.py [--ops N] [--samples K] [--write-page]

The oracle is PyTorch's OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``, in the wheel; it needs the
``expecttest`` package): each op's float32 sample inputs, its own way to call the op. For each op
and each of its first K samples, the op runs on the CPU and, with every tensor of the sample moved
to ``sim:0``, on the simulated device, both from the same random seed. An op *agrees* when every
sample gives the CPU's values (NaN where the CPU has NaN), or is *refused* when the device says in
its own words that it cannot run it (a ``NotImplementedError`` naming the simulated device); it
*fails* when it raises anything else (an error the CPU does not raise, a traceback from inside the
device's code) or gives other values. An op whose OpInfo lists no float32 for CUDA
(``op.supported_dtypes("cuda")``: ``histogram``) must be refused as CUDA's dispatcher refuses it
(*as on CUDA*); run, or refused so where CUDA runs it, it fails. A sample the CPU itself refuses is
left out. Prints the ops that agree, are refused and fail, of all, and each failing op with its
first difference;
``tests/simdevice/test_simdevice_ops.py`` runs every op over its first samples and fails on any op
that fails.
"""

from __future__ import annotations

import argparse
import warnings
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from page import WRITE_PAGE_HELP, write_row  # noqa: E402

OWN_WORDS = "simulated device"  # what every refusal of the device says (simdevice)
# how CUDA's dispatcher, and the device for an operator CUDA has no kernel for, begin their refusal
NO_KERNEL = "Could not run '"
# Ops whose result holds whatever memory held ("uninitialized data", torch.empty's docs): compared
# by shape and dtype only, on any device.
UNINITIALIZED = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
}
# Errors PyTorch raises for every device type when the sample's tensors all move to the device, as
# this sweep moves them: the op itself wants that argument on the CPU (the check is in the op, not
# in a backend). Ops that read their input's storage, not its elements: a move to any device copies
# the elements alone, so their results are compared only for an input that is the whole of its
# storage.
STORAGE_READERS = {"as_strided", "as_strided_copy", "as_strided_scatter"}
# TensorShape.cpp
CPU_ARGUMENTS = {"tensor_split": "tensor_split expected tensor_indices_or_sections to be on cpu"}


@dataclass
class Outcome:
    """One op's result: ``agrees``, ``as on CUDA``, ``refused`` or ``fails``, and what its first
    failing sample did."""

    name: str
    kind: str
    samples: int = 0
    detail: str = ""
    seconds: float = field(default=0.0, repr=False)


def _on(value, device: str):
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _host(value):
    return pytree.tree_map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, value)


def _same(cpu, there, values: bool = True) -> str:
    """ "" when the device's result is the CPU's (only its shapes and dtypes, without ``values``),
    else what differs."""
    left, right = pytree.tree_leaves(cpu), pytree.tree_leaves(_host(there))
    if len(left) != len(right):
        return f"{len(right)} results where the CPU gives {len(left)}"
    for a, b in zip(left, right):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"a {type(b).__name__} where the CPU gives a {type(a).__name__}"
        if isinstance(a, torch.Tensor):
            if (a.shape, a.dtype) != (b.shape, b.dtype):
                return f"{tuple(b.shape)} {b.dtype} where the CPU gives {tuple(a.shape)} {a.dtype}"
            if not values:
                continue
            try:
                torch.testing.assert_close(
                    b, a, equal_nan=True, rtol=1e-5, atol=1e-6, check_device=False
                )
            except AssertionError as error:
                return "other values: " + " ".join(str(error).split())[:160]
        elif a != b and not (a != a and b != b):  # NaN equals NaN here
            return f"{b!r} where the CPU gives {a!r}"
    return ""


def _whole_storage(tensor: torch.Tensor) -> bool:
    return (
        tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )


def run_op(op, samples: int) -> Outcome:
    """The outcome of ``op`` (an OpInfo) over its first ``samples`` float32 sample inputs."""
    began = time.perf_counter()
    outcome = Outcome(op.name, "agrees")
    # PyTorch's own word on CUDA: no float32 there, so CUDA refuses every sample
    on_cuda = torch.float32 in op.supported_dtypes("cuda")
    try:
        inputs = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples]
    except Exception as error:  # noqa: BLE001 - an op without float32 samples here: nothing to compare
        return Outcome(op.name, "no samples", detail=f"{type(error).__name__}")
    for sample in inputs:
        if op.name in STORAGE_READERS and not _whole_storage(sample.input):
            continue
        torch.manual_seed(0)
        try:
            expected = _host(op(sample.input, *sample.args, **sample.kwargs))
        except Exception:  # noqa: BLE001 - the CPU refuses this sample: nothing to compare
            continue
        try:
            moved = sample.transform(lambda v: v.to("sim:0") if isinstance(v, torch.Tensor) else v)
            torch.manual_seed(0)
            got = op(moved.input, *moved.args, **moved.kwargs)
        except NotImplementedError as error:
            said = " ".join(str(error).split())
            if said.startswith(NO_KERNEL) and OWN_WORDS in said:
                outcome.kind = "fails" if on_cuda else "as on CUDA"
                outcome.detail = "CUDA runs it (OpInfo), the device refused: " if on_cuda else ""
                outcome.detail += said[:160]
                break
            if OWN_WORDS in said:
                outcome.kind, outcome.detail = "refused", said[:160]
                break
            outcome.kind, outcome.detail = (
                "fails",
                f"NotImplementedError: {str(error).splitlines()[0][:160]}",
            )
            break
        except Exception as error:  # noqa: BLE001 - the CPU ran it: any error on the device is a difference
            if op.name in CPU_ARGUMENTS and str(error).startswith(CPU_ARGUMENTS[op.name]):
                outcome.samples += 1
                continue
            outcome.kind = "fails"
            outcome.detail = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
            break
        outcome.samples += 1
        differs = _same(expected, got, values=op.name not in UNINITIALIZED)
        if differs:
            outcome.kind, outcome.detail = "fails", differs
            break
    if outcome.kind == "agrees" and not outcome.samples:
        outcome.kind = "no samples"
    elif outcome.kind == "agrees" and not on_cuda:
        outcome.kind = "fails"
        outcome.detail = "ran, where OpInfo lists no float32 for CUDA and CUDA refuses it"
    outcome.seconds = time.perf_counter() - began
    return outcome


def op_database():
    """PyTorch's OpInfo database (its import takes seconds), float32 ops only."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if torch.float32 in op.dtypes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops", type=int, default=0, help="only the first N ops of the database (0: all)"
    )
    parser.add_argument(
        "--samples", type=int, default=4, help="sample inputs per op (default: %(default)s)"
    )
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args(argv)

    import simdevice as sim

    # the ops' own deprecation warnings, once per op: not this script's output
    warnings.simplefilter("ignore")
    sim.enable(2)
    ops = op_database()
    ops = ops[: args.ops] if args.ops else ops
    outcomes = [run_op(op, args.samples) for op in ops]
    counted = [o for o in outcomes if o.kind != "no samples"]
    by_kind = {
        kind: [o for o in counted if o.kind == kind]
        for kind in ("agrees", "as on CUDA", "refused", "fails")
    }
    for outcome in by_kind["fails"]:
        print(f"fails    {outcome.name}: {outcome.detail}")
    result = (
        f"{len(by_kind['agrees'])} of {len(counted)} ops of PyTorch's OpInfo database give the"
        f" CPU's values on sim:0 ({100 * len(by_kind['agrees']) / max(1, len(counted)):.1f}%),"
        f" {len(by_kind['as on CUDA'])} are refused as CUDA refuses them (no float32 for CUDA in"
        f" their OpInfo), {len(by_kind['refused'])} are refused in the device's words,"
        f" {len(by_kind['fails'])} fail; float32, at most {args.samples} samples each"
    )
    print(result)
    if args.write_page:
        write_row(__file__, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
