"""Run PyTorch's OpInfo samples with one tensor left on the CPU and the others on sim:0; print how
many ops raise or run as CUDA's same-device rules predict.

    python benchmarks/simdevice_mismatch.py [--ops N] [--samples K] [--only NAME ...] [--write-page]

For each op's first K float32 samples (those of ``benchmarks/simdevice_ops.py``) and each tensor of
a sample in turn, that tensor stays on the CPU and the others move to ``sim:0``; a tensor of more
than 0 dimensions is tried a second time as a 0-dim tensor of its first element, where the CPU runs
the sample so. A dispatch mode watches every aten operator of the run: :func:`predict` says from
CUDA's rules (each cited beside it) whether CUDA would raise there, and with which message, or runs
an operator without a CUDA kernel as its composite. The device must raise that message at that
operator, or run it; a run the rules let through must give the CPU's values. A RuntimeError about
devices raised between operators comes from a composite's own check (multi_dot's, meshgrid's), code
above every backend that CUDA runs alike, and is taken as CUDA's. An op *agrees* when every variant
does; it is *not predicted* when a run reaches an operator the rules here cannot judge
(``_pack_padded_sequence``'s own checks) or the device refuses it in its own words; else it
*differs*. An operator with a CPU kernel and no CUDA or composite one is refused by CUDA's
dispatcher, on one device or two. The rules are written here, not taken from the device's check;
their data (which operators' TensorIterator allows a CPU scalar, the generated checks' table) are
the device's, each checked against PyTorch by a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from page import WRITE_PAGE_HELP, write_row  # noqa: E402
from simdevice_ops import CPU_ARGUMENTS, OWN_WORDS, UNINITIALIZED, _same, op_database  # noqa: E402

SAME = "Expected all tensors to be on the same device, "
TOO_MANY = "Trying to pass too many CPU scalars to non-CPU kernel!"
BACKEND = "SIM"  # CUDA's words read for the simulated device: wrapper_CUDA_add as wrapper_SIM_add

# Operators that move data between devices or read metadata only: no device check on CUDA either
# (copy_ between devices is a copy: copy_impl, aten/src/ATen/native/Copy.cpp).
TRANSFERS = {
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
    "_local_scalar_dense",
    "item",
}
# No generated device check in a composite kernel: torchgen gives one to CUDA's own kernels only
# (torchgen/gen.py)
COMPOSITES = tuple(
    getattr(torch._C.DispatchKey, name)
    for name in (
        "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional",
        "CompositeImplicitAutograd",
    )
)
# resize_as_ grows a 0-dim self to its template's size: the new elements hold whatever memory held,
# on any device.
SHAPE_ONLY = UNINITIALIZED | {"resize_as_"}
INDEXING = {
    "index",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "_unsafe_index",
    "_unsafe_index_put",
}
# Checks the rules here do not model: what CUDA raises for them is left unpredicted.
UNMODELLED = {"_pack_padded_sequence"}
CONVOLUTIONS = {"convolution", "_convolution"}
# ConvBackend::Mkldnn and the next in ATen/native/ConvUtils.h's enum, MkldnnTranspose, which
# torch._C._ConvBackend leaves without a name
ONEDNN = {int(torch._C._ConvBackend.Mkldnn), int(torch._C._ConvBackend.Mkldnn) + 1}
# legacy type names, as Tensor::toString writes them (torch.FloatTensor, torch.cuda.FloatTensor)
_LEGACY = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half"}


def _device_data():
    """The generated wrappers' checks (from torchgen, ``device_checks.json``) and which operators'
    TensorIterator takes a CPU scalar, with the CUDA kernels that assert on one
    (``simdevice._iterrules``)."""
    import simdevice as sim
    from simdevice import _iterrules

    data = json.loads(Path(sim.__file__).with_name("device_checks.json").read_text())
    return (
        data["checks"],
        frozenset(data["cuda_kernels"]),
        frozenset(data["cpu_only"]),
        _iterrules.ALLOW_CPU_SCALAR,
        _iterrules.ASSERTING,
    )


CHECKS, CUDA_KERNELS, CPU_ONLY, ALLOW, ASSERTING = _device_data()


@dataclass(frozen=True)
class Raises:
    message: str
    # the error's text begins with the message (what follows it is not predicted)
    prefix: bool = False

    def said(self, text: str) -> bool:
        return text.startswith(self.message) if self.prefix else text == self.message


@dataclass(frozen=True)
class Unpredicted:
    reason: str


@dataclass(frozen=True)
class Composite:
    key: object


def _bound(func, args: tuple, kwargs: dict):
    """(argument, value) of each schema argument given."""
    for position, argument in enumerate(func._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        if value is not None:
            yield argument, value


def _tensors(value):
    return [
        t
        for t in (value if isinstance(value, (list, tuple)) else (value,))
        if isinstance(t, torch.Tensor)
    ]


def predict(func, args: tuple, kwargs: dict):
    """What CUDA does with ``func``'s tensors: None (it runs), Raises, Composite (it runs the
    operator's composite, whose parts are judged in turn) or Unpredicted."""
    devices = {t.device for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
    name = func._schema.name.split("::")[-1]
    key = name if func._overloadname == "default" else f"{name}.{func._overloadname}"
    if key in CPU_ONLY:
        # no CUDA kernel: the dispatcher refuses before any kernel checks a device (reportError,
        # aten/src/ATen/core/dispatch/OperatorEntry.cpp)
        return Raises(
            f"Could not run '{func._schema.name}{key[len(name) :]}' with"
            f" arguments from the '{BACKEND}' backend.",
            prefix=True,
        )
    if len(devices) < 2 or name in TRANSFERS:
        return None
    # the generated wrapper: check_and_update_common_device (ATen/core/op_registration/adaption.h)
    if key in CHECKS:
        return _wrapper_check(func, key, args, kwargs)
    if name in CONVOLUTIONS:
        return _convolution(args)
    if name in UNMODELLED:
        return Unpredicted(f"{name}'s own checks")
    if name not in CUDA_KERNELS or name.startswith("_foreach_"):
        # no CUDA kernel: CUDA runs the composite; a foreach operator over two devices runs tensor
        # by tensor (the fast route wants one device: _check_tensors_share_device_and_dtype,
        # native/ForeachUtils.h)
        for dispatch_key in COMPOSITES:
            if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), dispatch_key):
                return Composite(dispatch_key)
        return Unpredicted(f"{key} has no CUDA kernel and no composite")  # nor a CPU one
    return _own_check(name, args) or _iterator(name, func, args, kwargs)


