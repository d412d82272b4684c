"""CPU stream scheduler: both backends (pipert._C and pure Python) give the same semantics."""
import os
import subprocess
import sys
import threading

import pytest
import torch

from pipert import _ext
from pipert.device.streams import StreamSet, clock, default_backend


@pytest.fixture
def dev(backend):
    with StreamSet("cpu", backend=backend) as d:
        yield d


def test_fifo_order(dev):
    seen = []
    for i in range(200):
        dev.compute.enqueue(lambda i=i: seen.append(i))
    dev.compute.synchronize()
    assert seen == list(range(200))
    assert dev.compute.query()


def test_enqueue_never_blocks_host(dev):
    gate = threading.Event()
    dev.send.enqueue(lambda: gate.wait(30))  # the stream is busy until the host opens the gate
    dev.send.enqueue_delay(0.01)
    ev = dev.send.record()
    pending = (not ev.query(), not dev.send.query(), ev.time is None, ev.ideal_time is None)
    gate.set()
    ev.synchronize()
    assert all(pending), pending
    assert ev.query() and ev.time >= ev.ideal_time


def test_wait_blocks_only_the_waiting_stream(dev):
    state = {"a": 0}
    seen = []
    dev.compute.enqueue_delay(0.02)
    dev.compute.enqueue(lambda: state.update(a=1))
    ev = dev.compute.record()
    dev.recv.enqueue(lambda: seen.append(("recv-before-wait", state["a"])))
    dev.send.wait(ev)
    dev.send.enqueue(lambda: seen.append(("send-after-wait", state["a"])))
    dev.synchronize()
    assert ("send-after-wait", 1) in seen
    assert ("recv-before-wait", 0) in seen  # recv did not wait


def test_wait_uses_record_current_at_call(dev):
    dev.synchronize()
    ev = dev.compute.record()
    dev.compute.synchronize()
    dev.send.wait(ev)                 # captures the completed record
    gate = threading.Event()
    dev.compute.enqueue(lambda: gate.wait(30))
    dev.compute.record(ev)            # re-record: pending until the gate opens
    ran = []
    dev.send.enqueue(lambda: ran.append(ev.query()))
    dev.send.synchronize()            # the send stream did not wait for the new record
    gate.set()
    ev.synchronize()
    assert ran == [False]


def test_never_recorded_event_is_complete(dev):
    ev = dev.event()
    assert ev.query() and ev.time is None
    ev.synchronize()
    dev.compute.wait(ev)  # no-op
    dev.compute.synchronize()


def test_errors_are_sticky_and_propagate(dev):
    ran = []
    dev.compute.enqueue(lambda: 1 / 0)
    dev.compute.enqueue(lambda: ran.append("compute"))  # skipped
    ev = dev.compute.record()
    dev.send.wait(ev)
    dev.send.enqueue(lambda: ran.append("send"))  # skipped: send inherits the error
    dev.recv.enqueue(lambda: ran.append("recv"))  # independent stream: runs
    with pytest.raises(RuntimeError, match=r"^stream 'cpu/compute': ZeroDivisionError: division by zero$"):
        ev.synchronize()
    with pytest.raises(RuntimeError, match=r"^stream 'cpu/send': stream 'cpu/compute': ZeroDivisionError"):
        dev.send.synchronize()
    dev.recv.synchronize()
    assert ran == ["recv"]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        dev.synchronize()


# Timed items count on each stream's ideal clock (csrc/core/stream.h): an item starts, ideally,
# at max(previous item's ideal end, its enqueue time). These tests check that arithmetic, which
# holds exactly however busy the machine is; how late real wake-ups come after the ideal time
# is measured by benchmarks/bench_delay.py.

@pytest.mark.parametrize("dt", [1e-3, 10e-3])
def test_delay_counts_from_enqueue_on_an_idle_stream(dev, dt):
    t = clock()
    dev.send.enqueue_delay(dt)
    t1 = clock()
    e1 = dev.send.record()
    e1.synchronize()
    assert t + dt <= e1.ideal_time <= t1 + dt
    assert e1.ideal_time <= e1.time


