"""Multi-process runs: results come back, failures are named, nothing is left running."""

import os
import subprocess

import pytest
import torch

from devcourse.distributed import (
    DistributedRunError,
    free_port,
    run_functions,
    start_ranks,
    torchrun,
    write_script,
)


def _setup():
    dist.init_process_group("gloo")  # noqa: F821 (the script's prelude imports dist)
    return dist.get_rank(), dist.get_world_size()  # noqa: F821


def _train(outdir):
    rank, world = _setup()
    local_rank = int(os.environ["LOCAL_RANK"])
    accelerator = torch.accelerator.current_accelerator()
    device = torch.device(accelerator.type, local_rank) if accelerator else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2).to(device), device_ids=[local_rank] if accelerator else None)  # noqa: F821
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # each rank sees other data
    for _ in range(3):
        loss = model(torch.randn(8, 4).to(device)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {
        "rank": rank,
        "world": world,
        "device": str(model.module.weight.device),
        "weight": model.module.weight.detach(),
    }


def _processes_running(folder):
    """Processes whose command line names a file in ``folder`` (the run's script)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(folder) in line]


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """A temporary folder of the test's own, for this process and the runs it starts: what a run
    leaves there."""
    import tempfile

    folder = tmp_path / "temporary"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(scope="module")
def two_nodes_on_the_cpu():
    return run_functions([_setup], _train, nproc_per_node=1, nnodes=2)


def test_two_nodes_train_in_step(two_nodes_on_the_cpu):
    results = two_nodes_on_the_cpu
    assert sorted(r["rank"] for r in results) == [0, 1] and {r["world"] for r in results} == {2}
    assert [r["device"] for r in results] == ["cpu", "cpu"]
    assert torch.equal(results[0]["weight"], results[1]["weight"]), "DDP keeps parameters in step"


# What torchrun gives every process and the course reads or shows (torchrun's agent adds its own
# store's and error file's variables, which a process without an agent does not need).
TORCHRUN_VARIABLES = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
]


def _variables(outdir):
    _setup()
    # No rank leaves before every rank has connected: a rank 0 that exits at once can close its
    # side of gloo's pair while rank 1 still connects ("Connection closed by peer").
    dist.barrier()  # noqa: F821 (the script's prelude imports dist)
    return dict(os.environ)


@pytest.mark.parametrize("nodes", [1, 2])
def test_start_ranks_gives_each_process_what_torchrun_gives_it(tmp_path, nodes, temporary):
    """The same script under torchrun (c10d rendezvous, one agent per node) and under start_ranks
    (no agent)."""
    per_node = 2 // nodes
    script = write_script(tmp_path / "env.py", [_setup], _variables, tmp_path)
    seen = {}
    for launcher in (torchrun, start_ranks):
        launcher(script, nproc_per_node=per_node, nnodes=nodes, cwd=tmp_path, timeout_s=60)
        seen[launcher.__name__] = [
            torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)
        ]
        assert list(temporary.iterdir()) == [], f"{launcher.__name__} left its logs behind"
    for by_torchrun, by_start_ranks in zip(seen["torchrun"], seen["start_ranks"]):
        assert {k: by_torchrun.get(k) for k in TORCHRUN_VARIABLES} == {
            k: by_start_ranks.get(k) for k in TORCHRUN_VARIABLES
        }
        assert None not in [by_torchrun.get(k) for k in TORCHRUN_VARIABLES], by_torchrun
    assert [r["GROUP_RANK"] for r in seen["start_ranks"]] == (
        ["0", "0"] if nodes == 1 else ["0", "1"]
    )


def _lineage(outdir):
    """The commands of this rank's parent (torchrun's launcher) and of the launcher's parent."""

    def parent_of(pid):
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])

    def command(pid):
        with open(f"/proc/{pid}/cmdline") as cmdline:
            return cmdline.read().replace("\0", " ").strip()

    launcher = os.getppid()
    return {"launcher": command(launcher), "above": command(parent_of(launcher))}


