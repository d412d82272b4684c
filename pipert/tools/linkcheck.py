"""How exactly the stream path of DelayedTransport injects a link latency between two ranks.

Rank 0 stamps its clock on its send queue just before each message, rank 1 stamps its own
after it may read it; ``measured = read stamp - send stamp`` (moved into one clock by the
offset of the stream path), ``error = measured - latency``. Messages are one at a time, so the
link's FIFO adds nothing. Where it runs (:func:`measure_link_delays`):

- two GPUs: two processes over NCCL (``cuda:0 -> cuda:1``; the stamps are ``%globaltimer`` of
  two GPUs of one host, one clock);
- one GPU: NCCL refuses two ranks on one device, so both ranks run in one process, rank 0 on a
  send stream and rank 1 on a receive stream, the inner transport a stream-ordered device copy
  (:class:`DeviceCopyTransport`): the same frames and kernels without the NCCL hop; the send
  stream is held for ``GATE_NS`` before each stamp, so the host has issued the send by then;
- no GPU: two processes over gloo, the host mirror of the same steps.
"""
from __future__ import annotations

import json
import statistics
from collections import deque
from pathlib import Path
from typing import Any, Sequence

import torch

from .. import _ext

__all__ = ["DeviceCopyTransport", "measure_link_delays", "summarise"]

PAYLOAD = 1024  # float32 elements per message (4 KiB)
GATE_NS = 5_000_000  # one GPU: the send stream's hold before each message


def summarise(delay: float, errors: Sequence[float], where: str) -> dict:
    """One row: the latency asked for and the errors of its messages (seconds)."""
    absolute = sorted(abs(e) for e in errors)
    return {"delay_s": delay, "n": len(errors), "median_err_s": statistics.median(errors),
            "p95_abs_err_s": absolute[min(len(absolute) - 1, round(0.95 * (len(absolute) - 1)))],
            "max_abs_err_s": absolute[-1], "where": where}


class _Work:
    def __init__(self, fn: Any = None) -> None:
        self.fn = fn

    def wait(self, timeout: Any = None) -> bool:
        if self.fn is not None:
            self.fn()
            self.fn = None
        return True


class _Handle:
    stream_waits = True  # wait_stream() orders the current stream, as NCCL's Work.wait() does

    def __init__(self, work: _Work) -> None:
        self.work = work

    def wait(self, timeout: float) -> None:
        self.work.wait()

    def wait_stream(self) -> None:
        self.work.wait()

    def done(self) -> bool:
        return self.work.fn is None


class DeviceCopyTransport:
    """Two ranks of one process on one device: a message is the sender's tensor and an event on
    its current stream; ``work.wait()`` of the receive makes the receiver's current stream wait
    for that event and copies (the stream-ordered contract of NCCL's ``Work.wait()``). A receive
    must be posted after its send."""

    def __init__(self, rank: int, boxes: dict) -> None:
        self.rank, self.world_size, self.boxes = rank, 2, boxes

    @staticmethod
    def pair() -> tuple["DeviceCopyTransport", "DeviceCopyTransport"]:
        boxes = {(0, 1): deque(), (1, 0): deque()}
        return DeviceCopyTransport(0, boxes), DeviceCopyTransport(1, boxes)

    def isend(self, tensor: torch.Tensor, peer: int) -> _Handle:
        ev = torch.cuda.Event()
        ev.record()
        self.boxes[(self.rank, peer)].append((tensor, ev))
        return _Handle(_Work())

    def irecv(self, tensor: torch.Tensor, peer: int) -> _Handle:
        def land() -> None:
            src, ev = self.boxes[(peer, self.rank)].popleft()
            stream = torch.cuda.current_stream(tensor.device)
            stream.wait_event(ev)
            tensor.copy_(src)
            src.record_stream(stream)  # the sender's frame outlives its handle until this copy ran
        return _Handle(_Work(land))


def _delayed(inner: Any, latency: float) -> Any:
    from ..comm.links import LinkEmulator, LinkSpec
    from ..comm.delayed import DelayedTransport
    return DelayedTransport(inner, LinkEmulator(2, LinkSpec(latency)), path="stream")


def _one_device(device: torch.device, delays: Sequence[float], repeats: int) -> list[dict]:
    a, b = DeviceCopyTransport.pair()
    send, recv = torch.cuda.Stream(device, priority=-1), torch.cuda.Stream(device, priority=-1)
    x = torch.ones(PAYLOAD, device=device)
    rows = []
    for d in delays:
        ta, tb = _delayed(a, d), _delayed(b, d)
        ops = ta.ops(device)
        stamps = torch.zeros(repeats, 2, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)  # the side streams read what the default stream wrote
        for k in range(repeats):
            out = torch.empty_like(x)
            with torch.cuda.stream(send):
                # held first, so the stamp and the link kernels run back to back on the device: the
                # error is the injected delay's, not the host's time to issue the send
                _ext.C.cuda_sleep_for(send.cuda_stream, GATE_NS)
                ops.stamp(stamps[k, 0:1])
                ta.isend(x, 1)
            with torch.cuda.stream(recv):
                tb.irecv(out, 0).wait(60.0)
                ops.stamp(stamps[k, 1:2])
            recv.synchronize()  # one message at a time
        rows.append(summarise(d, [(t1 - t0) * 1e-9 - d for t0, t1 in stamps.tolist()],
                              f"one process on {device}: send stream -> recv stream (device copy)"))
    return rows


def _two_processes(rank: int, world: int, delays: Sequence[float], repeats: int, out: str) -> None:
    import torch.distributed as dist

    from ..comm.linkframes import dist_clock_offsets
    from ..comm.dist import DistTransport
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", rank) if nccl else torch.device("cpu")
    inner = DistTransport()
    offsets = dist_clock_offsets(inner, _delayed(inner, 0.0).ops(device), device)
    x = torch.ones(PAYLOAD, device=device)
    rows = []
    for d in delays:
        t = _delayed(inner, d)
        t.clock_offsets.update(offsets)
        ops = t.ops(device)
        stamps = torch.zeros(repeats, dtype=torch.int64, device=device)
        for k in range(repeats):
            dist.barrier()  # one message at a time
            if rank == 0:
                ops.stamp(stamps[k:k + 1])
                t.isend(x, 1).wait(60.0)
            else:
                buf = torch.empty_like(x)
                t.irecv(buf, 0).wait(60.0)
                ops.stamp(stamps[k:k + 1])
            if nccl:
                torch.cuda.synchronize(device)
        if rank == 0:
            dist.send(stamps, 1)
        else:
            sent = torch.empty_like(stamps)
            dist.recv(sent, 0)
            shift = offsets.get(0, 0)  # rank 1's clock minus rank 0's
            rows.append(summarise(d, [(t1 - t0 - shift) * 1e-9 - d for t0, t1 in zip(sent.tolist(), stamps.tolist())],
                                  "2 processes, nccl cuda:0 -> cuda:1" if nccl else "2 processes, gloo (host mirror)"))
    if rank == 1:
        Path(out).write_text(json.dumps(rows))


def measure_link_delays(delays: Sequence[float], repeats: int, out: str | Path) -> list[dict]:
    """Rows of :func:`summarise` per latency (module doc picks where); ``out`` a scratch JSON path."""
    from ..launch import launch
    if torch.cuda.is_available() and torch.cuda.device_count() == 1:
        return _one_device(torch.device("cuda", 0), delays, repeats)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    launch(_two_processes, 2, args=(list(delays), repeats, str(out)), backend=backend)
    return json.loads(Path(out).read_text())
