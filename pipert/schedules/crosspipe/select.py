"""Schedule selection (paper §6.2) and the cross-DC pipeline-vs-data-parallel comparison (§5.2).

:func:`rank_schedules` builds the static and CrossPipe candidates for one system (cost
model, links, memory limit), simulates each and ranks them: schedules within the limit
first, fastest first. ``pipert plan`` prints :func:`format_ranking` of it.

All candidates describe the same model: a family with V chunks per rank is timed under
``cost_for(V)`` (default :class:`ChunkScaledCost`: a unit is 1/V of a stage's compute
and stash), so 1F1B and ZB-V compare like for like. Pass ``cost_for=lambda v: cost``
when ``cost`` already prices the units of every family.

:func:`compare_pp_dp` is App. E: two DCs, either the pipeline spans them (the better of
CrossPipe UD and Wave; every PP message crosses with ``pp_message_bytes`` on the
shared cross-DC link) or each DC holds whole pipelines (ZB-V inside one DC) and the
gradients cross once per step, unoverlapped: ``2 alpha + N * bytes_per_param / B``
(ring all-reduce between two DCs: two rounds, half the parameters each).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...cost.topology import LinkSpec, Links, Topology
from ...cost.uniform import UniformCost
from ...ir import Schedule
from .model import ChunkScaledCost

__all__ = ["Candidate", "STATIC", "CROSSPIPE", "rank_schedules", "format_ranking", "CrossDCConfig", "PPvsDP",
           "compare_pp_dp", "llama3_405b", "format_pp_dp"]

STATIC = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v")
CROSSPIPE = ("crosspipe-greedy", "crosspipe-wave", "crosspipe-optimal")
_CHUNKS = {"interleaved-1f1b": 2, "zb-v": 2, "crosspipe-wave": 2}


@dataclass
class Candidate:
    """One simulated candidate schedule."""

    name: str
    """Registry name."""
    makespan: float
    """Simulated makespan (inf if it could not be built)."""
    peak_memory: float
    """Largest per-rank peak memory (simulator accounting)."""
    fits: bool
    """Peak memory within the limit (True when there is no limit)."""
    build_s: float
    """Wall time to generate the schedule."""
    schedule: Schedule | None = None
    """The schedule (None if it could not be built)."""
    note: str = ""
    """Why it could not be built, or generator facts (solver status, gap)."""


def rank_schedules(stages: int, microbatches: int, cost: Any, links: Any = None, topology: Any = None, *,
                   memory_limit: float | Sequence[float] | None = None, names: Sequence[str] = STATIC + CROSSPIPE[:2],
                   cost_for: Callable[[int], Any] | None = None, options: dict[str, dict] | None = None
                   ) -> list[Candidate]:
    """Build, simulate and rank ``names`` (fits first, then makespan).

    ``memory_limit`` (one number, or one per rank) None: CrossPipe families take their default
    (the paper's budget: the static counterpart's per-rank peaks) and every candidate fits. ``options[name]`` are extra builder options.
    """
    from ...sim import simulate
    from .. import build_schedule
    cost_for = cost_for or (lambda v: cost if v == 1 else ChunkScaledCost(cost, v))
    out = []
    for name in names:
        v = _CHUNKS.get(name, 1)
        c = cost_for(v)
        opts = dict((options or {}).get(name, {}))
        if name.startswith("crosspipe"):
            opts.update(cost=c, links=links, topology=topology, memory_limit=memory_limit)
        t0 = time.perf_counter()
        try:
            s = build_schedule(name, stages=stages, microbatches=microbatches, chunks=v, **opts)
        except (ValueError, RuntimeError) as e:
            out.append(Candidate(name, math.inf, math.inf, False, time.perf_counter() - t0, None, str(e)))
            continue
        dt = time.perf_counter() - t0
        r = simulate(s, c, links, topology)
        peak = max(r.peak_memory)
        note = ""
        if "status" in s.meta:
            note = f"{s.meta['status']}, gap {s.meta['gap']:.1%}"
        out.append(Candidate(name, r.makespan, peak, _fits(r.peak_memory, memory_limit), dt, s, note))
    out.sort(key=lambda c: (not c.fits, c.makespan))
    return out


def _fits(peaks: Sequence[float], limit: float | Sequence[float] | None) -> bool:
    """Every rank's peak within its limit (one number: the same on every rank; None: no limit)."""
    if limit is None:
        return True
    lims = [limit] * len(peaks) if isinstance(limit, (int, float)) else list(limit)
    return all(p <= q + 1e-9 for p, q in zip(peaks, lims))


