"""`pipert train`: the main job, on gloo processes.

The command runs in the test's process (pipert.clirun; its ranks are gloo processes of the
shared fork server): nothing here tests what a separate ``python -m pipert`` process adds (that
is test_plan_auto_runs's printed command and test_launcher's)."""
import json

import pytest

from pipert.clirun import CliRun, run_cli


def train(*args: str) -> CliRun:
    return run_cli("train", *args)


def test_train_json_check_and_loss_goes_down():
    """Ten steps at the default lr take the tiny model's loss from ln(256) ~ 5.5 down by 1.2 (mean
    of the last three steps against the first three); an update 10x too small (lr 3e-4) gets 0.4 and
    no update 0, so a threshold of 0.8 fails on an optimizer that does not step or steps too little
    (a wrong update is --check's: the parameters' error against the reference)."""
    steps = train("--steps", "10", "--json", "--check", "--lr", "3e-3").rows()
    assert [s["step"] for s in steps] == list(range(10))
    for s in steps:
        assert s["tokens_per_s"] > 0
        assert s["max_grad_rel_err"] <= 1e-5 and s["max_param_rel_err"] <= 1e-5, s
        assert abs(s["loss"] - s["ref_loss"]) <= 1e-5 * abs(s["ref_loss"])
    first = sum(s["loss"] for s in steps[:3]) / 3
    last = sum(s["loss"] for s in steps[-3:]) / 3
    assert last < first - 0.8, (first, last)


def test_check_follows_a_schedule_that_updates_several_times_per_step():
    """weipipe-zb2 updates every P micro-batches (two updates per step at M = 2P): --check
    compares against one reference update per group, and the program reaches the spawned
    ranks intact (WAITs find their SENDs after pickling)."""
    steps = train("--schedule", "weipipe-zb2", "--steps", "2", "--json", "--check").rows()
    assert len(steps) == 2
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-5 and s["max_param_rel_err"] <= 1e-5, s
        assert abs(s["loss"] - s["ref_loss"]) <= 1e-5 * abs(s["ref_loss"]), s


def test_each_rank_materialises_only_the_units_it_computes_or_holds():
    """The model is built on the meta device in every process; a rank allocates only its units,
    with the values of a full build (the reference on rank 0 is one: max_init_rel_err is 0)."""
    from pipert.models import build_units
    from pipert.pipeline import units_needed
    from pipert.train import TrainConfig, build_program
    first = train("--model", "small", "--stages", "4", "--steps", "1", "--json", "--check").rows()[0]
    schedule = build_program(TrainConfig(model="small", stages=4))
    meta = build_units("small", schedule.num_units, keep=[])  # sizes only: nothing is allocated
    unit_bytes = [sum(p.numel() * p.element_size() for p in u.parameters()) for u in meta]
    expected = [sum(unit_bytes[u] for u in units_needed(schedule, r)) for r in range(4)]
    assert [len(units_needed(schedule, r)) for r in range(4)] == [1, 1, 1, 1]
    assert first["rank_param_bytes"] == expected
    assert first["model_param_bytes"] == sum(unit_bytes)
    assert max(expected) < 0.3 * sum(unit_bytes)
    assert first["max_init_rel_err"] == 0.0
    assert first["max_grad_rel_err"] <= 1e-5 and first["max_param_rel_err"] <= 1e-5, first


def test_pipemesh_on_a_two_by_two_mesh():
    """pipemesh over P=2 stages x D=2 replicas with ZeRO-3, its own sequences and selective
    recomputation trains exactly."""
    step = train("--schedule", "pipemesh", "--stages", "2", "--dp", "2", "--zero", "3", "--options",
                 "enqueue=4;dequeue=2,2", "--recompute", "no_attention", "--steps", "1", "--json", "--check",
                 "--dtype", "float64").rows()[0]
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10, step
    assert abs(step["loss"] - step["ref_loss"]) <= 1e-12 * abs(step["ref_loss"])


