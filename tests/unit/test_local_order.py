"""The local transport orders the ranks' streams (pipert.comm.streamorder): where it records
events, which stream waits for which, and when, checked on the CPU with a recording stand-in
for CUDA events; on a GPU, a slow producer's message arrives with its final values."""
import itertools
import threading

import pytest
import torch

from pipert.comm.local import LocalHub


class Recorder:
    """An Order that logs every call with the calling thread and the values of the watched
    tensors at that moment (what a stream would read if it ran the next step right then)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.watched: dict[str, torch.Tensor] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _snap(self) -> dict[str, list]:
        return {k: t.tolist() for k, t in self.watched.items()}

    def ready(self, t):
        with self._lock:
            ev = ("event", next(self._ids))
            self.log.append(("ready", threading.current_thread().name, ev, t, self._snap()))
            return ev

    def after(self, ev, t):
        with self._lock:
            self.log.append(("after", threading.current_thread().name, ev, t, self._snap()))

    def hold(self, t):
        with self._lock:
            self.log.append(("hold", threading.current_thread().name, None, t, self._snap()))


def _threads(fns: dict[str, callable]) -> None:
    ts = [threading.Thread(target=fn, name=name) for name, fn in fns.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)


def test_a_receive_waits_for_the_event_recorded_after_the_senders_copy():
    rec = Recorder()
    hub = LocalHub(2, order=rec)
    x, out = torch.full((3,), 7.0), torch.zeros(3)
    rec.watched["out"] = out
    box = {}
    _threads({"sender": lambda: box.setdefault("send", hub.transport(0).isend(x, 1))})
    x.fill_(-1.0)  # the sender may change its tensor once isend returned: the message is a copy
    _threads({"receiver": lambda: hub.transport(1).irecv(out, 0).wait(5.0)})
    (r_op, r_who, ev, copy, _), (a_op, a_who, waited, dst, before), (h_op, h_who, _, held, after) = rec.log
    assert (r_op, r_who) == ("ready", "sender") and copy is not x and copy.tolist() == [7.0] * 3
    assert (a_op, a_who, waited, dst) == ("after", "receiver", ev, out)  # the receiver's stream waits ...
    assert before["out"] == [0.0] * 3  # ... before it copies
    assert (h_op, h_who, held) == ("hold", "receiver", copy) and after["out"] == [7.0] * 3  # copy kept to its read
    assert out.tolist() == [7.0] * 3


@pytest.mark.parametrize("op", ["ALLREDUCE", "ALLGATHER"])
def test_collective_members_wait_for_every_input_and_then_for_the_reduction(op):
    rec = Recorder()
    hub = LocalHub(3, order=rec)
    parts = {r: torch.full((2,), float(r + 1)) for r in range(3)}
    outs = {r: torch.zeros(6) if op == "ALLGATHER" else None for r in range(3)}
    rec.watched.update({f"in{r}": t for r, t in parts.items()})
    rec.watched.update({f"out{r}": t for r, t in outs.items() if t is not None})
    result = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0] if op == "ALLGATHER" else [6.0, 6.0]

    def member(r):
        return lambda: hub.transport(r).collective(op, parts[r], (0, 1, 2), None, out=outs[r]).wait(5.0)
    _threads({f"rank{r}": member(r) for r in range(3)})

    def written(snap) -> bool:
        return all(snap[f"out{r}" if op == "ALLGATHER" else f"in{r}"] == result for r in range(3))

    inputs = {e[1]: e for e in rec.log if e[0] == "ready" and any(e[3] is t for t in parts.values())
              and not written(e[4])}
    assert set(inputs) == {"rank0", "rank1", "rank2"}  # every member's input, on its own thread
    done = [e for e in rec.log if e[0] == "ready" and written(e[4])]
    assert len(done) == 1  # one event, recorded after the reduction
    reducer, done_ev = done[0][1], done[0][2]
    waits = [e for e in rec.log if e[0] == "after" and e[1] == reducer and e[2] != done_ev]
    assert {e[2] for e in waits} == {inputs[r][2] for r in inputs}  # the reducer waits for every input ...
    assert not any(written(e[4]) for e in waits)  # ... before the reduction writes anything
    for r in range(3):  # every member's stream waits for the reduction before it reads again
        assert [e[2] for e in rec.log if e[0] == "after" and e[1] == f"rank{r}" and e[2] == done_ev] == [done_ev]
    held = [e[3] for e in rec.log if e[0] == "hold"]
    assert all(any(h is t for h in held) for t in list(parts.values()) + [o for o in outs.values() if o is not None])
    assert all(t.tolist() == result for t in (outs.values() if op == "ALLGATHER" else parts.values()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the race is between two CUDA streams")
def test_cuda_slow_producer_message_arrives_with_its_final_values():
    from pipert.tools.streamcheck import slow_producer_check
    expected, got = slow_producer_check(torch.device("cuda", 0))
    assert got == expected
