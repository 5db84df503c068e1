import os
import pickle
import re
import subprocess
import sys
import zipfile

import pytest
import torch
from torch import nn

from devcourse import checkpoints as ck
from devcourse.models import TinyNet, seeded_tinynet

CUDA_LOAD_ERROR = re.escape(
    "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False"
)


def _equal(a, b):
    return list(a) == list(b) and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@pytest.mark.parametrize("saved_on", ["cuda:0", "cuda:1"])
@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the error a CPU-only machine raises")
def test_fixture_saved_on_a_gpu_fails_to_load_without_map_location(tmp_path, saved_on):
    ck.make_checkpoint(tmp_path / "c.pt", saved_on=saved_on)
    with pytest.raises(RuntimeError, match=CUDA_LOAD_ERROR):
        torch.load(tmp_path / "c.pt", weights_only=True)


def test_fixture_records_the_device_it_claims(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt", saved_on="cuda:1")
    seen = []
    torch.load(
        tmp_path / "c.pt",
        map_location=lambda storage, location: seen.append(location) or storage,
        weights_only=True,
    )
    assert seen and set(seen) == {"cuda:1"}


def test_a_dict_map_location_that_names_another_device_leaves_the_tag(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt", saved_on="cuda:1")
    assert torch.load(tmp_path / "c.pt", map_location={"cuda:1": "cpu"}, weights_only=True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=CUDA_LOAD_ERROR):
            torch.load(tmp_path / "c.pt", map_location={"cuda:0": "cpu"}, weights_only=True)


def test_tagging_is_undone_after_the_save(tmp_path):
    before = list(torch.serialization._package_registry)
    ck.make_checkpoint(tmp_path / "c.pt", saved_on="cuda:0")
    assert torch.serialization._package_registry == before
    torch.save({"w": torch.ones(1)}, tmp_path / "plain.pt")
    assert torch.load(tmp_path / "plain.pt", weights_only=True)["w"].device.type == "cpu"


@pytest.mark.parametrize(
    "wrapper, prefix",
    [
        ("plain", ""),
        ("dataparallel", "module."),
        ("ddp", "module."),
        ("compiled", "_orig_mod."),
        ("compiled_ddp", "_orig_mod.module."),
        ("ddp_compiled", "module._orig_mod."),
    ],
)
def test_wrappers_write_their_real_prefixes(tmp_path, wrapper, prefix):
    reference = ck.make_checkpoint(tmp_path / "c.pt", saved_on="cpu", wrapper=wrapper)
    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    assert list(saved) == [prefix + key for key in reference]


def test_ddp_wrapper_leaves_no_process_group_behind():
    import torch.distributed as dist

    ck.wrapped_state_dict(seeded_tinynet(), "ddp")
    assert not dist.is_initialized()


def test_fp16_fixture_keeps_integer_buffers_integer(tmp_path):
    reference = ck.make_checkpoint(tmp_path / "c.pt", saved_on="cpu", dtype=torch.float16)
    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    assert saved["head.weight"].dtype == torch.float16
    assert saved["encoder.1.num_batches_tracked"].dtype == torch.int64
    assert _equal(saved, reference)


def test_fixtures_are_byte_for_byte_reproducible(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        ck.make_checkpoint(
            tmp_path / folder / "c.pt",
            saved_on="cuda:1",
            wrapper="ddp",
            dtype=torch.float16,
            training=True,
        )
    assert (tmp_path / "a" / "c.pt").read_bytes() == (tmp_path / "b" / "c.pt").read_bytes()


def test_other_seeds_give_other_weights(tmp_path):
    a = ck.make_checkpoint(tmp_path / "a.pt", seed=0)
    b = ck.make_checkpoint(tmp_path / "b.pt", seed=1)
    assert not torch.equal(a["head.weight"], b["head.weight"])


def test_training_fixture_holds_model_optimizer_epoch_and_rng(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt", saved_on="cuda:0", training=True)
    saved = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=True)
    assert set(saved) == {"model", "optimizer", "epoch", "rng_state"}
    assert saved["epoch"] == 3 and saved["optimizer"]["state"]  # momentum buffers exist


def test_making_a_fixture_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ck.make_checkpoint(tmp_path / "c.pt", training=True)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("bad", [dict(wrapper="fsdp"), dict(saved_on="gpu")])
def test_fixture_arguments_are_checked(tmp_path, bad):
    with pytest.raises((ValueError, RuntimeError)):
        ck.make_checkpoint(tmp_path / "c.pt", **bad)


# ---------------------------------------------------------------- the loader


@pytest.mark.parametrize("saved_on", ck.SAVED_ON)
@pytest.mark.parametrize("wrapper", ck.WRAPPERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_load_model_opens_every_fixture(tmp_path, saved_on, wrapper, dtype):
    reference = ck.make_checkpoint(
        tmp_path / "c.pt", saved_on=saved_on, wrapper=wrapper, dtype=dtype
    )
    model = ck.load_model(tmp_path / "c.pt", TinyNet, device="cpu")
    state = model.state_dict()
    assert all(
        t.dtype == (torch.int64 if k.endswith("tracked") else torch.float32)
        for k, t in state.items()
    )
    assert _equal(state, {k: v.to(state[k].dtype) for k, v in reference.items()})
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())


def test_load_model_reads_training_checkpoints_and_defaults_to_the_best_device(tmp_path):
    from devcourse import best_device

    reference = ck.make_checkpoint(
        tmp_path / "c.pt", saved_on="cuda:1", wrapper="compiled_ddp", training=True
    )
    model = ck.load_model(tmp_path / "c.pt", TinyNet)
    assert {p.device for p in model.parameters()} == {best_device()}
    assert _equal(model.cpu().state_dict(), reference)


def test_load_model_to_meta_gives_a_model_without_values(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt")
    model = ck.load_model(tmp_path / "c.pt", TinyNet, device="meta")
    assert all(t.is_meta for t in model.state_dict().values())


def test_load_model_builds_normally_when_a_buffer_is_not_persistent(tmp_path):
    class WithScratch(TinyNet):
        def __init__(self):
            super().__init__()
            self.register_buffer("scratch", torch.full((2,), 7.0), persistent=False)

    reference = ck.make_checkpoint(tmp_path / "c.pt")
    model = ck.load_model(tmp_path / "c.pt", WithScratch, device="cpu")
    assert torch.equal(model.scratch, torch.full((2,), 7.0))
    assert _equal(model.state_dict(), reference)


def test_strip_prefixes_removes_nested_wrappers_only_when_every_key_has_them():
    t = torch.zeros(1)
    assert list(ck.strip_prefixes({"_orig_mod.module.a": t, "_orig_mod.module.b.c": t})) == [
        "a",
        "b.c",
    ]
    assert list(ck.strip_prefixes({"module.a": t, "b": t})) == ["module.a", "b"]
    assert list(ck.strip_prefixes({})) == []


def test_find_state_dict_looks_inside_training_checkpoints():
    inner = {"w": torch.zeros(1)}
    for key in ck.STATE_DICT_KEYS:
        assert ck.find_state_dict({key: inner, "epoch": 1}) == inner
    with pytest.raises(ck.NotACheckpoint, match="no model state dict"):
        ck.find_state_dict({"epoch": 1})


def _bad_file(tmp_path, kind):
    path = tmp_path / "bad.pt"
    if kind == "missing":
        return tmp_path / "nowhere.pt"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        ck.make_checkpoint(tmp_path / "good.pt")
        data = (tmp_path / "good.pt").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "text":
        path.write_text("epoch,loss\n1,0.5\n")
    elif kind == "other_zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "hello")
    elif kind == "truncated_legacy":
        torch.save(
            {"w": torch.ones(100)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False
        )
        data = (tmp_path / "legacy.pt").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "whole_model":
        torch.save(TinyNet(), path)
    return path


@pytest.mark.parametrize(
    "kind, error, message",
    [
        ("missing", ck.CheckpointNotFound, "no checkpoint at"),
        ("empty", ck.EmptyCheckpoint, r"is empty \(0 bytes\)"),
        ("truncated", ck.TruncatedCheckpoint, "cut short or damaged"),
        ("truncated_legacy", ck.TruncatedCheckpoint, "cut short or damaged"),
        ("text", ck.NotACheckpoint, "not a PyTorch checkpoint"),
        ("other_zip", ck.NotACheckpoint, "not one written by torch.save"),
        ("whole_model", ck.UnsafeCheckpoint, "devcourse.models.TinyNet"),
    ],
)
def test_every_bad_file_gets_its_own_clear_error(tmp_path, kind, error, message):
    path = _bad_file(tmp_path, kind)
    with pytest.raises(error, match=message):
        ck.load_model(path, TinyNet, device="cpu")


def test_unsafe_checkpoint_lists_the_globals_and_runs_none_of_them(tmp_path):
    ran = []

    class Payload:
        def __reduce__(self):
            return (ran.append, ("payload ran",))

    torch.save({"w": torch.ones(1), "x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(ck.UnsafeCheckpoint) as err:
        ck.read_checkpoint(tmp_path / "evil.pt")
    assert err.value.globals_needed and ran == []
    assert isinstance(err.value.__cause__, pickle.UnpicklingError)


def test_unsafe_checkpoint_in_a_pickle_protocol_torch_cannot_list_still_refuses(tmp_path):
    torch.save(TinyNet(), tmp_path / "p4.pt", pickle_protocol=4)
    with pytest.raises(pickle.UnpicklingError, match="Unsupported operand"):
        # what the loader handles
        torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "p4.pt")
    with pytest.raises(
        ck.UnsafeCheckpoint, match="globals that are not tensors or plain containers"
    ) as err:
        ck.read_checkpoint(tmp_path / "p4.pt")
    assert err.value.globals_needed == []


def test_an_unexpected_error_while_listing_the_globals_goes_up_with_the_refusal(
    tmp_path, monkeypatch
):
    torch.save(TinyNet(), tmp_path / "whole.pt")

    def vanished(path):
        raise FileNotFoundError(f"{path} is gone")

    monkeypatch.setattr(torch.serialization, "get_unsafe_globals_in_checkpoint", vanished)
    with pytest.raises(FileNotFoundError, match="is gone") as err:
        ck.read_checkpoint(tmp_path / "whole.pt")
    # the weights_only refusal it came from
    assert isinstance(err.value.__context__, pickle.UnpicklingError)
    assert any("whole.pt" in note for note in getattr(err.value, "__notes__", ["whole.pt"]))


def test_a_mismatch_lists_missing_unexpected_and_misshapen_keys_and_loads_nothing(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt")

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 32))
            self.classifier = nn.Linear(32, 4)

    with pytest.raises(ck.KeyMismatch) as err:
        ck.load_model(tmp_path / "c.pt", Other, device="cpu")
    assert "classifier.weight" in err.value.missing
    assert "head.weight" in err.value.unexpected
    assert err.value.wrong_shape == [
        "encoder.0.weight: checkpoint (16, 8), model (32, 8)",
        "encoder.0.bias: checkpoint (16,), model (32,)",
    ]
    assert "missing from the checkpoint" in str(err.value) and "not in the model" in str(err.value)

    target = Other()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ck.KeyMismatch):
        ck.check_keys(target, ck.read_state_dict(tmp_path / "c.pt"))
    assert _equal(target.state_dict(), before), "a failed check loads nothing"


def test_read_checkpoint_can_memory_map(tmp_path):
    ck.make_checkpoint(tmp_path / "c.pt")
    mapped = ck.read_checkpoint(tmp_path / "c.pt", mmap=True)
    assert _equal(mapped, ck.read_checkpoint(tmp_path / "c.pt"))


def test_amp_fixture_adds_the_grad_scaler_state_and_still_loads(tmp_path):
    reference = ck.make_checkpoint(
        tmp_path / "c.pt", saved_on="cuda:1", wrapper="ddp", dtype=torch.float16, amp=True
    )
    saved = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=True)
    assert set(saved) == {"model", "optimizer", "epoch", "rng_state", "scaler"}
    assert saved["scaler"]["scale"] == 65536.0 and "growth_interval" in saved["scaler"]
    model = ck.load_model(tmp_path / "c.pt", TinyNet, device="cpu")
    assert _equal(
        model.state_dict(), {k: v.to(model.state_dict()[k].dtype) for k, v in reference.items()}
    )


DDP_MADE_AND_DROPPED = """
import os, sys
from torch.nn.parallel import DistributedDataParallel
from devcourse.checkpoints import single_process_group, _GROUPS
from devcourse.models import TinyNet

for _ in range(int(sys.argv[1])):
    with single_process_group():
        ddp = DistributedDataParallel(TinyNet())
    del ddp  # its group's last work may still be ending in one of the group's threads
print("done", len(_GROUPS), len(os.listdir("/proc/self/task")), flush=True)
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity"), reason="Linux: busy processes on the same cores"
)
def test_deleting_a_ddp_model_right_after_its_group_never_hangs(tmp_path):
    """A DDP model made in single_process_group and deleted at once, on a busy machine, 300 times in
    each of two processes.

    Before the helper held its groups, PyTorch could destroy the group inside the model's teardown
    with the GIL held while a thread of the group waited for the GIL: on two busy cores 4 of 5 such
    runs hung for good, and this test failed at its timeout.
    """
    script = tmp_path / "ddp_made_and_dropped.py"
    script.write_text(DDP_MADE_AND_DROPPED)
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    try:
        runs = [
            subprocess.Popen(
                [sys.executable, str(script), "300"], stdout=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        for run in runs:
            try:
                out, _ = run.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                run.kill()
                pytest.fail("a process that made and deleted DDP models hung")
            done, groups, threads = out.split()
            # The groups no model holds are let go of, and their threads end with them.
            assert done == "done" and int(groups) <= 3 and int(threads) < 30, out
    finally:
        for process in busy:
            process.kill()
            process.wait()
