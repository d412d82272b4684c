"""The local transport's stream order shown on a GPU: a slow producer, with and without the events
of ``pipert.comm.streamorder`` (run by benchmarks/gpu_checks.py)."""
from __future__ import annotations

import torch

from ..comm.local import LocalHub
from ..comm.streamorder import Order
from ..device.streams import _sleep_cycles

__all__ = ["slow_producer_check"]


def slow_producer_check(device: torch.device, order: Order | None = None, seconds: float = 0.05,
                        numel: int = 1 << 20) -> tuple[float, float]:
    """Two ranks of one process on two streams of a GPU over a LocalHub with ``order``: the
    sender's stream runs a long kernel (``seconds``) before it writes the tensor it sends; the
    receiver sums what it received on its own stream as soon as its receive completed on the
    host. Returns (the sum sent, the sum received); they differ when the receiver's stream did
    not wait for the sender's."""
    hub = LocalHub(2, order=order)
    sender, receiver = hub.transport(0), hub.transport(1)
    s0, s1 = torch.cuda.Stream(device), torch.cuda.Stream(device)
    x = torch.zeros(numel, device=device)
    out = torch.zeros(numel, device=device)
    cycles = _sleep_cycles(device, seconds)
    torch.cuda.synchronize(device)
    with torch.cuda.stream(s0):
        torch.cuda._sleep(cycles)  # the producer's long kernel
        x.fill_(3.0)
        sender.isend(x, 1)
    with torch.cuda.stream(s1):
        receiver.irecv(out, 0).wait(10.0)
        got = out.sum()
    torch.cuda.synchronize(device)
    return 3.0 * numel, float(got)
