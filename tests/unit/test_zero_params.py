"""ZeRO stage per parameter: specs, the ZeRO classes of a unit in the IR, the validator and
simulator (bytes and memory per class), and training on the local backend (dp=2) equal to the
reference, measured memory equal to the model's after every action."""
from __future__ import annotations

import dataclasses

import pytest

from pipert.cost.profiled import ProfiledCost
from pipert.ir import Action, Op, Payload, Schedule
from pipert.ir.action import ScheduleFormatError, parse_action
from pipert.tools.profile import profile_units
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.schedules.zero_rules import resolve_zero
from pipert.sim import validate
from pipert.sim.graph import build_graph
from pipert.pipeline import split_microbatches
from pipert.testing import make_batch, tiny_units
from pipert.train import TrainConfig
from test_conformance import check_conforms

SPEC = "0:norm,3:mlp,2:attn.w,1"
"""Norms whole (ZeRO-0), MLP weights ZeRO-3, attention projections ZeRO-2, the rest ZeRO-1."""


def _names(units):
    return [[(n, p.numel()) for n, p in m.named_parameters()] for m in units]


def _mixed(name: str = "1f1b", spec: str = SPEC, **opts) -> tuple[Schedule, list]:
    s = build_schedule(name, stages=2, microbatches=2, **opts)
    units = tiny_units(s.num_units, "float64")
    zeros, numel = resolve_zero(spec, _names(units))
    return replicate(s, 2, zeros, numel), units


# --- specs -------------------------------------------------------------------------------------
def test_rules_give_each_parameter_the_first_matching_stage():
    units = tiny_units(3, "float64")
    zeros, numel = resolve_zero(SPEC, _names(units))
    names = [n for n, _ in units[1].named_parameters()]
    assert dict(zip(names, zeros[1])) == {
        "layers.1.attn_norm.weight": 0, "layers.1.attn.wq.weight": 2, "layers.1.attn.wk.weight": 2,
        "layers.1.attn.wv.weight": 2, "layers.1.attn.wo.weight": 2, "layers.1.mlp_norm.weight": 0,
        "layers.1.mlp.w1.weight": 3, "layers.1.mlp.w3.weight": 3, "layers.1.mlp.w2.weight": 3}
    assert zeros[0][0] == 1 and numel[1] == tuple(n for _, n in _names(units)[1])   # embed: the default


def test_shares_take_the_largest_parameters_first():
    units = tiny_units(3, "float64")
    zeros, _ = resolve_zero("p=0.3,g=0.6", _names(units))
    params = _names(units)[1]
    total = sum(n for _, n in params)
    by_stage = {z: sum(n for (_, n), zz in zip(params, zeros[1]) if zz == z) for z in (1, 2, 3)}
    # MLP weights (1536 each) are the largest: two of them reach 30 % of the unit's 7744 elements
    assert [z for (name, _), z in zip(params, zeros[1]) if "mlp.w" in name] == [3, 3, 2]
    assert by_stage[3] >= 0.3 * total and by_stage[3] + by_stage[2] >= 0.6 * total
    assert resolve_zero("p=0,g=0", _names(units))[0] == [1, 1, 1]   # one stage: stored as the unit's stage


@pytest.mark.parametrize("spec, words", [
    ("3:mlp,2:attn", ["'3:mlp,2:attn'", "the last entry '2:attn' must be a bare default stage"]),
    ("3:mlp,1,2", ["bare stage before the last entry"]),
    ("4:mlp,1", ["stage '4' is not 0, 1, 2 or 3"]),
    ("3:,1", ["empty pattern"]),
    ("3:mlp,,1", ["an entry is empty"]),
    ("p=0.5,g=0.2", ["0 <= p <= g <= 1"]),
    ("p=x", ["share p='x' is not a number"]),
])
def test_bad_specs_name_the_spec_the_fault_and_what_is_allowed(spec, words):
    with pytest.raises(ValueError) as e:
        resolve_zero(spec, _names(tiny_units(2, "float64")))
    for w in words + ["allowed:", "STAGE:PATTERN"]:
        assert w in str(e.value)
    with pytest.raises(ValueError, match="--zero: zero spec"):
        TrainConfig(dp=2, zero=spec).validate()


def test_per_parameter_lists_are_checked_against_the_units():
    names = _names(tiny_units(3, "float64"))
    with pytest.raises(ValueError, match="zero of unit 1: .* for each of its 9 parameters"):
        resolve_zero([1, (3, 1), 1], names)
    with pytest.raises(ValueError, match="2 entries for 3 units"):
        resolve_zero([1, 2], names)


