"""WeiPipe (Lin et al., PPoPP'25): weights and weight-gradients travel a one-way ring.

Units ``0..P-1`` are the paper's chunks ``W_0..W_{P-1}`` (embedding in unit 0; final norm,
head and loss in unit P-1). Worker k runs micro-batches ``k, k+P, k+2P, ...`` through all
units; activations never move. Time is cut into *turns*; the paper's circle puts, at turn
t, the forward copy of ``W_{(t-k) mod P}`` and the backward copy of ``W_{(k-t-1) mod P}``
(with its gradient accumulator D) on worker k (docs/weight_passing.md).

A generator is two pure steps:

1. ``weipipe_plan(config)`` -> ``RingPlan``: the compute actions of every (worker, turn),
   and the *streams* derived from them. A stream is one copy (weight or wgrad) of one unit
   and one version that moves one hop ``k -> k+1`` per turn, lock-step, from its first
   use to its last use (also through laps where nobody uses it, as in the paper). On the
   paper's ring (``ring="paper"``, the default) a weight stream starts earlier, at its
   owner's last turn on its phase before the first use (or at turn 0, where the paper's
   re-seed puts it), and a gradient stream rides on to its owner.
2. ``lower_ring(plan)`` -> ``Schedule``: SEND/RECV/FREE/OPT from the streams. A worker
   receives a weight for turn t unless it owns that unit or already holds the same
   version from turn t-1, from its ring predecessor; a stream's first copy comes from the
   owner. Paper ring: a gradient moves after its holder's turn and the next holder waits
   for it (``WAIT RECV wgrad``) before adding to it, so turns are enforced. Direct ring
   (``ring="direct"``): a gradient moves right after its contribution, nobody waits for
   it, and a completed one goes straight to the owner. The owner's ``OPT`` follows as soon
   as its gradient is complete.

Invariants of every generated schedule: each transfer is ``weight`` or ``wgrad``; a rank
holds at most one version of a unit's weights at a time; ``WZB2`` has
``meta["update_every"] == P`` and every compute of micro-batch m uses weight version
``m // P``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..ir import Action, Op, Payload, Placement, Schedule
from ..ir.semantics import LOCAL_WGRAD_OPS, action_time
from .registry import PipelineConfig, available, register

__all__ = ["VARIANTS", "WeiPipeConfig", "Stream", "RingPlan", "SlotProgram", "weipipe_plan", "lower_ring",
           "weipipe_schedule", "weipipe_naive", "weipipe_interleave", "weipipe_zb1", "weipipe_zb2",
           "weipipe_interleave_direct", "RINGS",
           "check_weipipe", "ring_message_count", "lockstep_makespan"]

VARIANTS = ("naive", "interleave", "zb1", "zb2")
RINGS = ("paper", "direct")
"""``paper``: every copy travels the ring turn by turn from its circle position (the default);
``direct``: pipert's faster variant, first copies straight from the owner (docs/weight_passing.md)."""


@dataclass(frozen=True)
class WeiPipeConfig:
    """One WeiPipe iteration."""

    stages: int
    """P: workers on the ring = number of units (chunks of layers); >= 2."""
    microbatches: int
    """N: micro-batches per iteration; a multiple of P (n = N/P per worker)."""
    variant: str = "interleave"
    """One of VARIANTS: naive, interleave, zb1 (even P and even n), zb2."""
    ranks_per_node: int | None = None
    """Ranks per node (only recorded in meta; the ring is rank order either way)."""
    ring: str = "paper"
    """One of RINGS: ``paper`` (copies move one ring hop per turn from their circle position;
    a gradient accumulator moves after its holder's turn and the next holder adds to it only
    once it arrived) or ``direct`` (a copy starts at its first use, sent there by the owner;
    finished gradients go straight to the owner; turns are not enforced)."""

    def __post_init__(self) -> None:
        check_weipipe(self.variant, self.stages, self.microbatches, self.ranks_per_node)
        if self.ring not in RINGS:
            raise ValueError(f"weipipe ring {self.ring!r} unknown; allowed: {', '.join(RINGS)}")

    @property
    def per_worker(self) -> int:
        """n: micro-batches per worker."""
        return self.microbatches // self.stages


