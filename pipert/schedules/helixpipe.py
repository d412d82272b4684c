"""HelixPipe (Zhang et al.): attention-parallel partition with a (two-fold) FILO order.

Units (``partition(model, cut="helix")``), for L = P·V layers (V = ``chunks`` = layers per stage):
``[C(0), A(0), C(1), A(1), ..., A(L-1), C(L)]``, unit ``2l`` = C(l), ``2l+1`` = A(l), ``2L`` = C(L).
C(l) = post(l-1) + pre(l) (embedding in C(0); final norm, head and loss in C(L)); A(l) = the QKV
projection and the attention core of layer l.

Micro-batch i has group ``g = i // (P·F)``, offset ``d = (i mod P·F) // F`` and fold ``f = i mod F``:
the F micro-batches of one op are consecutive (``F u3 m0,1``) and share their offset.

Placement (a table): C(l) runs on and owns stage ``l mod P`` (C(L) on stage 0, as P | L);
A(l) of offset d runs on stage ``(l + d + 1) mod P``; its weights (the QKV projection) are
owned by C(l)'s stage. Per stage, the forward order is the authors' (docs/helixpipe.md,
"Per-stage order"), one group after the other; the backward is the exact reverse of the
whole forward list (first in, last out), as full backwards B.

The paper's configuration is the default of ``helixpipe-2fold`` (``PAPER_DEFAULTS``): asynchronous
two-fold (``expand_folds``: one compute and one message per micro-batch, each message leaving as
soon as its own compute ends), recomputation without attention inside the units and the loss in
the backward of C(L) (the LM head and cross-entropy run in its B, so its F ends at the final norm
and the logits are never stashed). The three are recorded in ``meta`` (``asynchronous``,
``recompute``, ``loss_in_backward``), where the cost models and ``pipert train`` read them; the
options of the same names opt out.

Transfers: activations from ``lower`` (the residual travels with the norm output to A(l) and
back with the attention output: it is relayed through the attention stage); a stage that
computes A(l) without owning it receives its weights once per step (posted ``P`` computes
ahead), accumulates its weight gradient over all its micro-batches, sends it to the owner
after its last backward of A(l) and frees the weights.
"""
from __future__ import annotations

from ..ir import Action, Op, Payload, Placement, Schedule, add_optimizer_steps, lower
from ..ir.passes import expand_folds, post_receives_early
from .registry import PipelineConfig, available, register

__all__ = ["PAPER_DEFAULTS", "RECOMPUTE_NAMES", "helix_forward_order", "helix_placement", "helixpipe_schedule", "check_helixpipe", "helixpipe",
           "helixpipe_2fold", "helix_unit", "helix_offset"]


RECOMPUTE_NAMES = ("none", "no_attention", "full")
"""The units' recompute modes (the keys of ``pipert.models.recompute.RECOMPUTE_MODES``, named here
without importing torch)."""

PAPER_DEFAULTS = {
    "helixpipe": dict(folds=1, asynchronous=False, recompute="none", loss_in_backward=False),
    "helixpipe-2fold": dict(folds=2, asynchronous=True, recompute="no_attention", loss_in_backward=True),
}
"""Each family's default options: ``helixpipe-2fold`` runs as the paper's experiments do (two-fold,
asynchronous, recomputation without attention, loss in the backward); ``helixpipe`` is the naive
FILO of the paper's Table 2 (one micro-batch per op, nothing recomputed)."""


def helix_unit(kind: str, layer: int) -> int:
    """Unit index of C(layer) (``kind="C"``) or A(layer) (``kind="A"``)."""
    return 2 * layer + (1 if kind == "A" else 0)


def helix_offset(mb: int, stages: int, folds: int) -> int:
    """The offset d of micro-batch ``mb`` inside its group of ``stages * folds``."""
    return (mb % (stages * folds)) // folds


def check_helixpipe(name: str, stages: int, microbatches: int, chunks: int, folds: int) -> None:
    """ValueError naming the value and what is allowed."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 1:
        raise ValueError(f"{name}: folds must be a positive integer (micro-batches per op), got {folds!r}")
    if stages < 2:
        raise ValueError(f"{name} needs stages >= 2 (attention moves to other stages), got P={stages}")
    group = stages * folds
    if microbatches % group:
        lo = max(group, microbatches // group * group)
        hi = (microbatches // group + 1) * group
        allowed = f"{lo}, {hi}" if lo != hi else f"{lo}, {lo + group}"
        raise ValueError(f"{name} runs micro-batches in groups of P*F = {stages}*{folds} = {group} (one attention "
                         f"offset per stage, F per op), so microbatches must be a multiple of {group}; got "
                         f"M={microbatches}; nearest allowed: {allowed}")
    if chunks < 1:
        raise ValueError(f"{name}: chunks (layers per stage) must be >= 1, got V={chunks}")


def helix_forward_order(rank: int, stages: int, layers: int) -> list[tuple[str, int, int]]:
    """Forward ops of one group on ``rank`` as (kind "C"/"A", layer, offset d), the authors'
    order (``attn_pipe_schedule.py``); each op runs all F folds of its offset."""
    p, r, L = stages, rank, layers
    out: list[tuple[str, int, int]] = []
    if r == 0:
        out.append(("C", 0, 0))
    for d in range(r - 1, -1, -1):                       # warm-up
        out.append(("A", r - 1 - d, d))
        if d == 0:
            out.append(("C", r, 0))
    for k in range(L // p):
        if k:
            for d in range(p - 2, -1, -1):
                out.append(("A", k * p + r - d - 1, d))
                if d == 0:
                    out.append(("C", k * p + r, 0))
        for d in range(1, p):
            out.append(("C", k * p + r, d))
            if d == p - 1:
                out.append(("A", k * p + r, p - 1))
    for d in range(p - 2, r - 1, -1):                    # cool-down
        out.append(("A", L + r - d - 1, d))
        if d == 0:
            out.append(("C", L, 0))
    if r == 0:
        out.extend(("C", L, d) for d in range(1, p))
    return out


def helix_placement(stages: int, layers: int, microbatches: int, folds: int) -> Placement:
    """Table placement: C(l) on ``l mod P``, A(l) of offset d on ``(l + d + 1) mod P``; every
    unit's weights owned by ``l mod P`` (A(l)'s QKV weights by C(l)'s stage)."""
    rows, owners = [], []
    for u in range(2 * layers + 1):
        l, is_attn = divmod(u, 2)
        rows.append(tuple((l + helix_offset(i, stages, folds) + 1) % stages if is_attn else l % stages
                          for i in range(microbatches)))
        owners.append(l % stages)
    return Placement("table", tuple(rows), tuple(owners))


