"""devcourse.sharded: a checkpoint saved by two FSDP2 ranks with DCP, loaded back in one process."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from devcourse.models import seeded_tinynet
from devcourse.sharded import save_sharded_checkpoint, shard_files


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded") / "checkpoint"
    return folder, save_sharded_checkpoint(folder, seed=2, with_optimizer=True)


def test_one_file_per_rank_and_a_metadata_file(saved):
    folder, _ = saved
    assert sorted(shard_files(folder)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert all(size > 0 for size in shard_files(folder).values())


def test_each_rank_saved_half_of_each_sharded_weight(saved):
    folder, _ = saved
    entry = (
        dcp.FileSystemReader(folder).read_metadata().state_dict_metadata["model.encoder.0.weight"]
    )
    assert tuple(entry.size) == (16, 8)
    assert sorted((tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks) == [
        ((0, 0), (8, 8)),
        ((8, 0), (8, 8)),
    ]


def test_the_full_state_dict_is_what_one_process_loads(saved):
    folder, full = saved
    model = seeded_tinynet(0)
    assert not torch.equal(model.head.weight, full["head.weight"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model.state_dict()}, checkpoint_id=folder)
    assert sorted(model.state_dict()) == sorted(full)
    for key, value in model.state_dict().items():
        assert torch.equal(value, full[key]), key
    # one AdamW step away from the seeded model, in eval mode: BatchNorm's statistics unchanged (up
    # to float rounding: the ranks build the seeded model with one thread, this process with more)
    seeded = seeded_tinynet(2).state_dict()
    assert not torch.allclose(full["head.weight"], seeded["head.weight"])
    assert torch.allclose(
        full["encoder.1.running_mean"], seeded["encoder.1.running_mean"], atol=1e-6
    )


def test_optimizer_state_and_step_are_saved_beside_the_model(saved):
    folder, _ = saved
    keys = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    assert "step" in keys
    assert any(key.startswith("optimizer.state.") and key.endswith("exp_avg") for key in keys), (
        sorted(keys)[:5]
    )
