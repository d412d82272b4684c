"""The benchmark script parses its flags and its CPU dry run passes (it is not timed here)."""
import importlib.util
import pathlib
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_chunked_mlp.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_chunked_mlp", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_flags(bench):
    args = bench.parse_args([])
    assert (args.seqs, args.hidden, args.ffn, args.dtype) == ([32768, 65536, 131072], 4096,
                                                              14336, "bfloat16")
    quick = bench.parse_args(["--quick"])
    assert quick.seqs == [4096, 8192] and quick.chunks == [1024, 2048]
    names = [v.name for v in bench.variants("swiglu", [4096, 8192], 16384, 4096)]
    assert names[:3] == ["torch unchunked", "torch chunks 16384", "torch chunks 4096 + checkpoint"]
    assert names[3:] == ["ours (a) 4096", "ours (a) 8192", "ours (b) 4096", "ours (b) 8192"]
    assert bench.model_flops(2, 3, 5, "swiglu") == 18 * 2 * 3 * 5


def test_dry_run(bench, capsys):
    assert bench.main(["--dry-run"]) == 0
    assert "dry run ok" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_refuses_without_gpu(bench, capsys):
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_judge_and_report_writer(bench, tmp_path):
    """The verdicts and the CSV/markdown writer, on hand-made rows (no timings involved)."""
    gib, n, f = 2 ** 30, 1000, 10
    base = {"n": n, "kind": "torch", "peak": 4 * gib}
    ckpt = {"n": n, "kind": "torch-ckpt", "peak": 2 * gib}
    a_ok = {"n": n, "kind": "ours-a", "chunk": 100, "time_ratio": 1.02, "peak": 3 * gib}
    a_slow = dict(a_ok, time_ratio=1.05)
    a_big = dict(a_ok, peak=4 * gib - (n - 100) * f * 2 + 1)
    b_ok = {"n": n, "kind": "ours-b", "chunk": 100, "time_ratio": 1.24, "peak": 2 * gib}
    b_big = dict(b_ok, peak=2 * gib + 1)
    verdicts = [bench.judge(r, base, ckpt, f, 2)[1] for r in (a_ok, a_slow, a_big, b_ok, b_big)]
    assert verdicts == ["PASS", "MISS", "MISS", "PASS", "MISS"]
    assert bench.judge(base, base, ckpt, f, 2) == ("", "")

    args = bench.parse_args(["--quick", "--out-dir", str(tmp_path)])
    common = {"n": 4096, "chunk": 4096, "ms": 2.0, "tflops": 100.0, "peak": gib,
              "time_ratio": 1.0, "target": "", "verdict": "", "status": "ok"}
    rows = [dict(common, variant="torch unchunked", kind="torch"),
            dict(common, variant="ours (b) 1024", kind="ours-b", chunk=1024, verdict="MISS",
                 target="time <= 1.25x")]
    bench.write(rows, args, "t", "Some GPU")
    md = (tmp_path / "t.md").read_text()
    assert "Some GPU" in md and "| 4096 | ours (b) 1024 |" in md and "1 target(s) missed" in md
    assert "- seq 4096, ours (b) 1024: no bound of its target (time <= 1.25x) exceeded by the stored figures" in md
    csv_lines = (tmp_path / "t.csv").read_text().splitlines()
    assert csv_lines[0].startswith("n,variant,chunk,ms") and len(csv_lines) == 3


def test_report_is_rebuilt_from_the_stored_csv_and_context(bench, tmp_path):
    rows = [dict(n=4096, variant="torch unchunked", chunk=0, ms=2.0, tflops=300.0, peak=2 * bench.GIB,
                 time_ratio=1.0, target="", verdict="", status="ok"),
            dict(n=4096, variant="ours (a) 1024", chunk=1024, ms=2.2, tflops=270.0, peak=bench.GIB,
                 time_ratio=1.1, target="<= 1.03x", verdict="MISS", status="ok")]
    args = bench.parse_args(["--quick", "--out-dir", str(tmp_path)])
    bench.write(rows, args, "chunked_mlp_quick", "a GPU")
    written = (tmp_path / "chunked_mlp_quick.md").read_text()
    assert "| 4096 | ours (a) 1024 | 2.20 | 270 | 1.00 | 1.100 | <= 1.03x | MISS |" in written
    assert "1 target(s) missed:\n- seq 4096, ours (a) 1024: time 1.100x above 1.03x" in written
    assert bench.main(["--quick", "--out-dir", str(tmp_path), "--from-csv"]) == 0
    rebuilt = (tmp_path / "chunked_mlp_quick.md").read_text()
    assert [line for line in rebuilt.splitlines() if "report rebuilt" not in line] == written.splitlines()
