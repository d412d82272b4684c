"""Collectives across emulated links: one price (``collective_time``) for the simulator and the
link emulator, held FIFO per group, and a step whose held collectives are the simulator's."""
import math

import pytest
import torch

from pipert import _ext
from pipert.comm.base import Done
from pipert.comm.delayed import DelayedTransport
from pipert.comm.links import LinkEmulator
from pipert.cost.topology import Links, LinkSpec, Topology, collective_time
from pipert.linkflags import LinkOptions

BACKENDS = ["python"] + (["ext"] if _ext.HAVE_EXT else [])
OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")


def _links() -> Links:
    """8 ranks, 2 DCs of 2 nodes of 2 ranks: every link class has its own numbers."""
    return LinkOptions(dcs=2, dc_latency=3e-3, dc_bandwidth=1e8, ranks_per_node=2, node_latency=2e-4,
                       node_bandwidth=5e8).links(8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("group", [(0, 1), (0, 2), (0, 4), (1, 5, 3), (0, 2, 4, 6), (6, 4, 2, 0)])
def test_the_emulator_prices_a_collective_as_the_simulator(backend, group):
    links = _links()
    em = LinkEmulator.from_links(links, backend=backend)
    for op in OPS:
        want = links.collective(op, group, 3e6)
        assert em.collectives.price(op.upper(), group, 3e6) == pytest.approx(want, rel=1e-9, abs=1e-15)
        assert collective_time(op, group, 3e6, links.spec) == want


def test_ring_prices_by_hand():
    """Two members across the DC link: all-reduce is 2 ring steps of half the buffer, all-gather
    one; a ring that crosses the DC boundary pays its slowest link at every step."""
    links = _links()
    lat, bw, b = 3e-3, 1e8, 3e6
    assert links.collective("allreduce", (0, 4), b) == pytest.approx(2 * (lat + b / 2 / bw))
    assert links.collective("allgather", (0, 4), b) == pytest.approx(lat + b / 2 / bw)
    # ring 0 -> 2 -> 4 -> 6 -> 0: two node links, two DC links; each of 3 steps pays the DC link
    assert links.collective("reducescatter", (0, 2, 4, 6), b) == pytest.approx(3 * (lat + b / 4 / bw))
    # inside one node (ranks 0, 1) every link is free
    assert links.collective("allreduce", (0, 1), b) == 0.0
    assert links.collective("allreduce", (3,), b) == 0.0


def test_only_a_group_whose_ring_crosses_an_emulated_link_is_held():
    em = LinkEmulator.from_links(_links(), backend="python")
    assert not em.collectives.crosses((0, 1))       # one node: free
    assert em.collectives.crosses((0, 2))           # two nodes of one DC
    assert em.collectives.crosses((1, 5))           # two DCs
    free_nodes = LinkEmulator.from_links(LinkOptions(dcs=2, dc_latency=1e-3).links(4), backend="python")
    assert not free_nodes.collectives.crosses((0, 1)) and free_nodes.collectives.crosses((1, 2))
    assert LinkEmulator(4, LinkSpec(0.0, 1e9)).collectives.crosses((0, 1))  # bandwidth alone


@pytest.mark.parametrize("backend", BACKENDS)
def test_holds_are_fifo_per_group_and_release_in_posting_order(backend):
    em = LinkEmulator(4, LinkSpec(1e-3, math.inf), backend=backend)
    cl = em.collectives
    calls = []
    t0 = 1.0  # long past: every release is due at once
    a = cl.hold(0, "ALLREDUCE", (0, 2), 100, lambda: calls.append("a"), ready=t0)
    b = cl.hold(0, "ALLREDUCE", (0, 2), 100, lambda: calls.append("b"), ready=t0)   # waits for a
    c = cl.hold(0, "BROADCAST", (0, 1), 100, lambda: calls.append("c"), ready=t0)   # its own group
    d = cl.hold(2, "ALLREDUCE", (2, 0), 100, lambda: calls.append("d"), ready=t0 + 5e-3)  # rank 2's own clock
    em.drain()
    step = em.collectives.price("ALLREDUCE", (0, 2), 100)
    assert step == pytest.approx(2 * 1e-3)
    assert (a.release, b.release) == pytest.approx((t0 + step, t0 + 2 * step))
    assert c.release == pytest.approx(t0 + 1e-3) and d.release == pytest.approx(t0 + 5e-3 + step)
    assert sorted(calls) == ["a", "b", "c", "d"] and calls.index("a") < calls.index("b")  # one group's in order
    assert [h.op for h in cl.records(0)] == ["ALLREDUCE", "ALLREDUCE", "BROADCAST"]
    assert cl.held(0) == 3 and cl.records(0, since=2) == [c] and cl.records(2) == [d]


class _Inner:
    """A transport that records what reaches it."""

    rank, world_size = 0, 4

    def __init__(self):
        self.got = []

    def collective(self, op, tensor, group, root, out=None):
        self.got.append((op, tensor.clone(), tuple(group)))
        return Done()


def test_delayed_transport_holds_a_crossing_collective_and_copies_what_it_only_gives():
    em = LinkEmulator.from_links(LinkOptions(dcs=2, dc_latency=1e-3, dc_bandwidth=1e9).links(4), backend="python")
    inner = _Inner()
    tr = DelayedTransport(inner, em, path="timer")
    shard = torch.ones(3, dtype=torch.float64)
    whole = torch.empty(6, dtype=torch.float64)
    h = tr.collective("ALLGATHER", shard, (2, 0), None, out=whole)
    shard.fill_(7.0)  # after the post: the gather still sends what was posted
    h.wait(10.0)
    assert inner.got[0][0] == "ALLGATHER" and torch.equal(inner.got[0][1], torch.ones(3, dtype=torch.float64))
    (held,) = em.collectives.records(0)
    assert held.group == (2, 0) and held.nbytes == 6 * 8  # priced on the whole buffer, in the action's ring
    assert held.delay == pytest.approx(1e-3 + 24 / 1e9)
    inside = tr.collective("ALLREDUCE", shard, (0, 1), None)  # one DC: straight through
    assert isinstance(inside, Done) and em.collectives.held(0) == 1


def test_a_local_dp_step_holds_each_collective_for_the_simulators_price():
    """P=2 x D=2 over 2 DCs (replica d on ranks 2d, 2d+1): the pipelines stay inside a DC and every
    gradient all-reduce crosses the DC link; the emulator held each for the simulator's price."""
    from pipert.pipeline import Pipeline
    from pipert.testing import simulated_collective_prices, unit_weight_bytes
    from pipert.tools.reference import grouped_reference_step, rel_err
    from pipert.train import TrainConfig, _rank_units, build_program
    cfg = TrainConfig(stages=2, dp=2, microbatches=4, batch_size=4, seq=16, steps=1, dtype="float64", dcs=2,
                      dc_latency="1ms", dc_bandwidth="1Gbps")
    program = build_program(cfg)
    links = cfg.link_options().links(4)
    units = _rank_units(cfg, program, torch.device("cpu"))
    ref = _rank_units(cfg, program, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (4, 16), generator=g)
    y = torch.randint(0, 256, (4, 16), generator=g)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    with Pipeline(units, program, backend="local", links=links, optimizer=sgd) as pipe:
        pipe.step(x, y)
        held = pipe.held_collectives()
        grads = pipe.named_grads()
    want = simulated_collective_prices(program, links, unit_weight_bytes(units))
    for r in range(4):
        got = [(h.op, h.delay) for h in held[r]]
        assert [op for op, _ in got] == [op for op, p in want[r] if p > 0] and got, (r, got, want[r])
        assert [d for _, d in got] == pytest.approx([p for _, p in want[r] if p > 0], rel=1e-9), r
    step, _ = grouped_reference_step(ref, x, y, 4, 4, sgd([p for u in ref for p in u.parameters()]))
    assert rel_err(grads, step.grads) <= 1e-10
