"""PipeMesh's elastic schedule (pipert/schedules/pipemesh.py): Megatron and breadth-first as
special cases, Algorithm 1's warm-up and activation peak, and sequences that cannot run."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipert.ir import Op
from pipert.schedules import PipelineConfig, build_schedule
from pipert.schedules.pipemesh import pass_orders, peak_live_passes, sequences
from pipert.sim import validate


def _computes(s):
    return [[(a.op, a.unit, a.mb) for a in acts if a.op in (Op.F, Op.B)] for acts in s.actions]


@pytest.mark.parametrize("P,B,V", [(2, 4, 2), (4, 8, 2), (3, 6, 3)])
def test_megatron_sequences_give_interleaved_1f1b(P, B, V):
    pm = build_schedule("pipemesh", stages=P, microbatches=B, chunks=V)
    mt = build_schedule("interleaved-1f1b", stages=P, microbatches=B, chunks=V)
    assert _computes(pm) == _computes(mt)


@pytest.mark.parametrize("P,B,V,e,d", [(2, 4, 2, (4,), (4,)), (4, 8, 2, (8,), (4, 4)), (4, 12, 2, (6, 6), (6, 6)),
                                       (3, 6, 3, (6,), (3, 3)), (2, 6, 2, (2, 2, 2), (2, 2, 2))])
def test_live_passes_peak_at_first_backward(P, B, V, e, d):
    """Counting forward passes whose backward has not run: the maximum is e_1(V-1) + 2(P-1-s) + 1,
    reached right before the stage's first backward."""
    cfg = PipelineConfig(P, B, V)
    for s, passes in enumerate(pass_orders(cfg, *sequences(cfg, e, d))):
        live = peak = 0
        at_first_b = None
        for op, _, _ in passes:
            if op == "B" and at_first_b is None:
                at_first_b = live
            live += 1 if op == "F" else -1
            peak = max(peak, live)
        assert peak == at_first_b == peak_live_passes(P, V, B, e[0], s) == min((V - 1) * e[0] + 2 * (P - 1 - s) + 1,
                                                                                V * B)
    validate(build_schedule("pipemesh", stages=P, microbatches=B, chunks=V, enqueue=e, dequeue=d))


def test_breadth_first_runs_every_forward_before_any_backward_on_the_last_stage():
    s = build_schedule("pipemesh", stages=2, microbatches=4, chunks=2, enqueue=(4,), dequeue=(4,))
    ops = [a.op for a in s.actions[1] if a.op in (Op.F, Op.B)]
    assert ops[:5] == [Op.F] * 5 and ops[5] is Op.B


def test_units_per_chunk_keeps_a_chunk_on_one_rank():
    s = build_schedule("pipemesh", stages=2, microbatches=4, chunks=2, units_per_chunk=3)
    assert s.num_units == 12 and s.meta["units_per_chunk"] == 3
    assert [s.placement.rank(u, 0) for u in range(12)] == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
    validate(s)


@pytest.mark.parametrize("opts,words", [
    (dict(enqueue=(4, 3)), ["enqueue", "sums to 7", "B=8"]),
    (dict(dequeue=(2, 6)), ["dequeue", "< P=4"]),
    (dict(enqueue="4,x"), ["enqueue", "comma-separated"]),
    (dict(enqueue=(4, 4), dequeue=(8,)), ["cannot run", "enqueue [4, 4] / dequeue [8]", "input_later",
                                          "stage 2 would run the backward of its chunk 1, micro-batch 4 (dequeue "
                                          "group 1 of 8) before its forward: 6 warm-up forwards"]),
    (dict(enqueue=(8,), max_live_passes=12), ["e_1=8", "15 live forward passes", "max_live_passes=12", "e_1 <= 5"]),
    (dict(units_per_chunk=0), ["units_per_chunk"]),
])
def test_sequences_that_cannot_run_are_rejected(opts, words):
    with pytest.raises(ValueError) as e:
        build_schedule("pipemesh", stages=4, microbatches=8, chunks=2, **opts)
    for w in words:
        assert w in str(e.value)


def test_fewer_microbatches_than_stages_is_rejected():
    with pytest.raises(ValueError, match="microbatches >= stages"):
        build_schedule("pipemesh", stages=4, microbatches=3)


# --- over D replicas: PipeMesh's collectives -----------------------------------------------------

MIXED = (3, 2, 1, 3, 3, 2, 1, 3, 2, 3, 2, 3)
"""ZeRO stage per unit of a P=2, V=2 model with 3 units per chunk: every chunk mixes stages."""


def _mesh(**opts):
    from pipert.schedules.data_parallel import replicate
    s = build_schedule("pipemesh", stages=2, microbatches=4, chunks=2, units_per_chunk=3, **opts)
    return replicate(s, 2, MIXED)


