"""No host stalls where a transport completes on the stream (NCCL on a GPU), checked on the CPU:
the executor completes handles that report stream semantics with ``wait_stream()`` and never
with a host ``wait``; losses stay on their device and a step reads them once."""
import datetime
import itertools

import pytest
import torch

from pipert.comm import dist as tr
from pipert.comm import local
from pipert.comm.base import stream_waits
from pipert.errors import PeerFailure
from pipert.pipeline import Pipeline
from pipert.testing import Case, make_batch, run_case, sgd, tiny_units


_ids = itertools.count()


class _Recorded:
    """A handle of the wrapped transport: logs how the executor completes it. Its stream wait
    completes the inner operation on the calling thread (the worker that plays the stream)."""

    def __init__(self, inner, kind: str, log: list, stream: bool) -> None:
        self.inner, self.kind, self.log, self.stream_waits = inner, kind, log, stream
        self.id = next(_ids)

    def wait(self, timeout: float) -> None:
        self.log.append((self.kind, "host", self.id))
        self.inner.wait(timeout)

    def wait_stream(self) -> None:
        self.log.append((self.kind, "stream", self.id))
        self.inner.wait(60.0)

    def done(self) -> bool:
        return self.inner.done()


class _Recording:
    def __init__(self, inner, log: list, stream: bool) -> None:
        self.inner, self.log, self.stream = inner, log, stream
        self.rank, self.world_size = inner.rank, inner.world_size

    def isend(self, t, peer):
        return _Recorded(self.inner.isend(t, peer), "send", self.log, self.stream)

    def irecv(self, t, peer):
        h = _Recorded(self.inner.irecv(t, peer), "recv", self.log, self.stream)
        self.log.append(("recv", "posted", h.id))
        return h

    def collective(self, op, t, group, root, out=None):
        return _Recorded(self.inner.collective(op, t, group, root, out), "collective", self.log, self.stream)


def _run(monkeypatch, case: Case, stream: bool) -> tuple[list, object]:
    log: list = []
    monkeypatch.setattr(local.LocalHub, "transport", lambda hub, rank: _Recording(local.LocalTransport(hub, rank), log,
                                                                                stream))
    return log, run_case(case)


@pytest.mark.parametrize("case", [Case("1f1b", 2, 4, steps=2), Case("1f1b", 2, 8, dp=2, zero=1, steps=2)], ids=str)
@pytest.mark.parametrize("stream", [True, False], ids=["stream-semantics", "host-waits"])
def test_executor_waits_on_the_stream_when_the_transport_reports_it(monkeypatch, case, stream):
    log, r = _run(monkeypatch, case, stream)
    assert r.loss_err <= 1e-12 and r.grad_err <= 1e-10 and r.param_err <= 1e-10, r
    posted = {h for kind, how, h in log if how == "posted"}
    completed = [(kind, how, h) for kind, how, h in log if how != "posted"]
    assert posted and {h for kind, _, h in completed if kind == "recv"} == posted  # every receive completed
    recv_ways = [how for kind, how, _ in completed if kind == "recv"]
    assert len(recv_ways) == len(posted)  # once each
    if stream:
        assert {how for _, how, _ in completed} == {"stream"}  # no host wait at all
    else:
        assert set(recv_ways) == {"host"}  # the same counter sees host waits where they happen
    if case.dp > 1:
        assert any(kind == "collective" for kind, _, _ in completed)


def test_dist_handles_wait_on_the_stream_without_a_timeout():
    seen = []

    class Work:
        def wait(self, *args):
            seen.append(args)
            return True

        def is_completed(self):
            return True

    h = tr._posted(lambda: Work(), stream=True)
    assert stream_waits(h)
    h.wait_stream()
    h.wait(5.0)
    assert seen == [(), (datetime.timedelta(seconds=5.0),)]  # a timeout would make torch poll on the host
    assert not stream_waits(tr._posted(lambda: Work()))
    assert not stream_waits(object())  # handles without the attribute wait on the host