def test_a_saved_pipemesh_plan_trains_exactly(tmp_path):
    """`pipert plan --pipemesh --save` (P=2, D=2, its own sequences, ZeRO-2 mix and recomputation,
    scaled so that its units fit the tiny model) and `pipert train --plan` on 4 gloo processes:
    equal to the single-process reference."""
    path = str(tmp_path / "plan.json")
    made = run_cli("plan", "--pipemesh", "-P", "2", "--dp", "2", "--tp", "1", "-V", "2", "--batch", "16",
                   "--inter-node-gbps", "100000", "--memory-budget", "340", "--save", path)
    assert made.returncode == 0, made.stderr[-2000:]
    doc = json.load(open(path))
    assert doc["enqueue"] == [2, 2, 2, 2] and doc["zero"]["zero2"] == 1.0
    assert doc["recompute"]["runtime"] == "keep:attention,projection"      # norms and activations recomputed
    step = train("--plan", path, "--steps", "1", "--json", "--check", "--dtype", "float64").rows()[0]
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10, step
    assert abs(step["loss"] - step["ref_loss"]) <= 1e-12 * abs(step["ref_loss"])


def test_train_gpt_with_chunked_mlp_and_recompute_matches_its_reference():
    """The GPT model with the chunked MLP (recompute mode) and recomputation without attention
    trains under a schedule; the pipeline equals the single-process reference in float64."""
    steps = train("--model", "gpt-tiny", "--stages", "2", "--microbatches", "4", "--batch-size", "4", "--seq", "16",
                  "--steps", "2", "--json", "--check", "--backend", "local", "--dtype", "float64",
                  "--mlp-chunk", "8", "--mlp-recompute", "--recompute", "no_attention").rows()
    assert len(steps) == 2 and steps[1]["loss"] < steps[0]["loss"]
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s


def test_train_helixpipe_on_gloo_matches_its_reference():
    """helixpipe-2fold on two gloo processes: V = layers / P chosen for the model, the QKV
    weights travel, the step equals the single-process reference in float64."""
    steps = train("--schedule", "helixpipe-2fold", "--model", "gpt-tiny", "--stages", "2", "--microbatches", "4",
                  "--batch-size", "4", "--seq", "16", "--steps", "2", "--json", "--check", "--dtype", "float64",
                  "--recompute", "no_attention").rows()
    assert len(steps) == 2
    for s in steps:
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s


@pytest.mark.parametrize("args, message", [
    (("--stages", "8"), "--stages 8 x 1 chunks of 1f1b = 8 units, but model 'tiny' has 4 layers"),
    (("--schedule", "helixpipe", "--stages", "3", "--microbatches", "6", "--batch-size", "6"),
     "model 'tiny' has 4 layers, --stages 3; allowed --stages: divisors of 4"),
    (("--schedule", "helixpipe-2fold", "--stages", "4", "--microbatches", "4", "--batch-size", "4"),
     "microbatches must be a multiple of 8; got M=4; nearest allowed: 8, 16"),
    (("--model", "gpt-huge"), "--model 'gpt-huge' unknown; allowed: tiny"),
    (("--recompute", "most"), "--recompute 'most' unknown; allowed: none, no_attention, full"),
    (("--mlp-recompute",), "--mlp-recompute applies to the chunked MLP; give --mlp-chunk N > 0"),
    (("--batch-size", "10"), "not divisible into 8 micro-batches"),
    (("--schedule", "zb-v", "--chunks", "3"), "zb-v needs chunks == 2"),
    (("--schedule", "nope"), "unknown schedule 'nope'"),
    (("--schedule", "pipemesh", "--stages", "2", "--dp", "2", "--options", "enqueue=2,2;dequeue=4"),
     "enqueue [2, 2] / dequeue [4] with P=2, V=2, B=4 cannot run"),
    (("--schedule", "pipemesh", "--options", "enqueue"), "--options: 'enqueue' is not name=value"),
])
def test_train_rejects_bad_configs_before_starting_processes(monkeypatch, args, message):
    import pipert.launch

    def launched(*a, **k):
        raise AssertionError(f"ranks were started for a bad config: {args}")
    monkeypatch.setattr(pipert.launch, "launch", launched)
    out = train(*args)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr
    assert "pipert train: error:" in out.stderr
