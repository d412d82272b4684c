"""``pipert plan --auto``: ranking, memory pruning, extrapolation, JSON shape and flag errors
(the printed command runs under pipert train: tests/multiproc/test_plan_auto_runs.py)."""
import json
import re
import subprocess
import sys

import pytest

from pipert.cli import main
from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import LinkSpec, default_link_specs
from pipert.cost.transformer import ModelSpec
from pipert.planner import pipe
from pipert.planner.auto import STATE_BYTES, analytic_cost, search
from pipert.planner.cluster import Cluster, parse_size
from pipert.planner.layouts import Layout, layouts

TINY = ModelSpec.preset("tiny")


def _plan(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["plan", "--auto", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_zero_bubble_ranks_above_1f1b_on_the_same_layout():
    """ZB-H1 runs 1F1B's forwards and input gradients in the same order and fills the bubble with
    the weight gradients: with free links, on one layout, it is never slower, and here strictly faster."""
    free = {k: LinkSpec() for k in ("intra_node", "inter_node", "inter_dc")}
    res = search(TINY, Cluster(4, 1, links=free), 16, families=("1f1b", "zb-h1"), stages=4, micro_batch=1, top=2)
    assert [c.layout.family for c in res.ranked] == ["zb-h1", "1f1b"]
    assert res.ranked[0].step < res.ranked[1].step


def test_a_slow_datacenter_link_keeps_data_parallelism_inside_a_datacenter():
    """Two datacenters of one node of 2 devices each, 10 Mbit/s between them: P = 1 and P = 2
    all-reduce each stage's gradients across the slow link, P = 4 sends only activations over it."""
    cl = Cluster(2, 2, 2, links={**default_link_specs(), "inter_dc": LinkSpec(1e-3, 1.25e6)})
    res = search(TINY, cl, 8, families=("1f1b",), tp=1, micro_batch=1, top=3)
    assert res.ranked[0].layout.stages == 4 and res.ranked[0].layout.dp == 1


def test_memory_prunes_and_what_is_ranked_fits():
    params = TINY.num_params
    budget = params * sum(STATE_BYTES.values()) / 3       # the whole model's states need P >= 3 or ZeRO
    dev = DeviceSpec("small", 1.0, memory=budget)
    res = search(TINY, Cluster(4, 1, device=dev), 16, families=("1f1b",), micro_batch=1, top=10)
    assert res.pruned_memory > 0 and res.ranked
    assert all(c.memory <= budget for c in res.ranked)
    # P = T = 1, D = 4: ZeRO-3's 4 bytes per parameter + a gathered unit + the activations > 16/3
    assert not any(c.layout.stages == 1 and c.layout.tp == 1 for c in res.ranked)
    # the whole model's states on one device of P = 4 would not fit without the split over stages
    assert any(c.layout.stages == 4 for c in res.ranked)


def test_nothing_fits_is_said_and_exit_status_1(capsys):
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--gpu-memory", "1MiB")
    assert rc == 1
    assert "nothing fits" in out and "--gpu-memory" in out


def test_extrapolated_step_matches_the_simulated_one(monkeypatch):
    """1F1B at M = 32 simulated whole, and from M = 16 and 8 along a line: within 1 %."""
    cl = Cluster(4, 1)
    lay = next(x for x in layouts(cl, TINY, 32, ("1f1b",), stages=4, micro_batch=1))
    cost = analytic_cost(cl)(TINY, lay, "none", lay.units)

    def run(shape: Layout):
        from pipert.schedules import build_schedule
        from pipert.sim import simulate
        s = build_schedule("1f1b", stages=shape.stages, microbatches=shape.microbatches)
        return s, simulate(s, cost, links=shape.links(cl), topology=shape.topology())
    whole = pipe.simulate_pipe(lay, run)
    monkeypatch.setattr(pipe, "PLAN_PAIR_LIMIT", 4 * 16)
    line = pipe.simulate_pipe(lay, run)
    assert line.extrapolated_from == (16, 8) and not whole.extrapolated_from
    assert line.makespan == pytest.approx(whole.makespan, rel=0.01)
    assert max(line.peak) == pytest.approx(max(whole.peak), rel=0.01)


def test_json_shape(capsys):
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "4", "--batch", "8", "--schedules",
                       "1f1b,zb-h1,interleaved-1f1b", "--top", "3", "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d) >= {"model", "cluster", "batch", "search", "ranking", "best"}
    assert d["cluster"]["gpus_per_node"] == 4 and d["batch"] == 8
    assert 1 <= len(d["ranking"]) <= 3
    steps = [r["step_s"] for r in d["ranking"]]
    assert steps == sorted(steps)
    row = d["ranking"][0]
    for key in ("schedule", "P", "D", "T", "V", "M", "micro_batch", "zero", "recompute", "step_s", "bubble",
                "exposed_comm_s", "memory_bytes", "why_not", "command", "train_args"):
        assert key in row
    assert row["P"] * row["D"] * row["T"] == 4
    assert d["best"]["command"].startswith("pipert train --schedule ")


def test_tensor_parallel_layouts_get_a_command_with_their_tp(capsys):
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--tp", "2",
                       "--schedules", "1f1b", "--json")
    d = json.loads(out)
    assert rc == 0 and d["ranking"] and d["best"] is not None
    for r in d["ranking"]:
        argv = r["command"].split()
        assert argv[argv.index("--tp") + 1] == "2" and not r["why_not"], r


def test_7b_on_8x8_gpus_in_2_datacenters_prints_a_table_and_a_command(capsys):
    """The issue's example, kept short: T = 1 (every layout found has a command) and a 1 s budget."""
    rc, out, _ = _plan(capsys, "--model", "7b", "--gpus-per-node", "8", "--nodes", "8", "--dcs", "2",
                       "--tp", "1", "--time-limit", "1s")
    assert rc == 0
    assert "rank schedule" in out and "2 DCs" in out
    assert "torchrun --nnodes 8 --nproc-per-node 8" in out and "-m pipert.cli train --schedule" in out
    assert "scaled down to a CPU (--model tiny, P=2, D<=2, T=1, gloo): pipert train --schedule" in out


@pytest.mark.parametrize("args, words", [
    (["--gpu-memory", "80"], ["--gpu-memory '80' has no unit", "GiB"]),
    (["--gpu-memory", "80GX"], ["unknown size unit", "allowed"]),
    (["--dcs", "2", "--nodes", "2", "--dc-latency", "20"], ["--dc-latency '20' has no unit"]),
    (["--node-bandwidth", "fast"], ["--node-bandwidth 'fast'", "allowed units"]),
    (["--nodes", "3", "--dcs", "2"], ["--nodes 3", "multiple of 2"]),
    (["--gpus-per-node", "0"], ["--gpus-per-node must be >= 1"]),
    (["--ranks-per-node", "8"], ["--ranks-per-node 8 does not apply to --auto", "--gpus-per-node"]),
    (["--schedules", "1f1b,nope"], ["--schedules: unknown nope", "allowed"]),
    (["--tp", "3"], ["--tp 3", "allowed --tp"]),
])
def test_bad_flags_name_flag_value_and_what_is_allowed(capsys, args, words):
    rc, _, err = _plan(capsys, "--model", "tiny", *args)
    assert rc == 2
    for w in words:
        assert w in err, err


def test_auto_flags_without_auto_are_refused(capsys):
    assert main(["plan", "--gpus-per-node", "8"]) == 2
    assert "give --auto too" in capsys.readouterr().err


def test_model_sizes_and_parse_size():
    rc = main(["plan", "--auto", "--model", "layers=4,hidden=256,heads=4", "--gpus-per-node", "2", "--batch", "4",
               "--schedules", "1f1b", "--json"])
    assert rc == 0
    assert parse_size("80GiB", "--x") == 80 * 2 ** 30 and parse_size("1.5 GB", "--x") == 1.5e9


def test_profile_plans_with_measured_units_and_link(monkeypatch):
    """--profile's cost: the real tiny units profiled per unit count (the link measurement, two gloo
    processes, replaced by a fixed one here); the ranking uses them and the measured link."""
    from pipert.planner import measure
    monkeypatch.setattr(measure, "measure_link", lambda: LinkSpec(1e-4, 1e9))
    spec = ModelSpec.preset("tiny", seq=16)
    cluster, cost_for, measured = measure.measured_cluster("tiny", spec, Cluster(2, 1))
    assert cluster.links["intra_node"] == LinkSpec(1e-4, 1e9) and "latency 100 us" in measured["link"]
    res = search(spec, cluster, 4, families=("1f1b",), tp=1, micro_batch=1, cost_for=cost_for)
    best = res.ranked[0]
    assert best.step > 0 and best.memory > 0
    cost = cost_for(spec, best.layout, "none", best.layout.units)
    assert cost.num_units == best.layout.units and all(cost.unit_time(u, "F") > 0 for u in range(cost.num_units))
    with pytest.raises(ValueError, match="not a pipert train model"):
        measure.measured_cluster("7b", ModelSpec.preset("7b"), Cluster(2, 1))


PLAN_WITHOUT_TORCH = """
import sys
from pipert.cli import main
rc = main(["plan", "--auto", "--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--seq", "16", "--jobs", "1"])
print("torch imported:", "torch" in sys.modules, "rc:", rc)
"""


def test_plan_auto_imports_no_torch():
    """The planner reads train's presets from ``pipert.presets`` (torch-free): planning a tiny
    cluster, naming train's preset in its note, leaves torch unimported (``--profile`` imports it)."""
    out = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pipert train's preset 'tiny' is another model" in out.stdout
    assert out.stdout.rstrip().endswith("torch imported: False rc: 0")


def test_forked_workers_find_the_same_top():
    kw = dict(families=("1f1b", "zb-h1", "interleaved-1f1b"), top=3)
    one = search(TINY, Cluster(4, 1), 16, **kw)
    two = search(TINY, Cluster(4, 1), 16, jobs=2, **kw)
    assert [c.as_dict() for c in two.ranked[:3]] == [c.as_dict() for c in one.ranked[:3]]


def test_no_layout_names_the_reasons(capsys):
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--schedules", "helixpipe",
                       "--micro-batch-size", "4")
    assert rc == 1
    assert "no layout could be built; most common reasons:" in out and "helixpipe" in out


