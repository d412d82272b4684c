"""The command ``pipert plan --auto`` prints for a tiny model on a small CPU "cluster" runs under
``pipert train`` on gloo processes (two steps). The printed command runs as a user runs it, in its
own ``python -m pipert`` process (this suite's one such train run; the others call
``pipert.cli.main`` in the test's process: pipert.clirun)."""
import json
import math
import shlex
import subprocess
import sys

from pipert.clirun import run_cli


def test_the_printed_command_runs_two_steps():
    plan = run_cli("plan", "--auto", "--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--seq", "16")
    assert plan.returncode == 0, plan.stderr[-2000:]
    line = next(x.strip() for x in plan.stdout.splitlines() if x.strip().startswith("pipert train "))
    argv = shlex.split(line)[2:]          # the arguments after "pipert train", as printed
    run = subprocess.run([sys.executable, "-m", "pipert.cli", "train", *argv, "--steps", "2", "--json",
                          "--backend", "gloo"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    steps = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1]


def test_the_7b_plans_command_scaled_down_to_the_cpu_trains_two_steps():
    """The issue's example (7B on 8 x 8 GPUs in 2 datacenters): the best runnable layout's command,
    scaled down as the note prints it (tiny model, P = 2, D <= 2), trains two steps on gloo."""
    plan = run_cli("plan", "--auto", "--model", "7b", "--gpus-per-node", "8", "--nodes", "8", "--dcs", "2",
                   "--time-limit", "5s", "--json")
    assert plan.returncode == 0, plan.stderr[-2000:]
    best = json.loads(plan.stdout)["best"]
    argv = best["cpu_train_args"]
    assert argv[argv.index("--schedule") + 1] == best["schedule"] and "tiny" in argv
    assert any(shlex.join(argv) in note for note in best["notes"])     # the command the note prints
    steps = run_cli("train", *argv, "--steps", "2", "--json").rows()
    assert [s["step"] for s in steps] == [0, 1] and all(math.isfinite(s["loss"]) for s in steps)
