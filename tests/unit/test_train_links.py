"""`pipert train` with emulated links and --profile, on the local backend (threads)."""
import json
import os

import pytest

from pipert.cli import main


def test_train_with_links_and_profile_reports_prediction_and_stays_exact(capsys):
    code = main(["train", "--backend", "local", "--stages", "2", "--microbatches", "4", "--batch-size", "4",
                 "--seq", "16", "--steps", "2", "--dtype", "float64", "--json", "--check", "--profile",
                 "--dcs", "2", "--dc-latency", "2ms", "--dc-bandwidth", "1Gbps"])
    assert code == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(steps) == 2
    assert steps[0]["links"]["text"] == "2 DCs: 2 ms, 1 Gbit/s between them"
    assert steps[0]["links"]["dc_bandwidth_Bps"] == 1.25e8
    # the program it ran: the one build_program compiles from the same flags (1F1B ignores the links)
    from pipert.train import TrainConfig, build_program
    built = build_program(TrainConfig(stages=2, microbatches=4, batch_size=4, seq=16, steps=2, dtype="float64",
                                      dcs=2, dc_latency="2ms", dc_bandwidth="1Gbps"))
    assert steps[0]["program_digest"] == built.validated is not None
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s
        # the critical path crosses the DC boundary at least twice (first forward, last backward)
        assert s["predicted_step_s"] > 2 * 2e-3, s
        assert s["measured_step_s"] > 0
        # the ranks share this host's cores: the shared prediction says how many of each
        assert s["ranks_per_host"] == [2] and s["cores_per_host"] == [len(os.sched_getaffinity(0))], s
        assert s["predicted_shared_step_s"] > 2 * 2e-3, s
        assert s["predicted_rel_err"] == pytest.approx((s["predicted_step_s"] - s["measured_step_s"]) /
                                                       s["measured_step_s"])


@pytest.mark.parametrize("flags,needle", [(["--dc-latency", "2 hours", "--dcs", "2"], "unknown time unit"),
                                          (["--dc-latency", "2ms"], "give --dcs >= 2"),
                                          (["--dcs", "3", "--dc-latency", "2ms"], "--dcs 3 does not divide")])
def test_bad_link_flags_fail_before_training(flags, needle, capsys):
    assert main(["train", "--backend", "local", "--stages", "4", "--steps", "1", *flags]) == 2
    assert needle in capsys.readouterr().err


def test_crosspipe_in_train_plans_around_the_link_flags_in_seconds():
    """The generator gets the run's links (seconds, bytes/s) and unit costs measured here: a
    different program from the link-blind one, its prediction in seconds past both crossings."""
    from pipert.train import TrainConfig, build_program
    shape = dict(schedule="crosspipe-greedy", stages=4, microbatches=8, batch_size=8, seq=16, steps=1)
    blind = build_program(TrainConfig(**shape))
    told = build_program(TrainConfig(**shape, dcs=2, dc_latency="20ms", dc_bandwidth="1Gbps"))
    assert told.validated != blind.validated
    # uniform costs: T_F units, a few per action; measured costs: seconds, every forward then
    # backward crossing the 20 ms link at least once each
    assert told.meta["predicted_makespan"] > 2 * 20e-3
    assert told.meta["predicted_makespan"] < blind.meta["predicted_makespan"] / 10


def test_crosspipe_in_train_with_replicas_is_told_the_replicas_and_their_links():
    """With --dp 2 the generator is told the replicas, each unit's reduction and the links over the
    P x D ranks (replica d's stage s on rank d*P+s, as the run emulates them); it prices the
    reductions itself (tests/unit/test_crosspipe_dp.py), and the program is the replicated one."""
    from pipert.train import TrainConfig, _link_plan, build_program
    shape = dict(schedule="crosspipe-greedy", stages=2, microbatches=8, batch_size=8, seq=16, steps=1, dp=2, dcs=2,
                 dc_latency="20ms", dc_bandwidth="1Gbps")
    opts = _link_plan(TrainConfig(**shape), 2)
    assert opts["dp"] == 2 and opts["dp_op"] == ["allreduce", "allreduce"]
    assert opts["links"].topology.num_ranks == 4
    assert opts["links"].spec(0, 2).latency == 20e-3 and opts["links"].spec(0, 1).latency == 0.0
    zero = _link_plan(TrainConfig(**shape, zero="2"), 2)
    assert zero["dp_op"] == ["reducescatter", "reducescatter"]
    program = build_program(TrainConfig(**shape))
    assert program.meta["dp"] == 2 and program.num_ranks == 4


def test_local_train_with_replicas_across_datacenters_is_exact_and_holds_the_reductions(capsys):
    """--dp 2 -P 2 --dcs 2: each replica's pipeline inside one DC, every gradient all-reduce across
    the DC link; the step stays exact and each rank's held seconds are the simulator's prices."""
    from pipert.testing import train_collective_seconds
    flags = dict(stages=2, dp=2, microbatches=4, batch_size=4, seq=16, steps=2, dtype="float64", dcs=2,
                 dc_latency="2ms", dc_bandwidth="1Gbps")
    assert main(["train", "--backend", "local", "--json", "--check", "--profile",
                 *[f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    want = train_collective_seconds(**flags)
    assert min(want) > 2 * 2e-3
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s
        assert s["collective_link_s"] == pytest.approx(want, rel=1e-9), s
        # the prediction runs the same program on the same links: no step shorter than a reduction
        assert s["predicted_step_s"] > max(want), s