TINY_PLAN = ("--model", "tiny", "--gpus-per-node", "2", "--batch", "4", "--seq", "16", "--jobs", "1")


def test_a_fold_count_the_build_refuses_is_skipped_with_its_reason(capsys):
    """helixpipe-2fold builds with F = 2: M = 2 at P = 2 passes its family check (any F) but not
    its build, so the layout is skipped with the build's reason, not counted as failed."""
    rc, out, _ = _plan(capsys, *TINY_PLAN, "--json")
    found = json.loads(out)["search"]
    assert rc == 0 and found["failed"] == {}
    assert any("P*F = 2*2 = 4" in why and "got M=2" in why for why in found["skipped"])
    assert all(lay.microbatches % (2 * lay.stages) == 0
               for lay in layouts(Cluster(2, 1), TINY, 4, ("helixpipe-2fold",)))
    rc, out, _ = _plan(capsys, *TINY_PLAN)
    assert rc == 0 and "failed" not in out


def test_a_failed_layout_shows_its_reason_in_text(capsys, monkeypatch):
    """A layout whose evaluation raises is counted as failed, and the text names the family and the
    first line of the message."""
    from pipert.planner import auto
    real = auto._evaluate

    def refuse_zb_h1(model, cluster, lay, *rest):
        if lay.family == "zb-h1":
            raise ValueError("refused here\nsecond line")
        return real(model, cluster, lay, *rest)
    monkeypatch.setattr(auto, "_evaluate", refuse_zb_h1)
    rc, out, _ = _plan(capsys, *TINY_PLAN, "--schedules", "1f1b,zb-h1")
    failed = re.search(r", (\d+) failed", out)
    assert rc == 0 and failed and int(failed[1]) >= 1
    assert f"failed: zb-h1: refused here ({failed[1]}x)" in out and "second line" not in out


