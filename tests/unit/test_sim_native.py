"""The compiled loops of pipert._simc (``walk``: Builder.run's common case, ``longest_path``:
run_timing's sweep, ``message_action`` and ``lower_rank``: lowering's Actions and rank loop) give results
identical to the pure-Python ones, on registered schedules with
random stages, micro-batches, chunks, costs, links and memory limits, after passes and mutations
that break the programs: the whole graph, memory traces, times, makespan, per-rank peaks, busy
and exposed communication, bytes per link and every error in order."""
from __future__ import annotations

import copy
import dataclasses
import glob
import os
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_lowering_one_pass import programs
from test_sim_fast_path import FAMILIES, _mutate

import pipert
from pipert.cost import UniformCost
from pipert.cost.topology import Links, Topology
from pipert.ir import Schedule, action, lower
from pipert.ir.action import Action, Op, Payload
from pipert.ir.passes import PASSES, fold_microbatches
from pipert.schedules import available, build_schedule
from pipert import native
from pipert.sim import simulate
from pipert.sim.engine import analyze
from pipert.sim.errors import ScheduleError
from pipert.sim import values
from pipert.sim.metrics import exposed_comm

BUILT_HERE = bool(glob.glob(str(Path(pipert.__file__).parent / "_C*.so")))   # setup.py builds both
DISABLED = os.environ.get("PIPERT_SIM_PURE") == "1" or os.environ.get("PIPERT_NO_EXT") == "1"


def test_the_compiled_loops_load_where_setup_py_built_the_extensions() -> None:
    if DISABLED:
        pytest.skip("PIPERT_SIM_PURE=1 or PIPERT_NO_EXT=1: the pure path by request")
    if not BUILT_HERE:
        pytest.skip("no extension built in this checkout (pipert._C is missing too)")
    assert native.SIMC is not None, f"pipert._simc did not load: {native.load_error}"


@contextmanager
def _loops(compiled: bool) -> Iterator[None]:
    """The engine's compiled loops, or (``compiled`` False) its pure-Python ones, for a while."""
    was = native.SIMC
    native.SIMC = was if compiled else None
    try:
        yield
    finally:
        native.SIMC = was


def _everything(s: Schedule, cost: UniformCost, links: Links | None, limit: object, compiled: bool) -> tuple:
    """All the engine reports on ``s``, through the compiled loops or the pure-Python ones."""
    with _loops(compiled):
        an = analyze(s, cost, links, limit)
        g, t = an.graph, an.times
        times = None if t is None else (t.start, t.end0, t.end1, t.makespan, exposed_comm(g, t))
        return (g.kind, g.dur, g.lat, g.succ, g.indeg, g.node_of, g.compute_nodes, g.comm_in, g.tx_prod,
                g.link_bytes, g.busy, g.peak_memory, g.memory_trace, g.queues, g.wg_parts, g.opt_checks, times,
                [(e.rank, e.index, e.reason, str(e)) for e in an.errors])


def _limit(data: st.DataObject, P: int) -> object:
    kind = data.draw(st.sampled_from(["none", "one", "per rank"]))
    if kind == "none":
        return None
    if kind == "one":
        return data.draw(st.sampled_from([0, 1, 2.5, 4, 6.0, 100]))
    return [data.draw(st.sampled_from([1, 2.5, 4.0, 1e9])) for _ in range(P)]


class _Called(UniformCost):
    """UniformCost by another type: the compiled walk calls its compute_time instead of reading
    UniformCost.op_times."""


needs_simc = pytest.mark.skipif(native.SIMC is None and (DISABLED or not BUILT_HERE),
                                reason="pipert._simc not built here (see the load test)")