# --- the IR ----------------------------------------------------------------------------------
def test_a_class_is_part_of_the_action_text_and_only_for_weight_payloads():
    a = parse_action("REDUCESCATTER wgrad u3 z2 @1,3")
    assert a.zclass == 2 and str(a) == "REDUCESCATTER wgrad u3 z2 @1,3" and a != dataclasses.replace(a, zclass=3)
    with pytest.raises(ScheduleFormatError, match="only messages, collectives and memory ops of payload weight"):
        parse_action("F u0 m0 z3")
    with pytest.raises(ScheduleFormatError, match="ZeRO class z5 unknown"):
        Action(Op.FREE, unit=0, payload=Payload.WEIGHT, zclass=5)


def test_schedule_files_keep_per_parameter_stages():
    s, _ = _mixed()
    back = Schedule.from_json(s.to_json())
    assert back.placement == s.placement and back.actions == s.actions
    assert s.placement.mixed(0) and s.placement.zero_classes(0) == (0, 1, 2, 3)


def test_placements_check_per_parameter_stages():
    from pipert.ir import Placement
    pl = Placement("unit", (0,), (0,), None, [(2, 2)], [(5, 7)])
    assert pl.zero == (2,) and pl.zero_numel is None and not pl.mixed(0)   # one stage: stored as it
    pl = Placement("unit", (0,), (0,), None, [(3, 1)], [(5, 15)])
    assert pl.class_share(0, 3) == 0.25 and pl.zero_parts(0) == [(1, 1), (3, 3)]
    with pytest.raises(ScheduleFormatError, match="zero_numel\\[0\\] giving each parameter's element count"):
        Placement("unit", (0,), (0,), None, [(3, 1)])
    with pytest.raises(ScheduleFormatError, match="zero3_buffers must be 1 .* or 2"):
        Placement("unit", (0,), (0,), None, [3], None, 3)
    with pytest.raises(ValueError, match="per-parameter ZeRO stages .* use zero_classes"):
        pl.zero_stage(0)


def test_the_validator_wants_a_class_on_mixed_units_and_none_on_others():
    s, _ = _mixed()
    acts = [list(a) for a in s.actions]
    i = next(i for i, a in enumerate(acts[0]) if a.op is Op.REDUCESCATTER and a.zclass == 3)
    acts[0][i] = dataclasses.replace(acts[0][i], zclass=None)
    errs = validate(s.with_actions(acts), all_errors=True)
    assert any(e.reason == "zero_class" and "unit 0 has ZeRO classes [0, 1, 2, 3]: name one" in e.detail
               for e in errs)
    plain = replicate(build_schedule("1f1b", stages=2, microbatches=2), 2, 3)
    acts = [list(a) for a in plain.actions]
    acts[0][0] = dataclasses.replace(acts[0][0], zclass=3)
    errs = validate(plain.with_actions(acts), all_errors=True)
    assert any(e.reason == "zero_class" and "one ZeRO stage (3)" in e.detail for e in errs)


def test_the_simulator_moves_and_counts_each_class_by_its_bytes():
    s, units = _mixed()
    x, y = make_batch(2)
    cost = ProfiledCost(profile_units(units, split_microbatches(x, 2)[0], split_microbatches(y, 2)[0]))
    g = build_graph(s, cost)
    assert not g.errors, g.errors[:3]
    weight = cost.memory("weight", 0)
    for _, a, nbytes in g.collectives:
        assert nbytes == pytest.approx(cost.message_bytes(a.payload, a.unit, 1) * s.placement.class_share(a.unit,
                                                                                                          a.zclass))
    shares = {k: s.placement.class_share(0, k) for k in range(4)}
    assert sum(shares.values()) == pytest.approx(1.0) and all(v > 0 for v in shares.values())
    trace, acts = g.memory_trace[0], s.actions[0]
    for i, a in enumerate(acts):
        before = trace[i - 1] if i else 0.0
        if a.op is Op.ALLGATHER and a.unit == 0:
            # the gathered ZeRO-3 class counts while present; ZeRO-1/2 whole weights are model state
            want = shares[3] * weight if a.zclass == 3 else 0.0
            assert trace[i] - before == pytest.approx(want), a
        if a.op is Op.FREE and a.unit == 0:
            assert before - trace[i] == pytest.approx(shares[3] * weight)