def format_ranking(cands: Sequence[Candidate], memory_limit: float | Sequence[float] | None = None) -> str:
    """Text table of a ranking (what ``pipert plan`` prints)."""
    lim = "none" if memory_limit is None else f"{memory_limit:g}" if isinstance(memory_limit, (int, float)) \
        else " ".join(f"{x:g}" for x in memory_limit)
    best = next((c.makespan for c in cands if c.fits and math.isfinite(c.makespan)), math.nan)
    lines = [f"memory limit per rank: {lim}",
             f"{'rank':<5}{'schedule':<20}{'makespan':>10}{'vs best':>9}{'peak mem':>10}{'fits':>6}{'build s':>9}  note"]
    for i, c in enumerate(cands, 1):
        rel = f"{c.makespan / best:.3f}" if math.isfinite(c.makespan) and best > 0 else "-"
        lines.append(f"{i:<5}{c.name:<20}{c.makespan:>10.4g}{rel:>9}{c.peak_memory:>10.4g}{'yes' if c.fits else 'no':>6}"
                     f"{c.build_s:>9.3f}  {c.note}")
    return "\n".join(lines)


@dataclass(frozen=True)
class CrossDCConfig:
    """A two-datacenter training step for :func:`compare_pp_dp` (seconds and bytes)."""

    stages: int
    """Pipeline stages P (split evenly over the two DCs for cross-DC PP)."""
    microbatches: int
    """Micro-batches per pipeline per step."""
    tf: float
    """Forward time of one stage for one micro-batch."""
    td: float
    """Input-gradient time of one stage."""
    tw: float
    """Weight-gradient time of one stage."""
    params: float
    """Model parameters N."""
    pp_message_bytes: float
    """Bytes one PP message puts on the shared cross-DC link (all DP replicas together)."""
    dc_latency: float
    """Cross-DC latency alpha."""
    dc_bandwidth: float
    """Cross-DC bandwidth B in bytes per second."""
    bytes_per_param: float = 2.0
    """Gradient bytes per parameter (bf16)."""


@dataclass
class PPvsDP:
    """Step times of cross-DC pipeline parallelism vs cross-DC data parallelism."""

    pp_time: float
    """Best CrossPipe step time with the pipeline spanning both DCs."""
    pp_schedule: str
    """Which CrossPipe family gave it."""
    dp_time: float
    """ZB-V inside one DC plus the unoverlapped cross-DC gradient all-reduce."""
    single_dc_time: float
    """ZB-V with no cross-DC traffic (the ideal)."""
    dp_sim_time: float = math.nan
    """The DP side simulated: ZB-V replicated over the two DCs, each stage's gradient all-reduce at
    the optimizer step (``at-opt``) priced by the simulator on its share of the link."""
    dp_overlap_time: float = math.nan
    """The same with the DP-overlap operations (``crosspipe-overlap``: each reduction right after
    its unit's last W, beside the remaining backward)."""
    pp_link_floor: float = math.nan
    """M messages per direction back to back on the cross-DC link: no PP step is shorter."""

    @property
    def speedup(self) -> float:
        """How much faster cross-DC PP is than cross-DC DP."""
        return self.dp_time / self.pp_time

    @property
    def slowdown(self) -> float:
        """Cross-DC PP relative to the single-DC ideal."""
        return self.pp_time / self.single_dc_time


