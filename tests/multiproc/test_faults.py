"""A rank that hangs or dies mid-step makes the others fail within the timeout, naming the
stalled rank, the action and the peer."""
import re
import threading
import time

import pytest

from pipert.exec.instrument import Fault, Instrumentation
from pipert.errors import PipelineTimeout
from pipert.launch import LaunchError
from pipert.launch import launch
from pipert.pipeline import Pipeline
from pipert.schedules import build_schedule
from pipert.testing import fault_worker, make_batch, sgd, tiny_units

TIMEOUT = 3.0


def test_local_hang_names_rank_action_and_peer():
    sched = build_schedule("1f1b", stages=4, microbatches=8)
    pipe = Pipeline(tiny_units(4, "float32"), sched, optimizer=sgd, timeout=TIMEOUT,
                    instrument=Instrumentation(fault=Fault(2, 3, "hang")))
    x, y = make_batch(8)
    with pytest.raises(PipelineTimeout) as err:
        pipe.step(x, y)
    msg = str(err.value)
    assert re.search(r"rank [13] stalled at action \d+ \((RECV|SEND) \w+ u\d m\d [<-]+2\)", msg), msg
    assert "from rank 2" in msg or "to rank 2" in msg, msg
    # no rank thread outlives the failed step (a stuck one would block interpreter exit)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("pipert-rank")]


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_gloo_fault_stops_the_job_within_timeout(mode):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as err:
        # the survivors get 10 s after the first failure to report their peer: each is then in a
        # wait that times out within TIMEOUT (3 s), so 10 s leaves 7 s for a loaded machine; rank 2
        # (hang) is killed after it
        launch(fault_worker, 4, args=("1f1b", 8, Instrumentation(fault=Fault(2, 3, mode)), TIMEOUT), timeout=30.0,
               grace=10.0)
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
    # start-up of 4 processes on a loaded 2-core machine included; the waits time out after 3 s and
    # the launcher kills rank 2 10 s after the first failure
    assert elapsed < 90, elapsed


def test_ranks_that_build_different_programs_fail_at_start_naming_them():
    with pytest.raises(LaunchError) as err:
        launch(fault_worker, 2, args=(["1f1b", "gpipe"], 4, None, TIMEOUT), timeout=TIMEOUT)
    msg = str(err.value)
    assert "ranks disagree on the program" in msg and "ranks [0]" in msg and "ranks [1]" in msg, msg


def _build_on_rank0_only(rank: int, world: int, out: str) -> None:
    """Pipeline(schedule=name, backend="dist") where every rank but 0 cannot build schedules:
    the job still runs, because rank 0 builds the program and sends it."""
    import json

    import pipert.compiler as compiler_module
    from pipert.pipeline import Pipeline
    from pipert.testing import make_batch, sgd, tiny_units

    if rank != 0:
        def refuse(*args, **kwargs):
            raise AssertionError(f"rank {rank} built a schedule")
        compiler_module.build_schedule = refuse
    pipe = Pipeline(tiny_units(2, "float64"), "crosspipe-optimal", microbatches=3, optimizer=sgd, backend="dist",
                    timeout=TIMEOUT)
    x, y = make_batch(3)
    pipe.step(x, y)
    with open(f"{out}.{rank}", "w") as f:
        json.dump([str(a) for a in pipe.program.actions[rank]], f)


def test_a_named_schedule_is_built_once_and_shared(tmp_path):
    import json
    out = str(tmp_path / "program")
    launch(_build_on_rank0_only, 2, args=(out,), timeout=60.0)
    progs = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    assert all(progs), progs


def test_a_failing_build_is_raised_on_every_rank():
    with pytest.raises(LaunchError) as err:
        launch(_bad_build, 2, timeout=60.0, grace=30.0)  # each rank ends on its own
    errors = err.value.errors
    assert set(errors) == {0, 1} and all("zb-v needs chunks == 2" in e for e in errors.values()), errors


def _bad_build(rank: int, world: int) -> None:
    from pipert.pipeline import Pipeline
    from pipert.testing import tiny_units
    Pipeline(tiny_units(6, "float64"), "zb-v", microbatches=2, chunks=3, backend="dist", timeout=TIMEOUT)