def _free_received_weights(s: Schedule) -> Schedule:
    """``FREE weight u`` right after a rank returns its gradient of a unit it does not own."""
    out = []
    for acts in s.actions:
        new = []
        for a in acts:
            new.append(a)
            if a.op is Op.SEND and a.payload is Payload.WGRAD:
                new.append(Action(Op.FREE, unit=a.unit, payload=Payload.WEIGHT))
        out.append(new)
    return s.with_actions(out)


def helixpipe_schedule(stages: int, microbatches: int, chunks: int = 1, folds: int = 1,
                       name: str | None = None, *, asynchronous: bool = False, recompute: str = "none",
                       loss_in_backward: bool = False) -> Schedule:
    """The HelixPipe schedule: ``stages`` P, ``microbatches`` M (a multiple of P·F),
    ``chunks`` V layers per stage (L = P·V), ``folds`` F micro-batches per op (pure).
    ``asynchronous``: each fold's compute and message its own action (``expand_folds``);
    ``recompute`` (the units' mode) and ``loss_in_backward`` are recorded in ``meta``."""
    name = name or ("helixpipe" if folds == 1 else "helixpipe-2fold")
    check_helixpipe(name, stages, microbatches, chunks, folds)
    for flag, value in (("asynchronous", asynchronous), ("loss_in_backward", loss_in_backward)):
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise ValueError(f"{name}: option {flag} must be 0 or 1 (true or false), got {value!r}")
    if recompute not in RECOMPUTE_NAMES:
        raise ValueError(f"{name}: option recompute={recompute!r} unknown; allowed: {', '.join(RECOMPUTE_NAMES)}")
    p, F, L = stages, folds, stages * chunks
    groups = microbatches // (p * F)
    compute: list[list[Action]] = []
    for r in range(p):
        fwd = [Action(Op.F, helix_unit(kind, l), tuple(g * p * F + d * F + f for f in range(F)))
               for g in range(groups) for kind, l, d in helix_forward_order(r, p, L)]
        compute.append(fwd + [Action(Op.B, a.unit, a.mb) for a in reversed(fwd)])
    placement = helix_placement(p, L, microbatches, F)
    meta = {"family": name, "stages": p, "chunks": chunks, "split_backward": False, "folds": F, "layers": L,
            "cut": "helix", "asynchronous": bool(asynchronous and F > 1), "recompute": recompute,
            "loss_in_backward": bool(loss_in_backward)}
    s = lower(name, p, 2 * L + 1, microbatches, placement, add_optimizer_steps(compute, placement), meta,
              weights=True)
    s = post_receives_early(_free_received_weights(s), p, payloads=(Payload.WEIGHT,))
    return expand_folds(s) if meta["asynchronous"] else s


def _builder(family_name: str):
    d = PAPER_DEFAULTS[family_name]

    def build(config: PipelineConfig, *, folds: int = d["folds"], asynchronous: bool = d["asynchronous"],
              recompute: str = d["recompute"], loss_in_backward: bool = d["loss_in_backward"]) -> Schedule:
        return helixpipe_schedule(config.stages, config.microbatches, config.chunks, folds, family_name,
                                  asynchronous=asynchronous, recompute=recompute, loss_in_backward=loss_in_backward)
    build.__name__ = family_name.replace("-", "_")
    build.__doc__ = f"{family_name}: HelixPipe, by default {d}."
    return build


helixpipe = _builder("helixpipe")
helixpipe_2fold = _builder("helixpipe-2fold")


def _check(family_name: str):
    """What holds for every fold count (the build checks M against its own F)."""
    def check(config: PipelineConfig) -> None:
        check_helixpipe(family_name, config.stages, config.microbatches, config.chunks, 1)
    return check


def _register() -> None:
    for fname, fn, F, desc in (
            ("helixpipe", helixpipe, 1, "HelixPipe: attention of each layer spread over the stages, FILO order"),
            ("helixpipe-2fold", helixpipe_2fold, 2,
             "HelixPipe two-fold FILO as the paper runs it: two micro-batches per op, asynchronous, recompute "
             "without attention, loss in backward (options folds, asynchronous, recompute, loss_in_backward)")):
        register(fname, fn, desc, max_chunks=None, check=_check(fname),
                 constraints=f"P >= 2; L = P*V layers; F*P | M (folds=F, default {F})", replace=fname in available())


_register()