def compare_pp_dp(cfg: CrossDCConfig, *, optimal: bool = False, time_limit: float = 30.0,
                  memory_budget: str = "paper", simulate_dp: bool = False) -> PPvsDP:
    """App. E: time both ways of spanning two DCs (module doc). ``optimal`` adds the CP-SAT
    schedules to the PP side (slow beyond P = 8); ``memory_budget`` is the CrossPipe builders';
    ``simulate_dp`` also simulates the DP side with and without the DP-overlap operations."""
    from ...sim import simulate
    from .. import build_schedule
    P, M = cfg.stages, cfg.microbatches
    cost = _WireCost(UniformCost(tf=cfg.tf, td=cfg.td, tw=cfg.tw), cfg.pp_message_bytes)
    topo = Topology(P, num_dcs=2)
    links = Links(topo, {"inter_dc": LinkSpec(cfg.dc_latency, cfg.dc_bandwidth)})
    names = ["crosspipe-greedy", "crosspipe-wave"] + (["crosspipe-optimal"] if optimal else [])
    opts = {n: {"memory_budget": memory_budget, **({"time_limit": time_limit} if n == "crosspipe-optimal" else {})}
            for n in names}
    ranked = rank_schedules(P, M, cost, links, topo, names=names, options=opts)
    pp = ranked[0]
    zbv = build_schedule("zb-v", stages=P, microbatches=M)
    single = simulate(zbv, ChunkScaledCost(cost, 2)).makespan
    dp = single + 2 * cfg.dc_latency + cfg.params * cfg.bytes_per_param / cfg.dc_bandwidth
    floor = M * links.transfer(P // 2 - 1, P // 2, cfg.pp_message_bytes)[0]
    sims = [_dp_simulated(cfg, zbv, pol) for pol in ("at-opt", "crosspipe-overlap")] if simulate_dp \
        else [math.nan, math.nan]
    return PPvsDP(pp.makespan, pp.name, dp, single, sims[0], sims[1], floor)


def _dp_simulated(cfg: CrossDCConfig, zbv: Schedule, policy: str) -> float:
    """Cross-DC DP simulated: one ZB-V replica per DC (ranks d*P + s), each unit's gradient
    (N * bytes_per_param / 2P bytes) all-reduced between its two holders by ``policy``; the P
    stage groups share the link, each on B / P (all P reduce at once in the unoverlapped step,
    which is the paper's 2 alpha + 2N bytes / B per ZB-V chunk)."""
    from ...sim import simulate
    from ..data_parallel import replicate
    P = cfg.stages
    grad = cfg.params * cfg.bytes_per_param / (2 * P)
    cost = _WireCost(ChunkScaledCost(UniformCost(tf=cfg.tf, td=cfg.td, tw=cfg.tw), 2), grad)
    links = Links(Topology(2 * P, num_dcs=2), {"inter_dc": LinkSpec(cfg.dc_latency, cfg.dc_bandwidth / P)})
    return simulate(replicate(zbv, 2, policy=policy), cost, links).makespan


class _WireCost:
    """A cost model whose activation/gradient messages weigh ``wire_bytes`` on the links
    while their buffers keep ``base``'s memory size (a message of all DP replicas)."""

    def __init__(self, base: Any, wire_bytes: float) -> None:
        self.base, self.wire_bytes = base, wire_bytes

    def compute_time(self, action: Any, rank: int) -> float:
        return self.base.compute_time(action, rank)

    def message_bytes(self, payload: Any, unit: int, num_mbs: int = 1) -> float:
        return self.wire_bytes * num_mbs

    def memory(self, kind: str, unit: int) -> float:
        return self.base.memory(kind, unit)


def llama3_405b(dc_latency: float, dc_bandwidth: float, *, data_parallel: int = 64,
                seq: int = 8192, hidden: int = 16384, stages: int = 16) -> CrossDCConfig:
    """App. E setup: Llama-3-405B, TP 8, PP 16, DP 64, s = 8192, GBS = 2 P DP (M = 2P per
    pipeline), T_F = 0.109 s per stage (500 TFLOP/s per GPU), D = W = F; a PP message is
    one micro-batch's bf16 activations (s * d * 2 bytes) for every DP replica."""
    tf = 0.109
    return CrossDCConfig(stages, 2 * stages, tf, tf, tf, 405e9, 2.0 * seq * hidden * data_parallel,
                         dc_latency, dc_bandwidth)


def format_pp_dp(rows: Sequence[tuple[float, float, PPvsDP]]) -> str:
    """Table of (latency s, bandwidth B/s, result) rows."""
    lines = [f"{'latency':>9}{'bandwidth':>12}{'PP step':>10}{'PP via':>18}{'DP step':>10}{'PP/DP speedup':>15}"
             f"{'PP vs 1 DC':>12}"]
    for lat, bw, r in rows:
        lines.append(f"{lat * 1e3:>7.0f}ms{bw / 1e9:>8.0f}GB/s{r.pp_time:>10.3f}{r.pp_schedule:>18}{r.dp_time:>10.3f}"
                     f"{r.speedup:>14.2f}x{r.slowdown:>11.2f}x")
    return "\n".join(lines)
