"""Tensor parallelism in PipeMesh's planner: TP collectives in the component times, T as a
dimension of the plan (every divisor of the GPUs per node), the paper's T with --paper, and the
defaults a bare `pipert plan --pipemesh` states."""
from __future__ import annotations

import json
import math

import pytest

from pipert.cli import main
from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import LinkSpec
from pipert.planner.workload import PAPER_MODELS, Cluster, tp_layer_times, workload

BW = 150e9


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("name", ["gpt3-58b", "falcon-66b"])
def test_tp_collectives_per_layer(name, t):
    """Megatron SP: 2 all-gathers + 2 reduce-scatters of [s, h] each way, each (T-1)/T * bytes /
    bw on a ring; Falcon's parallel attention and MLP share one of each."""
    m = PAPER_MODELS[name]
    cluster = Cluster(DeviceSpec.preset("a100"), 8, 100.0, intra_node=LinkSpec(0.0, BW))
    one = (t - 1) / t * m.seq * m.hidden * 2 / BW
    n = 2 if m.parallel else 4
    assert tp_layer_times(m, t, cluster) == pytest.approx((n * one, n * one), rel=1e-12)
    assert tp_layer_times(m, 1, cluster) == (0.0, 0.0)


def test_component_times_add_tp_traffic():
    m = PAPER_MODELS["gpt3-58b"]
    dev = DeviceSpec.preset("a100")
    free = Cluster(dev, 8, 100.0, intra_node=LinkSpec(0.0, math.inf))
    nvlink = Cluster(dev, 8, 100.0, intra_node=LinkSpec(0.0, BW))
    kw = dict(tp=8, stages=4, dp=3, chunks=2, microbatches=8)
    c0, c1 = workload(m, free, **kw)[0], workload(m, nvlink, **kw)[0]
    per_chunk = m.layers // (4 * 2)
    f, d = tp_layer_times(m, 8, nvlink)
    assert c0.bwd == pytest.approx(2 * c0.fwd, rel=1e-12)
    assert c1.fwd == pytest.approx(c0.fwd + per_chunk * f, rel=1e-12)
    assert c1.bwd == pytest.approx(c0.bwd + per_chunk * d, rel=1e-12)


def _plan(capsys, *argv: str) -> dict:
    assert main(["plan", "--pipemesh", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bare_plan_states_defaults_and_picks_t(capsys):
    out = _plan(capsys)
    assert out["defaults"]["-P"] == 4 and out["defaults"]["--dp"] == 3 and out["defaults"]["--model"] == "gpt3-58b"
    cands = out["tp_candidates"]
    assert [c["tp"] for c in cands] == [1, 2, 4, 8] and out["sp"] is True
    chosen = [c for c in cands if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["tp"] == out["tp"]
    assert chosen[0]["per_device"] == max(c["per_device"] for c in cands)
    assert cands[0]["error"].startswith("memory budget")         # 58B on 12 GPUs does not fit 80 GiB
    for c in cands:
        if c["t_iter"] is not None:
            assert c["per_device"] == pytest.approx(8 * 3 / (c["t_iter"] * c["devices"]))
    # the text form tells the same
    assert main(["plan", "--pipemesh"]) == 0
    text = capsys.readouterr().out
    assert "defaults: --model gpt3-58b" in text and "<- chosen" in text


def test_given_tp_and_paper_tp(capsys):
    out = _plan(capsys, "--tp", "4")
    assert out["tp"] == 4 and out["tp_candidates"] == [] and "--tp" not in out["defaults"]
    paper = _plan(capsys, "--paper", "gpt3-a100")
    assert paper["tp"] == 8 and paper["sp"] and paper["defaults"] == {}
    assert "T,P,D=8,3,3, sequence parallel" in paper["setting"]


@pytest.mark.parametrize("argv,message", [
    (("-P", "5"), "-P 5: GPT-3 58B's 72 layers do not split into 5 stages of equal chunks; allowed -P: 1, 2, 3, 4, 6"),
    (("--stages", "0"), "-P must be >= 1, got 0"),
    (("-M", "0"), "-M must be >= 1, got 0"),
    (("--tp", "0"), "--tp must be >= 1, got 0"),
    (("--tp", "16"), "--tp 16: a tensor-parallel group (with sequence parallelism) lies inside a node of "
                     "--ranks-per-node 8 GPUs"),
    (("--model", "llama2-55b", "--tp", "3"), "allowed --tp: 1, 2, 4, 8"),
    (("--ranks-per-node", "6", "--tp", "4"), "allowed --tp: 1, 2"),
    (("--memory-budget", "1"), "no tensor-parallel size fits: T=1: memory budget 1.000 GiB is below"),
])
def test_bad_planner_input_is_named(capsys, argv, message):
    assert main(["plan", "--pipemesh", *argv]) == 2
    assert message in capsys.readouterr().err


def test_ranking_plan_takes_tp(capsys):
    """plan (the schedule ranking) prices its analytic costs with --tp/--sp as simulate does."""
    base = ["plan", "--model", "7b", "--seq", "2048", "-P", "4", "-M", "8", "--json"]
    assert main(base) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*base, "--tp", "8", "--sp", "--ranks-per-node", "8"]) == 0
    eight = json.loads(capsys.readouterr().out)
    assert (eight["tp"], eight["sp"], one["tp"]) == (8, True, 1)
    by = lambda out: {r["schedule"]: r["makespan"] for r in out["ranking"]}   # noqa: E731
    assert by(eight)["1f1b"] < by(one)["1f1b"] / 2
    for argv, message in ((["--tp", "8"], "--tp 8 prices tensor parallelism with the analytic model"),
                          (["--pp-vs-dp", "--sp"], "--sp does not apply to --pp-vs-dp"),
                          (["--pipemesh", "--paper", "gpt3-a100", "--tp", "4"], "--tp 4 does not apply to --paper")):
        assert main(["plan", *argv]) == 2
        assert message in capsys.readouterr().err
