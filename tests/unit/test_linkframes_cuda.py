"""The stream path of DelayedTransport on a GPU: each directed link has its own send and
receive streams, so a message held by one link's delay does not hold back another link's."""
from collections import deque

import pytest
import torch

from pipert import _ext
from pipert.tools.linkcheck import DeviceCopyTransport
from pipert.comm.links import LinkEmulator, LinkSpec
from pipert.comm.delayed import DelayedTransport
from pipert.comm.base import stream_waits

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _ext.HAVE_EXT_CUDA),
                                reason="needs a GPU and pipert._C with CUDA (the link kernels)")


def _ranks(n: int, emulator: LinkEmulator) -> list[DelayedTransport]:
    """n ranks of one process on one GPU, the inner transport a stream-ordered device copy."""
    boxes = {(s, d): deque() for s in range(n) for d in range(n) if s != d}
    inner = [DeviceCopyTransport(r, boxes) for r in range(n)]
    for t in inner:
        t.world_size = n
    return [DelayedTransport(t, emulator, path="stream") for t in inner]


def test_a_delayed_link_does_not_hold_back_another_links_receive():
    em = LinkEmulator(3)
    em.set_link(0, 1, LinkSpec(2.0))     # 2 s of latency from rank 0
    em.set_link(2, 1, LinkSpec(10e-6))   # 10 us from rank 2
    ranks = _ranks(3, em)
    dev = torch.device("cuda", 0)
    x0, x2 = torch.full((256,), 1.0, device=dev), torch.full((256,), 2.0, device=dev)
    ranks[0].isend(x0, 1)
    ranks[2].isend(x2, 1)
    a, b = torch.empty_like(x0), torch.empty_like(x2)
    slow, fast = ranks[1].irecv(a, 0), ranks[1].irecv(b, 2)  # posted in this order on one stream
    assert stream_waits(slow) and stream_waits(fast)
    fast.event.synchronize()
    assert not slow.done()  # the later receive from rank 2 completed while rank 0's is in its latency
    fast.wait_stream()
    assert b.tolist() == [2.0] * 256
    torch.cuda.synchronize(dev)
    assert a.tolist() == [1.0] * 256
