"""CrossPipe's DP-aware objective and recompute case reached from the normal paths: ``compile(...,
dp=D)`` (and ``simulate --dp D``) prices the replicas' reductions for the generator itself, and
``simulate``, ``compare`` and ``export`` take ``--options`` as ``train`` does."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main
from pipert.compiler import compile, replica_options
from pipert.cost import Links, LinkSpec, Topology, UniformCost
from pipert.ir import Op
from pipert.schedules import build_schedule
from pipert.schedules.crosspipe import ChunkScaledCost, pattern_units
from pipert.schedules.crosspipe.build import reduction_times
from pipert.sim import simulate

# the case of test_crosspipe_recompute_dp: replica 0 in DC 0, replica 1 in DC 1, every reduction crosses
P, M = 2, 4
WAVE = ChunkScaledCost(UniformCost(tf=1.0, tb=2.0), 2)
DP_LINKS = Links(Topology(2 * P, num_dcs=2), {"inter_dc": LinkSpec(0.5, 1.0)})


def _compiled(name: str, **extra):
    return compile(name, stages=P, microbatches=2 * M, dp=2, chunks=2,
                   schedule_options={"cost": WAVE, "links": DP_LINKS, **extra})


@pytest.mark.parametrize("name, extra", [("crosspipe-wave", {}), ("crosspipe-optimal", {"time_limit": 600.0})])
def test_compile_with_replicas_plans_around_the_reductions(name, extra):
    auto = _compiled(name, **extra)
    blind = _compiled(name, dp_time=0, **extra)       # a given dp_time wins: the DP-blind order
    assert "replicate:crosspipe-overlap" in auto.passes and auto.actions != blind.actions
    t_auto, t_blind = (simulate(p, WAVE, DP_LINKS).makespan for p in (auto, blind))
    assert t_auto == pytest.approx(auto.meta["predicted_makespan"], abs=1e-9)   # the replicated step
    assert t_auto < t_blind - 1.0
    # the times compile derived are the simulator's pricing of the reductions (reduction_times)
    told = build_schedule(name, stages=P, microbatches=M, chunks=2, cost=WAVE, links=DP_LINKS,
                          dp_time=reduction_times(pattern_units("wave", P), P, 2, WAVE, DP_LINKS), **extra)
    assert compile(told, dp=2).actions == auto.actions


def test_replica_options_name_the_collective_replicate_emits():
    assert replica_options("crosspipe-wave", 2) == {"dp": 2, "dp_op": "allreduce", "zero": 0}
    assert replica_options("crosspipe-greedy", 3, zero="2") == {"dp": 3, "dp_op": "reducescatter", "zero": 2}
    assert replica_options("crosspipe-greedy", 1) == {} and replica_options("1f1b", 2) == {}


def test_replicas_need_links_over_every_rank_placed_alike():
    with pytest.raises(ValueError, match=r"dp=2: the links span 2 ranks, but 2 replicas of 2 stages run on 4"):
        _compiled("crosspipe-wave", links=Links.uniform_dc(Topology(P, num_dcs=2), 1.0, 1.0))
    # 3 replicas of 4 stages over 2 DCs of 6 ranks: replica 1 (ranks 4..7) crosses where replica 0 does not
    links = Links(Topology(12, num_dcs=2), {"inter_dc": LinkSpec(1.0, 1.0)})
    with pytest.raises(ValueError, match=r"replica 1's stages 0 -> 2 \(ranks 4 -> 6\) cross other links"):
        compile("crosspipe-greedy", stages=4, microbatches=12, dp=3,
                schedule_options={"cost": UniformCost(), "links": links})


def test_simulate_dp_builds_the_replicated_program_through_compile(capsys, tmp_path):
    link = ["--dcs", "2", "--dc-latency", "0.5", "--dc-transfer", "1", "--tf", "0.5", "--tb", "1"]
    argv = ["simulate", "crosspipe-wave", "-P", "2", "-M", "8", "--dp", "2", *link, "--json"]
    aware, blind = (_json(capsys, argv + extra) for extra in ([], ["--options", "dp_time=0"]))
    assert aware["dp"] == 2 and aware["stages"] == 4 and aware["microbatches"] == 8
    assert aware["makespan"] < blind["makespan"] - 1.0
    # the same program as compile's with the scenario's costs and links over the 4 ranks
    cost = UniformCost(tf=0.5, tb=1.0)
    links = Links(Topology(4, num_dcs=2), {"inter_dc": LinkSpec(0.5, float("inf"), 1.0)})
    prog = compile("crosspipe-wave", stages=2, microbatches=8, dp=2, chunks=2,
                   schedule_options={"cost": cost, "links": links})
    assert aware["makespan"] == simulate(prog, cost, links).makespan == prog.meta["predicted_makespan"]
    path = str(tmp_path / "one.json")
    assert main(["export", "1f1b", "-P", "2", "-M", "4", "-o", path]) == 0
    assert main(["simulate", path, "--dp", "2"]) == 2
    assert "--dp 2 replicates a schedule this command builds; a schedule file keeps" in capsys.readouterr().err


# --- --options in simulate, compare, export ------------------------------------------------------------
SHAPE = ["-P", "4", "-M", "8"]
ACT = UniformCost(tf=1.0, tb=2.0)


def _simulated(**options) -> float:
    return simulate(build_schedule("crosspipe-greedy", stages=4, microbatches=8, cost=ACT, **options), ACT).makespan


def _json(capsys, argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_reaches_the_generator_options(capsys):
    plain = _json(capsys, ["simulate", "crosspipe-greedy", *SHAPE, "--json"])["makespan"]
    for name, value in (("recompute", "full"), ("memory_budget", "static-max")):
        got = _json(capsys, ["simulate", "crosspipe-greedy", *SHAPE, "--json", "--options", f"{name}={value}"])
        assert got["makespan"] == _simulated(**{name: value}) != plain


def test_export_reaches_dp_time(capsys, tmp_path):
    # Wave: with reductions to hide, the later chunk's last W goes first (one replica's makespan is
    # not what the order then optimises)
    def exported(extra: list[str]) -> list:
        assert main(["export", "crosspipe-wave", "-P", "2", "-M", "4", "--format", "torch-json", *extra]) == 0
        return json.loads(capsys.readouterr().out)
    told = build_schedule("crosspipe-wave", stages=2, microbatches=4, cost=ACT, dp_time=3.0)
    assert exported(["--options", "dp_time=3"]) != exported([])
    path = str(tmp_path / "told.json")
    assert main(["export", "crosspipe-wave", "-P", "2", "-M", "4", "--options", "dp_time=3", "-o", path]) == 0
    from pipert.ir.files import load_schedule
    assert load_schedule(path).actions == told.actions


def test_export_and_compare_reach_recompute_full(capsys, tmp_path):
    path = str(tmp_path / "s.json")
    assert main(["export", "crosspipe-greedy", *SHAPE, "--options", "recompute=full", "-o", path]) == 0
    from pipert.ir.files import load_schedule
    s = load_schedule(path)
    assert sum(a.op is Op.RECOMPUTE for _, _, a in s) == 4 * 8 and s.meta["recompute_ops"] == "full"
    rows = _json(capsys, ["compare", *SHAPE, "--schedules", "crosspipe-greedy,1f1b", "--options", "recompute=full",
                          "--json", "--plot", ""])
    got = {r["schedule"]: r["makespan"] for r in rows}
    assert got["crosspipe-greedy"] == _simulated(recompute="full") != _simulated()
    assert got["1f1b"] == simulate(build_schedule("1f1b", stages=4, microbatches=8), ACT).makespan


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "1f1b", "--options", "recompute=full"], "--options recompute=...: 1f1b has no option recompute"),
    (["export", "crosspipe-greedy", "--options", "recompute"], "'recompute' is not name=value"),
    (["simulate", "crosspipe-greedy", "--options", "recompute=half"], "recompute='half' unknown; allowed: none"),
    (["simulate", "crosspipe-greedy", "--options", "dp=2", "--dcs", "2", "--dc-latency", "1"],
     "the links span 4 ranks, but 2 replicas of 4 stages run on 8"),
    (["simulate", "1f1b", "-M", "6", "--dp", "4"], "--microbatches 6 do not split over --dp 4 replicas"),
    (["simulate", "crosspipe-greedy", "-P", "4", "--dp", "3", "--dcs", "2", "--dc-latency", "1", "-M", "9"],
     "replica 1's stages 0 -> 2 (ranks 4 -> 6) cross other links than replica 0's"),
])
def test_bad_options_are_refused_naming_them(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