@needs_simc
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_loops_equal_the_pure_ones(data: st.DataObject) -> None:
    assert native.SIMC is not None, native.load_error
    name = data.draw(st.sampled_from(FAMILIES))
    P = data.draw(st.integers(2, 5))
    M = data.draw(st.integers(1, 3)) * 2 * P
    chunks = data.draw(st.sampled_from([None, 2, 3])) if name == "interleaved-1f1b" else None
    s = build_schedule(name, stages=P, microbatches=M, chunks=chunks)
    for p in data.draw(st.lists(st.sampled_from(["recompute", "offload_stashes", "send_early", "expand_folds"]),
                                max_size=2)):
        s = PASSES[p](s)
    if data.draw(st.booleans()) and s.placement.kind != "microbatch":
        s = fold_microbatches(s, 2)
    s = _mutate(s, data)
    tf = data.draw(st.sampled_from([1.0, 0.1, 3, 0.7]))
    cost = UniformCost(tf=tf, tb=data.draw(st.sampled_from([None, 2.0, 0.3, 5])),
                       act_bytes=data.draw(st.sampled_from([1.0, 0.5, 3])))
    if data.draw(st.booleans()):   # not exactly UniformCost: the compiled walk calls compute_time
        cost = _Called(**{f.name: getattr(cost, f.name) for f in dataclasses.fields(cost)})
    links = None
    if data.draw(st.booleans()):
        links = Links.preset(Topology(P, ranks_per_node=data.draw(st.sampled_from([n for n in range(1, P + 1)
                                                                                  if P % n == 0]))))
    limit = _limit(data, P)
    assert _everything(s, cost, links, limit, True) == _everything(s, cost, links, limit, False)


@needs_simc
@pytest.mark.parametrize("limit", [None, 3.0])
def test_compiled_simulate_equals_the_pure_one_at_size(limit: float | None) -> None:
    """A larger program (P=8, M=64, links across nodes): simulate()'s every figure, or its error."""
    s = build_schedule("1f1b", stages=8, microbatches=64)
    links = Links.preset(Topology(8, ranks_per_node=2))
    cost = UniformCost(tf=1.0, tb=2.0)

    def run(compiled: bool) -> tuple:
        with _loops(compiled):
            try:
                r = simulate(s, cost, links, memory_limit=limit)
            except ScheduleError as e:
                return (str(e),)
            return (r.makespan, r.busy, r.idle, r.peak_memory, r.comm_bytes, r.exposed_comm, r.graph.memory_trace,
                    r.times.start, r.times.end1)

    got, want = run(True), run(False)
    assert got == want
    assert (len(got) == 1) == (limit is not None)   # the limit is exceeded: the same first error


_MESSAGES = st.tuples(st.sampled_from([Op.SEND, Op.RECV]), st.sampled_from(list(Payload)), st.integers(0, 7))
_COMPUTES = st.tuples(st.sampled_from([Op.F, Op.B, Op.D, Op.W, Op.RECOMPUTE]), st.none(), st.none())


@needs_simc
@settings(max_examples=50, deadline=None)
@given(st.one_of(_MESSAGES, _COMPUTES), st.integers(0, 9), st.lists(st.integers(0, 9), min_size=1, max_size=3))
def test_compiled_message_action_builds_the_pure_ones_action(kind: tuple, unit: int, mb: list[int]) -> None:
    """Lowering's Actions built in C (a message, or a compute without payload and peer): the same
    class and every field (hash and text follow)."""
    op, payload, peer = kind
    assert action.message_action is native.SIMC.message_action
    got = native.SIMC.message_action(op, unit, tuple(mb), payload, peer)
    want = action._message_action_py(op, unit, tuple(mb), payload, peer)
    assert type(got) is Action
    assert [getattr(got, f.name) for f in dataclasses.fields(Action)] == \
        [getattr(want, f.name) for f in dataclasses.fields(Action)]
    assert (got, hash(got), str(got)) == (want, hash(want), str(want))
    if payload is None:   # a compute: compute_action, in C the three-argument message_action
        assert action.compute_action is native.SIMC.message_action
        got, want = action.compute_action(op, unit, tuple(mb)), action._message_action_py(op, unit, tuple(mb), None, None)
        assert type(got) is Action and [getattr(got, f.name) for f in dataclasses.fields(Action)] == \
            [getattr(want, f.name) for f in dataclasses.fields(Action)]


