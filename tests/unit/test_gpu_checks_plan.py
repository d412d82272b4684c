"""benchmarks/gpu_checks.py: on a machine without a GPU it says so, prints its plan and exits 0."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_checks.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=SCRIPT.parent)


def test_plan_lists_every_check_group():
    out = _run("--plan")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [ln.split(":")[0].strip() for ln in lines] == ["1. delay", "2. overlap", "3. emulation", "4. links",
                                                          "5. train", "6. nccl-1", "7. race", "8. vs-loop",
                                                          "9. host", "10. gap"]
    assert "10 us to 100 ms" in lines[0] and "crosspipe-greedy" in lines[2]
    assert "10 us to 100 ms" in lines[3] and "NCCL" in lines[3]
    assert "14 runs of pipert train --check" in lines[4]
    assert "--backend nccl -P 1" in lines[5] and "medium" in lines[7] and "chains off" in lines[9]


def test_train_check_reads_the_errors_and_reports_a_failed_run(monkeypatch):
    """The train check on the CPU (local transport): the same code that runs on cuda:0."""
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_checks
    monkeypatch.setattr(gpu_checks, "TRAIN", [("--schedule gpipe -P 2", "float64", 1e-10),
                                              ("--schedule no-such-schedule -P 2", "float64", 1e-10)])
    good, bad = gpu_checks.check_train(quick=False)
    assert good["pass"] and good["error"] <= 1e-10 and good["case"] == "--schedule gpipe -P 2 (float64)"
    assert not bad["pass"] and "exit 2" in bad["note"] and "no-such-schedule" in bad["note"]
    assert "| train | --schedule gpipe -P 2 (float64) |" in gpu_checks.report([good, bad], {"commit": "x"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script measures")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = _run("--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no GPU here" in out.stdout and "4. links" in out.stdout
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def _checks():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_checks
    import gpu_stall_checks
    return gpu_checks, gpu_stall_checks


def test_nccl_single_check_runs_pipert_train_with_one_process(monkeypatch):
    """The same row builder as on a GPU, with gloo in place of NCCL (no GPU here)."""
    gpu_checks, _ = _checks()
    monkeypatch.setattr(gpu_checks, "NCCL_SINGLE", ("--backend gloo -P 1", "float64", 1e-10))
    row, = gpu_checks.check_nccl_single(quick=True)
    assert row["check"] == "nccl-1" and row["case"] == "--backend gloo -P 1 (float64)"
    assert row["pass"] and row["error"] <= 1e-10, row


def test_stall_checks_rows_follow_from_their_measurements():
    """vs-loop, host and gap on the CPU (small sizes): each row's error and verdict are computed
    from its own expected and measured values; informational rows are reported, not counted."""
    gpu_checks, stalls = _checks()
    loop, = stalls.check_vs_loop(True, "cpu", model="small", seq=16, mb_size=1, microbatches=2, warmup=1)
    assert loop["error"] == pytest.approx(loop["measured_s"] / loop["expected_s"] - 1)
    assert loop["pass"] == (loop["measured_s"] <= 1.02 * loop["expected_s"])
    assert "largest loss difference" in loop["note"] and float(loop["note"].split("difference ")[1].split()[0]) < 1e-5
    host, = stalls.check_host(True, "cpu", stages=2, microbatches=4, seq=16, steps=2)
    assert 0 < host["measured_s"] and host["pass"] == (host["measured_s"] < host["expected_s"])
    gaps = stalls.check_gap(True, "cpu")
    before = [r for r in gaps if "chains off" in r["case"]]
    after = [r for r in gaps if "chains on" in r["case"]]
    assert len(before) == len(after) == 4 and all(r["pass"] == gpu_checks.INFO for r in before)
    assert all(isinstance(r["pass"], bool) for r in after)
    from pipert.device.streams import Chain
    assert Chain.enabled  # restored after the "before" runs
    text = gpu_checks.report(gaps + [loop], {"commit": "x"})
    assert text.count("| info |") == 4 and "- gap: " in text and " of 4 within target (and informational rows)" in text