# --- training --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, opts, spec", [
    ("1f1b", {}, SPEC),
    ("pipemesh", dict(chunks=2, enqueue=(2,), dequeue=(2,)), SPEC),
    ("pipemesh", dict(chunks=2), "p=0.4,g=0.7"),
])
def test_mixed_units_train_exactly_and_memory_is_measured_as_modelled(name, opts, spec):
    s, _ = _mixed(name, spec, **opts)
    assert any(s.placement.mixed(u) for u in range(s.num_units))
    check_conforms(s)


def test_weight_passing_schedules_take_one_stage_per_unit_only():
    s = build_schedule("weipipe-interleave", stages=2, microbatches=2)
    zeros, numel = resolve_zero(SPEC, _names(tiny_units(s.num_units, "float64")))
    with pytest.raises(ValueError, match="moves the weights or gradients of unit.*need a schedule that passes "
                                         "activations only"):
        replicate(s, 2, zeros, numel)


def test_weights_offloaded_before_replication_are_refused_for_mixed_units():
    from pipert.ir.passes import offload_weights
    s = offload_weights(build_schedule("interleaved-1f1b", stages=1, microbatches=2, chunks=2))
    zeros, numel = resolve_zero(SPEC, _names(tiny_units(s.num_units, "float64")))
    with pytest.raises(ValueError, match=r"already offloads the weights of unit\(s\) \[0, 1\].*replicate first, "
                                         r"then apply offload_weights"):
        replicate(s, 2, zeros, numel)
    assert replicate(s, 2, 1).placement.zero == (1, 1)  # one stage per unit: the offloads stay as they are


def test_class_bytes_add_up_to_the_unit_exactly():
    s, units = _mixed()
    pl = s.placement
    for u in range(s.num_units):
        fracs = [pl.class_fraction(u, z) for z in pl.zero_classes(u)] if pl.mixed(u) else [(1, 1)]
        size = float(sum(p.numel() for p in units[u].parameters()) * 8)
        assert sum(size * n / d for n, d in fracs) == size   # exact: every class is whole elements


def test_offloaded_weights_of_a_mixed_unit_move_class_by_class():
    from pipert.ir.passes import offload_weights
    base = build_schedule("interleaved-1f1b", stages=1, microbatches=2, chunks=2)   # no sends between computes
    zeros, numel = resolve_zero(SPEC, _names(tiny_units(base.num_units, "float64")))
    s = replicate(base, 2, zeros, numel)
    moved = [a for a in offload_weights(s).actions[0] if a.op in (Op.OFFLOAD, Op.PREFETCH)]
    assert moved and {a.zclass for a in moved} == {0, 1, 2, 3}
    assert not validate(offload_weights(s), all_errors=True)
    check_conforms(offload_weights(s))


# --- separate forward and backward copies of gathered ZeRO-3 weights ---------------------------
def _split(name: str, spec, **opts) -> Schedule:
    M = 4 if name == "pipemesh" else 2
    s = build_schedule(name, stages=2, microbatches=M, **opts)
    zeros, numel = resolve_zero(spec, _names(tiny_units(s.num_units, "float64")))
    return replicate(s, 2, zeros, numel, zero3_buffers=2)


def test_a_side_names_a_gathered_copy_and_files_keep_the_choice():
    a = parse_action("FREE weight u2 z3 bwd")
    assert a.side == "bwd" and str(a) == "FREE weight u2 z3 bwd" and a != dataclasses.replace(a, side="fwd")
    with pytest.raises(ScheduleFormatError, match="only ALLGATHER and FREE of payload weight"):
        parse_action("REDUCESCATTER wgrad u2 z3 bwd @0,2")
    s = _split("1f1b", SPEC)
    back = Schedule.from_json(s.to_json())
    assert back.placement.zero3_buffers == 2 and back.actions == s.actions
    with pytest.raises(ValueError, match="--zero3-buffers must be 1 .* or 2"):
        TrainConfig(dp=2, zero="3", zero3_buffers=3).validate()


def test_the_validator_wants_a_side_exactly_where_copies_are_kept_apart():
    s = _split("1f1b", 3)
    acts = [list(a) for a in s.actions]
    i = next(i for i, a in enumerate(acts[0]) if a.op is Op.ALLGATHER and a.side == "bwd")
    acts[0][i] = dataclasses.replace(acts[0][i], side=None)
    errs = validate(s.with_actions(acts), all_errors=True)
    assert any(e.reason == "zero_class" and "name one (fwd or bwd)" in e.detail for e in errs)
    plain = replicate(build_schedule("1f1b", stages=2, microbatches=2), 2, 3)
    acts = [list(a) for a in plain.actions]
    i = next(i for i, a in enumerate(acts[0]) if a.op is Op.ALLGATHER)
    acts[0][i] = dataclasses.replace(acts[0][i], side="fwd")
    errs = validate(plain.with_actions(acts), all_errors=True)
    assert any(e.reason == "zero_class" and "does not keep apart (placement zero3_buffers=1" in e.detail
               for e in errs)


