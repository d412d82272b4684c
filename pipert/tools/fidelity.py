"""Predicted beside measured: the simulator fed with what a running job measured.

A traced step (``Instrumentation(trace=True)``, ``pipert.exec.instrument``) records the time of every compute of every rank on its
own (``StepResult.op_times``: the unit's work, waits for received values excluded). The mean
per (op, unit) over the step's micro-batches (a path through the step is a sum of computes, and
the mean of a sum is the sum of the means; on a shared machine the times are right-skewed, so a
median would understate it); each piece of a split compute has its own mean (the pieces of a W
are uneven and each pays a compute's fixed costs, so 1/N of the whole misprices them; an op
that ran only in pieces takes the sum of their means as its whole), the message sizes of the units' boundaries and
weights, and the same link model the run emulates (``pipert.cost.Links``) make a
:class:`pipert.cost.profiled.ProfiledCost`; the engine's makespan of the program the ranks
ran, its DAG as the emulated links run it (``pipert.sim.eager``: a RECV posted late does not hold
its message), is the predicted step time. Only times are measured here: memory sizes are left 0 (the
makespan does not depend on them).

Which prediction to read: :func:`predict_step`, with any number of ranks per core: its compute
times and queue overhead are measured with the ranks as they share the cores (at P = 4 on 2 cores
within 10 % for `train --profile` and `emulate --real`); :func:`predict_step_shared` is a
cross-check from CPU seconds, blind to waits that take no CPU (the interpreter lock that the
threads of `emulate --real` share).

Ranks that share a CPU host with fewer cores than ranks (several gloo processes on one machine)
wait for a core, inside their computes and between them, which a simulator that gives every
rank a device of its own cannot see. The shared prediction (:func:`predict_step_shared`) feeds
the simulator's DAG with each compute's CPU seconds (the work, without the waits for a core)
and times it with the host's cores shared among the computes that run at once
(:func:`pipert.sim.shared.shared_makespan`). The CPU a process spends on anything else in the
step (issuing actions, queue hand-offs, gloo calls, link timers: its CPU time minus its
computes') takes the same cores: it is spread evenly over the process's computes
(``action_overhead`` CPU seconds each).

Messages also cost more than the link model: the hand-off to the send thread, the transport's
own transit and the wake-ups of the threads that post, carry and read them. The step measures it
(``StepResult.messages``): for each message whose reader was already waiting when the link model
says it arrived (``arrive`` replays the link's FIFO from the ends of the computes that made the
messages, where the simulator starts them), the reader's wait ended
``completed - arrive`` later; the median of those (:func:`message_overhead`) is added to the
latency of every link in both predictions (the simulator's own latency term). It needs the
ranks' clocks to be one (processes of one host: ``time.perf_counter``); ranks on several hosts
get none.

The step also spends time the program's computes and messages do not show, and the step
measures it (``pipert.exec.executor.StepResult``, ``Pipeline.last_edges``):

- each rank's compute queue, beyond its computes' own work and its waits for communication, spends
  time between and around them: issuing, the hand-offs between its queue threads, Python, the
  interpreter lock its send and receive threads also take, waits for a core. That time
  (``queue_overhead``) over the rank's computes is added to each of its computes in the
  prediction with a core per rank (``StepProfile.queue_overhead``);
- each OPT is its unit's own mean (the ranks' optimizer steps differ with their units' sizes);
- the host's work before the program's first action (splitting the batch, clearing gradients,
  issuing) and after its last (the loss's reduction) is added to both predictions: the mean over
  the processes of the first (``StepProfile.head``), and the least over the processes of the
  second (``StepProfile.tail``: the process that ends last waits least for the others).

Under tensor parallelism T processes run each rank's computes together (their collectives keep
them in step): each process measures the rank's computes, the means take every process's, the
messages are those of tp coordinate 0 (every coordinate carries the same ones), and a host's
capacity in the shared prediction is its cores / T (a rank's compute keeps T processes busy).
"""
from __future__ import annotations

import math
import os
import socket
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..cost.profiled import piece_key
from ..cost.topology import LinkSpec
from .profile import UnitProfile

