"""pipert simulate: --passes times the program that pipert train --passes runs."""
from __future__ import annotations

import json

from pipert.cli import main
from pipert.cost import UniformCost
from pipert.ir.passes import recompute
from pipert.schedules import build_schedule
from pipert.sim import simulate


def _run(capsys, *argv: str) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_passes_change_what_is_simulated(capsys):
    plain = _run(capsys, "1f1b", "-P", "2", "-M", "4")
    rec = _run(capsys, "1f1b", "-P", "2", "-M", "4", "--passes", "recompute")
    want = simulate(recompute(build_schedule("1f1b", stages=2, microbatches=4)), UniformCost(1.0, 2.0))
    assert rec["makespan"] == want.makespan > plain["makespan"]     # every backward re-runs its forward
    assert rec["peak_memory"] == list(want.peak_memory)
    assert rec["peak_memory"][0] < plain["peak_memory"][0]           # kept inputs instead of stashes


def test_unknown_pass_is_named(capsys):
    assert main(["simulate", "1f1b", "--passes", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'bogus'" in err and "recompute" in err


def test_helixpipe_with_the_analytic_model_takes_layers_per_stage(capsys):
    """The tiny preset has 4 layers: on 2 stages HelixPipe gets V = 2 (9 units), priced by the
    helix units of the analytic model; the asynchronous two-fold (expand_folds) is the default,
    --sync-folds opts out, and the pass on the synchronous schedule gives the default back."""
    out = _run(capsys, "helixpipe-2fold", "-P", "2", "-M", "4", "--model", "tiny", "--seq", "256")
    assert out["units"] == 9 and out["makespan"] > 0
    sync = _run(capsys, "helixpipe-2fold", "-P", "2", "-M", "4", "--model", "tiny", "--seq", "256", "--sync-folds")
    asyn = _run(capsys, "helixpipe-2fold", "-P", "2", "-M", "4", "--model", "tiny", "--seq", "256", "--sync-folds",
                "--passes", "expand_folds,send_early")
    assert asyn["makespan"] == out["makespan"] and asyn["makespan"] <= sync["makespan"]
    assert main(["simulate", "helixpipe", "-P", "3", "-M", "3", "--model", "tiny"]) == 2
    assert "do not split over P=3 stages; allowed P: divisors of 4" in capsys.readouterr().err


def test_compare_refuses_an_unknown_schedule_name(capsys):
    assert main(["compare", "--schedules", "1f1b,nope", "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert "unknown schedule 'nope'; available: gpipe, 1f1b" in err


def test_a_reader_that_closes_early_gets_no_traceback():
    """`python -m pipert simulate ... --grid | head -1`: output beyond the pipe's buffer, reader gone
    after one line."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-m", "pipert",
                          "simulate", "1f1b", "-P", "8", "-M", "256", "--grid"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout.readline().startswith(b"schedule      1f1b")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_plan_json_ranks_the_schedules_the_table_ranks(capsys):
    assert main(["plan", "-P", "2", "-M", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["schedule"]: r for r in out["ranking"]}
    assert out["stages"] == 2 and out["microbatches"] == 4 and "1f1b" in rows and "crosspipe-greedy" in rows
    assert rows["1f1b"]["makespan"] == simulate(build_schedule("1f1b", stages=2, microbatches=4),
                                                UniformCost(1.0, 2.0)).makespan
    spans = [r["makespan"] for r in out["ranking"]]
    assert spans == sorted(spans)


def test_plan_pp_vs_dp_json(capsys):
    assert main(["plan", "--pp-vs-dp", "--latencies", "4ms", "--bandwidths", "64GB/s", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["latency_s"] == 0.004 and row["bandwidth_Bps"] == 64e9
    assert row["pp_vs_dp_speedup"] == row["dp_step"] / row["pp_step"]
    assert row["pp_vs_single_dc"] == row["pp_step"] / row["single_dc_step"]


def test_the_process_own_command_ends_as_the_interpreter_would():
    """main() without argv leaves the process itself (skipping freeing its result, cli._leave): the
    JSON is whole on stdout, atexit handlers run, the status is main's; a main(argv) call returns."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import atexit, sys; atexit.register(lambda: print('handler ran', file=sys.stderr)); "
            "from pipert.cli import main; sys.argv = ['pipert'] + sys.argv[1:]; sys.exit(main())")
    for argv, want in ((["1f1b", "-P", "4", "-M", "64", "--json"], 0), (["1f1b", "--passes", "bogus"], 2)):
        p = subprocess.run([sys.executable, "-c", code, "simulate", *argv], capture_output=True, env=env,
                           timeout=120)
        assert p.returncode == want and p.stderr.decode().endswith("handler ran\n"), p.stderr
        if want == 0:
            out = json.loads(p.stdout)
            assert out["makespan"] == simulate(build_schedule("1f1b", stages=4, microbatches=64),
                                               UniformCost(1.0, 2.0)).makespan
