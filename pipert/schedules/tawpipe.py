"""TawPipe (Wu & Chen, AAAI'26): weight passing grouped by node.

P ranks in D = P/G nodes of G ranks (``ranks_per_node``, the same grouping as the
simulator's Topology). Units ``0..P-1`` are shards (embedding in unit 0; final norm, head
and loss in unit P-1). Device i of node k owns shard ``(D*i + k) mod P``, i.e. shard j
lives on rank ``(j mod D)*G + j//D``: its master weights, gradient accumulator and
optimizer state never move. Every rank runs its own micro-batches ``d, d+P, ...`` one at
a time, forward through shards 0..P-1 then backward P-1..0; all ranks of a node work on
the same shard at the same step, node k one step behind node k-1 (the paper's stagger).

Per step of node k on shard j:

- the *master* holds ``W_j``: the owner if j is local, else the *staging* rank, the rank
  of node k with the owner's local index, which receives ``W_j`` from the owner by P2P
  one step ahead (prefetch; inter-node P2P only between equal local ranks);
- ``BROADCAST weight j @node ^master`` (one step ahead), then everyone computes;
- backward: ``REDUCE wgrad j @node ^root``, root = owner if local else staging; the
  staging rank sends each sum to the owner right after its reduce (once per micro-batch
  step, as the authors' code does); the owner's ``OPT j`` follows as soon as every sum is in
  (``opt_last``: after the owner's last compute instead, so that the data-parallel reduction
  ``replicate`` puts right before it stalls none of the owner's computes).
- a shard used at two consecutive steps is kept (the turnaround shard P-1, and shard 0
  between one micro-batch's backward and the next one's forward).

``tawpipe_plan`` is the pure step table; ``tawpipe_schedule`` lowers it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..ir import Action, Op, Payload, Placement, Schedule
from .registry import PipelineConfig, available, check_dp_option, register
from .weipipe import COLL0, COLL1, COMPUTE, FREE_, SEND0, SlotProgram, opt_with_waits

__all__ = ["TawPipeConfig", "TawPlan", "Step", "tawpipe_plan", "tawpipe_schedule", "tawpipe", "check_tawpipe",
           "tawpipe_owner", "tawpipe_bytes", "tawpipe_lockstep_makespan"]


def check_tawpipe(stages: int, microbatches: int, ranks_per_node: int | None) -> None:
    """ValueError naming the value and what is allowed."""
    if stages < 1:
        raise ValueError(f"tawpipe needs stages >= 1, got P={stages}")
    g = stages if ranks_per_node is None else ranks_per_node
    if g < 1 or stages % g:
        divisors = ", ".join(str(d) for d in range(1, stages + 1) if stages % d == 0)
        raise ValueError(f"tawpipe needs ranks_per_node to divide stages (P mod D == 0), got ranks_per_node={g}, "
                         f"P={stages}; allowed: {divisors}")
    if microbatches < stages or microbatches % stages:
        raise ValueError(f"tawpipe needs microbatches to be a positive multiple of stages (P | N: every rank runs "
                         f"N/P), got N={microbatches}, P={stages}")


@dataclass(frozen=True)
class TawPipeConfig:
    """One TawPipe iteration."""

    stages: int
    """P: ranks = number of shards (units)."""
    microbatches: int
    """N: micro-batches per iteration; a multiple of P (N/P per rank)."""
    ranks_per_node: int | None = None
    """G: ranks per node (group); must divide P. None: all ranks on one node (D = 1)."""
    stagger: bool = True
    """Node k runs k steps behind node 0 (the paper; balances each node's inter-node
    sends and receives). False: all nodes on the same shard at the same step."""
    opt_last: bool = False
    """Each owner steps its shard after its last compute of the iteration, not as soon as the
    shard's sums are in (the registry builder sets it with data-parallel replicas, ``dp > 1``)."""

    def __post_init__(self) -> None:
        check_tawpipe(self.stages, self.microbatches, self.ranks_per_node)

    @property
    def group_size(self) -> int:
        """G."""
        return self.ranks_per_node or self.stages

    @property
    def nodes(self) -> int:
        """D = P / G."""
        return self.stages // self.group_size


