"""plan --auto's pruning keeps the ranking: the top found with pruning (lower bounds, layouts
proven slower from their schedule's messages) equals the exhaustive search's top; the schedule
bound is below every simulated finish (also on random small clusters); a search cut by its time
limit says so."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipert.cli import main
from pipert.cost.topology import LinkSpec, default_link_specs
from pipert.cost.transformer import ModelSpec
from pipert.planner import auto
from pipert.planner.auto import analytic_cost, search
from pipert.planner.cluster import Cluster
from pipert.planner.layouts import layouts
from pipert.planner.prune import finish_bounds

TINY = ModelSpec.preset("tiny")
SLOW_DC = {**default_link_specs(), "inter_dc": LinkSpec(1e-3, 1.25e6)}
GBIT_DC = {**default_link_specs(), "inter_dc": LinkSpec(1e-3, 1.25e8)}
FAMILIES = ("1f1b", "zb-h1", "weipipe-interleave", "tawpipe")


@pytest.mark.parametrize("cluster, top", [(Cluster(2, 2, 2, links=GBIT_DC), 3), (Cluster(4, 2, 2, links=SLOW_DC), 1),
                                          (Cluster(4, 1), 3)])
def test_pruned_search_finds_the_exhaustive_top(cluster, top, monkeypatch):
    proven = []
    slower = auto._slower

    def spy(*args, **kw):
        proven.append(slower(*args, **kw))
        return proven[-1]
    monkeypatch.setattr(auto, "_slower", spy)
    pruned = search(TINY, cluster, 16, families=FAMILIES, top=top, time_budget=600)
    everything = search(TINY, cluster, 16, families=FAMILIES, top=10 ** 6, time_budget=600)
    assert everything.pruned_bound == 0 and pruned.pruned_bound > 0
    assert [c.as_dict() for c in pruned.ranked[:top]] == [c.as_dict() for c in everything.ranked[:top]]
    if cluster.dcs > 1:   # weight passing across the slow link: some layouts proven slower unsimulated
        assert any(proven)


def _bounds_below_finish(cl: Cluster, batch: int, families: tuple[str, ...]) -> int:
    """Assert the schedule bound is below each rank's simulated finish for every layout; return how
    many layouts had a positive bound."""
    from pipert.planner.pipe import _pipe
    from pipert.sim import simulate
    checked = 0
    for lay in layouts(cl, TINY, batch, families):
        cost = analytic_cost(cl)(TINY, lay, "none", lay.units)
        links = lay.links(cl)
        try:
            sched = auto._build(lay, cost, links, cl.device.memory, "none")
        except ValueError:
            continue
        finish = _pipe(sched, simulate(sched, cost, links=links, topology=lay.topology())).finish
        bound = finish_bounds(sched, cost, links)
        assert all(b <= f * (1 + 1e-9) for b, f in zip(bound, finish)), (lay, bound, finish)
        checked += max(bound) > 0
    return checked


def test_schedule_bound_is_below_every_simulated_finish():
    cl = Cluster(2, 2, 2, links=SLOW_DC)
    assert _bounds_below_finish(cl, 16, ("1f1b", "zb-h1", "weipipe-interleave", "tawpipe", "helixpipe-2fold")) >= 5


def test_a_search_cut_by_its_time_limit_says_so(capsys):
    rc = main(["plan", "--auto", "--model", "tiny", "--gpus-per-node", "4", "--batch", "16",
               "--time-limit", "1e-9s"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "not reached in the time limit" in out and "stopped at the time limit" in out

SMALL_FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "weipipe-interleave", "tawpipe", "helixpipe-2fold")


@st.composite
def small_clusters(draw):
    gpn, nodes = draw(st.sampled_from([(2, 1), (4, 1), (2, 2), (4, 2)]))
    dcs = draw(st.sampled_from([1, 2])) if nodes == 2 else 1
    dc = LinkSpec(draw(st.sampled_from([1e-5, 1e-3])), draw(st.sampled_from([1.25e6, 1.25e8, 1.25e10])))
    return Cluster(gpn, nodes, dcs, links={**default_link_specs(), "inter_dc": dc})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=small_clusters(), top=st.integers(1, 4), batch=st.sampled_from([8, 16]))
def test_random_clusters_pruned_top_equals_exhaustive_and_bounds_hold(cluster, top, batch):
    """Every pruning (bound order, cheap layouts first, the schedule bound) keeps the top; the
    schedule bound is below the simulated finish of every layout of the cluster."""
    pruned = search(TINY, cluster, batch, families=SMALL_FAMILIES, top=top, time_budget=600)
    everything = search(TINY, cluster, batch, families=SMALL_FAMILIES, top=10 ** 6, time_budget=600)
    assert everything.pruned_bound == 0
    assert [c.as_dict() for c in pruned.ranked[:top]] == [c.as_dict() for c in everything.ranked[:top]]
    _bounds_below_finish(cluster, batch, SMALL_FAMILIES)


def test_forked_workers_start_after_the_parents_garbage_is_collected():
    """Workers are forks of this process: a StreamSet in a reference cycle (what a dropped Pipeline
    leaves for the collector) is collected before the fork; a worker that runs the collector would
    otherwise stop stream workers it does not have, and hang."""
    import gc
    import multiprocessing
    import threading
    import time
    from types import SimpleNamespace

    from pipert import _ext
    from pipert.device.streams import StreamSet
    from pipert.planner.runner import run_in_order
    if not _ext.HAVE_EXT:
        pytest.skip("pipert._C not built (its stream workers are what a forked collector would stop)")

    def evaluate(lay, bound, cutoff):
        gc.collect()
        return SimpleNamespace(step=lay + 1.0, memory=0.0, layout=SimpleNamespace(family="f", stages=1)), 1, {}, False
    result: list = []
    gc.disable()
    try:
        s = StreamSet("cpu", backend="ext")
        s.issue([("run", s.compute, lambda: None)])  # its C++ worker thread runs
        s.synchronize()
        cycle: list = [s]
        cycle.append(cycle)
        del s, cycle
        items = [(float(i), i) for i in range(4)]
        t = threading.Thread(target=lambda: result.append(run_in_order(items, evaluate, 2, 60.0, time.perf_counter(),
                                                                       jobs=2)), daemon=True)
        t.start()
        t.join(60)
    finally:
        gc.enable()
        for child in multiprocessing.active_children():
            child.kill()
    assert result, "a forked worker hung"
    assert [c.step for c in result[0][0]][:2] == [1.0, 2.0]


@pytest.mark.parametrize("family", ["helixpipe", "helixpipe-2fold"])
@pytest.mark.parametrize("recompute", ["none", "no_attention"])
def test_helix_placement_busy_is_each_ranks_simulated_compute(family, recompute):
    """The unbuilt HelixPipe bound (its placement's F + B per rank) equals the seconds each rank
    computes in the simulation, OPT left out: its last non-OPT compute cannot end earlier."""
    from pipert.ir.action import Op
    from pipert.planner.prune import placement_busy
    from pipert.schedules.helixpipe import helix_placement
    cl = Cluster(4, 2, 2, links=SLOW_DC)
    checked = 0
    for lay in layouts(cl, TINY, 16, (family,)):
        cost, _, run = auto._runner(TINY, cl, lay, recompute, analytic_cost(cl), auto.Search([], 1e18), {}, {})
        try:
            _, res = run(lay)
        except ValueError:    # two-fold: M not a multiple of 2P
            continue
        computed = [0.0] * lay.stages
        for rank, queue, action, start, end in res.events:
            if queue == "compute" and action.op is not Op.OPT:
                computed[rank] += end - start
        folds = auto.family_default(family, "folds", 1)
        busy = placement_busy(helix_placement(lay.stages, lay.stages * lay.chunks, lay.microbatches, folds), cost,
                              lay.stages)
        assert busy == pytest.approx(computed, rel=1e-12), lay
        checked += 1
    assert checked >= 4


def test_forked_layouts_past_the_cheap_ones_start_with_the_cutoff_one_process_would_have():
    """With forked workers, a layout after the cheap first ones starts only once ``top`` layouts
    were found (its cutoff finite, so it can be proven slower unsimulated)."""
    import time
    from types import SimpleNamespace

    from pipert.planner.runner import run_in_order

    def evaluate(lay, bound, cutoff):
        time.sleep(0.05)
        cand = SimpleNamespace(step=100.0 - bound, memory=0.0, cutoff=cutoff, bound=bound,
                               layout=SimpleNamespace(family=lay, stages=1))
        return cand, 1, {}, False
    items = [(float(i), "cheap" if i < 3 else "other") for i in range(10)]
    found, _ = run_in_order(items, evaluate, 2, 60.0, time.perf_counter(), jobs=2,
                            cheap=lambda lay: lay == "cheap")
    later = [c for c in found if c.layout.family == "other"]
    assert later and all(c.cutoff < float("inf") for c in later)