def _wrapper_check(func, key: str, args: tuple, kwargs: dict):
    """Every checked argument, 0-dim or not, on the first one's device, in the generated order."""
    return _checked(key, {argument.name: value for argument, value in _bound(func, args, kwargs)})


def _checked(key: str, given: dict):
    """:func:`_wrapper_check` with the arguments by name."""
    method, names = CHECKS[key]
    first = None
    for argument in names:
        for tensor in _tensors(given.get(argument)):
            first = first or tensor.device
            if tensor.device != first:
                return Raises(
                    f"{SAME}but got {argument} is on {tensor.device}, different from other tensors"
                    f" on {first} (when checking argument in method {method.format(BACKEND)})"
                )
    return None


def _type_name(tensor: torch.Tensor) -> str:
    kind = f"{_LEGACY.get(tensor.dtype, tensor.dtype)}Tensor"
    return f"torch.{kind}" if tensor.device.type == "cpu" else f"torch.{BACKEND.lower()}.{kind}"


def _convolution(args: tuple):
    """``_convolution`` (aten/src/ATen/native/Convolution.cpp), a composite that CUDA runs too,
    picks its backend by the input. A CPU input gets the backend the CPU gives it
    (``torch._C._select_conv_backend``, PyTorch's own choice, which looks at the input's device and
    the parameters' sizes only): oneDNN checks the parameters' types first
    (``check_input_same_type_as_parameters`` with the backend), any other runs the composite, whose
    parts are judged in turn. A CUDA input goes to ``_conv_depthwise2d``/``conv_depthwise3d`` when
    depthwise (``is_depthwise``; ``use_cudnn_depthwise`` wants half precision or channels-last),
    whose generated wrappers check devices; else to cuDNN after
    ``check_input_same_type_as_parameters``, which compares device types and dtypes."""
    input, weight, bias = args[0], args[1], args[2]
    stride, padding, dilation, transposed, output_padding, groups = args[3:9]
    parameters = [("weight", weight), ("bias", bias)]
    if input.device.type == "cpu":
        backend = torch._C._select_conv_backend(
            input,
            weight.cpu(),
            None if bias is None else bias.cpu(),
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
        )
        if int(backend) in ONEDNN:
            for role, tensor in parameters:
                if tensor is not None and tensor.device.type != "cpu":
                    return Raises(
                        f"Input type ({_type_name(input)}) and {role} type ({_type_name(tensor)})"
                        f" should be the same or input should be a MKLDNN tensor and {role} is a"
                        " dense tensor"
                    )
        return Composite(torch._C.DispatchKey.CompositeExplicitAutograd)
    if (
        not transposed
        and input.dim() in (4, 5)
        and groups > 1
        and input.size(1) == groups
        and weight.size(0) % input.size(1) == 0
        and input.is_contiguous()
    ):
        key = "_conv_depthwise2d" if input.dim() == 4 else "conv_depthwise3d"
        return _checked(key, {"self": input, "weight": weight, "bias": bias})
    for role, tensor in parameters:
        if tensor is not None and tensor.device.type != input.device.type:
            return Raises(
                f"Input type ({_type_name(input)}) and {role} type ({_type_name(tensor)}) should be"
                " the same"
            )
    return None