__all__ = ["StepProfile", "local_measurements", "profile_from_measurements", "message_overhead", "predict_step",
           "predict_step_shared"]

_MEMORY_KINDS = ("stash", "stash_w", "kept")


@dataclass
class StepProfile:
    """What one step measured, ready for the simulator."""

    profiles: list[UnitProfile]
    """Per unit: mean seconds of each op that ran, message sizes of its boundary and weights."""
    t_opt: float
    """Mean seconds of one rank's optimizer step."""
    busy: float = 0.0
    """Seconds of every compute of every rank in the step, added up."""
    cpu_profiles: list[UnitProfile] = field(default_factory=list)
    """As ``profiles``, with each compute's CPU seconds (its work without waits for a core)."""
    cpu_opt: float = 0.0
    """Mean CPU seconds of one rank's optimizer step."""
    host_of_rank: list[int] = field(default_factory=list)
    """Per rank, the index of the CPU host it computes on (empty: a rank computes on a GPU)."""
    cores: list[float] = field(default_factory=list)
    """Per host, the cores its processes may run on, in ranks' terms: divided by T under tensor
    parallelism."""
    action_overhead: float = 0.0
    """CPU seconds per compute that the processes of a CPU host spent beyond their computes."""
    messages: list = field(default_factory=list)
    """Every rank's ``StepResult.messages`` with the rank in front (rank, kind, peer, k, ...);
    empty unless every rank ran on one host."""
    queue_overhead: list[float] = field(default_factory=list)
    """Per rank, seconds its compute queue spent per compute beyond computing and waiting (module
    doc); empty: none measured."""
    head: float = 0.0
    """Seconds of host work before the program's first action (module doc)."""
    tail: float = 0.0
    """Seconds of host work after the program's last action (module doc)."""

    @property
    def max_forward(self) -> float:
        """The longest unit forward (mean seconds): CrossPipe's T_F, the yardstick of link delays."""
        return max((p.times.get("F", 0.0) for p in self.profiles), default=0.0)


def local_measurements(pipe: Any) -> dict:
    """This process's share of the last step of a traced ``Pipeline``: compute times of its ranks,
    boundary bytes of every unit and weight bytes of the units it holds (plain data, to gather)."""
    times = [t for r in pipe.last_results.values() for t in r.op_times]
    on_cpu = all(p.device.type == "cpu" for mods in pipe.modules.values() for m in mods.values()
                 for p in m.parameters())
    U = pipe.program.num_units
    act = {u: b.numel() * b.dtype.itemsize for u in range(U) if (b := pipe._boundary.get((u, 0))) is not None}
    weight = {u: sum(p.numel() * p.element_size() for p in mod.parameters())
              for mods in pipe.modules.values() for u, mod in mods.items()}
    messages = [(r, *m) for r, res in pipe.last_results.items() for m in res.messages]
    tp = getattr(pipe, "tp", 1)
    queue = {r: (res.queue_overhead, res.queue_computes) for r, res in pipe.last_results.items()}
    return {"queue": queue, "edges": getattr(pipe, "last_edges", (0.0, 0.0)), "times": times, "act": act, "weight": weight, "ranks": list(pipe.ranks), "tp": tp,
            "tp_rank": _tp_rank(pipe),
            "host": socket.gethostname() if on_cpu else None, "cores": len(os.sched_getaffinity(0)),
            "process_cpu": getattr(pipe, "last_process_cpu", 0.0), "messages": messages,
            "clock_host": socket.gethostname()}


def _tp_rank(pipe) -> int:
    """This process's tp coordinate (``pipert.comm.mesh.ProcessLayout``)."""
    if getattr(pipe, "tp", 1) == 1:
        return 0
    import torch.distributed as dist
    return pipe.layout.tp_rank(dist.get_rank())


