"""Sharded checkpoints for notebook 09: a checkpoint written by several ranks, made on any machine.

:func:`save_sharded_checkpoint` starts ranks as torchrun would
(:func:`devcourse.distributed.run_functions`), each on the CPU with gloo, so no GPU is needed (on a
GPU machine too: a checkpoint's files do not depend on where the ranks ran), and they save an FSDP2
model with ``torch.distributed.checkpoint`` (DCP), which records no device. Introduced in
09_sharded_checkpoints.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from devcourse.distributed import run_functions

__all__ = ["save_sharded_checkpoint", "shard_files"]


def _save_sharded_worker(outdir):
    """One rank: build the seeded model, shard it with FSDP2, train a step, save with DCP (one
    process of the run)."""
    import json

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from devcourse.models import seeded_tinynet

    request = json.loads((outdir / "request.json").read_text())
    dist.init_process_group("gloo")  # noqa: F821 (the script's prelude imports dist)
    rank = dist.get_rank()  # noqa: F821
    # eval(): BatchNorm's running statistics are buffers, which FSDP2 does not shard or
    # synchronise; trained per rank they would differ, and DCP saves one rank's copy.
    model = seeded_tinynet(request["seed"]).eval()
    # A CPU mesh, named: without one FSDP2 makes a mesh on the machine's accelerator and moves
    # each rank to the GPU of its local rank, which a machine with fewer GPUs than ranks lacks.
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # noqa: F821
    for child in model.children():
        fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    # each rank its own batch
    generator = torch.Generator().manual_seed(request["seed"] * 100 + rank)
    model(torch.randn(8, 8, generator=generator)).square().mean().backward()
    optimizer.step()
    if request["with_optimizer"]:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "step": 1}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(outdir / "checkpoint"))
    # Every rank takes part in gathering the full state dict; rank 0 returns it.
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return full if rank == 0 else None


def save_sharded_checkpoint(
    folder: str | Path,
    seed: int = 0,
    world_size: int = 2,
    with_optimizer: bool = False,
    timeout_s: float = 120,
) -> dict[str, torch.Tensor]:
    """Save a ``TinyNet`` sharded over ``world_size`` CPU ranks with DCP into ``folder``; return its
    full state dict.

    The model is ``seeded_tinynet(seed)`` after one AdamW step in which each rank trained on its own
    batch (in eval mode, so BatchNorm's running statistics stay equal on every rank), so its values
    differ from the seeded model's. The checkpoint holds ``{"model": state_dict}``, plus
    ``"optimizer"`` and ``"step"`` with ``with_optimizer=True``. ``folder`` is created if needed;
    files already in it are overwritten. It gets one ``__<rank>_0.distcp`` file per rank and a
    ``.metadata`` file saying which rank holds which rows of each tensor; the same folder loads onto
    the CPU, a GPU or the simulated device. On a CPU-only machine it runs as anywhere else.
    """
    folder = Path(folder)
    with tempfile.TemporaryDirectory(prefix="sharded-save-") as workdir:
        workdir = Path(workdir)
        (workdir / "request.json").write_text(
            json.dumps({"seed": seed, "with_optimizer": with_optimizer})
        )
        results = run_functions(
            [], _save_sharded_worker, nproc_per_node=world_size, timeout_s=timeout_s, outdir=workdir
        )
        shutil.copytree(workdir / "checkpoint", folder, dirs_exist_ok=True)
    return results[0]


def shard_files(folder: str | Path) -> dict[str, int]:
    """The files of a DCP checkpoint folder and their sizes in bytes, sorted by name."""
    return {
        path.name: path.stat().st_size for path in sorted(Path(folder).iterdir()) if path.is_file()
    }