def _own_check(name: str, args: tuple):
    """Checks some operators make before TensorIterator's, on CUDA."""
    # index's meta function (native/TensorAdvancedIndexing.cpp)
    if name in ("index", "_unsafe_index"):
        self, indices = args[0], args[1]
        if any(
            i is not None and i.device.type != "cpu" and i.device != self.device for i in indices
        ):
            return Raises(
                "indices should be either on cpu or on the same device as the indexed tensor "
                f"({self.device})"
            )
    # masked_fill__cuda (cuda/Indexing.cu)
    if name == "masked_fill_" and args[1].device != args[0].device:
        return Raises(
            f"expected self and mask to be on the same device, but got mask on {args[1].device} and"
            f" self on {args[0].device}"
        )
    return None


def _operands(name: str, func, args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, bool, str]]:
    """(tensor, is output, argument) in TensorIterator's order: outputs (out=, an in-place self)
    before inputs."""
    outputs, inputs = [], []
    for argument, value in _bound(func, args, kwargs):
        written = argument.alias_info is not None and argument.alias_info.is_write
        for tensor in _tensors(value):
            if written:
                outputs.append((tensor, True, argument.name))
            if not argument.is_out:
                inputs.append((tensor, False, argument.name))
    # index tensors may stay on the CPU, as in x[cpu_index] (index's meta function)
    if name in INDEXING:
        inputs = [o for o in inputs if o[2] != "indices"]
    # fill_ (Fill.cpp), masked_fill__cuda and index_fill_ read a 0-dim value on any device as a
    # number, and _index_put_impl_ moves one to self's device (native/TensorAdvancedIndexing.cpp)
    if name in ("fill_", "masked_fill_", "index_fill_") or name in INDEXING:
        inputs = [o for o in inputs if not (o[2] in ("value", "values") and o[0].dim() == 0)]
    return outputs + inputs


