"""The layouts ``pipert plan --auto`` searches: T (tensor parallel, inside a node) x P (pipeline
stages) x D (data-parallel replicas) = the cluster's devices, the micro-batch size b, and per
schedule family its chunks V. Each layout names the links its pipeline crosses and the ranks of
each data-parallel group (:mod:`pipert.planner.cluster` has the rank order).

Invariants of every layout :func:`layouts` yields: ``T * P * D == cluster.gpus``; T divides the
GPUs per node and shards the model (``tp_problem`` is None); the global batch is
``D * M * b`` sequences; pipeline ranks per node and per datacenter divide P or are multiples of
it (so every replica crosses the same links); the family accepts (P, M, V) and the model has a
layer for every unit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ..cost.tensor_parallel import tp_problem
from ..cost.topology import Links, Topology
from ..scenario import LAYER_PER_CHUNK
from ..scenario_flags import PAIR_LIMITS, MAX_PAIRS
from .cluster import Cluster

__all__ = ["Layout", "FAMILIES", "MICRO_BATCHES", "WEIGHT_PASSING", "PLAN_PAIR_LIMIT", "layouts", "divisors",
           "family_default", "build_problem"]

FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "weipipe-interleave", "tawpipe", "helixpipe-2fold",
            "pipemesh", "crosspipe-greedy")
"""One registered schedule per family of the seed papers (CP-SAT's crosspipe-optimal is left out:
its solve alone takes longer than the whole search may). HelixPipe is searched as its paper runs
it (helixpipe-2fold's defaults: asynchronous two-fold, loss in backward; the recomputation is the
planner's choice), not the naive FILO ``helixpipe`` (the paper's ablation; ``--schedules helixpipe``
searches it): at 1B on 8 GPUs and 7B on 16 (batch 32, 64) the two-fold's best step was 9 % and
17 % shorter."""
WEIGHT_PASSING = ("weipipe-naive", "weipipe-interleave", "weipipe-zb1", "weipipe-zb2", "tawpipe")
"""Families whose weights travel and activations stay: their stage boundaries are not crossed by
every micro-batch's activation, but every rank needs every unit's weights."""
PLAN_PAIRS = {"crosspipe-greedy": 512, "helixpipe": 2560, "helixpipe-2fold": 2560}
"""Most (unit, micro-batch) pairs the planner simulates per family (default :data:`PLAN_PAIR_LIMIT`):
the engine's time grows with them and the whole search has seconds."""
PLAN_PAIR_LIMIT = 1024
_CHUNKS = {"interleaved-1f1b": (2, 4), "zb-v": (2,), "pipemesh": (2,)}
"""Chunks V tried per family (others: 1; HelixPipe: layers / P)."""


MICRO_BATCHES = (1, 2, 4)
"""Micro-batch sizes b tried unless fixed: the analytic costs are linear in b, so a larger b only
saves message latencies and costs bubble and memory."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Layout:
    """One way to run a step on the cluster."""

    family: str
    """Registered schedule name."""
    stages: int
    """Pipeline ranks P (each T devices)."""
    dp: int
    """Data-parallel replicas D."""
    tp: int
    """Tensor-parallel size T."""
    sp: bool
    """Sequence parallelism over the TP group."""
    chunks: int
    """Units per rank V (HelixPipe: layers per stage)."""
    microbatches: int
    """Micro-batches per replica and step M."""
    micro_batch: int
    """Sequences per micro-batch b."""
    ranks_per_node: int
    """Pipeline ranks of one replica on one node (P when the replica fits a node)."""
    dcs: int
    """Datacenters one replica's pipeline spans."""

    @property
    def units(self) -> int:
        return self.stages * self.chunks * 2 + 1 if self.family in LAYER_PER_CHUNK else self.stages * self.chunks

    def topology(self) -> Topology:
        """The P ranks of one replica as the simulator sees them."""
        rpn = self.ranks_per_node if self.ranks_per_node < self.stages else None
        return Topology(self.stages, rpn, self.dcs)

    def links(self, cluster: Cluster) -> Links:
        return Links(self.topology(), dict(cluster.links))

    def dp_group(self, stage: int) -> tuple[int, ...]:
        """Ranks (of :meth:`Cluster.rank_topology`) that hold ``stage``'s weights: one per replica."""
        return tuple(d * self.stages + stage for d in range(self.dp))

    def describe(self) -> str:
        v = f" V={self.chunks}" if self.chunks > 1 else ""
        t = f" T={self.tp}{' SP' if self.sp else ''}" if self.tp > 1 else ""
        return f"P={self.stages} D={self.dp}{t}{v} M={self.microbatches} b={self.micro_batch}"


