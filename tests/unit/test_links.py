"""Link delay injection: deadline math, timer delivery, stream transfers; both backends."""
import math
import random
import threading
import pytest
import torch

from pipert import _ext
from pipert.comm.links import LinkEmulator, LinkSpec
from pipert.device.streams import StreamSet, clock

MB = 1e6


def test_math_fifo_and_pipelining(backend):
    em = LinkEmulator(2, LinkSpec(latency=5e-3, bandwidth=1e9), backend=backend)  # 1 MB = 1 ms
    assert em.schedule_message(0, 1, 2 * MB, 0.0) == pytest.approx((0.0, 7e-3), abs=1e-9)
    # ready at 1 ms while the link is busy until 2 ms: departs at 2 ms, during the first's latency
    assert em.schedule_message(0, 1, 1 * MB, 1e-3) == pytest.approx((2e-3, 8e-3), abs=1e-9)
    assert em.free_at(0, 1) == pytest.approx(3e-3, abs=1e-9)
    # idle link: departs when ready
    assert em.schedule_message(0, 1, 1 * MB, 10e-3) == pytest.approx((10e-3, 16e-3), abs=1e-9)
    # the reverse direction is its own link (full duplex)
    assert em.schedule_message(1, 0, 1 * MB, 0.0) == pytest.approx((0.0, 6e-3), abs=1e-9)
    em.reset()
    assert em.free_at(0, 1) == 0.0


def test_per_pair_links_and_validation(backend):
    em = LinkEmulator(3, links={(0, 2): LinkSpec(1e-3, 1e6), (2, 0): (2e-3, 2e6)}, backend=backend)
    assert em.link(0, 2) == LinkSpec(1e-3, 1e6)
    assert em.link(2, 0) == LinkSpec(2e-3, 2e6)
    assert em.link(0, 1) == LinkSpec(0.0, math.inf)
    assert em.schedule_message(0, 1, 1e12, 5.0) == (5.0, 5.0)  # ideal link
    assert em.occupancy(0, 2, 1000) == pytest.approx(1e-3)
    with pytest.raises((IndexError, ValueError)):
        em.schedule_message(0, 3, 1, 0.0)
    with pytest.raises(ValueError):
        LinkSpec(latency=-1.0)
    with pytest.raises(ValueError):
        LinkSpec(bandwidth=0.0)


@pytest.mark.skipif(not _ext.HAVE_EXT, reason="pipert._C not built")
def test_backends_agree_on_random_traffic():
    rng = random.Random(7)
    ems = [LinkEmulator(4, LinkSpec(1e-4, 1e8), backend=b) for b in ("ext", "python")]
    for em in ems:
        em.set_link(1, 2, LinkSpec(3e-3, 5e7))
    t = 0.0
    for _ in range(500):
        s, d = rng.randrange(4), rng.randrange(4)
        nbytes = rng.choice([0, 1, 1000, 1e5, 3e6])
        t += rng.random() * 1e-3
        got = [em.schedule_message(s, d, nbytes, t) for em in ems]
        assert got[0] == pytest.approx(got[1], abs=2e-9)


def test_per_message_occupancy(backend):
    em = LinkEmulator(2, LinkSpec(latency=1e-3, bandwidth=1e9, per_message=2e-3), backend=backend)
    assert em.schedule_message(0, 1, 1 * MB, 0.0) == pytest.approx((0.0, 4e-3), abs=1e-9)
    assert em.free_at(0, 1) == pytest.approx(3e-3, abs=1e-9)
    assert em.schedule_message(0, 1, 0, 0.0) == pytest.approx((3e-3, 6e-3), abs=1e-9)  # empty message
    assert em.occupancy(0, 1, 1 * MB) == pytest.approx(3e-3)