@needs_simc
@pytest.mark.parametrize("name", available())
def test_compiled_lowering_builds_the_pure_ones_programs(name: str) -> None:
    """Every registered family at a few sizes: the same programs, placement and meta (or the same
    refusal) with lowering's rank loop in C (``lower_rank``) as in Python."""
    for P, M in ((2, 4), (3, 6), (4, 8)):
        got, want = (_built(name, P, M, compiled) for compiled in (True, False))
        assert got == want, (name, P, M)


def _built(name: str, P: int, M: int, compiled: bool) -> tuple:
    with _loops(compiled):
        try:
            s = build_schedule(name, stages=P, microbatches=M)
        except ValueError as e:
            return (str(e),)
        timeless = {k: v for k, v in s.meta.items() if not k.endswith("_s")}   # a solver's seconds differ
        return (s.actions, s.placement, timeless, s.num_units)


@st.composite
def _in_pieces(draw: st.DrawFn) -> tuple:
    """programs() with each compute cut into 1 to 3 sub-blocks (receives before the first, sends
    after the last)."""
    P, U, M, placement, compute = draw(programs())
    n = draw(st.integers(1, 3))
    if n > 1:
        compute = [[dataclasses.replace(a, sub=(j, n)) if a.op is not Op.OPT else a
                    for a in acts for j in (range(n) if a.op is not Op.OPT else (0,))] for acts in compute]
    return P, U, M, placement, compute


@needs_simc
@settings(max_examples=100, deadline=None)
@given(_in_pieces())
def test_compiled_lowering_equals_the_pure_one_on_random_placements(program: tuple) -> None:
    """Units on random ranks in random orders, in pieces: the one pass (or its refusal, then the two
    passes), and the two passes alone (``post_ahead`` 2)."""
    assert _lowered(program, True) == _lowered(program, False)


def _lowered(program: tuple, compiled: bool) -> list:
    P, U, M, placement, compute = program
    with _loops(compiled):
        return [lower("x", P, U, M, placement, compute, post_ahead=ahead).actions for ahead in (1, 2)]


_ARRAY_OPS = st.lists(st.tuples(st.sampled_from(["node", "edge", "bump", "set", "read"]), st.integers(0, 40),
                                st.integers(-3, 90), st.sampled_from([0.0, 0.5, 2, 1e300, -7.25])), max_size=60)


@needs_simc
@settings(max_examples=100, deadline=None)
@given(_ARRAY_OPS)
def test_compiled_node_arrays_read_and_grow_as_lists(ops: list[tuple]) -> None:
    """native.node_arrays(): the C-owned (kind, dur, lat, succ, indeg) after the Builder's and the
    consumers' operations (append, succ[p].append, [i] += 1, [i] = x, [-i], iteration, count) hold
    what Python lists hold after the same ones, pickle and copy as themselves, and refuse what
    lists refuse."""
    with _loops(True):
        got = native.node_arrays()
    with _loops(False):
        want = native.node_arrays()
    assert type(got[3]) is native.SIMC.Succ and type(want[3]) is list
    for op, p, x, d in ops:
        for kind, dur, lat, succ, indeg in (got, want):
            n = len(kind)
            if op == "node":
                kind.append(p % 3)
                dur.append(d)
                lat.append(d)
                succ.append([])
                indeg.append(0)
            elif n and op == "edge":
                succ[p % n].append(x << 1 | 1)
                indeg[x % n] += 1
            elif n and op == "bump":
                indeg[-1 - p % n] += 1
            elif n and op == "set":
                dur[p % n] = d
    for g, w in zip(got, want):
        assert g == w and list(g) == w and len(g) == len(w) and not g != w
    assert got[0].count(1) == want[0].count(1)
    assert [list(e) for e in got[3]] == want[3] and [len(e) for e in got[3]] == [len(e) for e in want[3]]
    assert [e[-1] for e in got[3] if len(e)] == [e[-1] for e in want[3] if e]
    for arr in got:
        again = pickle.loads(pickle.dumps(arr))
        assert type(again) is type(arr) and again == arr and copy.deepcopy(arr) == arr
        with pytest.raises(IndexError):
            arr[len(arr)]
    with pytest.raises(TypeError):
        got[0].append("x")