@pytest.mark.skipif(
    not os.path.exists("/proc/self/stat"), reason="reads the processes' parents in /proc (Linux)"
)
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "DEVCOURSE_NO_WARMSTART"])
def test_torchruns_launcher_is_forked_warm_and_starts_its_ranks_itself(tmp_path, monkeypatch, warm):
    """On Linux the launcher is forked from the warm server (no torch import of its own); the ranks
    are its children, started by torchrun as anywhere. Turned off, the launcher is a child of the
    caller."""
    if not warm:
        monkeypatch.setenv("DEVCOURSE_NO_WARMSTART", "1")
    script = write_script(tmp_path / "lineage.py", [], _lineage, tmp_path)
    torchrun(script, nproc_per_node=2, timeout_s=60)
    for rank in range(2):
        seen = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert "-m torch.distributed.run" in seen["launcher"], seen
        assert ("-m autograder.run.forkserver warmstart" in seen["above"]) == warm, seen


@pytest.mark.skipif(
    torch.accelerator.is_available(),
    reason="simulated devices are only turned on without an accelerator",
)
def test_ranks_on_simulated_devices_train_as_on_the_cpu(two_nodes_on_the_cpu):
    results = run_functions([_setup], _train, simulated_devices=2)
    assert [r["rank"] for r in results] == [0, 1] and [r["device"] for r in results] == [
        "sim:0",
        "sim:1",
    ]
    assert torch.equal(results[0]["weight"], results[1]["weight"])
    # gradients all-reduced in gloo from the simulated tensors' values: the same numbers as on the
    # CPU
    assert torch.allclose(results[0]["weight"], two_nodes_on_the_cpu[0]["weight"], atol=1e-6)


def _hang(outdir):
    import time

    time.sleep(600)


@pytest.mark.parametrize("launcher", [torchrun, start_ranks], ids=lambda f: f.__name__)
def test_a_run_past_its_time_limit_is_stopped_with_a_clear_message(tmp_path, launcher, temporary):
    script = write_script(tmp_path / "hang.py", [], _hang, tmp_path)
    with pytest.raises(DistributedRunError, match=r"did not finish within 6 s"):
        launcher(script, timeout_s=6)
    assert _processes_running(tmp_path) == []
    assert list(temporary.iterdir()) == []


def _rank_one_dies(outdir):
    dist.init_process_group("gloo")  # noqa: F821
    if dist.get_rank() == 1:  # noqa: F821
        os._exit(3)
    dist.barrier()  # noqa: F821 (would wait forever for rank 1)


def _rank_zero_leaves_first(outdir):
    import time

    store, rank, _ = next(dist.rendezvous("env://"))  # noqa: F821 (init_process_group's store)
    if rank == 0:
        store.set("left", "rank 0")
        return None
    time.sleep(1.0)  # rank 0 has ended by now
    return store.get("left").decode()


def test_a_rank_that_ends_first_leaves_the_store_to_the_others():
    """The store lives as long as the run, as torchrun's agent holds it: rank 1 of gloo reads rank
    0's sequence number from it after their connection (``setSequenceNumberForGroup``), and a rank 0
    that held it and had already ended failed rank 1's ``init_process_group`` under load."""
    assert run_functions([], _rank_zero_leaves_first, timeout_s=60) == [None, "rank 0"]


@pytest.mark.parametrize("launcher", [torchrun, start_ranks], ids=lambda f: f.__name__)
def test_a_dead_rank_ends_the_run_instead_of_hanging(tmp_path, launcher):
    script = write_script(tmp_path / "dies.py", [], _rank_one_dies, tmp_path)
    with pytest.raises(DistributedRunError, match="exited with code"):
        launcher(script, timeout_s=60)
    assert _processes_running(tmp_path) == []


def _wrong_answer(batch):
    raise ValueError(f"a batch of {len(batch)} rows is not what rank 1 expected")


def _rank_one_raises(outdir):
    dist.init_process_group("gloo")  # noqa: F821
    if dist.get_rank() == 1:  # noqa: F821
        _wrong_answer([1, 2, 3])
    dist.barrier()  # noqa: F821 (fails on rank 0 once rank 1 is gone)


def test_the_first_exception_of_a_rank_leads_the_message_with_its_traceback():
    with pytest.raises(DistributedRunError) as failure:
        run_functions([_wrong_answer], _rank_one_raises, timeout_s=60)
    message = str(failure.value)
    assert message.startswith(
        "rank 1 raised ValueError: a batch of 3 rows is not what rank 1 expected"
    ), message[:300]
    assert "in _wrong_answer" in message and "then rank 0 raised" in message, message[:2000]