def _cpu_scalar(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.dim() == 0


def _iterator(name: str, func, args: tuple, kwargs: dict):
    """TensorIteratorBase::compute_types (aten/src/ATen/TensorIterator.cpp): the common device is
    the first operand's not on the CPU; an input that is a 0-dim CPU tensor passes where the config
    allows CPU scalars, one at most; any other operand elsewhere raises. Then the CUDA kernel's own
    checks of a CPU scalar."""
    operands = _operands(name, func, args, kwargs)
    base = name.rstrip("_") if not name.endswith("__") else name
    if base == "where" and any(not out and t.device.type != "cpu" for t, out, _ in operands):
        # where_self_out (native/TensorCompare.cpp) moves each 0-dim CPU input to the device first
        operands = [o for o in operands if o[1] or not _cpu_scalar(o[0])]
    common = (
        next(t.device for t, _, _ in operands if t.device.type != "cpu")
        if any(t.device.type != "cpu" for t, _, _ in operands)
        else None
    )
    if common is None:
        return None
    scalar_at = None
    for position, (tensor, output, _) in enumerate(operands):
        if base in ALLOW and not output and _cpu_scalar(tensor):
            if scalar_at is not None:
                return Raises(TOO_MANY)
            scalar_at = position
        elif tensor.device != common:
            return Raises(f"{SAME}but found at least two devices, {common} and {tensor.device}!")
    if scalar_at is None:
        return None
    # TensorIterator's operand index: a functional operator's output is operand 0 before it exists
    index = scalar_at + (0 if operands[0][1] else 1)
    if base == "addcmul" and index in (1, 2):  # addcmul_cuda_kernel (cuda/PointwiseOpsKernel.cu)
        which = "self" if index == 1 else "tensor1"
        extra = (
            ""
            if index == 1
            else (
                " However, CPU Scalar support for tensor2 is supported, please swap your "
                "tensor1 and tensor2 terms."
            )
        )
        return Raises(
            f"CPU Scalar support for {which} argument is not supported when calling addcmul on sim "
            f"tensors.{extra}"
        )
    # gpu_kernel's assert (cuda/Loops.cuh); cuda/Lerp.cu
    if base in ASSERTING or (base == "lerp" and index != 3):
        return Raises(f"argument {index}: expected a {BACKEND} device but found cpu")
    return None


class _Stop(BaseException):
    """Ends a run at the operator judged (BaseException: the op's own ``except Exception`` lets it
    through)."""


class Watch(TorchDispatchMode):
    """Judges each operator of a run against :func:`predict`; ``verdict`` holds the first judgement
    that ends it."""

    def __init__(self):
        super().__init__()
        self.verdict: tuple[str, str] | None = None

    def _stop(self, kind: str, detail: str):
        self.verdict = (kind, detail)
        raise _Stop

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        guess = predict(func, args, kwargs)
        if isinstance(guess, Unpredicted):
            self._stop("not predicted", guess.reason)
        if isinstance(guess, Composite):
            with self:  # the composite's parts come back here, each judged
                return func._op_dk(guess.key, *args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except _Stop:
            raise
        except Exception as error:  # noqa: BLE001 - any error is compared with the prediction
            said = str(error)
            if isinstance(guess, Raises) and guess.said(said):
                self._stop("agrees", said)
            if isinstance(error, NotImplementedError) and OWN_WORDS in said:
                self._stop("not predicted", f"refused: {said.splitlines()[0][:120]}")
            expected = guess.message if isinstance(guess, Raises) else "that it runs"
            self._stop(
                "differs",
                f"{func}: {type(error).__name__}: {said.splitlines()[0][:140]}; the rules "
                f"predict {expected}",
            )
        if isinstance(guess, Raises):
            self._stop("differs", f"{func} ran; the rules predict {guess.message}")
        return out


@dataclass
class Outcome:
    """One op's result: ``agrees``, ``not predicted``, ``differs`` or ``no variants``, with its
    first detail."""

    name: str
    kind: str = "no variants"
    variants: int = 0
    detail: str = ""
    seconds: float = field(default=0.0, repr=False)


def variants(sample) -> list[tuple[str, object]]:
    """(label, sample inputs as a pytree) for each tensor left on the CPU, as it is and as a 0-dim
    tensor."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    places = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if len(places) < 2:
        return []
    found = []
    for place in places:
        leaf = leaves[place]
        tries = [("as it is", leaf)]
        if leaf.dim() > 0 and leaf.numel() > 0:
            tries.append(("0-dim", leaf.detach().reshape(-1)[0].clone()))
        for label, left in tries:
            moved = [
                left if i == place else (v.to("sim:0") if i in places else v)
                for i, v in enumerate(leaves)
            ]
            kept = [left if i == place else v for i, v in enumerate(leaves)]
            found.append(
                (
                    f"tensor {places.index(place)} {label}",
                    pytree.tree_unflatten(kept, spec),
                    pytree.tree_unflatten(moved, spec),
                )
            )
    return found


def _call(op, inputs):
    first, args, kwargs = inputs
    torch.manual_seed(0)
    return op(first, *args, **kwargs)


def run_variant(op, on_cpu, mixed) -> tuple[str, str] | None:
    """("agrees" | "not predicted" | "differs", detail) for one variant; None when the CPU refuses
    its inputs."""
    try:
        expected = pytree.tree_map(
            lambda v: v.detach() if isinstance(v, torch.Tensor) else v, _call(op, on_cpu)
        )
    except Exception:  # noqa: BLE001 - the CPU refuses these inputs: nothing to compare
        return None
    watch = Watch()
    try:
        with watch:
            got = _call(op, mixed)
    except _Stop:
        return watch.verdict
    except Exception as error:  # noqa: BLE001 - raised outside any operator: PyTorch's own Python code
        said = str(error)
        if op.name in CPU_ARGUMENTS and said.startswith(CPU_ARGUMENTS[op.name]):
            return ("agrees", said)  # the op wants that argument on the CPU, on every device
        if isinstance(error, RuntimeError) and "device" in said.lower():
            # a composite's own check of its tensors' devices (multi_dot's, meshgrid's ...): code
            # above every backend, run on CUDA alike, so its error is CUDA's
            return ("agrees", said)
        return (
            "differs",
            (
                f"{type(error).__name__}: {said.splitlines()[0][:140] if said else ''} (outside an "
                "operator)"
            ),
        )
    differs = _same(expected, got, values=op.name not in SHAPE_ONLY)
    return ("differs", f"ran, but {differs}") if differs else ("agrees", "ran")


def run_op(op, samples: int) -> Outcome:
    """The outcome of ``op`` over every variant of its first ``samples`` float32 samples."""
    began = time.perf_counter()
    outcome = Outcome(op.name)
    try:
        inputs = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples]
    except Exception:  # noqa: BLE001 - no float32 samples here
        return outcome
    for sample in inputs:
        if any(
            isinstance(v, torch.Tensor) and v.layout != torch.strided
            for v in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
        ):
            # a sparse tensor: the device refuses to hold one (benchmarks/simdevice_ops.py counts
            # those)
            continue
        for label, on_cpu, mixed in variants(sample):
            verdict = run_variant(op, on_cpu, mixed)
            if verdict is None:
                continue
            outcome.variants += 1
            kind, detail = verdict
            if (
                kind == "differs"
                or (kind == "not predicted" and outcome.kind != "differs")
                or outcome.kind == "no variants"
            ):
                if outcome.kind != kind:
                    outcome.kind, outcome.detail = kind, f"{label}: {detail}"
            if kind == "differs":
                break
        if outcome.kind == "differs":
            break
    outcome.seconds = time.perf_counter() - began
    return outcome


def summary(outcomes: list[Outcome], samples: int) -> str:
    counted = [o for o in outcomes if o.kind != "no variants"]
    kinds = {
        kind: sum(o.kind == kind for o in counted)
        for kind in ("agrees", "not predicted", "differs")
    }
    variants_run = sum(o.variants for o in counted)
    return (
        f"{kinds['agrees']} of {len(counted)} ops of PyTorch's OpInfo database raise or run on"
        " sim:0 with one tensor left on the CPU as CUDA's rules predict, in every variant"
        f" ({100 * kinds['agrees'] / max(1, len(counted)):.1f}%); {kinds['not predicted']} reach an"
        f" operator the rules here cannot judge, {kinds['differs']} differ; {variants_run} mismatch"
        f" variants, float32, at most {samples} samples each"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ops", type=int, default=0, help="only the first N ops of the database (0: all)"
    )
    parser.add_argument(
        "--samples", type=int, default=4, help="sample inputs per op (default: %(default)s)"
    )
    parser.add_argument("--only", nargs="*", default=(), help="only the ops of these names")
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args(argv)

    import simdevice as sim

    warnings.simplefilter("ignore")  # the ops' own deprecation warnings: not this script's output
    sim.enable(2)
    ops = [op for op in op_database() if not args.only or op.name in args.only]
    ops = ops[: args.ops] if args.ops else ops
    outcomes = [run_op(op, args.samples) for op in ops]
    for outcome in outcomes:
        if outcome.kind in ("differs", "not predicted"):
            print(f"{outcome.kind:14} {outcome.name}: {outcome.detail}")
    result = summary(outcomes, args.samples)
    print(result)
    if args.write_page:
        write_row(__file__, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