def layouts(cluster: Cluster, model: object, batch: int, families: tuple[str, ...] = FAMILIES, *,
            tp: int | None = None, sp: bool = False, stages: int | None = None, dp: int | None = None,
            micro_batch: int | None = None, skipped: dict | None = None) -> Iterator[Layout]:
    """Every layout of the module doc's invariants; ``tp``, ``stages``, ``dp``, ``micro_batch``
    fix that dimension. ``skipped`` (reason -> count) collects why a shape was left out."""
    skipped = {} if skipped is None else skipped

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1
    layers = model.layers  # type: ignore[attr-defined]
    for t in divisors(cluster.gpus_per_node) if tp is None else [tp]:
        t_sp = sp and t > 1       # sequence parallelism splits over a TP group: T = 1 runs without it
        if tp_problem(model, t, t_sp):
            skip(f"T={t}{' SP' if t_sp else ''} does not shard the model")
            continue
        ranks, per_node = cluster.gpus // t, cluster.gpus_per_node // t
        per_dc = ranks // cluster.dcs
        for p in divisors(ranks) if stages is None else [stages]:
            if ranks % p:
                skip(f"P={p} does not divide the {ranks} ranks of T={t}")
                continue
            d = ranks // p
            if dp is not None and d != dp:
                continue
            if p % per_node and per_node % p or p % per_dc and per_dc % p:
                skip("a replica would straddle node or datacenter boundaries unevenly")
                continue
            if batch % d:
                skip(f"D={d} does not divide the batch")
                continue
            for b in MICRO_BATCHES if micro_batch is None else (micro_batch,):
                if (batch // d) % b:
                    skip(f"b={b} does not divide the batch of a replica")
                    continue
                m = batch // (d * b)
                for name in families:
                    for v in _chunks(name, p, layers):
                        lay = Layout(name, p, d, t, t_sp, v, m, b, min(p, per_node),
                                     p // per_dc if p > per_dc else 1)
                        why = _problem(lay, layers) or build_problem(name, p, m, v)
                        if why:
                            skip(why)
                            continue
                        yield lay


def family_default(name: str, option: str, fallback: Any) -> Any:
    """The default of generator option ``option`` of family ``name`` (what its schedule records
    unless told otherwise: helixpipe-2fold's paper defaults), else ``fallback``."""
    import inspect
    from ..schedules import family
    param = inspect.signature(family(name).build).parameters.get(option)
    return param.default if param is not None else fallback


def build_problem(name: str, stages: int, microbatches: int, chunks: int) -> str | None:
    """Why the planner cannot build family ``name`` at (P, M, V) with the options it builds with
    (None: it can): the family's constraints, and those of its default fold count (HelixPipe's
    family check holds for every F, its build for its own)."""
    from ..schedules import PipelineConfig, family
    try:
        family(name).validate(PipelineConfig(stages, microbatches, chunks))
        folds = family_default(name, "folds", None)
        if folds is not None:
            from ..schedules.helixpipe import check_helixpipe
            check_helixpipe(name, stages, microbatches, chunks, folds)
    except ValueError as e:
        return f"{name}: {str(e).splitlines()[0]}"
    return None


def _chunks(name: str, stages: int, layers: int) -> tuple[int, ...]:
    if name in LAYER_PER_CHUNK:
        return (layers // stages,) if layers % stages == 0 and stages > 1 else ()
    return _CHUNKS.get(name, (1,))


def _problem(lay: Layout, layers: int) -> str | None:
    """Why a layout cannot be built (None: it can), in constant time."""
    if lay.family not in LAYER_PER_CHUNK and lay.units > layers:
        return f"{lay.family}: P x V = {lay.units} units > {layers} layers"
    limit = PAIR_LIMITS.get(lay.family, MAX_PAIRS)
    if lay.units * lay.microbatches > limit:
        return f"{lay.family}: more than {limit} (unit, micro-batch) pairs"
    if lay.family.startswith("crosspipe") and lay.dcs < 2:
        return "crosspipe: the pipeline does not cross datacenters"
    return None
