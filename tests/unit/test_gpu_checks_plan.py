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
                                                          "5. train"]
    assert "10 us to 100 ms" in lines[0] and "crosspipe-greedy" in lines[2]
    assert "10 us to 100 ms" in lines[3] and "NCCL" in lines[3]
    assert "14 runs of pipert train --check" in lines[4]


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