@pytest.mark.parametrize("model, dc_bandwidth", [("tiny", 1.25e6), ("1b", 1.25e9)])
def test_every_lower_bound_is_below_its_simulated_step(model, dc_bandwidth):
    """The search may skip a layout only because its bound reaches the top: every layout it did
    simulate (all of them, with a large top) has bound <= step, across families and links."""
    cl = Cluster(2, 4, 2, links={**default_link_specs(), "inter_dc": LinkSpec(1e-3, dc_bandwidth)})
    res = search(ModelSpec.preset(model), cl, 16, top=10 ** 6, time_budget=60)
    assert res.pruned_bound == 0 and len({c.layout.family for c in res.ranked}) >= 6
    for c in res.ranked:
        assert c.bound <= c.step * (1 + 1e-9), (c.layout, c.bound, c.step)


def test_data_parallel_groups_are_priced_on_the_link_they_cross():
    """Rank d*P + p (replica-major): with P = 2 on 2 datacenters of 2 devices, replica 0 is DC 0 and
    replica 1 DC 1, so each stage's all-reduce crosses the DC link; with P = 4 there is no group."""
    dc = LinkSpec(2e-3, 1e9)
    cl = Cluster(2, 2, 2, links={**default_link_specs(), "inter_dc": dc})
    lay = next(x for x in layouts(cl, TINY, 8, ("1f1b",), stages=2, tp=1, micro_batch=1))
    assert lay.dp == 2 and lay.dp_group(1) == (1, 3) and lay.dcs == 1
    n = 1e6
    ring = cl.rank_links(1).collective("allreduce", lay.dp_group(1), n)
    assert ring == pytest.approx(2 * (dc.latency + n / 2 / 1e9))     # 2(n-1) steps of b/n, n = 2
    whole = next(x for x in layouts(cl, TINY, 8, ("1f1b",), stages=4, tp=1, micro_batch=1))
    assert whole.dp == 1 and whole.dcs == 2 and whole.links(cl).spec(1, 2) == dc


