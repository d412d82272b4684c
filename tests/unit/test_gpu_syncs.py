"""On a GPU, a step waits for the device a fixed number of times, whatever its micro-batch count
(torch's sync debug mode reports every synchronising call): no per-micro-batch host sync."""
import warnings

import pytest
import torch

from pipert.pipeline import Pipeline
from pipert.testing import make_batch, sgd, tiny_units

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _syncs_per_step(microbatches: int) -> int:
    dev = torch.device("cuda", 0)
    units = [u.to(dev) for u in tiny_units(2, "float32")]
    pipe = Pipeline(units, "1f1b", microbatches=microbatches, optimizer=sgd)
    x, y = (t.to(dev) for t in make_batch(microbatches))
    pipe.step(x, y)  # warm-up: boundaries, buffers, streams
    torch.cuda.synchronize(dev)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pipe.step(x, y)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def test_device_syncs_per_step_do_not_grow_with_micro_batches():
    few, many = _syncs_per_step(4), _syncs_per_step(16)
    assert few == many, (few, many)
    assert 1 <= many < 16  # the step's own waits (one per rank's queues and the loss read), not one per micro-batch