def test_dist_stream_wait_failure_names_the_peer_failure():
    class Broken:
        def wait(self, *args):
            raise RuntimeError("NCCL communicator was aborted")

    with pytest.raises(PeerFailure, match="aborted"):
        tr._posted(lambda: Broken(), stream=True).wait_stream()


def test_nccl_groups_are_made_with_high_priority_streams(monkeypatch):
    made = []

    class Options:
        is_high_priority_stream = False

    monkeypatch.setattr(tr.dist, "ProcessGroupNCCL", type("FakeNCCL", (), {"Options": Options}), raising=False)
    monkeypatch.setattr(tr.dist, "new_group", lambda ranks, **kw: made.append((ranks, kw)) or len(made))
    monkeypatch.setattr(tr.dist, "get_backend", lambda *a: "nccl")
    tr.comm_group((0, 1))
    (ranks, kw), = made
    assert ranks == [0, 1] and kw["pg_options"].is_high_priority_stream is True
    monkeypatch.setattr(tr.dist, "get_backend", lambda *a: "gloo")
    tr.comm_group((0, 1))
    assert made[1] == ([0, 1], {})


def _host_reads(monkeypatch, microbatches: int) -> int:
    """Reads of tensor values by the host during one step (item, tolist, float, int, bool)."""
    torch.manual_seed(0)
    units = tiny_units(2, "float64")
    pipe = Pipeline(units, "gpipe", microbatches=microbatches, optimizer=sgd)  # AdamW reads its CPU step counts
    x, y = make_batch(microbatches, seed=0)
    pipe.step(x, y)  # warm-up: boundaries, buffers
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            reads.append(_name)
            return _real(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, counted)
    loss = pipe.step(x, y)
    monkeypatch.undo()
    assert len(pipe.last_results[1].losses) == microbatches
    assert loss == pytest.approx(sum(pipe.last_results[1].losses.values()) / microbatches, rel=1e-15)
    return len(reads)


def test_a_step_reads_its_losses_once_whatever_the_micro_batch_count(monkeypatch):
    assert _host_reads(monkeypatch, 2) == _host_reads(monkeypatch, 8) == 1


class _Stuck:
    """A stream-semantics handle whose operation never completes on the device."""

    stream_waits = True

    def __init__(self, inner) -> None:
        self.inner = inner

    def wait(self, timeout: float) -> None:
        raise AssertionError("a stream-semantics handle is never waited on the host")

    def wait_stream(self) -> None:
        return None

    def done(self) -> bool:
        return False


class _Unfinished:
    """Host queues whose device work never finishes (what a GPU stuck in a receive looks like)."""

    def compute(self, fn, waits=()):
        fn()

    send = recv = compute

    def finish(self, timeout=None):
        return timeout is None

    def after(self, fn):
        fn()

    def close(self):
        return None


def test_a_step_whose_device_work_does_not_finish_names_its_first_communication_in_flight(monkeypatch):
    """With stream semantics the host never waits per message; when the step's one wait times out,
    the error names the rank, the first communication the device still waits for and its peer."""
    from pipert.errors import PipelineTimeout
    from pipert.exec.executor import RankExecutor

    class StuckRecv(_Recording):
        def irecv(self, t, peer):
            return _Stuck(self.inner.irecv(t, peer)) if self.inner.rank == 1 else self.inner.irecv(t, peer)

    monkeypatch.setattr(local.LocalHub, "transport", lambda hub, rank: StuckRecv(local.LocalTransport(hub, rank), [],
                                                                               False))
    pipe = Pipeline(tiny_units(2, "float64"), "1f1b", microbatches=2, optimizer=sgd, timeout=1.0)
    pipe._executors[1].queues = _Unfinished()  # rank 1's device waits for the receive forever
    with pytest.raises(PipelineTimeout) as err:
        pipe.step(*make_batch(2))
    msg = str(err.value)
    assert msg.startswith("rank 1 stalled at action ") and "(RECV act u0 m0 <-0)" in msg, msg
    assert "did not finish in 1 s" in msg and "act from rank 0" in msg, msg
