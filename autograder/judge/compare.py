"""A kernel's recorded values read back, and compared with the reference's as each test's assertion
says.

The values are what :mod:`autograder.inside.recorder` encoded in the kernel; nothing here runs code
from it. :func:`compare` is the verdict on one test: the student's events against the reference's,
site by site.
"""

from __future__ import annotations

import base64
import math
import pathlib
import re
from collections import OrderedDict
from dataclasses import dataclass

from autograder.prepare.probes import Site


class _Ref:
    """A value from a kernel that the grader holds by its name only (a device, a dtype, a class)."""

    def __init__(self, kind: str, name: str):
        self.kind, self.name = kind, name

    def __eq__(self, other):
        return isinstance(other, _Ref) and (self.kind, self.name) == (other.kind, other.name)

    def __hash__(self):
        return hash((self.kind, self.name))

    def __repr__(self):
        return f"{self.kind}({self.name})"


class Opaque:
    """A value the grader cannot compare (an arbitrary object): equal to nothing, itself
    included."""

    def __init__(self, kind: str):
        self.kind = kind

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<{self.kind}>"


@dataclass
class TensorValue:
    plain: bool
    device: str
    dtype: str
    shape: tuple
    # a CPU torch.Tensor with the values, or None (no values: meta, or too large: see digest)
    data: object
    digest: str | None = None
    # why the recorder kept no values of a tensor that has them ("layout")
    refused: str | None = None

    @property
    def holds(self) -> str:
        """What this record holds of the values: ``"values"``, ``"digest"`` or ``"none"`` (a meta
        tensor)."""
        return "values" if self.data is not None else "digest" if self.digest else "none"

    def tensor(self):
        """The values as a CPU tensor, for ``==`` with other values; an Opaque for a subclass or a
        digest."""
        return self.data if self.plain and self.data is not None else Opaque("tensor")


def decode(value, tensors: bool = False):
    """A kernel's encoded value as Python objects the grader compares (tensors as
    :class:`TensorValue` when ``tensors``, else as CPU tensors); nothing here runs code from the
    kernel."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):  # never produced by the encoder: a forged payload
        return Opaque("list")
    if not isinstance(value, dict):
        return Opaque("value")
    kind, v = value.get("$"), value.get("v")
    items = lambda: [decode(item, tensors) for item in (v if isinstance(v, list) else [])]  # noqa: E731
    try:
        if kind == "list":
            return items()
        if kind == "tuple":
            return tuple(items())
        if kind == "set":
            return set(items())
        if kind == "frozenset":
            return frozenset(items())
        if kind == "dict":
            pairs = [(decode(k, tensors), decode(x, tensors)) for k, x in v]
            return (
                OrderedDict(pairs) if value.get("cls") == "collections.OrderedDict" else dict(pairs)
            )
        if kind == "float":
            return float(v)
        if kind == "bytes":
            return base64.b64decode(v)
        if kind in ("device", "dtype", "type"):
            return _Ref(kind, str(v))
        if kind == "size":
            import torch

            return torch.Size([int(n) for n in v])
        if kind == "path":
            return pathlib.PurePosixPath(str(v))
        if kind == "tensor":
            record = _tensor(value)
            return record if tensors else record.tensor()
    except (TypeError, ValueError, KeyError, OverflowError, RuntimeError):
        return Opaque(str(kind))
    return Opaque(str(kind))


def _tensor(value: dict) -> TensorValue:
    import torch

    shape = tuple(int(n) for n in value["shape"])
    dtype = getattr(torch, str(value["dtype"]).removeprefix("torch."), None)
    data = None
    if value.get("data") is not None and isinstance(dtype, torch.dtype):
        raw = bytearray(base64.b64decode(value["data"]))
        count = math.prod(shape)
        if count == 0:
            data = torch.empty(shape, dtype=dtype)
        elif len(raw) == count * torch.empty((), dtype=dtype).element_size():
            data = torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()
    refused = value.get("refused")
    return TensorValue(
        bool(value.get("plain")),
        str(value["device"]),
        str(value["dtype"]),
        shape,
        data,
        value.get("sha256"),
        str(refused) if refused is not None else None,
    )


def holds(kind: str, actual, expected) -> bool:
    """Whether a recorded actual value passes a site of ``kind`` against the reference's recorded
    expectation.

    Both are encoded values (see :mod:`autograder.inside.recorder`); any error means no.
    """
    try:
        if kind == "check":
            return actual is True
        if kind == "eq":
            return bool(decode(actual) == decode(expected))
        got, spec = decode(actual, tensors=True), decode(expected, tensors=True)
        if not isinstance(got, TensorValue) or not isinstance(spec, dict):
            return False
        args, kwargs = list(spec.get("args", [])), dict(spec.get("kwargs", {}))
        if kind == "tensor":
            return _assert_tensor(got, *args, **kwargs)
        want = args[0] if args else None
        if (
            not isinstance(want, TensorValue)
            or not got.plain
            or got.data is None
            or want.data is None
        ):
            return False
        if kind == "equal":
            return got.device == want.device and _torch().equal(got.data, want.data)
        if kind == "allclose":
            return got.device == want.device and bool(
                _torch().allclose(got.data, want.data, *args[1:], **kwargs)
            )
        if kind == "assert_close":
            if kwargs.get("check_device", True) and got.device != want.device:
                return False
            kwargs.pop("check_device", None)
            _torch().testing.assert_close(got.data, want.data, *args[1:], **kwargs)
            return True
    except (AssertionError, TypeError, ValueError, RuntimeError, IndexError):
        return False
    return False


def _torch():
    import torch

    return torch


def _assert_tensor(got: TensorValue, expected=None, device=None) -> bool:
    """The checks of ``devcourse.grading.assert_tensor``, on recorded values."""
    if not isinstance(expected, TensorValue) or not got.plain:
        return False
    if device is None:
        want = expected.device
    elif isinstance(device, _Ref) and device.kind == "device":
        want = device.name
    elif isinstance(device, str):
        want = str(_torch().device(device))
    else:
        return False
    if (got.device, got.dtype, got.shape) != (want, expected.dtype, expected.shape):
        return False
    # a record holds what the reference holds
    if got.refused or expected.refused or got.holds != expected.holds:
        return False
    if expected.holds == "values":
        return _torch().equal(got.data, expected.data)
    if expected.holds == "digest":
        return got.digest == expected.digest
    return True  # neither has values (meta), as assert_tensor does


@dataclass(frozen=True)
class Outcome:
    """A probe compared with the reference: passed, and if not, the grader's own words for why."""

    passed: bool
    reason: str = ""


