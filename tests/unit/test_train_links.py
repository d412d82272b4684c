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
                                          (["--dcs", "3", "--dc-latency", "2ms"], "--dcs 3 does not divide"),
                                          (["--dcs", "2", "--dc-latency", "1ms", "--dp", "2", "--microbatches", "8"],
                                           "not the replicas' gradient collectives")])
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
    with pytest.raises(ValueError, match=r"--dp 2: the emulated links delay point-to-point messages only.*"
                                         r"allowed with link flags: --dp 1"):
        build_program(TrainConfig(**{**shape, "microbatches": 16}, dp=2, dcs=2, dc_latency="20ms"))
