"""`pipert bench overlap`: runs on the CPU queues, reports consistent numbers, rejects bad input."""
import json

import pytest
import torch

from pipert.bench import OverlapResult
from pipert.cli import main


@pytest.mark.parametrize("extra", [[], ["--latency", "1ms", "--bandwidth", "8Gbps"]])
def test_overlap_json_is_consistent(extra, capsys):
    assert main(["bench", "overlap", "--gemm", "32", "--computes", "2", "--message-bytes", "4096", "--messages", "2",
                 "--repeats", "1", "--json", *extra]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["device"] == "cpu" and r["streams"] in ("ext", "python")
    assert min(r["compute_s"], r["comm_s"], r["both_s"]) > 0
    assert r["limit_s"] == max(r["compute_s"], r["comm_s"]) and r["serial_s"] == r["compute_s"] + r["comm_s"]
    assert r["overlap"] == pytest.approx((r["serial_s"] - r["both_s"]) / (r["serial_s"] - r["limit_s"]))
    if extra:
        assert r["latency"] == 1e-3 and r["bandwidth"] == 1e9
        assert r["comm_s"] >= 1e-3  # two messages of 4 KiB, each arriving 1 ms after its occupancy


def test_overlap_table_names_every_row(capsys):
    assert main(["bench", "overlap", "--gemm", "16", "--computes", "1", "--message-bytes", "64", "--messages", "1",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("compute alone", "messages alone", "both together", "limit max(compute, comm)", "serial sum",
                "overlap"):
        assert row in out


def test_overlap_share_is_one_without_room_to_save():
    r = OverlapResult("cpu", "ext", 1, 1, 1, 1, 0.0, float("inf"), 0.0, 0.5, 0.5)
    assert r.overlap == 1.0 and r.as_dict()["bandwidth"] is None


@pytest.mark.parametrize("flags,needle", [(["--gemm", "0"], "--gemm must be >= 1"),
                                          (["--message-bytes", "0"], "--message-bytes must be >= 1"),
                                          (["--latency", "3 days"], "unknown time unit"),
                                          (["--device", "tpu"], "--device 'tpu' is not a device; allowed: cpu"),
                                          (["--device", "meta"], "device type 'meta' unsupported; allowed: cpu"),
                                          pytest.param(["--device", "cuda"], "no CUDA device", marks=pytest.mark.skipif(
                                              torch.cuda.is_available(), reason="a GPU is here"))])
def test_bad_overlap_settings_are_named(flags, needle, capsys):
    assert main(["bench", "overlap", *flags]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [([], "required: {simulate,compare,export,train,emulate,plan,bench}"),
                                         (["bench"], "required: {overlap}")])
def test_missing_command_names_the_choices(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err