def test_helixpipe_is_searched_as_its_paper_runs_it_and_its_command_builds_the_same_program():
    """The default families hold helixpipe-2fold (not the naive FILO); its candidate was priced with
    the loss in backward and the recomputation its schedule records, and the printed train command
    builds a program with the same meta."""
    from dataclasses import fields

    from pipert.cli import build_parser
    from pipert.planner.auto import schedule_of
    from pipert.planner.command import train_argv
    from pipert.planner.layouts import FAMILIES
    from pipert.train import TrainConfig, build_program
    assert "helixpipe-2fold" in FAMILIES and "helixpipe" not in FAMILIES
    cluster = Cluster(2, 1)
    res = search(TINY, cluster, 8, families=("helixpipe-2fold",), top=2)
    cand = res.ranked[0]
    meta = schedule_of(TINY, cluster, cand).meta
    assert (meta["loss_in_backward"], meta["recompute"]) == (True, cand.recompute)
    args = build_parser("train").parse_args(["train"] + train_argv(cand, "tiny", 16, 4))
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    program = build_program(cfg)
    assert (program.meta["loss_in_backward"], program.meta["recompute"]) == (True, cand.recompute)
    assert (program.num_ranks, program.num_microbatches) == (cand.layout.stages, cand.layout.microbatches)


def _train_config(argv: list[str]):
    """``argv`` (after ``pipert train``) parsed by pipert's train parser into a validated TrainConfig,
    as ``cmd_train`` makes it (nothing launched)."""
    from dataclasses import fields

    from pipert.cli import _FILE_SHAPED, build_parser
    from pipert.train import TrainConfig
    args = build_parser("train").parse_args(["train", *argv])
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    values.update({k: getattr(TrainConfig(), k) for k in _FILE_SHAPED if values[k] is None})
    cfg = TrainConfig(**values)
    cfg.validate()
    return cfg


