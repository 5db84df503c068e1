"""Whether the packages a kernel imports come with compiled bytecode, and what to do where not.

A kernel sees the Python environment read-only, so where it was installed without bytecode (``uv pip
install``, ``pip install --no-compile``, ``PYTHONDONTWRITEBYTECODE=1``) every kernel compiles each
module it imports again. :func:`uncompiled` finds such packages and :func:`advice` says how to
compile them once; ``python -m autograder grade`` and ``python -m autograder worker`` print it as
they start. Nothing here changes the environment.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys

# What every kernel imports (the zygote preloads them), torch first: the one that costs most.
PACKAGES = (
    "torch",
    "numpy",
    "IPython",
    "ipykernel",
    "jupyter_client",
    "zmq",
    "tornado",
    "nbformat",
)


def uncompiled(packages: tuple[str, ...] | None = None) -> dict[str, str]:
    """The packages among ``packages`` (:data:`PACKAGES`) installed without bytecode: name -> the
    folder to compile.

    Looks only at the ``.py`` files directly in each package's folder (a package installed
    without bytecode has none anywhere, so its top level tells), and honours
    ``PYTHONPYCACHEPREFIX``. A package that is not installed, or that has bytecode for at least
    half of those files, is left out. The folder named is the one the package was installed
    into (its ``site-packages``): what came without bytecode beside it, such as the sympy that
    ``torch.export`` and ``torch.compile`` import, is compiled with it. Works the same with or
    without a GPU.
    """
    if sys.implementation.cache_tag is None:  # this Python caches no bytecode at all
        return {}
    missing = {}
    for name in PACKAGES if packages is None else packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        if spec.submodule_search_locations:
            folder = os.path.dirname(spec.origin)
            sources = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py")]
        else:
            folder, sources = spec.origin, [spec.origin]
        cached = sum(os.path.exists(importlib.util.cache_from_source(source)) for source in sources)
        if sources and cached * 2 < len(sources):
            missing[name] = os.path.dirname(folder)
    return missing


def advice(missing: dict[str, str]) -> list[str]:
    """The header's lines about ``missing`` (from :func:`uncompiled`): none when nothing is
    missing."""
    if not missing:
        return []
    folders = sorted(set(missing.values()))
    command = shlex.join([sys.executable, "-m", "compileall", "-q", "-j0", *folders])
    return [
        (
            f"No compiled bytecode for {', '.join(missing)}: every kernel compiles what it imports"
            " from them, every time (a sandboxed kernel cannot write bytecode), which makes"
            " grading slower. Compile them once, as the environment's owner:"
        ),
        f"  {command}",
    ]
