"""The device-semantics probes (probes_*.py) on index 0 and 1 of a device type, against CUDA's
outcomes.

    python tools/device_probes.py --device sim            # the simulated device against the
    catalogue python tools/device_probes.py --device cuda --record  # on a GPU: record CUDA's
    outcomes for this torch

The catalogue is tests/simdevice/device_probes.json; recordings go to
tests/simdevice/cuda_outcomes/. Imports only torch (and the simulated device for ``sim``). Exits 1
if an outcome differs from the catalogue.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path

import torch

import probes_tensors  # noqa: F401 -- its probes register on import, first
import probes_runtime  # noqa: F401 -- then these
from probe_registry import PROBES

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "simdevice" / "device_probes.json"
RECORDED = ROOT / "tests" / "simdevice" / "cuda_outcomes"
PLACEHOLDER = "<acc>"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def normalise(text: str, kind: str) -> str:
    """``text`` with the device type's name (``cuda``, ``CUDA``) as ``<acc>`` (``<ACC>``), addresses
    as ``0x?``.

    The name counts only where no letter touches it (``wrapper_CUDA_mm`` yes, ``simulated`` no)."""
    for name, placeholder in ((kind, PLACEHOLDER), (kind.upper(), PLACEHOLDER.upper())):
        text = re.sub(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])", placeholder, text)
    return _ADDRESS.sub("0x?", text)


def _summary(value, kind: str):
    if isinstance(value, str):
        return normalise(value, kind)
    if isinstance(value, (list, tuple)):
        return [_summary(item, kind) for item in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return normalise(repr(value), kind)


def outcome(fn, d0: str, d1: str | None, kind: str) -> dict:
    """What ``fn(d0, d1)`` does: ``{"returns": summary}`` or ``{"raises": type, "message": first
    line}``, with the device type's name read as ``<acc>`` (see :func:`normalise`) so that outcomes
    on ``cuda`` and ``sim`` compare."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = fn(d0, d1)
    except Exception as error:  # noqa: BLE001 -- whatever a probe raises is its outcome
        lines = str(error).strip().splitlines()
        return {
            "raises": type(error).__name__,
            "message": normalise(lines[0] if lines else "", kind),
        }
    return {"returns": _summary(value, kind)}


def run(kind: str, count: int, names=None) -> dict:
    """Every probe (or those ``names``) on ``kind:0`` and ``kind:1``; ``count``: how many devices
    there are."""
    d0, d1 = f"{kind}:0", (f"{kind}:1" if count > 1 else None)
    outcomes = {}
    for name, fn in PROBES.items():
        if names and name not in names:
            continue
        if fn.needs_two and d1 is None:
            outcomes[name] = {"skipped": "needs two devices"}
            continue
        outcomes[name] = outcome(fn, d0, d1, kind)
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()
    return {
        "torch": torch.__version__.split("+")[0],
        "device": kind,
        "device_count": count,
        "outcomes": outcomes,
    }


def matches(expected: dict, got: dict) -> bool:
    """Whether outcome ``got`` is the catalogue's ``expected``: the same summary, or the same
    exception type with a message that ``expected["match"]`` (a regular expression) finds."""
    if "returns" in expected:
        return "returns" in got and got["returns"] == expected["returns"]
    return (
        got.get("raises") == expected["raises"]
        and re.search(expected["match"], got.get("message", "")) is not None
    )


def compare(catalogue: dict, outcomes: dict) -> dict[str, list[str]]:
    """Sort each probe of ``outcomes`` against the catalogue: ``agrees``; ``limit`` (a listed limit
    of the simulated device, with its own words); ``lifted`` (a listed limit that now gives CUDA's
    outcome: take it off the list); ``differs``; ``skipped``; ``unlisted`` (no catalogue entry)."""
    report = {"agrees": [], "limit": [], "lifted": [], "differs": [], "skipped": [], "unlisted": []}
    for name, got in outcomes.items():
        entry = catalogue["probes"].get(name)
        if entry is None:
            report["unlisted"].append(name)
        elif "skipped" in got:
            report["skipped"].append(name)
        elif "limit" in entry and matches(entry["limit"], got):
            report["limit"].append(name)
        elif matches(entry["cuda"], got):
            report["lifted" if "limit" in entry else "agrees"].append(name)
        else:
            report["differs"].append(f"{name}: expected {entry['cuda']}, got {got}")
    return report


def same_as_recorded(recorded: dict, got: dict, entry: dict) -> bool:
    """Whether outcome ``got`` is CUDA's ``recorded`` one: equal, or the same exception type with
    messages that both fit the catalogue's expectation (a message may name a count of devices)."""
    if got == recorded:
        return True
    expected = entry["cuda"]
    return "raises" in recorded and matches(expected, recorded) and matches(expected, got)


def recorded_path(version: str, folder: Path = RECORDED) -> Path:
    return folder / f"torch-{version}.json"


def record(result: dict, folder: Path = RECORDED) -> Path:
    """Write ``result`` (from :func:`run` on a real accelerator) as the outcomes of its torch
    version."""
    folder.mkdir(parents=True, exist_ok=True)
    path = recorded_path(result["torch"], folder)
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return path


def recordings(folder: Path = RECORDED) -> dict[str, dict]:
    """Every recorded run, by torch version."""
    return {
        path.stem.removeprefix("torch-"): json.loads(path.read_text())
        for path in sorted(folder.glob("torch-*.json"))
    }


def _count(kind: str) -> int:
    if kind == "sim":
        import simdevice  # only the simulated device needs the course's package

        return len(simdevice.enable(2))
    return torch.get_device_module(kind).device_count()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="the device type to probe: cuda, sim, ...")
    parser.add_argument(
        "--record",
        nargs="?",
        const=str(RECORDED),
        default=None,
        metavar="FOLDER",
        help="write the outcomes as this torch version's recording (default folder: %(const)s)",
    )
    parser.add_argument("--only", nargs="*", help="run only these probes")
    args = parser.parse_args(argv)
    count = _count(args.device)
    if count < 1:
        print(f"no {args.device} device here", file=sys.stderr)
        return 2
    result = run(args.device, count, args.only)
    report = compare(json.loads(CATALOGUE.read_text()), result["outcomes"])
    for status, names in report.items():
        print(f"{status}: {len(names)}")
        if status != "agrees":
            for name in names:
                print(f"  {name}")
    if args.record is not None:
        print(f"recorded {record(result, Path(args.record))}")
    return 1 if report["differs"] or report["lifted"] else 0


if __name__ == "__main__":
    sys.exit(main())
