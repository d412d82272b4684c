"""Measured compute times -> the simulator's step time (pipert.tools.fidelity)."""
import pytest

from pipert.cost import UniformCost
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.tools.fidelity import (local_measurements, message_overhead, predict_step, predict_step_shared,
                                   profile_from_measurements)
from pipert.compiler import compile
from pipert.schedules import build_schedule
from pipert.sim import simulate
from pipert.exec.instrument import Instrumentation


def _parts(program, tf: float, tb: float, spread: float, cpu: float = 1.0, cores: int = 8) -> list[dict]:
    """Per rank (one process each, all on one host of ``cores`` cores): every compute of its
    program timed twice, ``spread`` longer and shorter than tf/tb, its CPU seconds ``cpu`` times that."""
    parts = []
    for r, actions in enumerate(program.actions):
        times = [(a.op.value, a.unit, t, cpu * t) for a in actions if a.op.value in ("F", "B")
                 for t in ((tf if a.op.value == "F" else tb) + d for d in (spread, -spread))]
        times += [("OPT", None, 0.2, 0.2 * cpu), ("OPT", None, 0.3, 0.3 * cpu)]
        parts.append({"times": times, "act": {u: 1000 for u in range(program.num_units)}, "weight": {r: 10},
                      "ranks": [r], "host": "h", "cores": cores})
    return parts


@pytest.mark.parametrize("links", [None, Links(Topology(4, num_dcs=2), {"inter_dc": LinkSpec(0.5, 4000.0)})])
def test_means_of_measured_times_predict_the_uniform_makespan(links):
    program = compile(build_schedule("1f1b", stages=4, microbatches=8))
    prof = profile_from_measurements(_parts(program, 1.0, 2.0, spread=0.5), program.num_units)
    assert prof.max_forward == pytest.approx(1.0) and prof.t_opt == pytest.approx(0.25)
    assert [p.sizes["act"] for p in prof.profiles] == [1000] * 4
    expected = simulate(program, UniformCost(tf=1.0, tb=2.0, t_opt=0.25, act_bytes=1000), links=links).makespan
    assert predict_step(program, prof, links) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("links", [None, Links(Topology(4, num_dcs=2), {"inter_dc": LinkSpec(0.5, 4000.0)})])
def test_shared_prediction_with_a_core_per_rank_is_the_simulators(links):
    program = compile(build_schedule("1f1b", stages=4, microbatches=8))
    prof = profile_from_measurements(_parts(program, 1.0, 2.0, spread=0.5, cpu=0.5, cores=4), program.num_units)
    assert prof.host_of_rank == [0, 0, 0, 0] and prof.cores == [4]
    expected = simulate(program, UniformCost(tf=0.5, tb=1.0, t_opt=0.125, act_bytes=1000), links=links).makespan
    assert predict_step_shared(program, prof, links) == pytest.approx(expected, rel=1e-12)


def test_shared_prediction_on_one_core_is_the_total_work_when_the_core_never_idles():
    # GPipe P=2 M=2, tf=1, tb=2: whenever one compute ends another is ready, so one core runs
    # the 2 ranks' 2*(2*1 + 2*2) = 12 seconds of work back to back (its own-core makespan is 9)
    program = compile(build_schedule("gpipe", stages=2, microbatches=2))
    prof = profile_from_measurements(_parts(program, 1.0, 2.0, spread=0.0, cores=1), program.num_units)
    prof.cpu_opt = prof.t_opt = 0.0
    assert predict_step(program, prof) == pytest.approx(9.0)
    assert predict_step_shared(program, prof) == pytest.approx(12.0)


def test_no_shared_prediction_for_ranks_on_gpus():
    program = compile(build_schedule("1f1b", stages=2, microbatches=2))
    parts = _parts(program, 1.0, 2.0, spread=0.0)
    parts[1]["host"] = None
    prof = profile_from_measurements(parts, program.num_units)
    assert prof.host_of_rank == [] and predict_step_shared(program, prof) is None


