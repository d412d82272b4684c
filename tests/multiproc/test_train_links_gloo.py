"""`pipert train` on gloo processes with emulated cross-DC links and --profile."""
import os

from pipert.clirun import run_cli


def test_gloo_train_with_links_is_exact_and_reports_the_prediction():
    steps = run_cli("train", "--backend", "gloo", "--stages", "2", "--microbatches", "4", "--batch-size", "4",
                    "--seq", "16", "--steps", "2", "--dtype", "float64", "--json", "--check", "--profile", "--dcs",
                    "2", "--dc-latency", "2ms", "--dc-bandwidth", "1Gbps").rows()
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[0]["links"]["text"] == "2 DCs: 2 ms, 1 Gbit/s between them"
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s
        assert s["predicted_step_s"] > 2 * 2e-3 and s["measured_step_s"] > 0, s  # >= 2 DC crossings on the path
        # the ranks share this host's cores: the shared prediction says how many of each
        assert s["ranks_per_host"] == [2] and s["cores_per_host"] == [len(os.sched_getaffinity(0))], s
        assert s["predicted_shared_step_s"] > 2 * 2e-3, s


def test_gloo_train_with_replicas_across_datacenters_holds_each_reduction_for_its_price():
    """-P 2 --dp 2 --dcs 2 on 4 gloo processes: the replicas' gradient all-reduces cross the DC link
    (each pipeline stays inside its DC); the step is exact and every rank's collectives were held
    for exactly the simulator's price (the emulator's own records, gathered per rank)."""
    import pytest
    from pipert.testing import train_collective_seconds
    flags = dict(stages=2, dp=2, microbatches=4, batch_size=4, seq=16, steps=1, dtype="float64", dcs=2,
                 dc_latency="2ms", dc_bandwidth="1Gbps")
    (step,) = run_cli("train", "--backend", "gloo", "--json", "--check",
                      *[f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]).rows()
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10, step
    want = train_collective_seconds(**flags)
    assert min(want) > 2 * 2e-3
    assert step["collective_link_s"] == pytest.approx(want, rel=1e-9), step
