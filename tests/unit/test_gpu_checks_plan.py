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
    assert [ln.split(":")[0].strip() for ln in lines] == ["1. delay", "2. overlap", "3. emulation", "4. links"]
    assert "10 us to 100 ms" in lines[0] and "crosspipe-greedy" in lines[2]
    assert "10 us to 100 ms" in lines[3] and "NCCL" in lines[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script measures")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = _run("--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no GPU here" in out.stdout and "4. links" in out.stdout
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written