def test_forward_and_backward_runs_hold_their_own_copies_and_both_count():
    """pipemesh's 1F1B phase interleaves forward and backward runs of a chunk: with one copy they
    share a gather; kept apart, a backward gather lands while the forward copy is present, and
    each copy adds its bytes."""
    opts = dict(chunks=2, enqueue=(4,), dequeue=(2, 2))
    s = _split("pipemesh", SPEC, **opts)
    shared = replicate(build_schedule("pipemesh", stages=2, microbatches=4, **opts), 2,
                       s.placement.zero, s.placement.zero_numel)
    units = tiny_units(s.num_units, "float64")
    x, y = make_batch(4)
    cost = ProfiledCost(profile_units(units, split_microbatches(x, 4)[0], split_microbatches(y, 4)[0]))
    g = build_graph(s, cost)
    assert not g.errors, g.errors[:3]
    gathers = [a for a in s.actions[0] if a.op is Op.ALLGATHER and a.zclass == 3]
    assert len(gathers) > sum(1 for a in shared.actions[0] if a.op is Op.ALLGATHER and a.zclass == 3)
    present: set[tuple] = set()
    both = 0
    trace = g.memory_trace[0]
    for i, a in enumerate(s.actions[0]):
        if a.side is None:
            continue
        size = cost.memory("weight", a.unit) * s.placement.class_share(a.unit, 3)
        if a.op is Op.ALLGATHER:
            both += (a.unit, "fwd" if a.side == "bwd" else "bwd") in present
            present.add((a.unit, a.side))
            assert trace[i] - trace[i - 1] == pytest.approx(size), a
        else:
            present.discard((a.unit, a.side))
            assert trace[i - 1] - trace[i] == pytest.approx(size), a
    assert both > 0


@pytest.mark.parametrize("name, opts, spec", [
    ("1f1b", {}, 3),
    ("zb-h1", {}, SPEC),                     # W after D: it reads the backward copy's parameters
    ("pipemesh", dict(chunks=2, enqueue=(4,), dequeue=(2, 2)), SPEC),
])
def test_separate_copies_train_exactly_and_memory_is_measured_as_modelled(name, opts, spec):
    check_conforms(_split(name, spec, **opts))


def test_the_emulator_realises_per_class_collectives_as_simulated():
    from pipert.cost import Links, Topology
    from pipert.cost.topology import LinkSpec
    from pipert.emulate import emulate
    s = _split("pipemesh", SPEC, chunks=2, enqueue=(4,), dequeue=(2, 2))
    units = tiny_units(s.num_units, "float64")
    x, y = make_batch(4)
    cost = ProfiledCost(profile_units(units, split_microbatches(x, 4)[0], split_microbatches(y, 4)[0]))
    slow = LinkSpec(0.0, 50e6)  # a tiny unit's float64 weights take about a millisecond
    links = Links(Topology(4), specs={"intra_node": slow, "inter_node": slow})
    r = emulate(s, cost, links, time_unit=1.0)
    assert r.ideal_makespan == pytest.approx(r.predicted, abs=1e-6), r
    assert r.makespan >= r.ideal_makespan - 1e-6


def test_train_takes_a_per_parameter_spec_and_separate_copies(capsys):
    import json
    from pipert.train import build_program, run_train
    cfg = TrainConfig(schedule="pipemesh", stages=2, dp=2, zero=SPEC, zero3_buffers=2, options="enqueue=4;dequeue=2,2",
                      microbatches=8, batch_size=8, seq=16, steps=1, json=True, check=True, dtype="float64",
                      backend="local")
    program = build_program(cfg)
    assert program.placement.zero3_buffers == 2 and program.placement.mixed(0)
    run_train(cfg)
    step = json.loads([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")][0])
    assert step["max_grad_rel_err"] <= 1e-10 and step["max_param_rel_err"] <= 1e-10, step
    assert abs(step["loss"] - step["ref_loss"]) <= 1e-12 * abs(step["ref_loss"])