def _rank_zero_fails_a_moment_later(outdir):
    import time

    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank 1 fails first")
    time.sleep(0.3)  # as a rank does that finds its peer gone, under load
    raise RuntimeError("rank 0 fails a moment later")


def test_a_rank_that_fails_a_moment_after_the_first_is_reported_too():
    with pytest.raises(DistributedRunError) as failure:
        run_functions([], _rank_zero_fails_a_moment_later, timeout_s=60)
    message = str(failure.value)
    assert message.startswith("rank 1 raised ValueError: rank 1 fails first"), message[:300]
    assert "then rank 0 raised RuntimeError: rank 0 fails a moment later" in message, message[:2000]
    assert "rank 1 exited with code" in message, message[-500:]


def test_helpers():
    port = free_port()
    assert 1024 < port < 65536


def test_script_holds_the_functions_and_a_harness(tmp_path):
    script = write_script(tmp_path / "run.py", [_setup], _train, tmp_path)
    text = script.read_text()
    assert "def _setup():" in text and "def _train(outdir):" in text
    assert 'if __name__ == "__main__":' in text and "rank{_os.environ['RANK']}.pt" in text


def _sync_batchnorm(outdir):
    rank, _ = _setup()
    device = torch.device("sim", int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))  # noqa: F821
    model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(net).to(device), device_ids=[device.index])  # noqa: F821
    batch = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    mine = batch[:4] if rank == 0 else batch[4:]  # shares of 4 and 6 samples
    model(mine.to(device)).pow(2).sum().backward()
    norm = model.module[1]
    return {
        "type": type(norm).__name__,
        "running_mean": norm.running_mean.cpu(),
        "running_var": norm.running_var.cpu(),
        "grad": model.module[0].weight.grad.cpu(),
    }


@pytest.mark.skipif(
    torch.accelerator.is_available(),
    reason="simulated devices are only turned on without an accelerator",
)
def test_sync_batchnorm_on_simulated_devices_sees_the_whole_batch():
    results = run_functions([_setup], _sync_batchnorm, simulated_devices=2)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    batch = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    net(batch).pow(2).sum().backward()  # one process, the whole batch
    for result in results:
        assert result["type"] == "SyncBatchNorm"
        torch.testing.assert_close(result["running_mean"], net[1].running_mean)
        torch.testing.assert_close(result["running_var"], net[1].running_var)
        # DDP averages the two ranks' gradients of their own shares of the loss
        torch.testing.assert_close(result["grad"], net[0].weight.grad / 2)


def init_process_group(outdir):
    """Stands in for torch.distributed's, failing as gloo's connect does, on the first two runs
    (rank 1 of each)."""
    rank = os.environ["RANK"]
    (outdir / f"attempt-{rank}-{len(list(outdir.glob(f'attempt-{rank}-*')))}").write_text("")
    if rank == "1" and len(list(outdir.glob("attempt-1-*"))) <= 2:
        raise RuntimeError(
            "Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer"
            " [127.0.0.1]:226"
        )


def connects_on_the_third_run(outdir):
    init_process_group(outdir)
    return int(os.environ["RANK"])


def fails_its_own_way(outdir):
    (outdir / f"ran-{os.environ['RANK']}-{len(list(outdir.glob('ran-*')))}").write_text("")
    raise ValueError("the answer is wrong")


def test_a_run_whose_ranks_could_not_connect_runs_again_and_no_other_failure_does(tmp_path):
    first, second = tmp_path / "gloo", tmp_path / "own"
    first.mkdir()
    second.mkdir()
    assert run_functions(
        [init_process_group], connects_on_the_third_run, outdir=first, timeout_s=60
    ) == [0, 1]
    assert len(list(first.glob("attempt-1-*"))) == 3, "three runs: the first two could not connect"
    with pytest.raises(DistributedRunError, match="ValueError: the answer is wrong"):
        run_functions([], fails_its_own_way, outdir=second, timeout_s=60)
    assert len(list(second.glob("ran-*"))) == 2, "one run of two ranks: not run again"
