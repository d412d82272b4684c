"""pipert.tools.linkcheck (the links case of benchmarks/gpu_checks.py) on its host mirror:
two gloo processes, the stream path of DelayedTransport, one clock."""
import pytest

from pipert.tools.linkcheck import measure_link_delays, summarise


def test_host_mirror_never_reads_before_the_latency(tmp_path):
    (row,) = measure_link_delays([2e-3], 3, tmp_path / "links.json")
    assert row["delay_s"] == 2e-3 and row["n"] == 3 and "gloo" in row["where"]
    # the read stamp follows the arrival, which is one latency after the send stamp
    assert row["median_err_s"] >= -1e-8 and row["max_abs_err_s"] >= row["p95_abs_err_s"] >= 0


def test_summarise_orders_the_errors():
    row = summarise(1e-3, [3e-6, -1e-6, 2e-6], "here")
    assert row["median_err_s"] == 2e-6 and row["max_abs_err_s"] == 3e-6 and row["n"] == 3
    with pytest.raises(ValueError):
        summarise(1e-3, [], "here")