def test_delay_until_absolute_deadline(dev):
    deadline = clock() + 0.01
    dev.recv.enqueue_delay(0.002)
    first = dev.recv.record()
    dev.recv.enqueue_delay_until(deadline)  # waits for the later of the two
    ev = dev.recv.record()
    ev.synchronize()
    assert ev.ideal_time == pytest.approx(max(deadline, first.ideal_time), abs=1e-9)
    assert deadline <= ev.time
    dev.recv.enqueue_delay_until(clock() - 1.0)  # a past deadline adds nothing
    done = dev.recv.record()
    done.synchronize()
    assert done.ideal_time - ev.ideal_time < 1.0


def test_spin_occupies_the_stream(dev):
    t = clock()
    dev.compute.enqueue_spin(0.005)
    t1 = clock()
    e1 = dev.compute.record()
    e1.synchronize()
    assert t + 0.005 <= e1.ideal_time <= t1 + 0.005
    assert t + 0.005 <= e1.time


def test_back_to_back_delays_do_not_accumulate_overhead(dev):
    # 200 delays of 50 us behind a 5 ms one end, ideally, 15 ms after the first was enqueued
    # (or after the last, if enqueueing took longer): no hand-off overhead adds up.
    t = clock()
    dev.send.enqueue_delay(0.005)
    t0 = clock()
    for _ in range(200):
        dev.send.enqueue_delay(50e-6)
    t1 = clock()
    e1 = dev.send.record()
    e1.synchronize()
    assert t + 0.015 - 1e-9 <= e1.ideal_time <= max(t1, t0 + 0.005) + 0.010 + 1e-9
    assert e1.ideal_time <= e1.time


def test_copy_runs_in_stream_order(dev):
    src = torch.arange(1000, dtype=torch.float32)
    dst = torch.zeros(1000)
    gate = threading.Event()
    dev.send.enqueue(lambda: gate.wait(30))
    dev.send.enqueue_copy(dst, src)
    early = bool(dst.sum() != 0)  # not copied yet: the stream waits at the gate
    gate.set()
    dev.send.synchronize()
    assert torch.equal(dst, src)
    assert not early


def test_streams_run_concurrently(dev):
    # Each stream waits until all three are inside their item at once: only concurrent
    # streams get there (a serial runner would break the barrier by timeout).
    barrier = threading.Barrier(3, timeout=30)
    for s in dev.streams:
        s.enqueue(barrier.wait)
    dev.synchronize()
    assert not barrier.broken


def test_stream_set_layout_and_event_pool(dev):
    assert [s.name for s in dev.streams] == ["cpu/compute", "cpu/send", "cpu/recv"]
    assert dev.compute.priority == 0 and dev.send.priority < 0 and dev.recv.priority < 0
    e1 = dev.event()
    dev.compute.record(e1)
    e1.synchronize()
    dev.release(e1)
    e2 = dev.event()
    assert e2 is e1
    assert e2.time is None  # a reused event starts as never recorded


def test_issue_batch_matches_single_calls(dev):
    log = []
    ev = dev.event()
    src, dst = torch.ones(4), torch.zeros(4)
    dev.issue([("run", dev.compute, lambda: log.append("c1")),
               ("delay", dev.compute, 0.01),
               ("run", dev.compute, lambda: log.append("c2")),
               ("record", dev.compute, ev),
               ("wait", dev.send, ev),
               ("copy", dev.send, dst, src),
               ("run", dev.send, lambda: log.append(("s", float(dst.sum())))),
               ("spin", dev.recv, 0.001),
               ("delay_until", dev.recv, clock() + 0.005)])
    dev.synchronize()
    assert log == ["c1", "c2", ("s", 4.0)]
    with pytest.raises(ValueError):
        dev.issue([("jump", dev.compute)])


def test_callables_run_off_the_host_thread(dev):
    where = []
    dev.compute.enqueue(lambda: where.append(threading.get_ident()))
    dev.compute.synchronize()
    assert where[0] != threading.get_ident()


def test_closed_stream_rejects_work(dev):
    dev.close()
    with pytest.raises(RuntimeError, match="closed"):
        dev.compute.enqueue(lambda: None)
    dev.close()  # idempotent