_MAP_OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "get", "pop", "pop1", "in", "item"]),
                              st.one_of(st.sampled_from([0, 1, 5, 1 << 40 | 3, -4, 2 ** 63 - 1, -2 ** 63]),
                                        st.integers(0, 300).map(lambda j: (j % 7 << 32 | j) << 5 | j % 3)),
                              st.integers(-2, 90)), max_size=300)


@needs_simc
@settings(max_examples=100, deadline=None)
@given(_MAP_OPS, st.booleans())
def test_compiled_value_maps_read_and_change_as_dicts(ops: list[tuple], floats: bool) -> None:
    """native.value_maps(): the C-owned (have, live) after the walk's operations ([k] = x, del,
    get, pop with and without a default, in, [k]) give what dicts give, and raise where they raise;
    they compare equal to those dicts and iterate (as the checks read the Builder's tables) in key order."""
    with _loops(True):
        got = native.value_maps()[floats]
    want: dict = {}
    assert type(got) is (native.SIMC.FloatMap if floats else native.SIMC.IntMap)
    for op, k, x in ops:
        v = x / 4 if floats else x

        def run(m: object) -> object:
            try:
                if op == "set":
                    m[k] = v
                elif op == "del":
                    del m[k]
                elif op == "get":
                    return m.get(k), m.get(k, -2)
                elif op == "pop":
                    return m.pop(k, None)
                elif op == "pop1":
                    return m.pop(k)
                elif op == "in":
                    return k in m
                else:
                    return m[k]
            except KeyError as e:
                return ("KeyError", e.args)
            return None

        assert run(got) == run(want)
        assert len(got) == len(want)
    assert got.todict() == dict(sorted(want.items())) and got == want and not got != want
    assert list(got) == sorted(want) and got.values() == [want[k] for k in sorted(want)]   # key order
    again = pickle.loads(pickle.dumps(got))
    assert type(again) is type(got) and again == want and copy.deepcopy(got) == want
    with pytest.raises(TypeError):
        got["x"] = 1
    with pytest.raises(OverflowError):
        got[2 ** 64] = 1
    assert got.get(2 ** 64, "absent") == "absent" and 2 ** 64 not in got


@needs_simc
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(FAMILIES), st.integers(2, 4), st.integers(0, 3), st.integers(0, 3), st.booleans(),
       st.booleans())
def test_compiled_survey_equals_the_pure_scans(name: str, P: int, du: int, dm: int, recompute: bool,
                                               zclass: bool) -> None:
    """survey(): the walk's scans of one rank's actions (indices beyond the schedule's, a ZeRO class
    or side named beside a unit's weights or gradient, a RECOMPUTE, each action's queue) as the
    pure ones give them; None (the pure scans) where an action is not exactly an Action."""
    s = build_schedule(name, stages=P, microbatches=2 * P)
    if recompute:
        s = PASSES["recompute"](s)
    U, M = max(1, s.num_units - du), max(1, s.num_microbatches - dm)
    qname = {op: f"q{j % 4}" for j, op in enumerate(Op)}
    for acts in s.actions:
        acts = list(acts)
        weights = [j for j, a in enumerate(acts) if a.payload is Payload.WEIGHT]
        if zclass and weights:
            acts[weights[-1]] = dataclasses.replace(acts[weights[-1]], zclass=0)
        ops = [a.op for a in acts]
        want = (values._out_of_range(acts, U, M), values._names_classes(acts), Op.RECOMPUTE in ops,
                [qname[op] for op in ops])
        assert native.SIMC.survey(acts, U, M, values._UNIT_PAYLOAD_TUPLE, qname, Op.RECOMPUTE) == want
    assert native.SIMC.survey([_Other(Op.F, 0, (0,))], U, M, values._UNIT_PAYLOAD_TUPLE, qname, Op.RECOMPUTE) is None


class _Other(Action):
    """An Action by another type: survey leaves it to the pure scans."""