def test_from_links_matches_the_cost_model(backend):
    from pipert.cost import Links, Topology, default_link_specs

    links = Links(Topology(8, ranks_per_node=2, num_dcs=2), default_link_specs(),
                  overrides={(3, 4): LinkSpec(2e-3, 1e8, 1e-4)})
    em = LinkEmulator.from_links(links, backend=backend)
    rng = random.Random(3)
    for _ in range(50):
        s, d = rng.randrange(8), rng.randrange(8)
        nbytes = rng.choice([0.0, 1e3, 1e6, 5e7])
        occ, lat = links.transfer(s, d, nbytes)
        em.reset()
        depart, arrive = em.schedule_message(s, d, nbytes, 1.0)
        assert depart == 1.0
        assert arrive == pytest.approx(1.0 + occ + lat, abs=2e-9)


class _Topo:
    num_ranks = 4

    def node_of(self, r):
        return r // 2

    def dc_of(self, r):
        return 0

    def link_class(self, s, d):
        return "local" if s == d else ("intra_node" if s // 2 == d // 2 else "inter_node")


def test_from_topology(backend):
    specs = {"intra_node": LinkSpec(1e-6, 1e11), "inter_node": LinkSpec(1e-5, 1e10)}
    em = LinkEmulator.from_topology(_Topo(), specs, overrides={(3, 0): (1e-3, 1e6)}, backend=backend)
    assert em.link(0, 1) == specs["intra_node"]
    assert em.link(1, 2) == specs["inter_node"]
    assert em.link(3, 0) == LinkSpec(1e-3, 1e6)
    assert em.link(0, 3) == specs["inter_node"]  # overrides are per direction
    assert em.link(2, 2) == LinkSpec()  # class missing from specs: ideal


def test_from_link_model(backend):
    class Linear:
        def transfer(self, s, d, nbytes):
            bw = 1e9 if abs(s - d) == 1 else 1e8
            return nbytes / bw, 2e-6 * (1 + abs(s - d))

    em = LinkEmulator.from_link_model(Linear(), 3, backend=backend)
    assert em.link(0, 1).bandwidth == pytest.approx(1e9)
    assert em.link(0, 2).latency == pytest.approx(6e-6)
    assert em.link(0, 2).bandwidth == pytest.approx(1e8)


def test_deliver_calls_at_arrival(backend):
    em = LinkEmulator(2, LinkSpec(3e-3, 1e9), backend=backend)
    fired = {}
    t0 = clock()
    timing = [em.deliver(0, 1, 1 * MB, lambda i=i: fired.setdefault(i, clock()), ready_time=t0)
              for i in range(3)]
    em.drain()
    for i, (depart, arrive) in enumerate(timing):
        assert depart == pytest.approx(t0 + i * 1e-3, abs=1e-6)
        assert arrive == pytest.approx(t0 + (i + 1) * 1e-3 + 3e-3, abs=1e-6)
        assert arrive <= fired[i]
    assert sorted(fired, key=fired.get) == [0, 1, 2]


def test_deliver_errors_reach_drain(backend):
    em = LinkEmulator(2, backend=backend)
    em.deliver(0, 1, 10, lambda: 1 / 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        em.drain()


def test_dist_isend_fires_after_arrival(backend):
    em = LinkEmulator(2, LinkSpec(10e-3, 1e8), backend=backend)
    calls = []
    t = torch.ones(250_000)  # 1 MB: 10 ms occupancy
    t0 = clock()
    fut = em.dist_isend(t, dst=1, src=0, send_fn=lambda x, d, group=None: calls.append((x, d, clock())) or "work")
    assert fut.result(timeout=5) == "work"
    (x, d, when), = calls
    assert x is t and d == 1
    assert when >= t0 + 20e-3


STREAM_BACKENDS = [pytest.param(("ext", "ext"), marks=pytest.mark.skipif(not _ext.HAVE_EXT, reason="no _C")),
                   ("python", "python"),
                   pytest.param(("python", "ext"), marks=pytest.mark.skipif(not _ext.HAVE_EXT, reason="no _C"))]


@pytest.fixture(params=STREAM_BACKENDS, ids=lambda p: f"links-{p[0]}-streams-{p[1]}")
def rig(request):
    link_backend, stream_backend = request.param
    with StreamSet("cpu", "r0", backend=stream_backend) as a, StreamSet("cpu", "r1", backend=stream_backend) as b:
        yield LinkEmulator(2, LinkSpec(4e-3, 1e9), backend=link_backend), a, b


# Transfers are timed on the streams' ideal clocks (see test_streams.py): the ideal times of
# their events equal the link model's departure, occupancy and arrival exactly, however busy
# the machine; real completions come no earlier. Gates (items that wait for the test) hold a
# stream still where a test needs an order of events.

def test_transfer_rendezvous_and_copy(rig):
    em, a, b = rig
    src, dst = torch.arange(16.0), torch.zeros(16)
    gate = threading.Event()
    b.recv.enqueue(lambda: gate.wait(30))  # the receiver posts late
    tr = em.enqueue_transfer(0, 1, 2 * MB, a.send, b.recv, copy=(dst, src))
    waiting = (not tr.arrived.query(), not dst.any())  # the host did not wait for the receiver
    t_open = clock()
    gate.set()
    tr.arrived.synchronize()
    tr.sent.synchronize()
    assert all(waiting), waiting
    assert tr.depart >= t_open
    assert tr.free_at == pytest.approx(tr.depart + 2e-3, abs=1e-6)
    assert tr.arrive == pytest.approx(tr.free_at + 4e-3, abs=1e-6)
    assert tr.sent.ideal_time == pytest.approx(tr.free_at, abs=1e-9)
    assert tr.arrived.ideal_time == pytest.approx(tr.arrive, abs=1e-9)
    assert tr.free_at <= tr.sent.time and tr.arrive <= tr.arrived.time
    assert torch.equal(dst, src)


def test_transfer_without_rendezvous_departs_when_sent(rig):
    em, a, b = rig
    gate = threading.Event()
    b.recv.enqueue(lambda: gate.wait(30))
    tr = em.enqueue_transfer(0, 1, 1 * MB, a.send, b.recv, rendezvous=False)
    tr.sent.synchronize()  # the send completes while the receiver is still held
    t_open = clock()
    gate.set()
    tr.arrived.synchronize()
    assert tr.depart < t_open
    # sent when the link is free; later only if this thread enqueued the record later (a loaded host)
    assert tr.free_at - 1e-9 <= tr.sent.ideal_time <= tr.sent.time
    assert tr.arrived.time >= t_open  # the recv stream was behind


def test_transfers_pipeline_on_one_link(rig):
    em, a, b = rig
    k = 5
    em.reset()
    gate = threading.Event()
    a.send.enqueue(lambda: gate.wait(30))  # all k become ready at once, when the gate opens
    trs = [em.enqueue_transfer(0, 1, 1 * MB, a.send, b.recv, rendezvous=False) for _ in range(k)]
    gate.set()
    b.recv.synchronize()
    for prev, cur in zip(trs, trs[1:]):
        assert cur.depart == pytest.approx(prev.free_at, abs=1e-9)  # FIFO occupancy, back to back
        assert cur.depart < prev.arrive  # in flight during the previous latency
    span = trs[-1].arrived.ideal_time - trs[0].depart
    assert span == pytest.approx(k * 1e-3 + 4e-3, abs=1e-6)
    assert trs[-1].arrived.time >= trs[-1].arrived.ideal_time


def test_transfer_with_callable_copy_and_compute_overlap(rig):
    # The compute stream and the transfer's copy are inside their items at the same time.
    em, a, b = rig
    em.reset()
    barrier = threading.Barrier(2, timeout=30)
    a.compute.enqueue(barrier.wait)
    tr = em.enqueue_transfer(0, 1, 5 * MB, a.send, b.recv, copy=barrier.wait)
    a.compute.synchronize()
    tr.arrived.synchronize()
    assert not barrier.broken


def test_transfer_rejects_bad_link(rig):
    em, a, b = rig
    with pytest.raises((IndexError, ValueError)):
        em.enqueue_transfer(0, 5, 10, a.send, b.recv)