def tawpipe_owner(shard: int, stages: int, ranks_per_node: int | None) -> int:
    """Rank owning ``shard``: device ``shard // D`` of node ``shard mod D``."""
    g = ranks_per_node or stages
    d = stages // g
    return (shard % d) * g + shard // d


@dataclass(frozen=True)
class Step:
    """What node k does at one global step."""

    op: Op
    """F or B."""
    unit: int
    """The shard computed."""
    local: int
    """Index r of the micro-batch on each rank (rank d runs micro-batch d + rP)."""
    master: int
    """Rank that holds the shard for the node (owner or staging)."""
    fetched: bool
    """True if the master received it by P2P from a remote owner for this step."""
    kept: bool
    """True if the node used the same shard at the previous step (nothing moves)."""


@dataclass
class TawPlan:
    """Step table of one iteration."""

    config: TawPipeConfig
    """The configuration."""
    steps: dict[tuple[int, int], Step]
    """(node, global step) -> Step; node k's local step is ``global - k``."""

    @property
    def turns(self) -> int:
        return max(t for _, t in self.steps) + 1

    def node_ranks(self, k: int) -> tuple[int, ...]:
        g = self.config.group_size
        return tuple(range(k * g, (k + 1) * g))

    def holdings(self, rank: int, step: int) -> tuple[int, ...]:
        """Shards whose weights ``rank`` holds during ``step``'s compute (own shard, the one
        computed, and the one prefetched for the next step)."""
        c, g = self.config, self.config.group_size
        k = rank // g
        out = {u for u in range(c.stages) if tawpipe_owner(u, c.stages, c.ranks_per_node) == rank}
        for t in (step, step + 1):
            st = self.steps.get((k, t))
            if st is not None:
                out.add(st.unit)
        return tuple(sorted(out))


def tawpipe_plan(config: TawPipeConfig) -> TawPlan:
    """Node k, local step s = t - k: micro-batch s // 2P, forward shard x < P or backward
    shard 2P-1-x at x = s mod 2P (pure)."""
    P, G, D = config.stages, config.group_size, config.nodes
    n_loc = config.microbatches // P
    steps: dict[tuple[int, int], Step] = {}
    for k in range(D):
        prev = None
        for s in range(2 * P * n_loc):
            r, x = divmod(s, 2 * P)
            op, j = (Op.F, x) if x < P else (Op.B, 2 * P - 1 - x)
            owner = tawpipe_owner(j, P, config.ranks_per_node)
            local = owner // G == k
            master = owner if local else k * G + j // D
            kept = prev == j
            steps[(k, s + (k if config.stagger else 0))] = Step(op, j, r, master, not local and not kept, kept)
            prev = j
    return TawPlan(config, steps)


def tawpipe_lockstep_makespan(plan: TawPlan, cost: object) -> float:
    """The paper's analysis model: global steps in lock-step, each as long as the slowest
    node's compute in it (``cost.compute_time(action, rank)`` of its first rank)."""
    slow: dict[int, float] = defaultdict(float)
    for (k, t), st in plan.steps.items():
        d = plan.node_ranks(k)[0]
        slow[t] = max(slow[t], cost.compute_time(Action(st.op, st.unit, d + st.local * plan.config.stages), d))
    return sum(slow.values())