def test_mixed_zero_collectives_sit_beside_passes_and_conform():
    """ZeRO-3 units are gathered before each run of their chunk and freed after it, ZeRO-2/3
    gradients are reduce-scattered after each backward run, ZeRO-1 ones once; the executor's
    order, values, measured memory (action by action) and training agree with the engine."""
    from test_conformance import check_conforms
    s = _mesh(enqueue=(4,), dequeue=(2, 2))
    acts = s.actions[0]

    def count(op, u):
        return sum(1 for a in acts if a.op is op and a.unit == u)
    # rank 0: chunk 0 = units 0-2 (ZeRO 3, 2, 1), chunk 2 = units 6-8 (ZeRO 1, 3, 2). Chunk 0 has one
    # forward run and two backward runs apart from it: 3 gathers of u0; chunk 2's forward run
    # overlaps its first backward run: 2 gathers of u7.
    assert (count(Op.ALLGATHER, 0), count(Op.FREE, 0), count(Op.ALLGATHER, 7), count(Op.FREE, 7)) == (3, 3, 2, 2)
    assert [count(Op.REDUCESCATTER, u) for u in (0, 1, 2, 6, 7, 8)] == [2, 2, 1, 1, 2, 2]  # ZeRO-2/3 per run
    # ZeRO-1/2: gathered once (the shards were stepped), before the unit's first forward; never freed
    first_f = {u: next(i for i, a in enumerate(acts) if a.op is Op.F and a.unit == u) for u in (1, 2, 6, 8)}
    for u in (1, 2, 6, 8):
        gathers = [i for i, a in enumerate(acts) if a.op is Op.ALLGATHER and a.unit == u]
        assert len(gathers) == 1 and gathers[0] < first_f[u] and count(Op.FREE, u) == 0
    i_opt = min(i for i, a in enumerate(acts) if a.op is Op.OPT)
    assert all(a.op is not Op.REDUCESCATTER for a in acts[i_opt:])
    # a reduce-scatter of a chunk left by the backward passes is posted before a later backward pass
    first_rs = next(i for i, a in enumerate(acts) if a.op is Op.REDUCESCATTER)
    assert any(a.op is Op.B for a in acts[first_rs:i_opt])
    check_conforms(s)


