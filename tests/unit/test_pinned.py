"""Pinned staging pool: reuse, size classes, deferred release, double buffering; both backends."""
import pytest
import torch

from pipert import _ext
from pipert.device.pinned import PinnedPool, size_class
from pipert.device.streams import StreamSet, clock
import threading


@pytest.fixture
def pool(backend):
    return PinnedPool(backend=backend)


def test_size_classes():
    assert [size_class(n) for n in (0, 1, 4096, 4097, 10**6)] == [4096, 4096, 4096, 8192, 2**20]
    if _ext.HAVE_EXT:
        assert all(_ext.C.PinnedPool.size_class(n) == size_class(n) for n in (0, 5000, 3 * 2**20))


def test_reuse_after_release(pool):
    a = pool.acquire(5000)
    assert a.capacity == 8192 and a.tensor.numel() == 5000 and a.tensor.dtype == torch.uint8
    a.tensor.fill_(7)
    ptr, bid = a.tensor.data_ptr(), a.id
    b = pool.acquire(5000)
    assert b.tensor.data_ptr() != ptr
    a.release()
    c = pool.acquire(7000)  # same size class: the block of a, not a new one
    assert c.id == bid and c.tensor.data_ptr() == ptr
    assert pool.stats() == {"allocations": 2, "reuses": 1, "bytes_reserved": 16384, "in_use": 2}
    d = pool.acquire(100)  # another class
    assert d.capacity == 4096
    assert pool.stats()["allocations"] == 3


def test_many_steps_allocate_once(pool):
    for _ in range(100):
        with pool.acquire(1 << 20) as buf:
            buf.tensor[0] = 1
    s = pool.stats()
    assert s["allocations"] == 1 and s["reuses"] == 99 and s["in_use"] == 0


def test_views_and_double_release(pool):
    buf = pool.acquire(64)
    v = buf.view(torch.float32, (4, 4))
    v.fill_(2.0)
    assert v.shape == (4, 4) and buf.tensor.view(torch.float32).sum() == 32.0
    with pytest.raises(ValueError):
        buf.view(torch.float64, (16,))  # 128 bytes > 64
    buf.release()
    with pytest.raises(ValueError):
        buf.release()


def test_release_after_event_is_deferred(pool):
    with StreamSet("cpu", backend="python") as dev:
        a = pool.acquire(4096)
        gate = threading.Event()
        dev.send.enqueue(lambda: gate.wait(30))  # a consumer that still uses the buffer
        ev = dev.send.record()
        a.release(after=ev)
        b = pool.acquire(4096)  # the event is pending: a is not handed out
        pending = not ev.query()
        gate.set()
        ev.synchronize()
        c = pool.acquire(4096)  # now it is
        assert c.id == a.id
        b.release()
        c.release()
        assert pending and b.id != a.id
        assert pool.stats()["allocations"] == 2


def test_double_buffer_alternates_and_waits(pool):
    with StreamSet("cpu", backend="python") as dev:
        db = pool.double_buffer(1 << 16)
        s0 = db.next()
        dev.send.enqueue_delay(0.03)
        ev0 = dev.send.record()
        db.done(ev0)  # slot 0's consumer finishes in 30 ms
        s1 = db.next()
        assert s1.id != s0.id
        again = db.next(stream=dev.compute)  # slot 0 again: the compute stream waits, not the host
        assert again.id == s0.id
        ran = []
        dev.compute.enqueue(lambda: ran.append(clock()))
        dev.compute.synchronize()
        assert ran[0] >= ev0.time
        dev.send.enqueue_delay(0.02)
        ev1 = dev.send.record()
        db.done(ev1)
        db.next()  # slot 1: no event given, at once
        db.next()  # slot 0 again, without a stream: the host waits for ev1
        assert ev1.query()
        for _ in range(20):
            db.next()
        db.close()
        assert pool.stats()["allocations"] == 2
        assert pool.stats()["in_use"] == 0


def test_stage_out_copies_bytes(pool):
    x = torch.randn(3, 5)
    buf = pool.stage_out(x)
    assert torch.equal(buf.view(x.dtype, x.shape), x)
    buf.release()
    with StreamSet("cpu", backend="python") as dev:
        dev.send.enqueue_delay(0.01)
        buf = pool.stage_out(x * 2, stream=dev.send)
        dev.send.synchronize()
        assert torch.equal(buf.view(x.dtype, x.shape), x * 2)


def test_trim(pool):
    a = pool.acquire(10)
    b = pool.acquire(10)
    a.release()
    assert pool.trim() == 4096
    assert pool.stats()["bytes_reserved"] == 4096
    b.release()
    assert pool.trim() == 4096
    assert pool.stats()["bytes_reserved"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_cpu_only_torch_says_not_pinned(pool):
    assert pool.pinned is False
    assert "not page-locked" in pool.backing
    assert not pool.acquire(10).tensor.is_pinned()
    with pytest.raises(RuntimeError, match="page-locked"):
        PinnedPool(page_locked=True)


@pytest.mark.skipif(not _ext.HAVE_EXT, reason="pipert._C not built")
def test_ext_trim_keeps_blocks_that_tensors_still_view():
    pool = PinnedPool(backend="ext")
    buf = pool.acquire(100)
    view = buf.tensor
    view.fill_(3)
    buf.release()
    assert pool.trim() == 0  # `view` still points at the block: not freed
    assert int(view.sum()) == 300
    del view, buf
    assert pool.trim() == 4096