def test_a_traced_step_records_wall_and_cpu_seconds_of_every_compute():
    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units
    units = tiny_units(2, "float64")
    pipe = Pipeline(units, build_schedule("1f1b", stages=2, microbatches=4), optimizer=sgd,
                    instrument=Instrumentation(trace=True))
    pipe.step(*make_batch(4))
    times = [t for r in pipe.last_results.values() for t in r.op_times]
    assert sorted({(op, u) for op, u, *_ in times}) == [("B", 0), ("B", 1), ("F", 0), ("F", 1), ("OPT", 0), ("OPT", 1)]
    assert len(times) == 2 * 2 * 4 + 2 and all(piece is None for *_, piece in times)
    # a compute's CPU seconds are its thread's: never more than its wall time (clock granularity aside)
    assert all(0 <= cpu <= wall + 1e-3 for _, _, wall, cpu, _ in times)


def test_message_overhead_counts_only_readers_that_waited():
    msgs = [(0, "send", 1, 0, 100, 1.0), (0, "send", 1, 1, 100, 1.0),
            (1, "recv", 0, 0, 0.5, 1.2),   # waited from 0.5: got it 0.2 s after it arrived
            (1, "recv", 0, 1, 2.0, 2.1)]   # came after it arrived: says nothing of the transit
    assert message_overhead(msgs) == pytest.approx(0.2)
    # on a link of 0.5 s latency and 0.1 s per message: arrivals at 1.6 and (FIFO) 1.7
    links = Links(Topology(2, num_dcs=2), {"inter_dc": LinkSpec(0.5, 1000.0)})
    msgs[2:] = [(1, "recv", 0, 0, 0.5, 1.65), (1, "recv", 0, 1, 1.0, 1.75)]
    assert message_overhead(msgs, links) == pytest.approx(0.05)
    assert message_overhead([]) == 0.0


def test_message_and_action_overheads_reach_both_predictions():
    program = compile(build_schedule("1f1b", stages=4, microbatches=8))
    parts = _parts(program, 1.0, 2.0, spread=0.0, cpu=0.5, cores=4)
    for p in parts:  # 0.1 CPU s per compute beyond the computes; one message 0.3 s late
        p["process_cpu"] = sum(t[3] for t in p["times"]) + 0.1 * len(p["times"])
        p["clock_host"] = "h"
    parts[0]["messages"] = [(0, "send", 1, 0, 8, 0.0)]
    parts[1]["messages"] = [(1, "recv", 0, 0, 0.0, 0.3)]
    prof = profile_from_measurements(parts, program.num_units)
    assert prof.action_overhead == pytest.approx(0.1) and len(prof.messages) == 2
    links = Links(Topology(4), {c: LinkSpec(0.3) for c in ("local", "intra_node", "inter_node", "inter_dc")})
    own = simulate(program, UniformCost(tf=1.0, tb=2.0, t_opt=0.25, act_bytes=1000), links=links).makespan
    assert predict_step(program, prof) == pytest.approx(own, rel=1e-12)
    cpu = simulate(program, UniformCost(tf=0.6, tb=1.1, t_opt=0.225, act_bytes=1000), links=links).makespan
    assert predict_step_shared(program, prof) == pytest.approx(cpu, rel=1e-12)  # a core per rank
    parts[1]["clock_host"] = "elsewhere"  # two clocks: the messages' times do not compare
    assert profile_from_measurements(parts, program.num_units).messages == []


def test_a_traced_step_records_each_message_at_both_ends():
    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units
    pipe = Pipeline(tiny_units(2, "float64"), build_schedule("1f1b", stages=2, microbatches=4), optimizer=sgd,
                    instrument=Instrumentation(trace=True))
    pipe.step(*make_batch(4))
    sends = {(r, m[1], m[2]): m for r, res in pipe.last_results.items() for m in res.messages if m[0] == "send"}
    recvs = {(m[1], r, m[2]): m for r, res in pipe.last_results.items() for m in res.messages if m[0] == "recv"}
    assert sorted(sends) == sorted(recvs) == [(0, 1, k) for k in range(4)] + [(1, 0, k) for k in range(4)]
    assert all(sends[key][3] > 0 and sends[key][4] <= recvs[key][4] for key in sends)  # posted before read
    assert pipe.last_process_cpu > 0


