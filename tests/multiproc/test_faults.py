"""A rank that hangs or dies mid-step makes the others fail within the timeout, naming the
stalled rank, the action and the peer."""
import re
import time

import pytest

from pipert.runtime.executor import Fault, PipelineTimeout
from pipert.runtime.launch import LaunchError, launch
from pipert.runtime.pipeline import Pipeline
from pipert.schedules import build_schedule
from pipert.testing import fault_worker, make_batch, sgd, tiny_units

TIMEOUT = 3.0


def test_local_hang_names_rank_action_and_peer():
    sched = build_schedule("1f1b", stages=4, microbatches=8)
    pipe = Pipeline(tiny_units(4, "float32"), sched, optimizer=sgd, timeout=TIMEOUT, fault=Fault(2, 3, "hang"))
    x, y = make_batch(8)
    t0 = time.monotonic()
    with pytest.raises(PipelineTimeout) as err:
        pipe.step(x, y)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert re.search(r"rank [13] stalled at action \d+ \((RECV|SEND) \w+ u\d m\d [<-]+2\)", msg), msg
    assert "from rank 2" in msg or "to rank 2" in msg, msg
    assert elapsed < 2 * TIMEOUT + 2, elapsed


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_gloo_fault_stops_the_job_within_timeout(mode):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as err:
        launch(fault_worker, 4, args=("1f1b", 8, Fault(2, 3, mode), TIMEOUT), timeout=30.0, grace=TIMEOUT + 5)
    elapsed = time.monotonic() - t0
    errors = err.value.errors
    # A neighbour of the stalled rank reports the action it waited in and names rank 2.
    named = [e for r, e in errors.items() if r != 2
             and re.search(r"rank [13] (stalled|failed) at action \d+ \([A-Z]+ \w+ u\d m\d (<-|->)2\)", e)
             and re.search(r"(from|to|peer) rank 2", e)]
    assert named, errors
    if mode == "exit":
        assert "exited with code 3" in errors[2]
    else:
        assert "stalled" in "".join(named)
    assert elapsed < 60, elapsed  # process start-up included; the waits themselves time out after 3 s
