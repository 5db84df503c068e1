"""The script each rank of :func:`devcourse.distributed.run_functions` runs: the source of functions
a notebook defined, which a worker process cannot import from the notebook's ``__main__``, then a
harness that calls one and saves what it returns."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Callable, Sequence

_HARNESS = """
if __name__ == "__main__":
    import os as _os
    import torch as _torch
    import torch.distributed as _dist
    from pathlib import Path as _Path

    if {simulated} and not _torch.accelerator.is_available():
        import simdevice as _simdevice

        _simdevice.enable({simulated})  # this node's simulated accelerators
    try:
        _result = {main}(_Path({outdir!r}))
    except BaseException as _error:  # the rank's own exception, for the message of the failed run
        import json as _json, time as _time, traceback as _traceback

        (_Path({outdir!r}) / f"rank{{_os.environ['RANK']}}.error").write_text(_json.dumps({{
            "time": _time.time(), "rank": int(_os.environ["RANK"]),
            "error": _traceback.format_exception_only(_error)[-1].strip(),
            "traceback": "".join(_traceback.format_exception(_error)),
        }}))
        raise
    _torch.save(_result, _Path({outdir!r}) / f"rank{{_os.environ['RANK']}}.pt")
    if _dist.is_initialized():
        _dist.destroy_process_group()
    # End without the interpreter's shutdown, as multiprocessing ends its workers: with gloo, the
    # last all-reduce of a backward pass holds a Python object that a gloo thread drops after the
    # work is done; dropped while the interpreter shuts down, it aborts the process ("terminate
    # called without an active exception"). destroy_process_group() does not wait for it.
    import sys as _sys

    _sys.stdout.flush()
    _sys.stderr.flush()
    _os._exit(0)
"""

_PRELUDE = """\
# Written by devcourse.rankscript.write_script: the functions below, then a harness.
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
"""


def write_script(
    path: str | Path,
    functions: Sequence[Callable],
    main: Callable,
    outdir: str | Path,
    simulated_devices: int = 0,
) -> Path:
    """Write a script holding the source of ``functions`` and ``main``, and a harness that calls
    ``main``.

    Each rank runs ``main(outdir)`` and its return value is saved as
    ``outdir/rank{RANK}.pt``. The functions may come from notebook cells;
    they see ``torch``, ``dist``, ``nn``, ``DDP``, ``DataLoader``,
    ``DistributedSampler``, ``TensorDataset``, ``os`` and ``Path``. With
    ``simulated_devices=N``, every process in which ``torch.accelerator``
    finds no accelerator turns on N simulated devices (``sim:0`` ...
    ``sim:N-1``, see :mod:`simdevice`) before ``main``: a node of
    N GPUs, as a CPU-only machine can have it. Where there is an accelerator
    (a GPU box), nothing is turned on. After saving the result the harness
    leaves the process group, if ``main`` left one open, and ends the process
    with ``os._exit(0)``, skipping the interpreter's shutdown, where a gloo
    worker thread can abort the process (07, section 2, says why).
    """
    sources = [textwrap.dedent(inspect.getsource(function)) for function in [*functions, main]]
    harness = _HARNESS.format(
        main=main.__name__, outdir=str(outdir), simulated=int(simulated_devices)
    )
    body = _PRELUDE + "\n\n" + "\n\n".join(sources) + harness
    path = Path(path)
    path.write_text(body)
    return path