def test_printed_train_commands_parse_and_validate_under_pipert_train(capsys):
    """gpt-7b is a pipert train preset: the best layout's command runs as printed (its flags parse and
    validate, the shape is the planned one); 7b is not: the command gives its sizes (the model train
    builds has the planned sizes), and its scaled-down CPU command validates."""
    rc, out, _ = _plan(capsys, "--model", "gpt-7b", "--gpus-per-node", "8", "--nodes", "8", "--dcs", "2",
                       "--tp", "1", "--schedules", "1f1b,zb-h1", "--time-limit", "1s", "--json")
    best = json.loads(out)["best"]
    assert rc == 0 and best["cpu_train_args"] is None and not best["notes"]
    assert best["command"].split(" -m pipert.cli train ")[1].split() == best["train_args"]
    cfg = _train_config(best["train_args"])
    assert (cfg.model, cfg.stages, cfg.dp, cfg.schedule) == ("gpt-7b", best["P"], best["D"], best["schedule"])
    assert cfg.microbatches == best["M"] * best["D"] and cfg.batch_size == cfg.microbatches * best["micro_batch"]
    rc, out, _ = _plan(capsys, "--model", "7b", "--gpus-per-node", "8", "--nodes", "8", "--dcs", "2",
                       "--schedules", "1f1b,zb-h1", "--time-limit", "1s", "--json")
    best = json.loads(out)["best"]
    from pipert.models import LlamaConfig, model_config
    built, planned = model_config(_train_config(best["train_args"]).model), ModelSpec.preset("7b")
    assert isinstance(built, LlamaConfig)
    assert (built.layers, built.hidden, built.heads, built.kv_heads, built.ffn, built.vocab, built.max_seq) == \
        (planned.layers, planned.hidden, planned.heads, planned.kv_heads, planned.ffn, planned.vocab, planned.seq)
    assert "pipert train has no preset '7b': --model gives its sizes" in best["notes"][0]
    cfg = _train_config(best["cpu_train_args"])
    assert (cfg.model, cfg.stages, cfg.backend, cfg.schedule) == ("tiny", 2, "gloo", best["schedule"])


def test_crosspipe_with_replicas_is_built_as_train_builds_it_and_its_step_is_the_programs(monkeypatch):
    """A CrossPipe pipeline crossing datacenters with D = 2 replicas (4 DCs) is built as ``pipert
    train --dp`` builds it (dp, each ZeRO stage's reduction, links over the P x D ranks), and the
    planner's step is the simulated step of the whole replicated program within 1 %."""
    import pipert.schedules as schedules
    from pipert.compiler import compile
    from pipert.planner.auto import schedule_of
    from pipert.sim import simulate
    told = []
    build = schedules.build_schedule

    def spy(name, **kw):
        if name == "crosspipe-greedy":
            told.append((kw.get("dp"), kw.get("dp_op"), kw["links"].topology.num_ranks))
        return build(name, **kw)
    monkeypatch.setattr(schedules, "build_schedule", spy)
    cl = Cluster(2, 4, 4, links={**default_link_specs(), "inter_dc": LinkSpec(5e-3, 1.25e9)})
    spec = ModelSpec.preset("1b")
    found = search(spec, cl, 32, families=("crosspipe-greedy",), dp=2, top=3, time_budget=600)
    assert found.ranked and {(2, "allreduce", 8), (2, "reducescatter", 8)} <= set(told)
    for cand in found.ranked[:2]:
        lay = cand.layout
        links = cl.rank_links(lay.tp)
        program = compile(schedule_of(spec, cl, cand), dp=lay.dp, zero=cand.zero, check=False).to_schedule()
        cost = analytic_cost(cl)(spec, lay, cand.recompute, lay.units, False)
        got = simulate(program, cost, links=links, topology=links.topology).makespan
        assert got == pytest.approx(cand.step, rel=0.01), (lay, cand.zero)