def test_backend_choice():
    assert default_backend("cpu") == ("ext" if _ext.HAVE_EXT else "python")
    with pytest.raises(ValueError):
        StreamSet("cpu", backend="cuda")
    with pytest.raises(ValueError):
        StreamSet("cpu", backend="fortran")


@pytest.mark.skipif(not _ext.HAVE_EXT, reason="pipert._C not built")
def test_ext_clock_is_perf_counter():
    a = clock()
    b = _ext.C.now()
    c = clock()
    assert a - 1e-3 <= b <= c + 1e-3


def test_fallback_warns_once_and_works():
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import pipert._ext\n"
        "    import pipert.device.streams as s, pipert.comm.links, pipert.device.pinned\n"
        "    import importlib; importlib.import_module('pipert._ext')\n"
        "msgs = [str(x.message) for x in w if 'pipert._C' in str(x.message)]\n"
        "assert len(msgs) == 1, msgs\n"
        "assert not pipert._ext.HAVE_EXT\n"
        "from pipert.comm.links import LinkEmulator, LinkSpec\n"
        "from pipert.device.pinned import PinnedPool\n"
        "d, e = s.StreamSet('cpu', 'r0'), s.StreamSet('cpu', 'r1')\n"
        "assert d.backend == 'python', d.backend\n"
        "em = LinkEmulator(2, LinkSpec(1e-3, 1e9))\n"
        "pool = PinnedPool()\n"
        "assert em.backend == 'python' and pool.backend == 'python'\n"
        "out = []\n"
        "d.compute.enqueue(lambda: out.append(1))\n"
        "t0 = s.clock()\n"
        "tr = em.enqueue_transfer(0, 1, 1e6, d.send, e.recv, copy=lambda: out.append(2))\n"
        "tr.arrived.synchronize(); d.synchronize()\n"
        "assert tr.arrived.time >= t0 + 2e-3 and sorted(out) == [1, 2], out\n"
        "b = pool.acquire(10); b.release(); assert pool.acquire(10).id == b.id\n"
        "d.close(); e.close()\n"
        "print('fallback-ok')\n")
    env = dict(os.environ, PIPERT_NO_EXT="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "fallback-ok" in r.stdout


_SELF_DROP = """
import threading, time
import torch  # loads the libraries pipert._C links against
from pipert import _C
done = threading.Event()
box = [_C.Stream("self-drop")]
def last_item():
    box.clear()          # the stream's last reference drops on its own worker thread
    done.set()
stream = box[0]
stream.enqueue(lambda: time.sleep(0.05))
stream.enqueue(last_item)
del stream
assert done.wait(10)
time.sleep(0.3)          # the stream is deleted off its worker, after that item
print("alive")
"""


@pytest.mark.skipif(not _ext.HAVE_EXT, reason="pipert._C not built")
def test_stream_dropped_inside_its_own_item_ends_cleanly():
    """A _C stream whose last reference drops inside one of its items (the garbage collector runs
    on whichever thread allocates) is deleted without joining its worker from the worker itself,
    which would end the process ("terminate called without an active exception")."""
    proc = subprocess.run([sys.executable, "-c", _SELF_DROP], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", (proc.returncode, proc.stderr[-2000:])


_EXIT_WHILE_RUNNING = """
import time
import torch
from pipert import _ext
streams = [_ext.C.Stream(f"exit{i}") for i in range(4)]
for s in streams:
    s.enqueue(lambda: time.sleep(0.3))  # Python still running on the workers when the main thread ends
    s.enqueue(lambda: sum(range(1000)))
print("main done")
"""


@pytest.mark.skipif(not _ext.HAVE_EXT, reason="pipert._C not built")
def test_process_exits_cleanly_while_streams_still_run_python():
    """Streams left open at exit are closed (their workers joined) before the interpreter
    finalizes: a worker taking the GIL after that is ended by pthread_exit, which aborted the
    process ("FATAL: exception not rethrown", exit 134)."""
    proc = subprocess.run([sys.executable, "-c", _EXIT_WHILE_RUNNING], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "main done", (proc.returncode, proc.stderr[-2000:])
