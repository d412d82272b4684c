"""Schedule files: torch.pipelining's CSV/JSON forms and pipert's JSON in every command, round
trips through torch's format, and files that keep their shape (ranks, units, placement)."""
from __future__ import annotations

import csv
import json

import pytest

from pipert.cli import main
from pipert.cost import UniformCost
from pipert.ir import ScheduleFormatError
from pipert.ir.files import dump_schedule, load_schedule
from pipert.ir.torch_format import from_torch, to_torch
from pipert.ir.torch_receives import receives_for_torch
from pipert.schedules import available, build_schedule
from pipert.sim import simulate, validate
from pipert.testing import torch_orders

# Families whose programs torch's format can hold (activation passing, one micro-batch per op);
# the weight-passing families move weights, which torch's format has no action for.
TORCH_EXPRESSIBLE = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "crosspipe-greedy", "crosspipe-wave",
                     "crosspipe-optimal"}
OPTIONS = {"tawpipe": {"ranks_per_node": 2}, "crosspipe-optimal": {"time_limit": 5.0}}


def _built(name: str, P: int):
    try:
        return build_schedule(name, stages=P, microbatches=2 * P, **OPTIONS.get(name, {}))
    except ValueError as e:          # e.g. tawpipe needs ranks_per_node to divide P
        assert "needs" in str(e) or "must" in str(e), e
        return None


@pytest.mark.parametrize("P", [2, 3, 4])
def test_every_registered_schedule_round_trips_through_torch_format_or_is_refused(P):
    round_tripped, pieces = set(), set()
    for name in available():
        s = _built(name, P)
        if s is None:
            continue
        try:
            exported = receives_for_torch(s)                             # what export --comms writes
            rows = to_torch(exported, comms=True)
        except ScheduleFormatError as e:
            assert name not in TORCH_EXPRESSIBLE or "s0/" in str(e), (name, e)   # only W pieces (crosspipe)
            assert "has no torch equivalent" in str(e) and "rank " in str(e)
            pieces.add(name)
            continue
        back = from_torch(json.loads(json.dumps(rows)), name=name)       # with transfers: the same program
        assert (back.num_ranks, back.num_units, back.num_microbatches) == (s.num_ranks, s.num_units,
                                                                          s.num_microbatches)
        assert back.placement == s.placement and back.actions == exported.actions, name
        lowered = from_torch(to_torch(s), name=name)                     # compute only: pipert lowers it
        assert [lowered.compute_actions(r) for r in range(P)] == [s.compute_actions(r) for r in range(P)]
        validate(lowered)
        round_tripped.add(name)
    assert round_tripped >= TORCH_EXPRESSIBLE - pieces


def _dump_csv(rows, path):
    """As torch's ``PipelineScheduleMulti._dump_csv`` writes ``pipeline_order``."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for r in range(len(rows)):
            writer.writerow(rows[r])


def test_torch_1f1b_order_is_refused_where_torch_misnumbers_it_and_runs_once_corrected(tmp_path):
    """torch 2.13's ``Schedule1F1B.pipeline_order`` numbers the last rank's forwards 1..M (its
    executor does not read that order); the import names the stage, corrected it is pipert's 1F1B."""
    P, M = 4, 8
    orders = {r: [str(a) for a in acts if a is not None] for r, acts in torch_orders("Schedule1F1B", P, M).items()}
    with pytest.raises(ScheduleFormatError, match=r"torch stage 3 forwards micro-batches 1\.\.8; every stage must "
                                                  r"forward 0\.\.7 .* missing \[0\], repeated or out of range \[8\]"):
        from_torch(orders, fsdp="drop")
    orders[P - 1] = [f"{a.split('F')[0]}F{int(a.split('F')[1]) - 1}" if "F" in a else a for a in orders[P - 1]]
    path = tmp_path / "1f1b.csv"
    _dump_csv(orders, path)
    s = load_schedule(path)
    ref = build_schedule("1f1b", stages=P, microbatches=M)
    assert [s.compute_actions(r) for r in range(P)] == [ref.compute_actions(r) for r in range(P)]
    assert simulate(s, UniformCost(1.0, 2.0)).makespan == simulate(ref, UniformCost(1.0, 2.0)).makespan


# torch builds pipeline_order_with_comms only for its multi-stage classes
@pytest.mark.parametrize("cls,v,same_as,comms", [("ScheduleGPipe", 1, "gpipe", False)] + [
    (cls, 2, same_as, comms) for cls, same_as in (("ScheduleInterleaved1F1B", None),
                                                  ("ScheduleInterleavedZeroBubble", None),
                                                  ("ScheduleZBVZeroBubble", "zb-v")) for comms in (False, True)])
def test_torch_schedule_classes_import_validate_and_simulate(tmp_path, capsys, cls, v, same_as, comms):
    P, M = 4, 8
    orders = torch_orders(cls, P, M, v, comms=comms)
    path = tmp_path / f"{cls}.csv"
    _dump_csv(orders, path)
    s = load_schedule(path)
    assert (s.num_ranks, s.num_units, s.num_microbatches) == (P, P * v, M)
    validate(s)
    ours = simulate(s, UniformCost(1.0, 2.0))
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["stages"], out["units"], out["makespan"]) == (P, P * v, ours.makespan)
    split = any(a.op.name == "W" for _, _, a in s)
    assert sum(ours.busy) == P * v * M * 3.0                            # every F and B (or D + W) once
    if same_as is not None:
        ref = build_schedule(same_as, stages=P, microbatches=M)
        assert split == ref.meta["split_backward"]
        assert ours.makespan == simulate(ref, UniformCost(1.0, 2.0)).makespan