def test_a_search_cut_short_by_the_time_limit_says_so_and_a_complete_one_does_not(capsys):
    """The 7b 8x8 search needs seconds of simulation: with a 10 ms budget layouts are left; the text
    names how many and the limit, the JSON marks the search incomplete with the same count.
    A 1-node search under a 10 min budget reaches every layout and prints no such line."""
    args = ["--model", "7b", "--gpus-per-node", "8", "--nodes", "8", "--dcs", "2", "--tp", "1",
            "--schedules", "1f1b,zb-h1"]
    rc, out, _ = _plan(capsys, *args, "--time-limit", "10ms", "--json")
    search = json.loads(out)["search"]
    assert rc in (0, 1) and search["not_run"] > 0 and search["complete"] is False
    rc, out, _ = _plan(capsys, *args, "--time-limit", "10ms")
    left = int(out.split(" not reached in the time limit")[0].rsplit(", ", 1)[1])
    assert left > 0 and "stopped at the time limit (0.01 s, --time-limit)" in out
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "2", "--nodes", "1", "--tp", "1",
                       "--schedules", "1f1b", "--time-limit", "600s", "--json")
    search = json.loads(out)["search"]
    assert rc == 0 and search["not_run"] == 0 and search["complete"] is True
    rc, out, _ = _plan(capsys, "--model", "tiny", "--gpus-per-node", "2", "--nodes", "1", "--tp", "1",
                       "--schedules", "1f1b", "--time-limit", "600s")
    assert rc == 0 and "time limit" not in out


@pytest.mark.parametrize("name", ["tiny", "gpt-1.3b"])
def test_the_commands_model_is_the_planned_model(capsys, name):
    """The command's --model has the planned sizes: plan's ``tiny`` (hidden 256) is not train's
    (hidden 64), so its command gives the sizes; a name both know with the same sizes stays."""
    from pipert.models import model_config
    rc, out, _ = _plan(capsys, "--model", name, "--gpus-per-node", "2", "--batch", "4", "--seq", "16",
                       "--schedules", "1f1b", "--json")
    d = json.loads(out)
    argv = d["best"]["train_args"]
    got = argv[argv.index("--model") + 1]
    c, spec = model_config(got), ModelSpec.preset(name)
    assert rc == 0 and (got == name) == (name != "tiny")
    assert (c.layers, c.hidden, c.ffn, c.heads, getattr(c, "kv_heads", c.heads), c.vocab) == \
        (spec.layers, spec.hidden, spec.ffn, spec.heads, spec.kv_heads, spec.vocab)
    assert any(note.startswith(f"pipert train's preset {name!r} is another model") for note in d["best"]["notes"]) \
        == (name == "tiny")


def test_tawpipe_with_replicas_runs_and_its_step_is_the_programs():
    """TawPipe with D = 2 has a command (``replicate`` takes its node collectives), its schedule is
    built as ``pipert train --dp`` builds it (owners step last), and the planner's step is the
    simulated step of the whole replicated program within 1 % (its owners' steps wait for sums still
    arriving after their last compute: ``pipe.finish_times``)."""
    from pipert.compiler import compile
    from pipert.planner.auto import schedule_of
    from pipert.planner.command import not_runnable
    from pipert.sim import simulate
    cl = Cluster(2, 4)
    spec = ModelSpec.preset("1b")
    found = search(spec, cl, 32, families=("tawpipe",), dp=2, top=2, time_budget=600)
    assert len(found.ranked) >= 2
    for cand in found.ranked[:2]:
        lay = cand.layout
        assert not_runnable(cand) == "" and schedule_of(spec, cl, cand).meta["opt_last"]
        links = cl.rank_links(lay.tp)
        program = compile(schedule_of(spec, cl, cand), dp=lay.dp, zero=cand.zero, check=False).to_schedule()
        cost = analytic_cost(cl)(spec, lay, cand.recompute, lay.units, False)
        got = simulate(program, cost, links=links, topology=links.topology).makespan
        assert got == pytest.approx(cand.step, rel=0.01), (lay, cand.zero)


def test_layouts_priced_from_a_retimed_simulation_do_not_fail(capsys):
    """On 32 GPUs in 2 DCs some weight-passing and TawPipe layouts are timed from a simulation of
    the same schedule under another recomputation (its key holds the replica options too)."""
    rc, out, _ = _plan(capsys, "--model", "1b", "--gpus-per-node", "8", "--nodes", "4", "--dcs", "2",
                       "--jobs", "1", "--json")
    found = json.loads(out)["search"]
    assert rc == 0 and found["failed"] == {} and found["simulated"] > 0
