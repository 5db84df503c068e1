"""benchmarks/simulated_device.py times an MLP, an LSTM and a Transformer step on sim:0 against the
CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_prints_a_ratio_for_each_model_with_equal_losses():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "simulated_device.py"),
            "--steps",
            "5",
            "--batch",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    # 1: a target missed, a tiny batch's business
    assert done.returncode in (0, 1), done.stderr[-2000:]
    ratios = re.findall(
        r"^(MLP|LSTM|Transformer) .* same losses: .* sim:0 / cpu: \d+\.\d\dx", done.stdout, re.M
    )
    assert ratios == ["MLP", "LSTM", "Transformer"], done.stdout