def check_weipipe(variant: str, stages: int, microbatches: int, ranks_per_node: int | None = None) -> None:
    """ValueError naming the value and what is allowed."""
    if variant not in VARIANTS:
        raise ValueError(f"weipipe variant {variant!r} unknown; allowed: {', '.join(VARIANTS)}")
    name = f"weipipe-{variant}"
    if stages < 2:
        raise ValueError(f"{name} needs stages >= 2 (a ring of at least two workers), got P={stages}")
    if microbatches < stages or microbatches % stages:
        raise ValueError(f"{name} needs microbatches to be a positive multiple of stages (P | N), got "
                         f"N={microbatches}, P={stages}; nearest allowed N: "
                         f"{max(stages, microbatches // stages * stages)}, {(microbatches // stages + 1) * stages}")
    n = microbatches // stages
    if variant == "zb1" and (stages % 2 or n % 2):
        raise ValueError(f"{name} pairs chunks and micro-batches, so it needs even P and even N/P; got P={stages}, "
                         f"N/P={n}")
    if ranks_per_node is not None and (ranks_per_node < 1 or stages % ranks_per_node):
        raise ValueError(f"{name}: ranks_per_node={ranks_per_node} must be >= 1 and divide stages={stages}")


@dataclass(frozen=True)
class Stream:
    """One copy of one unit travelling the ring lock-step: at turn t in [first, last] it is
    on worker ``(t - phase) mod P``."""

    role: str
    """"F" (forward weights), "B" (backward weights) or "D" (weight-gradient accumulator)."""
    unit: int
    """The unit (chunk) whose weights or gradient this is."""
    version: int
    """Weight version (number of optimizer steps before it) / update group of a gradient."""
    phase: int
    """The copy is on worker ``(t - phase) mod P`` at turn t."""
    first: int
    """First turn it is used."""
    last: int
    """Last turn it is used."""

    def holder(self, t: int, stages: int) -> int | None:
        """Worker holding the copy at turn t (None outside [first, last])."""
        return (t - self.phase) % stages if self.first <= t <= self.last else None


@dataclass
class RingPlan:
    """Compute actions per (worker, turn) and the streams they imply."""

    variant: str
    """One of VARIANTS."""
    stages: int
    """P."""
    ring: str
    """One of RINGS."""
    microbatches: int
    """N."""
    owners: tuple[int, ...]
    """owners[u]: rank holding unit u's master weights and optimizer state."""
    ops: dict[tuple[int, int], tuple[Action, ...]]
    """(worker, turn) -> compute actions in execution order."""
    update_every: int | None = None
    """Micro-batches per optimizer step (None: one step per iteration)."""
    streams: list[Stream] = field(default_factory=list)
    """Derived from ``ops`` by ``weipipe_plan``."""

    @property
    def turns(self) -> int:
        """Turns from the first to the last compute."""
        return max(t for _, t in self.ops) + 1

    def version_of(self, mb: int) -> int:
        return mb // self.update_every if self.update_every else 0

    def holdings(self, worker: int, turn: int) -> dict[str, tuple[int, ...]]:
        """The paper's circle at (worker, turn): role -> units held (lock-step positions)."""
        out: dict[str, list[int]] = {"F": [], "B": [], "D": []}
        for s in self.streams:
            if s.holder(turn, self.stages) == worker:
                out[s.role].append(s.unit)
        return {r: tuple(sorted(v)) for r, v in out.items()}


# --- compute actions per variant ----------------------------------------------------------

def _naive(P: int, n: int) -> dict:
    """Worker k, local micro-batch r, rho = t-k-2Pr: F of chunk rho (rho < P), else B of 2P-1-rho."""
    ops = {}
    for k in range(P):
        for r in range(n):
            for rho in range(2 * P):
                a = Action(Op.F, rho, k + r * P) if rho < P else Action(Op.B, 2 * P - 1 - rho, k + r * P)
                ops[(k, k + 2 * P * r + rho)] = (a,)
    return ops