def tawpipe_schedule(config: TawPipeConfig) -> Schedule:
    """Lower the step table to a schedule (pure)."""
    plan = tawpipe_plan(config)
    P, G = config.stages, config.group_size
    owners = tuple(tawpipe_owner(j, P, config.ranks_per_node) for j in range(P))
    prog = SlotProgram(P)
    arrivals: dict[int, list[int]] = defaultdict(list)             # shard -> slots its sums leave their node
    owner_sends: dict[int, list[Action]] = defaultdict(list)          # shard -> the owner's weight sends
    for (k, t), st in sorted(plan.steps.items(), key=lambda x: (x[0][1], x[0][0])):
        ranks, j = plan.node_ranks(k), st.unit
        if st.fetched:       # the owner sends one step ahead, to the rank with its local index
            send = prog.transfer(t - 1, SEND0, (0,), owners[j], st.master, Payload.WEIGHT, j, t)
            owner_sends[j].append(send)
        if not st.kept and G > 1:
            for d in ranks:
                prog.add(d, t - 1, COLL0, Action(Op.BROADCAST, unit=j, payload=Payload.WEIGHT, group=ranks,
                                                 root=st.master, tag=t), (0,))
        for d in ranks:
            prog.add(d, t, COMPUTE, Action(st.op, j, d + st.local * P))
            nxt = plan.steps.get((k, t + 1))
            if d != owners[j] and (nxt is None or nxt.unit != j):
                prog.add(d, t, FREE_, Action(Op.FREE, unit=j, payload=Payload.WEIGHT))
        if st.op is Op.B:
            root = owners[j] if owners[j] in ranks else st.master
            if G > 1:
                for d in ranks:
                    prog.add(d, t, COLL1, Action(Op.REDUCE, unit=j, payload=Payload.WGRAD, group=ranks, root=root,
                                                 tag=t), (0,))
            if root != owners[j]:     # every micro-batch step's sum leaves its node at once
                prog.transfer(t, COLL1, (1,), root, owners[j], Payload.WGRAD, j, t + 1)
                arrivals[j].append(t + 1)
            else:
                arrivals[j].append(t)
    for j, slots in arrivals.items():
        last = max(slots + [plan.turns]) if config.opt_last else max(slots)
        opt_with_waits(prog, owners[j], last, j, owner_sends[j])
    actions, starts = prog.build()
    turns = plan.turns
    meta = {"family": "tawpipe", "stages": P, "chunks": 1, "split_backward": False,
            "ranks_per_node": config.ranks_per_node, "nodes": config.nodes, "stagger": config.stagger,
            "opt_last": config.opt_last, "turns": turns,
            "turn_start": [[st.get(t, -1) for t in range(-1, turns + 1)] for st in starts]}
    placement = Placement.by_microbatch([m % P for m in range(config.microbatches)], owners)
    return Schedule("tawpipe", P, P, config.microbatches, placement, actions, meta)


def tawpipe_bytes(stages: int, microbatches: int, ranks_per_node: int | None, shard_bytes: float = 1.0
                  ) -> dict[str, float]:
    """Bytes of one iteration by link class, as ``SimResult.comm_bytes`` counts them (a
    BROADCAST/REDUCE puts its bytes on each of the G-1 links of its chain); closed forms
    of docs/weight_passing.md."""
    c = TawPipeConfig(stages, microbatches, ranks_per_node)
    P, G, D, n = c.stages, c.group_size, c.nodes, c.microbatches // c.stages
    fetches = 2 * n * (P - 1) + 1                         # new shards per node per iteration
    inter = (D - 1) * (fetches + n * P)                   # remote weights + a gradient per remote backward step
    intra = D * (G - 1) * (fetches + n * P)               # broadcasts + reduces (one per backward step)
    return {"local": 0.0, "intra_node": intra * shard_bytes, "inter_node": inter * shard_bytes, "inter_dc": 0.0}


def tawpipe(config: PipelineConfig, *, ranks_per_node: int | None = None, stagger: bool = True,
            dp: int = 1) -> Schedule:
    """TawPipe on ``config`` grouped by ``ranks_per_node`` (registry builder); ``dp``: the replicas the
    program will have (``pipert.compiler.replica_options``): with more than one, owners step last."""
    if ranks_per_node is None:
        raise ValueError("tawpipe groups ranks by node: give ranks_per_node (--ranks-per-node), a divisor of "
                         f"stages={config.stages}")
    check_dp_option("tawpipe", dp)
    return tawpipe_schedule(TawPipeConfig(config.stages, config.microbatches, ranks_per_node, stagger, dp > 1))


def _check(config: PipelineConfig) -> None:
    if config.chunks != 1:
        raise ValueError(f"tawpipe needs chunks == 1 (got V={config.chunks})")
    check_tawpipe(config.stages, config.microbatches, None)


register("tawpipe", tawpipe, "TawPipe: shards owned per device, intra-node broadcast/reduce, rail-aligned "
         "inter-node P2P (option ranks_per_node)", check=_check,
         constraints="V = 1; P | N; ranks_per_node divides P", replace="tawpipe" in available())
