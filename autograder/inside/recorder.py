"""Kernel-side half of the probes: record what a test's assertions see, and hand it to the grader.

The runner sends this file's source to the kernel with :mod:`autograder.inside.guard`'s and calls
:func:`install` with a name chosen for the run; each probe (:mod:`autograder.prepare.probes`) calls
the recorder under that name. Nothing here decides anything: the grader trusts none of what is
recorded, and compares it, outside the kernel, with the instructor's reference. Nothing is ever
unpickled by the grader.
"""


def install(name, publish=None, plain_tensor=""):  # noqa: C901 - one closure: nothing of it in any namespace
    """``plain_tensor``: a function's ``module.name`` that says whether a tensor is one the checks
    trust (default: PyTorch's own types only).

    The recorder offers ``value(site, actual[, expected])`` (a value comparison's encoded actual
    side; the instructor's probe passes the expected side too), ``check(site, passed)`` (a
    condition, True or False; False raises ``AssertionError`` as the assertion did),
    ``raised(error)`` (the class names of the exception and its causes), ``hidden()`` (a context
    marking events as from hidden checks) and ``end(token)``, which publishes the events, and the
    token the grader gave this run of the probe, as one display output of MIME type
    ``application/vnd.course.probe+json``. Values are JSON: containers with their type, tensors with
    type, device, dtype, shape and raw bytes (base64; a tensor of any layout but the strided one is
    refused, ``"refused": "layout"``, and fails every comparison), devices, dtypes and classes by
    name, anything else as an opaque object of its class.
    """
    import base64
    import builtins
    import collections
    import contextlib
    import hashlib
    import importlib
    import math
    import pathlib
    import random
    import sys
    import traceback

    def torch_module():
        """torch where the kernel imported it (no tensor exists elsewhere), as the guard puts it
        back before each probe."""
        return sys.modules.get("torch")

    def is_plain_tensor(value):
        if plain_tensor:
            module, _, function = plain_tensor.rpartition(".")
            return getattr(importlib.import_module(module), function)(value)
        torch = torch_module()
        return type(value) in (torch.Tensor, torch.nn.Parameter)

    mime = "application/vnd.course.probe+json"
    max_bytes = 32 << 20  # values of one tensor sent in full; a larger one is sent as a digest
    max_events = 100_000
    if publish is None:
        from IPython.display import publish_display_data

        def publish(payload):
            publish_display_data({mime: payload})

    def qualname(cls):
        name = getattr(cls, "__qualname__", getattr(cls, "__name__", "?"))
        return f"{getattr(cls, '__module__', '?')}.{name}"

    def tensor(value):
        torch = torch_module()
        record = {
            "$": "tensor",
            "cls": qualname(type(value)),
            "plain": is_plain_tensor(value),
            "device": str(value.device),
            "dtype": str(value.dtype),
            "shape": list(value.shape),
        }
        if record["plain"] and not value.is_meta and value.layout != torch.strided:
            # sparse and other layouts: no values recorded, so no comparison passes
            record["refused"] = "layout"
        elif record["plain"] and not value.is_meta:
            with torch._C.DisableTorchFunctionSubclass():
                flat = value.detach().cpu().contiguous().reshape(-1)
                raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            if len(raw) <= max_bytes:
                record["data"] = base64.b64encode(raw).decode()
            else:
                record["sha256"] = hashlib.sha256(raw).hexdigest()
        return record

    def torch_value(value):
        """A tensor, device, dtype or size encoded; None for anything else."""
        torch = torch_module()
        if torch is None:
            return None
        if isinstance(value, torch.Tensor):
            return tensor(value)
        if isinstance(value, torch.device):
            return {"$": "device", "v": str(value)}
        if isinstance(value, torch.dtype):
            return {"$": "dtype", "v": str(value)}
        if isinstance(value, torch.Size):
            return {"$": "size", "v": [int(n) for n in value]}
        return None

    def encode(value, depth=0):
        if value is None or type(value) in (bool, str, int):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if depth > 40:
            return {"$": "object", "cls": "too deep"}
        from_torch = torch_value(value)
        if from_torch is not None:
            return from_torch
        if isinstance(value, type):
            return {"$": "type", "v": qualname(value)}
        if isinstance(value, pathlib.PurePath):
            return {"$": "path", "v": str(value)}
        if isinstance(value, (bytes, bytearray)):
            return {"$": "bytes", "v": base64.b64encode(bytes(value)).decode()}
        if isinstance(value, dict):
            pairs = [
                [encode(k, depth + 1), encode(v, depth + 1)]
                for k, v in list(value.items())[:100_000]
            ]
            kind = (
                "collections.OrderedDict" if isinstance(value, collections.OrderedDict) else "dict"
            )
            return {"$": "dict", "cls": kind, "v": pairs}
        for kind, types in (
            ("list", list),
            ("tuple", tuple),
            ("set", set),
            ("frozenset", frozenset),
        ):
            if isinstance(value, types):
                items = [encode(item, depth + 1) for item in list(value)[:100_000]]
                if kind in ("set", "frozenset"):
                    items.sort(key=repr)
                return {"$": kind, "cls": qualname(type(value)), "v": items}
        # a subclass (numpy scalars, bool-like ints): its plain value
        if isinstance(value, (int, float)):
            return encode(float(value) if isinstance(value, float) else int(value), depth + 1)
        return {"$": "object", "cls": qualname(type(value))}

    def safe(value):
        try:
            return encode(value)
        except Exception as error:  # noqa: BLE001 - a value that cannot be read is recorded as such
            return {"$": "unreadable", "cls": type(error).__name__}

    class Recorder:
        def __init__(self):
            self.events, self.depth = [], 0

        def begin(self):
            """A new probe: no events yet, and the same random numbers in every kernel."""
            self.events, self.depth = [], 0
            if torch_module() is not None:
                torch_module().manual_seed(0)
            random.seed(0)
            try:
                import numpy

                numpy.random.seed(0)
            except ImportError:
                pass

        def _add(self, event):
            if len(self.events) < max_events:
                self.events.append(event)
            elif self.events[-1] != ["overflow"]:
                self.events.append(["overflow"])

        def value(self, site, actual, *expected):
            self._add([site, self.depth > 0, safe(actual), *(safe(e) for e in expected)])

        def check(self, site, passed):
            passed = bool(passed)
            self._add([site, self.depth > 0, passed])
            if not passed:
                raise AssertionError(f"check {site} failed")

        @contextlib.contextmanager
        def hidden(self):
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

        def raised(self, error):
            # for the instructor's log of the probes; never shown to students
            traceback.print_exception(error)
            names, seen = [], set()
            # the error and what caused it
            while error is not None and id(error) not in seen and len(names) < 5:
                seen.add(id(error))
                names.append(type(error).__name__)
                error = error.__cause__ or error.__context__
            self._add(["raised", *names])

        def end(self, token=None):
            publish(
                {"events": self.events}
                if token is None
                else {"events": self.events, "token": token}
            )

    builtins.__dict__[name] = Recorder()