def profile_from_measurements(parts: Iterable[dict], num_units: int) -> StepProfile:
    """One :class:`StepProfile` from the :func:`local_measurements` of every process."""
    parts = list(parts)
    wall: dict[tuple[str, int | None, tuple | None], list[float]] = {}   # (op, unit, piece) -> samples
    cpu: dict[tuple[str, int | None, tuple | None], list[float]] = {}
    act: dict[int, int] = {}
    weight: dict[int, int] = {}
    for part in parts:
        for op, u, s, c, *piece in part["times"]:
            key = (op, u, tuple(piece[0]) if piece and piece[0] else None)
            wall.setdefault(key, []).append(s)
            cpu.setdefault(key, []).append(c)
        act.update({int(k): v for k, v in part["act"].items()})
        weight.update({int(k): v for k, v in part["weight"].items()})

    def units(samples: dict) -> list[UnitProfile]:
        out = []
        for u in range(num_units):
            mean = {(op, piece): statistics.fmean(v) for (op, unit, piece), v in samples.items() if unit == u}
            times = {op if piece is None else piece_key(op, piece): t for (op, piece), t in mean.items()}
            for op, piece in mean:   # an op run only in pieces: its whole is the sum of their means
                whole = [mean.get((op, (j, piece[1]))) for j in range(piece[1])] if piece else [None]
                if op not in times and None not in whole:
                    times[op] = sum(whole)
            sizes = {"act": act.get(u, 0), "grad": act.get(u, 0), "weight": weight.get(u, 0),
                     "wgrad": weight.get(u, 0)}
            sizes.update({k: 0 for k in _MEMORY_KINDS})
            out.append(UnitProfile(times, sizes))
        return out

    def opt(samples: dict) -> float:
        v = [s for (op, _, _), ss in samples.items() if op == "OPT" for s in ss]
        return statistics.fmean(v) if v else 0.0

    _, cores, host_of = _hosts(parts)
    tp = max(p.get("tp", 1) for p in parts) if parts else 1
    cores = [c / tp for c in cores] if tp > 1 else cores
    busy = sum(t[2] for p in parts for t in p["times"])   # each piece of a split compute its own seconds
    beyond = sum(max(0.0, p.get("process_cpu", 0.0) - sum(t[3] for t in p["times"])) for p in parts)
    computes = sum(len(p["times"]) for p in parts)
    overhead = beyond / computes if host_of and computes else 0.0
    clocks = {p.get("clock_host") for p in parts}
    one_clock = len(clocks) == 1 and None not in clocks
    messages = [tuple(m) for p in parts if not p.get("tp_rank") for m in p.get("messages", ())] if one_clock else []
    queue: dict[int, list[float]] = {}
    for part in parts:
        for r, (seconds, n) in part.get("queue", {}).items():
            queue.setdefault(int(r), [0.0, 0])
            queue[int(r)][0] += seconds
            queue[int(r)][1] += n
    per_compute = [queue[r][0] / queue[r][1] if r in queue and queue[r][1] else 0.0 for r in range(max(queue) + 1)] \
        if queue else []
    edges = [p["edges"] for p in parts if "edges" in p]
    head = statistics.fmean(e[0] for e in edges) if edges else 0.0
    tail = min(e[1] for e in edges) if edges else 0.0
    return StepProfile(units(wall), opt(wall), busy, units(cpu), opt(cpu), host_of, cores, overhead, messages,
                       per_compute, head, tail)


def message_overhead(messages: Iterable[tuple], links: Any = None) -> float:
    """Median seconds by which a waiting reader got its message after the link model's arrival
    (module doc); 0 when no reader waited. ``links``: the emulated ``pipert.cost.Links`` (None:
    free links)."""
    sends: dict[tuple[int, int], list] = {}
    recvs: dict[tuple[int, int, int], tuple[float, float]] = {}
    for rank, kind, peer, k, *rest in messages:
        if kind == "send":
            sends.setdefault((rank, peer), []).append((k, *rest))
        else:
            recvs[(peer, rank, k)] = tuple(rest)
    late = []
    for (src, dst), msgs in sends.items():
        spec = links.spec(src, dst) if links is not None else LinkSpec()
        free_at = -math.inf
        for k, nbytes, ready in sorted(msgs):
            free_at = max(ready, free_at) + spec.occupancy(nbytes)  # FIFO, as pipert.comm.links
            arrive = free_at + spec.latency
            got = recvs.get((src, dst, k))
            if got is not None and got[0] <= arrive:
                late.append(got[1] - arrive)
    return statistics.median(late) if late else 0.0


