import math

from devcourse import ampbench


def test_every_mode_trains_in_its_own_process_and_reports():
    results = ampbench.compare_precision("cpu", steps=2, width=64, batch=16)
    assert [r.mode for r in results] == list(ampbench.MODES)
    for r in results:
        assert r.device == "cpu" and r.ms_per_step > 0 and r.peak_mib >= 0
        assert math.isfinite(r.last_loss) and 0 < r.last_loss < 10


def test_table_compares_each_mode_with_fp32():
    rows = [
        ampbench.PrecisionResult("fp32", "cpu", 10.0, 50.0, 2.3),
        ampbench.PrecisionResult("bf16", "cpu", 20.0, 60.0, 2.3),
    ]
    lines = ampbench.format_table(rows).splitlines()
    assert lines[0] == "device: cpu"
    assert lines[2].split() == ["fp32", "10.00", "1.00x", "50.0", "2.3000"]
    assert lines[3].split() == ["bf16", "20.00", "0.50x", "60.0", "2.3000"]