def test_tensor_parallel_processes_measure_their_rank_once():
    """T=2: each rank's two processes measure its computes (the means keep their values), the
    messages of tp coordinate 0 alone are counted, and a host of 4 cores runs 2 ranks' computes
    at once: the shared prediction is the T=1 one on 2 cores."""
    program = compile(build_schedule("1f1b", stages=4, microbatches=8))
    one = _parts(program, 1.0, 2.0, spread=0.5, cpu=0.5, cores=2)
    parts = []
    for p in _parts(program, 1.0, 2.0, spread=0.5, cpu=0.5, cores=4):
        r = p["ranks"][0]
        p["clock_host"], p["messages"] = "h", [(r, "send", r + 1, 0, 8, 0.0)] if r < 3 else []
        parts += [{**p, "tp": 2, "tp_rank": t} for t in (0, 1)]
    prof = profile_from_measurements(parts, program.num_units)
    assert prof.cores == [2.0] and prof.host_of_rank == [0, 0, 0, 0] and len(prof.messages) == 3
    want = profile_from_measurements(one, program.num_units)
    assert predict_step(program, prof) == pytest.approx(predict_step(program, want), rel=1e-12)
    assert predict_step_shared(program, prof) == pytest.approx(predict_step_shared(program, want), rel=1e-12)


def test_queue_overhead_opt_per_unit_and_host_edges_reach_the_prediction():
    """Each rank's queue overhead per compute lengthens its computes, each OPT is its unit's, and
    the host's work before and after the program adds to both predictions."""
    program = compile(build_schedule("1f1b", stages=2, microbatches=4))
    parts = _parts(program, 1.0, 2.0, spread=0.0, cores=2)
    for r, p in enumerate(parts):
        p["times"] = [t for t in p["times"] if t[0] != "OPT"] + [("OPT", r, 0.5 * (r + 1), 0.5 * (r + 1))]
        n = sum(a.is_compute for a in program.actions[r])
        p["queue"] = {r: ((0.1 + 0.1 * r) * n, n)}   # rank 0: 0.1 s per compute, rank 1: 0.2 s
        p["edges"] = (0.2 + r, 0.3 + r)               # head: mean 0.7; tail: least 0.3
    prof = profile_from_measurements(parts, program.num_units)
    assert prof.queue_overhead == pytest.approx([0.1, 0.2]) and (prof.head, prof.tail) == pytest.approx((0.7, 0.3))
    assert [p.times["OPT"] for p in prof.profiles] == [0.5, 1.0]

    class PerRank(UniformCost):
        def compute_time(self, action, rank):
            if action.op.value == "OPT":
                return 0.5 * (rank + 1) + 0.1 * (rank + 1)
            return super().compute_time(action, rank) + 0.1 * (rank + 1)
    want = simulate(program, PerRank(tf=1.0, tb=2.0, act_bytes=1000)).makespan + 1.0
    assert predict_step(program, prof) == pytest.approx(want, rel=1e-12)
    plain = simulate(program, UniformCost(tf=1.0, tb=2.0, act_bytes=1000)).makespan
    assert predict_step(program, prof) > plain + 1.0 + 8 * 0.2  # the old prediction had none of these


def test_a_traced_step_measures_its_queue_overhead_and_edges_and_sends_from_their_producers_end():
    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units
    pipe = Pipeline(tiny_units(2, "float64"), build_schedule("1f1b", stages=2, microbatches=4), optimizer=sgd,
                    instrument=Instrumentation(trace=True))
    pipe.step(*make_batch(4))
    head, tail = pipe.last_edges
    assert head > 0 and tail > 0
    for r, res in pipe.last_results.items():
        computes = [a for a in pipe.program.actions[r] if a.is_compute]
        assert res.queue_computes == len(computes) and res.queue_overhead > 0
        ends = {text: t1 for text, _, t1 in res.trace}
        producer = "F u0" if r == 0 else "B u1"
        for _, peer, k, _, ready in (m for m in res.messages if m[0] == "send"):
            assert ready == ends[f"{producer} m{k}"]  # the k-th message leaves when its value was made