@pytest.mark.parametrize("P,B,e,d,k,dp,save", [
    (2, 4, (4,), (2, 2), 3, 2, ("projection", "attention")),   # P x D mesh, mixed ZeRO, SAC
    (2, 6, (2, 2, 2), (2, 2, 2), 1, 1, ()),                      # Megatron
    (3, 6, (6,), (3, 3), 1, 1, ()),                              # breadth-first enqueue
])
def test_measured_live_passes_peak_is_algorithm_1s(P, B, e, d, k, dp, save):
    """Live forward passes per stage, seen by the saved-tensor hooks after every action of a real
    step (a pass: a chunk of one micro-batch whose units hold saved tensors), peak at
    e_1(V-1) + 2(P-i) + 1 (i = stage + 1); training stays equal to the reference."""
    import copy

    from pipert.models.recompute import selective_recompute
    from pipert.pipeline import Pipeline
    from pipert.exec.instrument import Instrumentation
    from pipert.tools.reference import reference_step
    from pipert.schedules.data_parallel import replicate
    from pipert.testing import make_batch, sgd, tiny_units
    from pipert.tools.reference import rel_err
    V = 2
    s = build_schedule("pipemesh", stages=P, microbatches=B, chunks=V, enqueue=e, dequeue=d, units_per_chunk=k)
    if dp > 1:
        s = replicate(s, dp, MIXED)
    units = tiny_units(s.num_units, "float64")
    ref_units = copy.deepcopy(units)
    units = [selective_recompute(u, save) for u in units] if save else units
    pipe = Pipeline(units, s, optimizer=sgd, instrument=Instrumentation(measure_memory=True))
    x, y = make_batch(B * dp)
    loss = pipe.step(x, y)
    for r, res in pipe.last_results.items():
        stage = r % P
        peak = max(len({(u // k, m) for u, m in live}) for live in res.stashes)
        assert peak == (V - 1) * e[0] + 2 * (P - (stage + 1)) + 1, f"rank {r} (stage {stage})"
    ref = reference_step(ref_units, x, y, B * dp, optimizer=sgd([p for u in ref_units for p in u.parameters()]))
    assert abs(loss - float(ref.loss)) <= 1e-12 * abs(loss)
    assert rel_err(pipe.named_grads(), ref.grads) <= 1e-10
    assert rel_err(pipe.named_parameters(), ref.params_after) <= 1e-10


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_simulator_times_the_collectives_on_the_links_and_pipemesh_hides_more(zero):
    """Replicas on two nodes, each ring step of a collective costs 1 on the inter-node link. The
    same compute program (Megatron's sequences) with PipeMesh's placement ends earlier than with
    every reduction before the optimizer, and both later than with free links."""
    from pipert.cost.topology import Links, LinkSpec, Topology
    from pipert.cost.uniform import UniformCost
    from pipert.schedules.data_parallel import replicate
    from pipert.sim.simulate import simulate
    topo = Topology(4, ranks_per_node=2)
    links = Links(topo, {"inter_node": LinkSpec(0.0, float("inf"), 1.0)})
    cost = UniformCost(tf=1.0, tb=2.0)
    pm = replicate(build_schedule("pipemesh", stages=2, microbatches=4, chunks=2), 2, zero)
    mt = replicate(build_schedule("interleaved-1f1b", stages=2, microbatches=4, chunks=2), 2, zero)
    free = simulate(pm, cost, Links.free(topo)).makespan
    assert free < simulate(pm, cost, links).makespan < simulate(mt, cost, links).makespan


def test_a_zero3_stash_refers_to_the_gathered_weights_instead_of_keeping_them():
    """Between a ZeRO-3 unit's FREE and its next ALLGATHER its stashes hold no copy of the
    weights: the backward reads whatever storage the parameter has then (here a new buffer with
    other values, so the gradient shows which one was read); other parameters keep theirs."""
    import torch

    from pipert.exec.stash import StashLedger
    lin = torch.nn.Linear(3, 2, bias=False).double()
    other = torch.nn.Linear(3, 2, bias=False).double()
    for refs, expect_new in (([lin.weight], True), ([], False)):
        ledger = StashLedger(lambda: [lin.weight], lambda u: refs)
        x = torch.ones(1, 3, dtype=torch.float64, requires_grad=True)
        old = lin.weight.detach().clone()
        with ledger.capture(0, 0):
            y = lin(x).sum()
        new = torch.full_like(old, 2.0)
        lin.weight.data = new.clone()          # FREE, then ALLGATHER into a new buffer
        y.backward()
        assert torch.equal(x.grad[0], (new if expect_new else old).sum(0))
        lin.weight.data = old
    assert other.weight.grad is None


@st.composite
def _configs(draw):
    P = draw(st.integers(2, 3))
    V = draw(st.integers(1, 3))
    B = draw(st.integers(P, 4 * P))

    def parts() -> tuple[int, ...]:  # g groups of P, the other B - gP micro-batches spread at random
        g = draw(st.integers(1, B // P))
        out = [P] * g
        for j in draw(st.lists(st.integers(0, g - 1), min_size=B - g * P, max_size=B - g * P)):
            out[j] += 1
        return tuple(out)
    return P, V, B, parts(), parts(), draw(st.integers(1, 2)), draw(st.lists(st.integers(0, 3), min_size=12,
                                                                             max_size=12))


@settings(max_examples=40, deadline=None)
@given(_configs())
def test_every_sequence_builds_a_valid_mesh_program_or_is_rejected_before_running(cfg):
    """Random sequences (groups >= P): either the program and its P x 2 mesh with random ZeRO
    stages per unit validate and the live-pass peak follows Algorithm 1, or the generator refuses
    with the validator's reason; nothing else happens."""
    from pipert.schedules.data_parallel import replicate
    P, V, B, e, d, k, zeros = cfg
    try:
        s = build_schedule("pipemesh", stages=P, microbatches=B, chunks=V, enqueue=e, dequeue=d, units_per_chunk=k)
    except ValueError as err:
        assert "cannot run" in str(err) and f"enqueue {list(e)} / dequeue {list(d)}" in str(err)
        return
    c = PipelineConfig(P, B, V)
    for stage, passes in enumerate(pass_orders(c, e, d)):
        live = peak = 0
        for op, _, _ in passes:
            live += 1 if op == "F" else -1
            peak = max(peak, live)
        assert peak == peak_live_passes(P, V, B, e[0], stage)
    validate(replicate(s, 2, zeros[:s.num_units] + [1] * (s.num_units - len(zeros))))


@pytest.mark.parametrize("zero", [(3, 2, 1) * 4, 0])
def test_units_without_parameters_take_part_in_zero_and_data_parallelism(zero):
    """The fine cut's attention units hold no parameters; their (empty) shards and gradients
    pass through the collectives and the result equals the reference."""
    from pipert.testing import Case, assert_exact, run_case
    case = Case("pipemesh", 2, 8, chunks=2, dp=2, zero=zero, fine=True,
                options=(("units_per_chunk", 3), ("enqueue", (4,)), ("dequeue", (2, 2))))
    assert_exact([run_case(case).as_dict()])
