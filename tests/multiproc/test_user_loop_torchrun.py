"""examples/user_loop.py under torchrun (gloo): a user's own nn.Module trained with their own
loop (clipping, cosine LR, eval) equals the same loop in one process."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_loop.py"


@pytest.mark.parametrize("nproc,extra", [(2, []), (4, ["--dp", "2", "--schedule", "pipemesh"])],
                         ids=["1f1b-P2", "pipemesh-P2xD2"])
def test_example_under_torchrun_equals_single_process(nproc, extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(EXAMPLE), "--check", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    number = r"largest difference ([0-9.e+-]+)$"
    params = [float(v) for v in re.findall(r"parameters after 3 steps, " + number, proc.stdout, re.M)]
    outputs = [float(v) for v in re.findall(r"eval outputs, " + number, proc.stdout, re.M)]
    assert len(params) == nproc and max(params) < 1e-10, proc.stdout
    assert len(outputs) == (2 if extra else 1) and max(outputs) < 1e-10, proc.stdout  # the last stage's ranks
    assert len(re.findall(r"^step \d: loss", proc.stdout, re.M)) == 3
