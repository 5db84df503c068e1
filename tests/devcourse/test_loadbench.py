import pytest

from devcourse import loadbench


def test_each_strategy_reports_time_and_memory_from_its_own_process():
    results = loadbench.compare_loading(32)
    assert [m.strategy for m in results] == list(loadbench.STRATEGIES)
    by_name = {m.strategy: m for m in results}
    assert all(m.seconds > 0 and m.checkpoint_mib > 30 for m in results)
    # a built model plus a loaded copy holds two copies; a meta-built model given the loaded
    # tensors, one
    plain = by_name["plain"].extra_peak_mib
    assert by_name["plain"].ratio > 1.5
    assert by_name["meta_assign"].extra_peak_mib < 0.75 * plain
    assert by_name["devcourse"].extra_peak_mib < 0.75 * plain
    # anonymous memory: mmap=True keeps the loaded copy in the file's pages, which the resident
    # peak counts and the anonymous one does not; meta_assign needs almost none of its own
    if by_name["plain"].extra_anon_mib is not None:  # Linux
        assert by_name["plain"].anon_ratio > 1.5
        assert by_name["mmap"].anon_ratio < 1.3 < by_name["mmap"].ratio
        assert by_name["meta_assign"].anon_ratio < 0.25


def test_table_has_one_row_per_strategy():
    rows = [
        loadbench.Measurement("plain", 1.5, 200.0, 100.0),
        loadbench.Measurement("devcourse", 0.5, 105.0, 100.0),
    ]
    lines = loadbench.format_table(rows).splitlines()
    assert lines[0] == "checkpoint: 100 MiB"
    assert lines[2].split() == ["plain", "1.50", "200", "2.00"]
    assert lines[3].split() == ["devcourse", "0.50", "105", "1.05"]


def test_table_adds_anonymous_memory_where_it_was_measured():
    rows = [loadbench.Measurement("mmap", 1.0, 200.0, 100.0, extra_anon_mib=100.0)]
    lines = loadbench.format_table(rows).splitlines()
    assert lines[1].split() == [
        "strategy",
        "seconds",
        "peak",
        "MiB",
        "x",
        "size",
        "anon",
        "MiB",
        "x",
        "size",
    ]
    assert lines[2].split() == ["mmap", "1.00", "200", "2.00", "100", "1.00"]


def test_table_adds_the_gpu_peak_when_loading_onto_a_gpu():
    rows = [loadbench.Measurement("plain", 1.0, 10.0, 100.0, "cuda:0", 200.0)]
    lines = loadbench.format_table(rows).splitlines()
    assert lines[0] == "checkpoint: 100 MiB, loaded onto cuda:0"
    assert lines[1].split()[-2:] == ["GPU", "MiB"] and lines[2].split()[-1] == "200"


def test_a_failing_strategy_raises_with_its_error(tmp_path):
    with pytest.raises(RuntimeError, match="plain failed"):
        loadbench.measure("plain", tmp_path / "missing.pt", 1)


def test_layer_count_follows_the_requested_size():
    assert loadbench.layers_for(1024) == 256 and loadbench.layers_for(1) == 1


def test_anon_peak_sees_memory_freed_before_the_block_ends():
    import mmap
    import time

    from devcourse import measure

    # A private anonymous mapping of its own: a tensor could reuse heap pages
    # an earlier test freed but malloc kept, and then nothing would grow.
    size = 32 * 2**20
    start = measure.anon_rss_mib()
    if start is None:  # no /proc here (macOS, Windows)
        with measure.AnonPeak() as anon:
            pass
        assert anon.peak is None
        return
    with measure.AnonPeak() as anon:
        block = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1  # written, so resident
        time.sleep(0.05)
        block.close()
    assert anon.peak - start > 24 and measure.anon_rss_mib() - start < 16
