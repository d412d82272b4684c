"""The stream path of DelayedTransport (pipert.comm.linkframes) on its CPU mirror: the same
two link steps the CUDA kernels run, on the host clock, over the one-process transport."""
import threading

import pytest
import torch

from pipert.comm import linkframes
from pipert.comm.links import LinkEmulator
from pipert.comm.linkframes import HostOps, clock_offsets, frame_size, link_clock_offsets, link_read_at
from pipert.device.streams import clock
from pipert.comm.delayed import DelayedTransport
from pipert.comm.local import LocalHub

LAT, BW = 4e-3, 1e6  # 4 ms latency; 1 MB/s: 800 bytes occupy the link for 0.8 ms


@pytest.fixture
def waits(monkeypatch):
    """Every deadline the link steps sleep to, in order (they still sleep)."""
    seen = []
    real = linkframes.sleep_until

    def record(t):
        seen.append(t)
        real(t)
    monkeypatch.setattr(linkframes, "sleep_until", record)
    return seen


def _pair(offsets=None, path="stream"):
    hub = LocalHub(2)
    em = LinkEmulator(2, (LAT, BW))
    return em, [DelayedTransport(hub.transport(r), em, path=path, clock_offsets=offsets) for r in (0, 1)]


def test_frames_carry_the_schedule_and_the_receiver_waits_for_the_arrival(waits):
    em, (a, b) = _pair()
    xs = [torch.arange(100, dtype=torch.float64) + k for k in range(2)]  # 800 bytes each
    t_ready = clock()
    sends = [a.isend(x, 1) for x in xs]
    outs = [torch.empty(100, dtype=torch.float64) for _ in xs]
    for out, h in zip(outs, [b.irecv(o, 0) for o in outs]):
        h.wait(5.0)
        assert clock() >= waits[-1]
    for h in sends:
        assert h.done()
    for x, out in zip(xs, outs):
        assert torch.equal(x, out)
    # sender: held until each message's occupancy ends, FIFO on the link; receiver: until arrival
    send_free = [waits[0], waits[1]]
    occ = em.occupancy(0, 1, 800)
    assert send_free[0] >= t_ready + occ - 1e-9
    assert send_free[1] >= send_free[0] + occ - 1e-9  # ready when the send queue reached it, after the first
    assert em.free_at(0, 1) == pytest.approx(send_free[1], abs=1e-9)
    assert waits[2:] == [pytest.approx(f + LAT, abs=2e-9) for f in send_free]
    assert em.delivered(0) == 2


def test_receiver_clock_offset_moves_the_read_deadline(waits):
    em, (a, b) = _pair(offsets={0: -250_000})  # rank 1's clock is 0.25 ms behind rank 0's
    out = torch.empty(3)
    a.isend(torch.ones(3), 1)
    b.irecv(out, 0).wait(5.0)
    free_at = waits[0]
    assert waits[1] == pytest.approx(free_at + LAT - 250e-6, abs=2e-9)
    assert link_read_at(10, -3) == 7


def test_free_link_and_timer_path_send_plain_messages(waits):
    hub = LocalHub(2)
    em = LinkEmulator(2, (0.0, float("inf")))
    a, b = (DelayedTransport(hub.transport(r), em, path="stream") for r in (0, 1))
    out = torch.empty(4)
    a.isend(torch.full((4,), 2.0), 1)
    b.irecv(out, 0).wait(5.0)
    assert torch.equal(out, torch.full((4,), 2.0)) and waits == [] and em.delivered(0) == 0
    # CPU tensors on "auto" take the timer path: no frames
    assert not DelayedTransport(hub.transport(0), em).takes_stream_path(torch.device("cpu"))
    assert frame_size(5) == 8 + 24 and frame_size(8) == 8 + 24


def test_bad_arguments_fail_fast():
    hub = LocalHub(2)
    em = LinkEmulator(2, (LAT, BW))
    with pytest.raises(ValueError, match="path 'device' unknown; allowed: auto, timer, stream"):
        DelayedTransport(hub.transport(0), em, path="device")
    a = DelayedTransport(hub.transport(0), em, path="stream")
    with pytest.raises(ValueError, match="contiguous"):
        a.isend(torch.zeros(4, 4).t(), 1)
    with pytest.raises(ValueError, match="clock 'gps' unknown; allowed: auto, shared, estimate"):
        link_clock_offsets(None, None, "cpu", ["h"], "gps")
    assert link_clock_offsets(None, None, "cpu", ["h", "h"], "auto") == {}


class _SkewedOps(HostOps):
    def __init__(self, skew_ns: int) -> None:
        super().__init__(None)
        self.skew = skew_ns

    def stamp(self, out):
        super().stamp(out)
        out.add_(self.skew)


def test_clock_offsets_recover_a_skew_within_their_bound():
    hub = LocalHub(2)
    skew = 7_000_000  # rank 1's clock reads 7 ms ahead
    results = {}

    def run(rank):
        results[rank] = clock_offsets(hub.transport(rank), _SkewedOps(skew if rank else 0), "cpu", rounds=4)
    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    (off0, bound0), (off1, bound1) = results[0], results[1]
    assert off0[1] == -off1[0] and bound0[1] == bound1[0] > 0
    assert abs(off1[0] - skew) <= bound1[0]  # rank 1 minus rank 0, within half the best round trip
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        clock_offsets(hub.transport(0), HostOps(None), "cpu", rounds=0)


@pytest.mark.parametrize("kw, needle", [({"path": "gpu"}, "link path 'gpu' unknown; allowed: auto, timer, stream"),
                                        ({"clock": "ntp"}, "link clock 'ntp' unknown; allowed: auto, shared")])
def test_pipeline_rejects_bad_link_options(kw, needle):
    from pipert.cost.topology import Links, Topology
    from pipert.pipeline import LinkEmulation
    with pytest.raises(ValueError, match=needle):
        LinkEmulation(Links(Topology(2)), **kw)


def test_one_process_pipeline_on_the_stream_path_is_exact():
    from pipert.testing import Case, run_case
    r = run_case(Case("1f1b", 2, 4, "float64", links=(("dcs", 2), ("dc_latency", "1ms")), link_path="stream"))
    assert max(r.loss_err, r.grad_err, r.param_err) <= 1e-10
    assert r.delayed["messages"] == 2 * 4


def test_staged_frames_are_posted_in_order_by_the_poster_thread(waits):
    from pipert.device.pinned import PinnedPool
    from pipert.comm.staging import StagedTransport
    hub, pool = LocalHub(2), PinnedPool()
    em = LinkEmulator(2, (LAT, BW))
    a, b = (DelayedTransport(StagedTransport(hub.transport(r), pool), em, path="stream") for r in (0, 1))
    xs = [torch.arange(100, dtype=torch.float64) * k for k in range(3)]
    sends = [a.isend(x, 1) for x in xs]
    outs = [torch.empty(100, dtype=torch.float64) for _ in xs]
    for out, h in zip(outs, [b.irecv(o, 0) for o in outs]):
        h.wait(5.0)
    for h in sends:
        h.wait(5.0)
        assert h.done()
    assert all(torch.equal(x, o) for x, o in zip(xs, outs))  # FIFO: each receive got its own message
    assert waits[3:] == [pytest.approx(f + LAT, abs=2e-9) for f in waits[:3]]  # read at each arrival
    assert pool.stats()["in_use"] == 0  # every staging buffer went back to the pool