def compare(student: dict | None, reference: dict, sites: list[Site]) -> Outcome:
    """Judge a student's recorded probe against the reference's, site by site, in order.

    The reason is written for the student: it quotes a visible assertion by its source, names a
    hidden one only as hidden, and never repeats anything the kernel recorded.
    """
    if not isinstance(student, dict) or not isinstance(student.get("events"), list):
        return Outcome(
            False,
            "its checks did not finish when the grader ran it again (the kernel stopped, or "
            "the test's run was cut short)",
        )
    events, expected = student["events"], reference["events"]
    for position, want in enumerate(expected):
        if position >= len(events):
            return Outcome(False, "it stopped before its last checks when the grader ran it again")
        got = events[position]
        if not isinstance(got, list) or not got:
            return Outcome(False, "its run recorded something the grader cannot read")
        if got[0] == "raised":
            return Outcome(
                False,
                f"{_where(sites, want[0])} was not reached: the run raised {_exception_name(got)}",
            )
        if got[0] != want[0]:
            return Outcome(
                False,
                f"{_where(sites, want[0])} was not reached: the test took another path "
                "through its checks",
            )
        site = _site(sites, want[0])
        if site is None:
            return Outcome(False, "the reference recorded a check the grader does not know")
        actual = got[2] if len(got) > 2 else None
        expectation = want[3] if len(want) > 3 else None
        if not holds(site.kind, actual, expectation):
            refused = (
                " (its value is a tensor of a layout whose values the grader does not record, such"
                " as a sparse one)"
                if _refused(actual)
                else ""
            )
            return Outcome(False, f"{_where(sites, want[0])} failed{refused}")
    if len(events) > len(expected):
        extra = events[len(expected)]
        if isinstance(extra, list) and extra and extra[0] == "raised":
            return Outcome(False, f"after its last check, the run raised {_exception_name(extra)}")
        return Outcome(False, "it made more checks than the instructor's solution does")
    return Outcome(True)


def _refused(value) -> bool:
    """Whether a recorded value is a tensor the recorder refused to record the values of."""
    return (
        isinstance(value, dict) and value.get("$") == "tensor" and value.get("refused") is not None
    )


def self_check(reference: dict | None, sites: list[Site]) -> str | None:
    """Why the instructor's own probe does not pass (its expected sides against its own values), or
    None."""
    if not isinstance(reference, dict) or not isinstance(reference.get("events"), list):
        return "its probe did not finish"
    for event in reference["events"]:
        if event[0] == "raised":
            return f"its probe raised {', from '.join(map(str, event[1:4])) or 'an exception'}"
        site = _site(sites, event[0])
        if site is None or len(event) < 3:
            return f"its probe recorded {str(event)[:80]}, which is no check of this notebook"
        if not holds(site.kind, event[2], event[3] if len(event) > 3 else None):
            return (
                f"check {site.id} ({site.text[:80]}) does not hold when the grader compares its"
                " values"
            )
    return None


_SHOWN_EXCEPTIONS = re.compile(
    r"^(?:[A-Z][A-Za-z]*(?:Error|Exception|Exit|Interrupt|Failed)|StopIteration)$"
)


def _exception_name(event: list) -> str:
    """An exception's class name, and its causes', where they look like Python's or PyTorch's own: a
    submission could name a class after a hidden test's text."""
    names = [
        (
            name
            if isinstance(name, str) and _SHOWN_EXCEPTIONS.match(name) and len(name) <= 40
            else "an exception"
        )
        for name in event[1:4]
    ]
    return ", from ".join(names) or "an exception"


def _site(sites: list[Site], site_id) -> Site | None:
    return (
        sites[site_id]
        if isinstance(site_id, int) and not isinstance(site_id, bool) and 0 <= site_id < len(sites)
        else None
    )


def _where(sites: list[Site], site_id: int) -> str:
    site = _site(sites, site_id)
    if site is None or site.hidden:
        return "a hidden check"
    text = site.text if len(site.text) <= 100 else site.text[:97] + "..."
    return f"the check `{text}`"