def _interleave(P: int, n: int) -> dict:
    """rho = t-k: F of chunk rho mod P for micro-batch k+(rho//P)P while rho < nP, and from
    rho = P on B of chunk P-1-(rho mod P) for the previous one. B runs first in a turn (its
    gradient leaves earlier and it frees a stash before F adds one)."""
    ops = {}
    for k in range(P):
        for rho in range((n + 1) * P):
            s, lap = rho % P, rho // P
            acts = []
            if lap >= 1:
                acts.append(Action(Op.B, P - 1 - s, k + (lap - 1) * P))
            if lap < n:
                acts.append(Action(Op.F, s, k + lap * P))
            ops[(k, k + rho)] = tuple(acts)
    return ops


def _zb1(P: int, n: int) -> dict:
    """Blocks of P turns; for each pair (a, b) = (2p, 2p+1) of local micro-batches:
    block 3p: F(a) + lower half of the previous one; 3p+1: F(b) + upper half of a;
    3p+2: lower half of a + upper half of b; block 3n/2: lower half of n-1. A "half" at
    x = 2i, 2i+1 runs D then W of chunk P-1-i (upper) or P/2-1-i (lower)."""
    h = P // 2

    def bw(x: int, upper: bool, mb: int) -> Action:
        c = (P - 1 if upper else h - 1) - x // 2
        return Action(Op.W if x % 2 else Op.D, c, mb)

    ops = {}
    for k in range(P):
        for beta in range(3 * n // 2 + 1):
            p, kind = divmod(beta, 3)
            a, b = k + 2 * p * P, k + (2 * p + 1) * P
            for x in range(P):
                if beta == 3 * n // 2:
                    acts = (bw(x, False, a - P),)
                elif kind == 0:
                    acts = ((bw(x, False, a - P),) if p else ()) + (Action(Op.F, x, a),)
                elif kind == 1:
                    acts = (bw(x, True, a), Action(Op.F, x, b))
                else:
                    acts = (bw(x, False, a), bw(x, True, b))
                ops[(k, k + beta * P + x)] = acts
    return ops


def _zb2(P: int, n: int) -> dict:
    """Round R (3P turns, one micro-batch k+RP per worker): F of chunks 0..P-1, then D of
    P-1..0, then W of 0..P-1 (forward order), one chunk operation per turn."""
    ops = {}
    for k in range(P):
        for R in range(n):
            m = k + R * P
            for y in range(3 * P):
                if y < P:
                    a = Action(Op.F, y, m)
                elif y < 2 * P:
                    a = Action(Op.D, 2 * P - 1 - y, m)
                else:
                    a = Action(Op.W, y - 2 * P, m)
                ops[(k, k + 3 * P * R + y)] = (a,)
    return ops


_OPS = {"naive": _naive, "interleave": _interleave, "zb1": _zb1, "zb2": _zb2}
_ROLE = {Op.F: ("F",), Op.B: ("B", "D"), Op.D: ("B",), Op.W: ("D",)}


def weipipe_plan(config: WeiPipeConfig) -> RingPlan:
    """The compute actions and streams of one iteration (pure)."""
    P, N, v = config.stages, config.microbatches, config.variant
    owners = tuple([P - 1] * P) if v == "zb2" else tuple(range(P))
    plan = RingPlan(v, P, config.ring, N, owners, _OPS[v](P, N // P), P if v == "zb2" else None)
    uses: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for (k, t), acts in plan.ops.items():
        for a in acts:
            for role in _ROLE[a.op]:
                uses[(role, a.unit, plan.version_of(a.mb[0]))].append((k, t))
    for (role, u, ver), pos in sorted(uses.items()):
        phases = {(t - k) % P for k, t in pos}
        if len(phases) != 1:
            raise AssertionError(f"weipipe-{v}: uses of {role} u{u} v{ver} are not on one ring phase: {sorted(pos)}")
        ts = [t for _, t in pos]
        stream = Stream(role, u, ver, phases.pop(), min(ts), max(ts))
        plan.streams.append(_on_paper_ring(stream, owners[u], P) if config.ring == "paper" else stream)
    return plan


def _on_paper_ring(s: Stream, owner: int, stages: int) -> Stream:
    """The stream as the paper's circle runs it: a weight copy starts at the owner's last turn
    on its phase before the first use (or at turn 0, where the re-seed of the previous
    iteration put it); a gradient accumulator rides on to its owner after the last
    contribution. A later version (WZB2) starts where it does: the owner sends it on right
    after its OPT, one ring hop, since its owner P-1 precedes worker 0."""
    if s.role == "D":
        return Stream(s.role, s.unit, s.version, s.phase, s.first,
                      s.last + (owner - s.holder(s.last, stages)) % stages)
    if s.version:
        return s
    first = s.first - (s.holder(s.first, stages) - owner) % stages
    return Stream(s.role, s.unit, s.version, s.phase, max(first, 0), s.last)


def lockstep_makespan(plan: RingPlan, cost: object) -> float:
    """The paper's analysis model: turns in lock-step, each as long as the slowest worker's
    compute in it (``action_time``: folds and sub-blocks applied); transfers free and hidden."""
    slow: dict[int, float] = defaultdict(float)
    for (k, t), acts in plan.ops.items():
        slow[t] = max(slow[t], sum(action_time(cost.compute_time, a, k) for a in acts))
    return sum(slow.values())


# --- program assembly shared with tawpipe ---------------------------------------------------

# Stages of a slot (a turn or step) in a rank's list, in order.
SEND0, RECV, COLL0, COMPUTE, COLL1, RECV_LATE, OPT_, SEND2, FREE_ = range(9)


class SlotProgram:
    """Per-rank action lists built slot by slot; transfers are added once and placed on
    both sides so that each directed link's SENDs and RECVs are in the same order.

    Within a slot: pre-compute sends, receives of pre-compute and post-OPT sends (for the
    next slot), pre-compute collectives, computes (each followed by the sends that depend on
    it), post-compute collectives and sends, receives of post-compute sends, WAIT+OPT, sends
    after the OPT, FREEs. A transfer starts once its RECV is posted (docs/semantics.md), so the
    weights a slot needs are received before the previous slot's computes: their transfer
    overlaps those computes. Gradients sent after a compute are received after the slot's
    computes (their buffers are not held across them).
    """

    def __init__(self, num_ranks: int) -> None:
        self.items: list[list[tuple[tuple, Action]]] = [[] for _ in range(num_ranks)]
        self._seq = 0

    def add(self, rank: int, slot: int, stage: int, action: Action, sub: tuple = ()) -> None:
        self._seq += 1
        self.items[rank].append(((slot, stage) + tuple(sub) + (self._seq,), action))

    def transfer(self, slot: int, stage: int, sub: tuple, src: int, dst: int, payload: Payload, unit: int,
                 tag: int, early: bool | None = None) -> Action:
        """SEND on src at (slot, stage, *sub, unit); the RECV on dst in the slot's early or late
        receive section at (stage, *sub, src, unit): a directed link has the same order on both
        sides (FIFO matching). ``early`` None: early for pre-compute and post-OPT sends, late for
        post-compute sends; a link's transfers of one slot must all be early or all late with
        the default order kept. ``sub`` must have the same length for every transfer that
        shares ``stage``. Returns the SEND."""
        send = Action(Op.SEND, unit=unit, payload=payload, peer=dst, tag=tag)
        self.add(src, slot, stage, send, tuple(sub) + (unit,))
        if early is None:
            early = stage in (SEND0, SEND2)
        self.add(dst, slot, RECV if early else RECV_LATE,
                 Action(Op.RECV, unit=unit, payload=payload, peer=src, tag=tag), (stage,) + tuple(sub) + (src, unit))
        return send

    def build(self) -> tuple[list[list[Action]], list[dict[int, int]]]:
        """(actions per rank, per rank {slot: index of its first action})."""
        actions, starts = [], []
        for items in self.items:
            items.sort(key=lambda x: x[0])
            acts, first = [], {}
            for key, a in items:
                first.setdefault(key[0], len(acts))
                acts.append(a)
            actions.append(acts)
            starts.append(first)
        return actions, starts


def opt_with_waits(prog: SlotProgram, rank: int, slot: int, unit: int, sends: list[Action]) -> None:
    """OPT u after WAITs for the owner's sends of weight u since its previous OPT (the step
    updates the buffer they read); one WAIT per peer, for its last send (a link completes
    its messages in order)."""
    last = {a.peer: a for a in sends}
    for s in (last[p] for p in sorted(last)):
        prog.add(rank, slot, OPT_, Action(Op.WAIT, unit=s.unit, payload=s.payload, peer=s.peer, tag=s.tag,
                                          waits=Op.SEND))
    prog.add(rank, slot, OPT_, Action(Op.OPT, unit=unit))


# --- lowering ---------------------------------------------------------------------------------

def lower_ring(plan: RingPlan, name: str | None = None,
               ranks_per_node: int | None = None) -> Schedule:
    """SEND/RECV/FREE/WAIT/OPT for ``plan`` (see the module doc for the rules)."""
    P, owners = plan.stages, plan.owners
    w_streams = [s for s in plan.streams if s.role != "D"]
    d_streams = [s for s in plan.streams if s.role == "D"]
    held: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)      # (k, t) -> unit -> version
    none: dict[int, int] = {}
    for s in w_streams:
        for t in range(s.first, s.last + 1):
            k = s.holder(t, P)
            ver = held[(k, t)].setdefault(s.unit, s.version)
            if ver != s.version:
                raise AssertionError(f"worker {k} would hold two versions of u{s.unit} at turn {t}")
    dheld: dict[tuple[int, int], set[int]] = defaultdict(set)
    for s in d_streams:
        for t in range(s.first, s.last + 1):
            dheld[(s.holder(t, P), t)].add(s.unit)
    # OPT of (unit, group) on the owner: in the turn its gradient is complete there.
    opt_at: dict[tuple[int, int], int] = {}
    opt_slots: dict[int, list[int]] = defaultdict(list)
    for s in d_streams:
        slot = s.last if s.holder(s.last, P) == owners[s.unit] else s.last + 1
        opt_at[(s.unit, s.version)] = slot
        opt_slots[s.unit].append(slot)

    def version(u: int, slot: int, after_opt: bool) -> int:
        return sum(1 for x in opt_slots[u] if x < slot or (after_opt and x == slot))

    prog = SlotProgram(P)
    owner_sends: dict[int, list[tuple[tuple[int, int], Action]]] = defaultdict(list)  # unit -> ((slot, stage), SEND)
    compute_index: dict[tuple[int, int, int], int] = {}                     # (k, t, unit) -> after its last contributor
    first_index: dict[tuple[int, int, int], int] = {}                       # (k, t, unit) -> before its first one
    for (k, t), acts in plan.ops.items():
        for i, a in enumerate(acts):   # compute i at sub 3i+1: a WAIT before it at 3i, its sends after at 3i+2
            prog.add(k, t, COMPUTE, a, (3 * i + 1,))
            if a.op in LOCAL_WGRAD_OPS:
                if a.unit not in dheld.get((k, t), ()):
                    raise AssertionError(f"worker {k} contributes to u{a.unit} at turn {t} off its D stream")
                compute_index[(k, t, a.unit)] = 3 * i + 2
                first_index.setdefault((k, t, a.unit), 3 * i)
    # weights: receive unless owned or already held (same version) from the previous turn
    for (k, t), units in sorted(held.items()):
        for u, ver in sorted(units.items()):
            if k == owners[u]:
                if version(u, t, False) != ver:
                    raise AssertionError(f"owner {k} has version {version(u, t, False)} of u{u} at turn {t}, "
                                         f"needs {ver}")
                continue
            before = held.get((k, t - 1), none)
            if before.get(u) == ver:
                continue
            prev = (k - 1) % P
            if held.get((prev, t - 1), none).get(u) == ver and prev != owners[u]:
                src, stage = prev, SEND0
            else:
                if plan.ring == "paper" and t > 0 and prev != owners[u]:
                    raise AssertionError(f"paper ring: u{u} v{ver} reaches worker {k} at turn {t} off the ring")
                src = owners[u]
                if version(u, t - 1, False) == ver:
                    stage = SEND0
                elif version(u, t - 1, True) == ver:
                    stage = SEND2
                else:
                    raise AssertionError(f"owner {src} cannot seed version {ver} of u{u} for turn {t}")
            if u in before:
                raise AssertionError(f"worker {k} would receive u{u} while still using another version")
            send = prog.transfer(t - 1, stage, (0,), src, k, Payload.WEIGHT, u, t)
            if src == owners[u]:
                owner_sends[u].append(((t - 1, stage), send))
        for u in units:
            if k != owners[u] and held.get((k, t + 1), none).get(u) != units[u]:
                prog.add(k, t, FREE_, Action(Op.FREE, unit=u, payload=Payload.WEIGHT))
    # gradients: one hop per turn along the stream, then straight to the owner
    for s in d_streams:
        for t in range(s.first, s.last + 1):
            k = s.holder(t, P)
            dst = s.holder(t + 1, P) if t < s.last else owners[s.unit]
            if dst == k:
                continue
            if s.unit in dheld.get((dst, t), ()):
                raise AssertionError(f"worker {dst} would merge two gradient streams of u{s.unit} at turn {t}")
            if plan.ring == "paper":
                # after the holder's turn; the next holder adds to it only once it has arrived
                prog.transfer(t, COLL1, (0,), k, dst, Payload.WGRAD, s.unit, t + 1, early=True)
                w = first_index.get((dst, t + 1, s.unit))
                if w is not None:
                    prog.add(dst, t + 1, COMPUTE, Action(Op.WAIT, unit=s.unit, payload=Payload.WGRAD, peer=k,
                                                         tag=t + 1, waits=Op.RECV), (w,))
                continue
            sub = compute_index.get((k, t, s.unit))
            # right after the turn's last contribution; passing through: before the compute
            stage, sub = (SEND0, (1,)) if sub is None else (COMPUTE, (sub,))
            prog.transfer(t, stage, sub, k, dst, Payload.WGRAD, s.unit, t + 1)
    # optimizer steps; each first waits for the owner's sends of the version it replaces
    for u, slots in opt_slots.items():
        done = (-2, 0)
        for slot in sorted(slots):
            sends = [a for pos, a in owner_sends[u] if done <= pos < (slot, OPT_)]
            opt_with_waits(prog, owners[u], slot, u, sends)
            done = (slot, OPT_)
    actions, starts = prog.build()
    meta = {"family": name or f"weipipe-{plan.variant}", "variant": plan.variant, "ring": plan.ring, "stages": P, "chunks": 1,
            "split_backward": plan.variant in ("zb1", "zb2"), "turns": plan.turns,
            "ranks_per_node": ranks_per_node,
            "turn_start": [[st.get(t, -1) for t in range(-1, plan.turns + 1)] for st in starts]}
    if plan.update_every:
        meta["update_every"] = plan.update_every
    placement = Placement.by_microbatch([m % P for m in range(plan.microbatches)], owners)
    return Schedule(name or f"weipipe-{plan.variant}", P, P, plan.microbatches, placement, actions, meta)


# --- public builders --------------------------------------------------------------------------

def weipipe_schedule(config: WeiPipeConfig) -> Schedule:
    """The schedule of ``config`` (pure)."""
    name = f"weipipe-{config.variant}" + ("-direct" if config.ring == "direct" else "")
    return lower_ring(weipipe_plan(config), name, config.ranks_per_node)


def _builder(variant: str, fixed_ring: str | None = None):
    def build(config: PipelineConfig, *, ranks_per_node: int | None = None, ring: str = "paper") -> Schedule:
        return weipipe_schedule(WeiPipeConfig(config.stages, config.microbatches, variant, ranks_per_node,
                                              fixed_ring or ring))
    build.__name__ = f"weipipe_{variant}" + (f"_{fixed_ring}" if fixed_ring else "")
    build.__doc__ = f"WeiPipe-{variant} (see pipert.schedules.weipipe); option ring: one of RINGS."
    return build


weipipe_naive = _builder("naive")
weipipe_interleave = _builder("interleave")
weipipe_zb1 = _builder("zb1")
weipipe_zb2 = _builder("zb2")
weipipe_interleave_direct = _builder("interleave", "direct")


def ring_message_count(variant: str, stages: int, microbatches: int) -> dict[str, int]:
    """Messages of one iteration of the ``direct`` ring (closed forms of
    docs/weight_passing.md), for interleave, naive and zb2: {"weight": ..., "wgrad": ...}."""
    P, n = stages, microbatches // stages
    if variant == "zb2":
        # per round: every F copy and every B copy but B_{P-1} (kept from its F) makes P-1
        # transfers (its position on the owner P-1 is free); every D makes P-1 hops
        return {"weight": n * (P - 1) * (2 * P - 1), "wgrad": n * P * (P - 1)}
    laps = {"interleave": n, "naive": 2 * n - 1}.get(variant)
    if laps is None:
        raise ValueError(f"no closed form for weipipe-{variant}; allowed: interleave, naive, zb2")
    # each weight stream covers laps*P positions, n... of them at its owner; held-over positions:
    # F_0 after B_0, B_{P-1} after F_{P-1}, and the middle unit(s)
    f0 = max(0, laps - 2)
    mid = 2 * (laps - 1) if P % 2 == 0 else laps - 1
    weight = (P - 1) * (2 * P * laps - (f0 + laps + mid))
    return {"weight": weight, "wgrad": P * (laps * P - 1) + (P - 1)}


def _check(variant: str):
    def check(config: PipelineConfig) -> None:
        if config.chunks != 1:
            raise ValueError(f"weipipe-{variant} needs chunks == 1 (got V={config.chunks})")
        check_weipipe(variant, config.stages, config.microbatches)
    return check


_DESCRIPTIONS = {
    "naive": "WeiPipe-Naive: weights and gradients on a ring, one F or B per turn",
    "interleave": "WeiPipe-Interleave: weight ring, F of one micro-batch + B of the previous per turn",
    "zb1": "WeiPipe-zero-bubble 1: D/W split, paired backward weights/gradients on the ring",
    "zb2": "WeiPipe-zero-bubble 2: F, D, W per micro-batch; optimizer step every P micro-batches",
}
_CONSTRAINTS = {"naive": "V = 1; P >= 2; P | N", "interleave": "V = 1; P >= 2; P | N",
                "zb1": "V = 1; P even >= 2; P | N; N/P even", "zb2": "V = 1; P >= 2; P | N (update every P)"}
_RING_DOC = " (the paper's ring, turn by turn; option ring=direct: first copies from the owner)"


def _register() -> None:
    for v, fn in (("naive", weipipe_naive), ("interleave", weipipe_interleave), ("zb1", weipipe_zb1),
                  ("zb2", weipipe_zb2)):
        name = f"weipipe-{v}"
        register(name, fn, _DESCRIPTIONS[v] + _RING_DOC, split_backward=v in ("zb1", "zb2"), check=_check(v),
                 constraints=_CONSTRAINTS[v], replace=name in available())
    name = "weipipe-interleave-direct"
    register(name, weipipe_interleave_direct, "WeiPipe-Interleave, pipert's faster ring: first copies straight "
             "from the owner, finished gradients straight to it, turns not enforced", check=_check("interleave"),
             constraints=_CONSTRAINTS["interleave"], replace=name in available())


_register()