def test_each_piece_of_a_split_compute_is_timed_on_its_own_and_counted_once():
    """A W split into sub-blocks gets one ``op_times`` entry per piece, with the piece's own seconds;
    what the ranks computed counts every piece once."""
    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units
    links = Links(Topology(2, num_dcs=2), {"inter_dc": LinkSpec(0.25, float("inf"), 0.5)})
    program = compile("crosspipe-greedy", stages=2, microbatches=4, schedule_options={"cost": UniformCost(),
                                                                                       "links": links})
    assert any(a.sub for acts in program.actions for a in acts)
    pipe = Pipeline(tiny_units(2, "float64"), program, optimizer=sgd, instrument=Instrumentation(trace=True))
    pipe.step(*make_batch(4))
    expected = 0.0
    for r, res in pipe.last_results.items():
        computes = [a for a in program.actions[r] if a.is_compute or a.op.value == "OPT"]
        assert [(a.op.value, a.unit, a.sub) for a in computes] == [(op, u, piece) for op, u, _, _, piece in res.op_times]
        expected += sum(wall for _, _, wall, _, _ in res.op_times)
    prof = profile_from_measurements([local_measurements(pipe)], program.num_units)
    assert prof.busy == pytest.approx(expected, rel=1e-9)
    split = {a.unit for acts in program.actions for a in acts if a.sub}
    assert all(any(" s" in key for key in prof.profiles[u].times) for u in split)


def _split_w_parts(whole: bool) -> tuple:
    """A 1-rank program whose W of micro-batch 0 runs in 2 uneven pieces (0.75 and 0.25 s) and, with
    ``whole``, micro-batch 1's W runs whole (0.5 s); the profile measured from it."""
    from pipert.ir.action import Action, Op
    from pipert.ir.schedule import Placement, Schedule
    acts = [Action(Op.F, 0, (0,)), Action(Op.F, 0, (1,)), Action(Op.D, 0, (0,)), Action(Op.D, 0, (1,)),
            Action(Op.W, 0, (0,), sub=(0, 2)), Action(Op.W, 0, (0,), sub=(1, 2)), Action(Op.W, 0, (1,)), Action(Op.OPT, 0)]
    if not whole:
        acts[6:7] = [Action(Op.W, 0, (1,), sub=(0, 2)), Action(Op.W, 0, (1,), sub=(1, 2))]
    program = compile(Schedule("split", 1, 1, 2, Placement.by_unit([0]), [acts]))
    times = [("F", 0, 1.0, 1.0, None)] * 2 + [("D", 0, 1.0, 1.0, None)] * 2 + [("OPT", 0, 0.1, 0.1, None)]
    times += [("W", 0, 0.75, 0.75, (0, 2)), ("W", 0, 0.25, 0.25, (1, 2))]
    times += [("W", 0, 0.5, 0.5, None)] if whole else [("W", 0, 0.75, 0.75, (0, 2)), ("W", 0, 0.25, 0.25, (1, 2))]
    part = {"times": times, "act": {0: 8}, "weight": {0: 8}, "ranks": [0], "host": "h", "cores": 1,
            "queue": {0: (0.0, 0)}}
    return program, profile_from_measurements([part], 1)


def test_split_pieces_are_priced_by_their_own_means_and_a_whole_by_whole_samples():
    """The simulator takes each piece's measured mean (not 1/N of the whole W's) and the whole W the
    mean of whole samples; an op measured only in pieces is their sum."""
    program, prof = _split_w_parts(whole=True)
    times = prof.profiles[0].times
    assert times["W"] == pytest.approx(0.5) and times["W s0/2"] == pytest.approx(0.75)
    res = simulate(program, _cost(prof))
    durations = [e - s for r, q, a, s, e in res.events if q == "compute" and a.op.value == "W"]
    assert durations == pytest.approx([0.75, 0.25, 0.5])
    assert predict_step(program, prof) == pytest.approx(2 + 2 + 1.5 + 0.1)
    _, only_pieces = _split_w_parts(whole=False)
    assert only_pieces.profiles[0].times["W"] == pytest.approx(1.0)


def test_queue_overhead_is_added_to_every_piece():
    """The queue measured each piece as a compute: each takes the rank's overhead once."""
    program, prof = _split_w_parts(whole=True)
    prof.queue_overhead = [0.01]
    assert predict_step(program, prof) == pytest.approx(2 + 2 + 1.5 + 0.1 + 8 * 0.01)


def _cost(prof):
    from pipert.cost.profiled import ProfiledCost
    return ProfiledCost(prof.profiles, prof.t_opt)