def _slower(links: Any, overhead: float, num_ranks: int) -> Any:
    """``links`` (None: free) with ``overhead`` more latency on every link."""
    from ..cost.base import LINK_CLASSES
    from ..cost.topology import Links, Topology
    if overhead <= 0:
        return links

    def more(s: LinkSpec) -> LinkSpec:
        return LinkSpec(s.latency + overhead, s.bandwidth, s.per_message)
    if links is None:
        return Links(Topology(num_ranks), {c: LinkSpec(overhead) for c in LINK_CLASSES})
    return Links(links.topology, {c: more(links.specs.get(c, LinkSpec())) for c in LINK_CLASSES},
                 {pair: more(s) for pair, s in links.overrides.items()})


def _hosts(parts: list[dict]) -> tuple[list[str], list[int], list[int]]:
    """(host names, cores per host, host index per rank); no hosts when a rank computes on a GPU
    or a part does not say where it ran."""
    if any(p.get("host") is None for p in parts):
        return [], [], []
    names = sorted({p["host"] for p in parts})
    cores = [min(p["cores"] for p in parts if p["host"] == h) for h in names]
    by_rank = {r: names.index(p["host"]) for p in parts for r in p["ranks"]}
    return names, cores, [by_rank[r] for r in sorted(by_rank)]


class _QueueCost:
    """A cost model whose computes on rank r take ``extra[r]`` seconds more (the queue's overhead),
    each piece of a split compute too (the queue measured each piece as a compute)."""

    def __init__(self, cost: Any, extra: list[float]) -> None:
        self.cost, self.extra = cost, extra

    def compute_time(self, action: Any, rank: int) -> float:
        from ..ir.semantics import action_time
        t = action_time(self.cost.compute_time, action, rank)
        return t + self.extra[rank] if t > 0 and rank < len(self.extra) else t

    compute_time.prices_pieces = True  # type: ignore[attr-defined]  # read by action_time

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cost, name)


def predict_step(program: Any, profile: StepProfile, links: Any = None) -> float:
    """The step time of ``program``, a core (or device) per rank: the engine's times of its DAG
    as the emulated links run it (``pipert.sim.eager``: a late RECV does not hold its transfer)
    with the measured costs, each rank's queue overhead on its computes, and ``links`` (a
    ``pipert.cost.Links``; None: messages are free) each slower by the profile's
    :func:`message_overhead`; plus the host's work around the program (module doc)."""
    from ..cost.profiled import ProfiledCost
    from ..sim.eager import eager_analysis
    from ..sim.timing import run_timing
    links = _slower(links, message_overhead(profile.messages, links), program.num_ranks)
    cost = _QueueCost(ProfiledCost(profile.profiles, profile.t_opt), profile.queue_overhead)
    times, _, errors = run_timing(eager_analysis(program, cost, links))
    if errors:
        raise errors[0]
    return times.makespan + profile.head + profile.tail


def predict_step_shared(program: Any, profile: StepProfile, links: Any = None) -> float | None:
    """The step time of ``program`` when the ranks of one host share its cores (see the module
    doc): the DAG of :func:`predict_step` with the measured CPU seconds and the action overhead,
    links as there, timed by processor sharing. None when the ranks computed on GPUs (their CPU
    seconds are not their work)."""
    if not profile.host_of_rank:
        return None
    from ..cost.profiled import ProfiledCost
    from ..sim.eager import eager_analysis
    from ..sim.shared import shared_makespan
    extra = profile.action_overhead
    cpu = [UnitProfile({op: t + extra for op, t in p.times.items()}, p.sizes) for p in profile.cpu_profiles]
    links = _slower(links, message_overhead(profile.messages, links), program.num_ranks)
    cost = ProfiledCost(cpu, profile.cpu_opt + extra if profile.cpu_opt else 0.0)
    return shared_makespan(eager_analysis(program, cost, links), profile.host_of_rank, profile.cores) + \
        profile.head + profile.tail
