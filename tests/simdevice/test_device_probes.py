"""The device-semantics catalogue: each probe of tools/device_probes.py on sim:0 and sim:1 against
CUDA's outcome.

CUDA's outcomes are the catalogue's (tests/simdevice/device_probes.json, each with its evidence)
and, where a GPU recorded them (``python tools/device_probes.py --device cuda --record``),
tests/simdevice/cuda_outcomes/. A listed limit of the simulated device is reported as one, in its
own words, and never counts as agreeing.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

import simdevice as sim

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import device_probes  # noqa: E402 -- the script sits in tools/, beside the probes it imports by name

CATALOGUE = json.loads(device_probes.CATALOGUE.read_text())


@pytest.fixture(scope="module")
def outcomes():
    sim.enable(2)
    # the probes seed the CPU generator, which the device's draws use
    with torch.random.fork_rng(devices=[]):
        return device_probes.run("sim", 2)


def _not_done_section() -> str:
    text = (ROOT / "docs" / "simulated-device.md").read_text()
    section = re.split(r"\n#+ ", text.split("What it does not do:", 1)[1], maxsplit=1)[0]
    return " ".join(section.split())


def test_the_catalogue_holds_every_probe_with_its_evidence():
    probes = CATALOGUE["probes"]
    assert len(probes) >= 60
    assert sorted(probes) == sorted(device_probes.PROBES), (
        "a probe without an entry, or an entry without a probe"
    )
    for name, entry in probes.items():
        assert len(entry["evidence"]) > 20, name
        for outcome in (entry["cuda"], entry.get("limit", {"returns": None})):
            assert ("returns" in outcome) != (
                "raises" in outcome and re.compile(outcome["match"]) is not None
            ), name
    not_done = _not_done_section()
    for name, entry in probes.items():
        if "limit" in entry:
            assert entry["limit_doc"] in not_done, (
                f"{name}: its limit is not in the docs' list ({entry['limit_doc']})"
            )


@pytest.mark.parametrize("name", sorted(CATALOGUE["probes"]))
def test_the_simulated_device_does_what_cuda_does(outcomes, name):
    got = outcomes["outcomes"][name]
    report = device_probes.compare(CATALOGUE, {name: got})
    assert not report["differs"], report["differs"][0]
    assert not report["lifted"], (
        f"{name} now gives CUDA's outcome: take its limit off the catalogue and the docs"
    )
    status = "limit" if "limit" in CATALOGUE["probes"][name] else "agrees"
    assert report[status] == [name]


def test_limits_are_reported_as_limits_never_as_agreeing(outcomes):
    report = device_probes.compare(CATALOGUE, outcomes["outcomes"])
    listed = sorted(name for name, entry in CATALOGUE["probes"].items() if "limit" in entry)
    assert sorted(report["limit"]) == listed and not set(listed) & set(report["agrees"])
    assert len(report["agrees"]) + len(report["limit"]) == len(CATALOGUE["probes"])


def test_a_probe_whose_outcome_differs_is_reported(outcomes):
    got = outcomes["outcomes"]
    changed = {
        "probes": {
            "to_another_index": {"cuda": {"returns": "<acc>:0"}, "evidence": "made up"},
            "item_of_two_elements": {
                "cuda": {"raises": "RuntimeError", "match": "^other words$"},
                "evidence": "made up",
            },
            "numpy_of_a_device_tensor": {
                "cuda": {"raises": "RuntimeError", "match": "numpy"},
                "evidence": "made up",
            },
            "resize_grows_in_place": {
                "cuda": {"raises": "NotImplementedError", "match": "simulated device"},
                "evidence": "made up",
                "limit": {"returns": [6]},
                "limit_doc": "made up",
            },
        }
    }
    report = device_probes.compare(changed, {name: got[name] for name in changed["probes"]})
    assert sorted(name.split(":")[0] for name in report["differs"]) == [
        "item_of_two_elements",
        "numpy_of_a_device_tensor",
        "to_another_index",
    ]
    assert report["lifted"] == ["resize_grows_in_place"] and report["agrees"] == []
    assert device_probes.compare(changed, {"not_in_it": got["to_another_index"]})["unlisted"] == [
        "not_in_it"
    ]


def test_outcomes_are_compared_with_the_device_type_read_as_a_placeholder():
    assert (
        device_probes.normalise("wrapper_CUDA_mm on cuda:1 at 0x7f3a2b", "cuda")
        == "wrapper_<ACC>_mm on <acc>:1 at 0x?"
    )
    assert (
        device_probes.normalise("the simulated device sim:0, torch.sim.FloatTensor", "sim")
        == "the simulated device <acc>:0, torch.<acc>.FloatTensor"
    )

    def raises():
        raise ValueError("cuda:0 at 0xdeadbeef\nsecond line")

    assert device_probes.outcome(lambda d0, d1: raises(), "cuda:0", None, "cuda") == {
        "raises": "ValueError",
        "message": "<acc>:0 at 0x?",
    }
    assert device_probes.outcome(lambda d0, d1: [d0, torch.float16], "cuda:0", None, "cuda") == {
        "returns": ["<acc>:0", "torch.float16"]
    }


def test_a_run_is_recorded_per_torch_version_and_read_back(outcomes, tmp_path):
    path = device_probes.record(outcomes, tmp_path)
    assert path.name == f"torch-{torch.__version__.split('+')[0]}.json"
    assert device_probes.recordings(tmp_path) == {outcomes["torch"]: outcomes}
    one = device_probes.run(
        "sim", 1, ["to_another_index", "new_zeros_on_index_1", "item_of_a_device_scalar"]
    )
    assert one["outcomes"]["to_another_index"] == {"skipped": "needs two devices"}
    assert device_probes.compare(CATALOGUE, one["outcomes"])["skipped"] == [
        "new_zeros_on_index_1",
        "to_another_index",
    ]
    assert (
        device_probes.main(
            ["--device", "sim", "--only", "item_of_a_device_scalar", "--record", str(tmp_path)]
        )
        == 0
    )
    assert device_probes.recordings(tmp_path)[outcomes["torch"]]["outcomes"] == {
        "item_of_a_device_scalar": {"returns": 2.5}
    }


def _differences(recorded: dict, outcomes: dict) -> list[str]:
    """Where CUDA's recording breaks the catalogue, and where the simulated device differs from the
    recording."""
    found = []
    for name, cuda in recorded["outcomes"].items():
        entry = CATALOGUE["probes"].get(name)
        if entry is None or "skipped" in cuda:
            continue
        if not device_probes.matches(entry["cuda"], cuda):
            found.append(f"{name}: CUDA recorded {cuda}, the catalogue expects {entry['cuda']}")
        elif "limit" not in entry and not device_probes.same_as_recorded(
            cuda, outcomes["outcomes"][name], entry
        ):
            found.append(
                f"{name}: CUDA recorded {cuda}, the simulated device gives"
                f" {outcomes['outcomes'][name]}"
            )
    return found


def test_recorded_cuda_outcomes_agree_with_the_catalogue_and_the_simulated_device(outcomes):
    recorded = device_probes.recordings()
    if not recorded:
        pytest.skip(
            "no CUDA outcomes recorded yet: run tools/device_probes.py --device cuda --record on"
            " a GPU"
        )
    ours = ".".join(torch.__version__.split(".")[:2])
    same = {
        version: run
        for version, run in recorded.items()
        if ".".join(version.split(".")[:2]) == ours
    }
    for version, run in recorded.items():
        if version not in same and _differences(run, outcomes):
            warnings.warn(
                f"CUDA under torch {version} (this is {torch.__version__}):"
                f" {_differences(run, outcomes)}"
            )
    if not same:
        pytest.skip(
            f"no CUDA outcomes recorded for torch {ours}; others compared: {sorted(recorded)}"
        )
    for version, run in same.items():
        assert _differences(run, outcomes) == [], version


def test_a_recording_that_differs_is_reported(outcomes):
    two = "a Tensor with 2 elements cannot be converted to Scalar"
    missing = (
        "Attempting to deserialize object on <ACC> device 4 but torch.<acc>.device_count() is 1."
        " Please use torch.load with map_location to map your storages to an existing device."
    )
    recorded = {
        "outcomes": {
            "to_another_index": {"returns": "<acc>:0"},
            "item_of_two_elements": {"raises": "RuntimeError", "message": two},
            "load_on_a_missing_index": {"raises": "RuntimeError", "message": missing},
        }
    }
    assert [d.split(":")[0] for d in _differences(recorded, outcomes)] == ["to_another_index"]
    other = dict(
        outcomes, outcomes=dict(outcomes["outcomes"], item_of_two_elements={"returns": 1.0})
    )
    assert [d.split(":")[0] for d in _differences(recorded, other)] == [
        "to_another_index",
        "item_of_two_elements",
    ]
