"""Messages staged through the pinned pool: the pool grows to what is in flight, reuses its
blocks afterwards and holds none once the messages are done; training stays exact."""
import copy

import torch

from pipert.ir import Op
from pipert.device.pinned import PinnedPool
from pipert.pipeline import Pipeline, RuntimeOptions
from pipert.tools.reference import grouped_reference_step
from pipert.comm.staging import StagedTransport
from pipert.comm.local import LocalHub
from pipert.schedules import build_schedule
from pipert.testing import make_batch, sgd, tiny_units
from pipert.tools.reference import rel_err


def test_staged_messages_arrive_intact_and_the_pool_reuses_without_leaks(backend):
    pool = PinnedPool(backend=backend, page_locked=False)
    hub = LocalHub(2)
    a, b = StagedTransport(hub.transport(0), pool), StagedTransport(hub.transport(1), pool)
    sizes = [(100,), (3000,), (8, 8), (100,)]
    for rnd in range(3):
        sent = [torch.randn(s, dtype=torch.float64) for s in sizes]
        got = [torch.empty_like(t) for t in sent]
        sends = [a.isend(t, 1) for t in sent]
        recvs = [b.irecv(t, 0) for t in got]
        assert pool.stats()["in_use"] == 2 * len(sizes)  # every message in flight holds its two buffers
        for h in sends + recvs:
            h.wait(5.0)
        assert all(torch.equal(x, y) for x, y in zip(sent, got))
        st = pool.stats()
        assert st["in_use"] == 0, st
        assert st["allocations"] == 2 * len(sizes), st  # the first round's blocks, never more
        assert st["reuses"] == 2 * len(sizes) * rnd, st
    del sends, recvs, h  # the handles' views of the blocks: the ext pool keeps a block a view points at
    assert pool.trim() == st["bytes_reserved"] and pool.stats()["bytes_reserved"] == 0


def test_a_pipeline_with_staged_messages_matches_the_reference_and_keeps_its_pool_flat():
    units = tiny_units(2, "float64")
    ref_units = copy.deepcopy(units)
    ref_opt = sgd([p for u in ref_units for p in u.parameters()])
    pipe = Pipeline(units, "1f1b", microbatches=4, optimizer=sgd, runtime=RuntimeOptions(staging=True))
    assert pipe.pool is not None
    sends = sum(a.op is Op.SEND for prog in build_schedule("1f1b", stages=2, microbatches=4).actions for a in prog)
    reuses = []
    for step in range(3):
        x, y = make_batch(4, seed=step)
        pipe.step(x, y)
        ref, _ = grouped_reference_step(ref_units, x, y, 4, 4, ref_opt)
        assert rel_err(pipe.named_grads(), ref.grads) <= 1e-10
        assert rel_err(pipe.named_parameters(), ref.params_after) <= 1e-10
        st = pipe.pool.stats()
        assert st["in_use"] == 0, st
        # how many messages are in flight at once depends on the threads' timing; the pool never
        # holds more than one step's messages (two buffers each), so a leak of one step shows
        assert 0 < st["allocations"] <= 2 * sends, (st, sends)
        assert st["allocations"] + st["reuses"] == 2 * sends * (step + 1), st  # every message takes two blocks
        reuses.append(st["reuses"])
    assert reuses[0] < reuses[1] < reuses[2]  # later steps take blocks back from the pool
