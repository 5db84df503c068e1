"""Kernel-side half of the grader's defences: snapshot what tests rely on, restore it before each
test.

The runner sends this file's source to a fresh kernel before a submission's first cell and calls
:func:`install` with a name chosen for that run; it calls that name before every test cell. It runs
inside the student's process, so it raises the bar rather than closing every door: the grader also
restores the test cells, demands each test's completion marker, scans the code and runs the kernel
in :mod:`autograder.run.sandbox`.
"""


def install(name, packages=(), setup="", plain_tensor=""):  # noqa: C901 - one closure: nothing of it in any namespace
    """``packages``, ``setup``, ``plain_tensor``: what the course's kernels import and run first,
    and how its checks tell a trusted tensor (:class:`autograder.course.profile.KernelSetup`).

    Calling ``name`` puts back, as before any student code ran: every attribute of the modules of
    ``IPython``, ``ipykernel``, ``builtins``, ``linecache`` and ``packages`` (``torch.allclose``,
    ``isinstance``, the course's assertion helpers ...) and their ``sys.modules`` entries; the
    methods of ``torch.Tensor``, ``nn.Module`` and its subclasses, the course's classes and
    IPython's shell (``showtraceback``, ``run_cell``, exception handlers, transformers, event
    callbacks); ``sys.stdout``/``stderr``, ``sys.excepthook``/``displayhook``, and no trace or
    profile function. ``name.eq``/``name.ne`` (what a test's ``==``/``!=`` become) refuse a value,
    or an item of a container, whose class brought an ``==`` of its own after student code ran;
    ``name.equal`` ... (for ``torch.equal``, ``allclose``, ``isclose``, ``testing.assert_close``)
    refuse a tensor of any subclass but those the course trusts and compare with
    ``__torch_function__`` overrides off. ``name.forget()``, a probe's first line, takes that cell's
    source out of ``linecache``.
    """
    import builtins
    import importlib
    import linecache
    import pkgutil
    import sys
    import threading

    import IPython

    course = []  # the course's own packages: every class they define is restored too
    for package in packages:
        module = importlib.import_module(package.removesuffix(".*"))
        if package.endswith(".*"):
            course.append(module.__name__)
            for info in pkgutil.iter_modules(module.__path__):
                importlib.import_module(f"{module.__name__}.{info.name}")
    # before the snapshot, so that what it changes (torch, turned on devices) is part of what is
    # restored
    if setup:
        module, _, function = setup.rpartition(".")
        getattr(importlib.import_module(module), function)()
    torch = sys.modules.get("torch")

    roots = {
        "IPython",
        "ipykernel",
        "builtins",
        "unittest",
        "linecache",
        *(p.split(".")[0] for p in packages),
    }
    sources = linecache.cache  # where IPython keeps each cell's source, for tracebacks
    modules = {
        key: module
        for key, module in sys.modules.items()
        if module is not None and key.split(".")[0] in roots
    }
    module_dicts = {key: (module, dict(vars(module))) for key, module in modules.items()}

    classes = set()
    if torch is not None:
        classes.update({torch.Tensor, torch._C.TensorBase, torch.nn.Module, torch.nn.Parameter})
        classes.update(
            c
            for c in vars(torch.nn).values()
            if isinstance(c, type) and issubclass(c, torch.nn.Module)
        )
        fake = sys.modules.get("torch._subclasses.fake_tensor")
        if fake is not None:
            classes.add(fake.FakeTensor)
    for key, module in modules.items():
        if key.split(".")[0] in course:
            classes.update(
                c
                for c in vars(module).values()
                if isinstance(c, type) and c.__module__.split(".")[0] in course
            )
    shell = IPython.get_ipython()
    if shell is not None:
        classes.update(type(shell).__mro__[:-1])
    class_dicts = {cls: dict(vars(cls)) for cls in classes}

    saved_sys = {
        key: getattr(sys, key) for key in ("stdout", "stderr", "excepthook", "displayhook")
    }
    shell_state = {}
    if shell is not None:
        shell_state = {
            "dict": dict(vars(shell)),
            "input_transformers_cleanup": list(shell.input_transformers_cleanup),
            "input_transformers_post": list(shell.input_transformers_post),
            "ast_transformers": list(shell.ast_transformers),
            "events": {
                event: list(callbacks) for event, callbacks in shell.events.callbacks.items()
            },
        }
    missing = object()

    # Every == that existed before student code ran; a class defined later with its own == is not
    # trusted.
    trusted_eq = set()
    pending, seen = [object], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for attr in ("__eq__", "__ne__"):
            if attr in vars(cls):
                trusted_eq.add(id(vars(cls)[attr]))
        try:
            pending.extend(type.__subclasses__(cls))
        except TypeError:
            pass
    trusted_types = (list, tuple, set, frozenset, dict)

    def honest(value, depth=0):
        cls = type(value)
        if depth > 20:
            return True
        for attr in ("__eq__", "__ne__"):
            method = next((vars(k)[attr] for k in cls.__mro__ if attr in vars(k)), None)
            if method is not None and id(method) not in trusted_eq:
                return False
        if isinstance(value, dict):
            return all(
                honest(k, depth + 1) and honest(v, depth + 1)
                for k, v in list(value.items())[:10000]
            )
        if isinstance(value, trusted_types):
            return all(honest(item, depth + 1) for item in list(value)[:10000])
        return True

    def eq(left, right):
        """``left == right`` for a test, refusing objects whose class brought its own ``==``."""
        if not (honest(left) and honest(right)):
            raise AssertionError(
                "a value compared by the test has a class with its own == or !=: not trusted"
            )
        return left == right

    def ne(left, right):
        if not (honest(left) and honest(right)):
            raise AssertionError(
                "a value compared by the test has a class with its own == or !=: not trusted"
            )
        return left != right

    if plain_tensor:
        module, _, function = plain_tensor.rpartition(".")
        is_plain_tensor = getattr(importlib.import_module(module), function)
    else:

        def is_plain_tensor(value):
            return type(value) in (torch.Tensor, torch.nn.Parameter)

    def untrusted_tensor(value, depth=0):
        """A tensor of a subclass (other than those the course trusts) anywhere in ``value``, or
        None."""
        if isinstance(value, torch.Tensor):
            return None if is_plain_tensor(value) else value
        if depth < 20 and isinstance(value, dict):
            value = list(value.values())
        if depth < 20 and isinstance(value, (list, tuple)):
            return next(
                (
                    t
                    for t in (untrusted_tensor(item, depth + 1) for item in value[:10000])
                    if t is not None
                ),
                None,
            )
        return None

    def tensor_check(function):
        def checked(*args, **kwargs):
            for value in (*args, *kwargs.values()):
                bad = untrusted_tensor(value)
                if bad is not None:
                    raise AssertionError(
                        f"a tensor compared by the test is a {type(bad).__name__}, a subclass of "
                        "torch.Tensor that can change what a comparison says: not trusted"
                    )
            # no __torch_function__ override decides the answer
            with torch._C.DisableTorchFunctionSubclass():
                return function(*args, **kwargs)

        return checked

    tensor_checks = {}
    # torch's own checks as they were; a test of a course without torch has none to call
    if torch is not None:
        tensor_checks = {
            "equal": tensor_check(torch.equal),
            "allclose": tensor_check(torch.allclose),
            "isclose": tensor_check(torch.isclose),
            "assert_close": tensor_check(importlib.import_module("torch.testing").assert_close),
        }

    def restore():
        for key, (module, saved) in module_dicts.items():
            sys.modules[key] = module
            current = vars(module)
            for attr, value in saved.items():
                if current.get(attr, missing) is not value:
                    current[attr] = value
        for cls, saved in class_dicts.items():
            for attr in [a for a in vars(cls) if a not in saved]:
                try:
                    delattr(cls, attr)
                except (AttributeError, TypeError):
                    pass
            for attr, value in saved.items():
                if vars(cls).get(attr, missing) is not value:
                    try:
                        setattr(cls, attr, value)
                    except (AttributeError, TypeError):
                        pass
        for key, value in saved_sys.items():
            setattr(sys, key, value)
        sys.settrace(None)
        sys.setprofile(None)
        threading.settrace(None)
        threading.setprofile(None)
        if shell is not None:
            current = vars(shell)
            for attr in [a for a in current if a not in shell_state["dict"]]:
                del current[attr]
            for attr in (
                "showtraceback",
                "run_cell",
                "run_cell_async",
                "run_ast_nodes",
                "run_code",
                "showsyntaxerror",
                "_showtraceback",
                "CustomTB",
                "custom_exceptions",
                "excepthook",
            ):
                if attr in shell_state["dict"]:
                    current[attr] = shell_state["dict"][attr]
            shell.custom_exceptions = ()
            shell.input_transformers_cleanup[:] = shell_state["input_transformers_cleanup"]
            shell.input_transformers_post[:] = shell_state["input_transformers_post"]
            shell.ast_transformers[:] = shell_state["ast_transformers"]
            for event, callbacks in shell_state["events"].items():
                shell.events.callbacks[event] = list(callbacks)
        builtins.__dict__[name] = restore
        return restore

    def forget(keep=()):
        """Take the calling cell's source out of ``linecache`` (a probe's: its hidden checks are not
        for the student's code to read, from a frame or by ``inspect``), all but the line ranges
        ``keep`` ((first, last), from 1)."""
        cell = sys._getframe(1).f_code.co_filename
        entry = sources.pop(cell, None)
        if entry is not None and keep:
            lines = [
                line if any(first <= number <= last for first, last in keep) else "\n"
                for number, line in enumerate(entry[2], 1)
            ]
            sources[cell] = (entry[0], None, lines, cell)

    restore.eq, restore.ne, restore.forget = eq, ne, forget
    for attr, checked in tensor_checks.items():
        setattr(restore, attr, checked)
    builtins.__dict__[name] = restore
