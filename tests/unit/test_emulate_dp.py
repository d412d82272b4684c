"""``pipert emulate --dp D`` (and ``--options``): the program simulate builds with the same flags,
replicas and collectives included, run with delayed links."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main

CROSS = ["--dcs", "2", "--dc-latency", "0.5", "--dc-transfer", "1", "--tf", "0.5", "--tb", "1"]
CASES = {
    "1f1b": ["1f1b", "-P", "2", "-M", "4", "--tf", "0.5", "--tb", "1"],
    "crosspipe-wave": ["crosspipe-wave", "-P", "2", "-M", "8", *CROSS],
    "crosspipe-greedy": ["crosspipe-greedy", "-P", "2", "-M", "8", *CROSS],
    "tawpipe": ["tawpipe", "-P", "2", "-M", "4", "--ranks-per-node", "1", "--model", "tiny", "--seq", "64",
                "--time-unit", "20"],
}


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _sim_argv(argv: list[str]) -> list[str]:
    """simulate takes no --time-unit: drop it and its value."""
    if "--time-unit" in argv:
        i = argv.index("--time-unit")
        return argv[:i] + argv[i + 2:]
    return argv


@pytest.mark.parametrize("name", list(CASES))
def test_emulate_dp_runs_the_program_simulate_builds(name, capsys):
    argv = [*CASES[name], "--dp", "2", "--json"]
    em = _json(capsys, ["emulate", *argv])
    sim = _json(capsys, ["simulate", *_sim_argv(argv)])
    assert em["schedule"] == sim["schedule"] == f"{name}-dp2" and sim["stages"] == 4
    assert em["predicted_makespan"] == sim["makespan"]
    # the delays the emulator issued give the simulator's makespan (the measured one adds wake-ups)
    assert em["ideal_makespan"] == pytest.approx(sim["makespan"], rel=1e-6)


def test_emulate_options_reach_the_generator_and_dp_1_is_no_flag(capsys):
    aware = _json(capsys, ["emulate", *CASES["crosspipe-wave"], "--dp", "2", "--json"])
    blind = _json(capsys, ["emulate", *CASES["crosspipe-wave"], "--dp", "2", "--options", "dp_time=0", "--json"])
    assert aware["predicted_makespan"] < blind["predicted_makespan"] - 1.0
    one = _json(capsys, ["emulate", *CASES["1f1b"], "--dp", "1", "--json"])
    none = _json(capsys, ["emulate", *CASES["1f1b"], "--json"])
    assert one["schedule"] == none["schedule"] == "1f1b"
    assert one["predicted_makespan"] == none["predicted_makespan"]


def test_emulate_real_dp_runs_every_replica(capsys):
    out = _json(capsys, ["emulate", "1f1b", "-P", "2", "-M", "4", "--dp", "2", "--real", "--steps", "1",
                         "--seq", "16", "--json"])
    assert out["schedule"] == "1f1b-dp2"
    assert out["measured_step_s"] > 0 and out["predicted_step_s"] > 0


def test_emulate_dp_refusals_name_the_flag(capsys, tmp_path):
    path = str(tmp_path / "one.json")
    assert main(["export", "1f1b", "-P", "2", "-M", "4", "-o", path]) == 0
    capsys.readouterr()
    assert main(["emulate", path, "--dp", "2"]) == 2
    assert "--dp 2 replicates a schedule this command builds; a schedule file keeps" in capsys.readouterr().err
    assert main(["emulate", "1f1b", "-M", "6", "--dp", "4"]) == 2
    assert "--microbatches 6 do not split over --dp 4 replicas" in capsys.readouterr().err
    assert main(["emulate", "1f1b", "--dp", "0"]) == 2
    assert "--dp must be an integer >= 1" in capsys.readouterr().err


def test_zero_builds_the_sharded_program_the_generator_planned(capsys):
    """``--zero Z`` compiles the replicas with ZeRO Z (reduce-scatters, weight gathers) and tells
    CrossPipe's generator, whose own makespan is then the simulated one."""
    argv = [*CASES["crosspipe-wave"], "--dp", "2", "--json"]
    zero3 = _json(capsys, ["simulate", *argv, "--zero", "3"])
    zero0 = _json(capsys, ["simulate", *argv])
    assert zero3["zero"] == 3 and zero0["zero"] == 0 and zero3["makespan"] != zero0["makespan"]
    em = _json(capsys, ["emulate", *argv, "--zero", "3"])
    assert em["predicted_makespan"] == zero3["makespan"]
    assert em["ideal_makespan"] == pytest.approx(zero3["makespan"], rel=1e-6)


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "1f1b", "--zero", "2"], "--zero 2 shards over data-parallel replicas: give --dp > 1 too"),
    (["emulate", "1f1b", "--dp", "2", "--zero", "4"], "--zero must be a ZeRO stage 0, 1, 2 or 3"),
    (["simulate", "crosspipe-greedy", "--options", "zero=3"], "zero=... is told to the generator by --zero"),
    (["emulate", "crosspipe-greedy", "-P", "4", "--dp", "3", "--dcs", "2", "--dc-latency", "1", "-M", "9"],
     "replica 1's stages 0 -> 2 (ranks 4 -> 6) cross other links than replica 0's"),
])
def test_zero_refusals_name_the_flag(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
