"""The command ``pipert plan --auto`` prints for a tiny model on a small CPU "cluster" runs under
``pipert train`` on gloo processes (two steps)."""
import json
import shlex
import subprocess
import sys


def test_the_printed_command_runs_two_steps():
    plan = subprocess.run([sys.executable, "-m", "pipert.cli", "plan", "--auto", "--model", "tiny",
                           "--gpus-per-node", "2", "--batch", "4", "--seq", "16"],
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    line = next(x.strip() for x in plan.stdout.splitlines() if x.strip().startswith("pipert train "))
    argv = shlex.split(line)[2:]          # the arguments after "pipert train", as printed
    run = subprocess.run([sys.executable, "-m", "pipert.cli", "train", *argv, "--steps", "2", "--json",
                          "--backend", "gloo"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    steps = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1]