def test_torch_json_forms_load(tmp_path):
    orders = torch_orders("ScheduleInterleaved1F1B", 2, 4, 2)
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([[None if a is None else str(a) for a in orders[r]] for r in range(2)]))
    as_dict = tmp_path / "dict.json"
    as_dict.write_text(json.dumps({str(r): [None if a is None else str(a) for a in orders[r]] for r in range(2)}))
    a, b = load_schedule(as_list), load_schedule(as_dict)
    assert a.actions == b.actions == from_torch(orders).actions
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ranks": 2}))
    with pytest.raises(ScheduleFormatError, match="expected pipert's schedule object"):
        load_schedule(bad)
    with pytest.raises(ScheduleFormatError, match="suffix '.txt' unknown; allowed: .json, .csv"):
        load_schedule(tmp_path / "x.txt")


@pytest.mark.parametrize("fmt,comms", [("torch-csv", False), ("torch-csv", True), ("torch-json", True),
                                       ("json", False)])
def test_export_then_simulate_the_file_equals_the_schedule_by_name(tmp_path, capsys, fmt, comms):
    path = tmp_path / ("zbv" + (".csv" if fmt == "torch-csv" else ".json"))
    assert main(["export", "zb-v", "-P", "3", "-M", "5", "--format", fmt, "-o", str(path)]
                + (["--comms"] if comms else [])) == 0
    assert main(["simulate", str(path), "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["simulate", "zb-v", "-P", "3", "-M", "5", "--json"]) == 0
    by_name = json.loads(capsys.readouterr().out)
    for k in ("stages", "units", "microbatches", "makespan", "peak_memory", "comm_bytes"):
        assert from_file[k] == by_name[k], k


def test_export_text_and_refusals(capsys):
    assert main(["export", "1f1b", "-P", "2", "-M", "2", "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["step", "rank", "0", "rank", "1"] and "SEND act u0 m0 ->1" in text
    assert main(["export", "weipipe-naive", "-P", "2", "-M", "2", "--format", "torch-csv"]) == 2
    assert "SEND weight u0 ->1" in capsys.readouterr().err
    assert main(["export", "1f1b", "--format", "json", "--comms"]) == 2
    assert "--comms applies to the torch formats only" in capsys.readouterr().err


def test_compare_ranks_a_file_against_the_registered_schedules_on_its_shape(tmp_path, capsys):
    path = tmp_path / "zbv.csv"
    _dump_csv(torch_orders("ScheduleZBVZeroBubble", 2, 4, 2, comms=True), path)
    assert main(["compare", str(path), "--json", "--plot", "", "--schedules", "zb-v,1f1b"]) == 0
    rows = {r["schedule"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"zbv (file)", "zb-v", "1f1b"}
    assert rows["zbv (file)"]["makespan"] == rows["zb-v"]["makespan"] < rows["1f1b"]["makespan"]


def test_a_file_keeps_its_rank_count_and_cross_dc_link(tmp_path, capsys):
    path = tmp_path / "two.json"
    build_schedule("1f1b", stages=2, microbatches=4).save(path)
    dc = ["--dcs", "2", "--dc-latency", "1"]

    def makespan(*argv):
        assert main(["simulate", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["makespan"]
    by_name = makespan("1f1b", "-P", "2", "-M", "4", *dc)
    assert makespan(str(path), *dc) == by_name > makespan(str(path))   # 19 vs 15: the link is kept
    eight = tmp_path / "eight.json"
    build_schedule("1f1b", stages=8, microbatches=8).save(eight)
    assert makespan(str(eight)) == simulate(build_schedule("1f1b", stages=8, microbatches=8),
                                            UniformCost(1.0, 2.0)).makespan


@pytest.mark.parametrize("flags,message", [
    (["-P", "4"], "--stages 4 contradicts schedule file {path!r}, which has stages = 2"),
    (["-M", "3"], "--microbatches 3 contradicts schedule file {path!r}, which has microbatches = 4"),
    (["--chunks", "2"], "--chunks 2 contradicts schedule file {path!r}, which has chunks = 1"),
])
@pytest.mark.parametrize("command", ["simulate", "compare", "export", "emulate"])
def test_flags_that_contradict_a_file_are_refused_naming_both_values(tmp_path, capsys, flags, message, command):
    path = tmp_path / "two.csv"
    path.write_text(dump_schedule(build_schedule("1f1b", stages=2, microbatches=4), "torch-csv"))
    assert main([command, str(path), *flags]) == 2
    assert message.format(path=str(path)) in capsys.readouterr().err


def test_train_runs_a_torch_file_exactly_and_keeps_its_shape(tmp_path, capsys):
    path = tmp_path / "zbv.csv"
    _dump_csv(torch_orders("ScheduleZBVZeroBubble", 2, 4, 2, comms=True), path)
    assert main(["train", "--schedule", str(path), "--backend", "local", "--steps", "1", "--batch-size", "4",
                 "--dtype", "float64", "--json", "--check"]) == 0
    step = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10
    assert abs(step["loss"] - step["ref_loss"]) <= 1e-10
    assert main(["train", "--schedule", str(path), "--chunks", "1"]) == 2
    assert f"--chunks 1 contradicts schedule file {str(path)!r}, which has chunks = 2" in capsys.readouterr().err
