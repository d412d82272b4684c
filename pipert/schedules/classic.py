"""Classic activation-passing schedules: GPipe, 1F1B and Megatron's interleaved 1F1B.

Units are chunks of layers, ``U = P*V``. GPipe and 1F1B have V = 1 and put unit u on
rank u. Interleaved 1F1B puts unit u on rank ``u mod P`` (Megatron's looping placement),
so rank i holds units ``i, i+P, ..., i+(V-1)P``.

Each generator emits per-rank compute orders and hands them to :func:`assemble`, which
adds the optimizer steps and lowers the transfers.
"""
from __future__ import annotations

from ..ir import Action, Op, Schedule
from ..ir.action import compute_action
from .registry import PipelineConfig, assemble, require_chunks

__all__ = ["gpipe", "one_f_one_b", "interleaved_1f1b", "check_gpipe", "check_1f1b", "check_interleaved",
           "interleaved_table", "group_sizes"]


def check_gpipe(config: PipelineConfig) -> None:
    """GPipe runs any M >= 1 with one chunk per rank."""
    require_chunks("gpipe", config, 1, 1)


def check_1f1b(config: PipelineConfig) -> None:
    """1F1B runs any M >= 1 (M < P just shortens the warm-up) with one chunk per rank."""
    require_chunks("1f1b", config, 1, 1)


def check_interleaved(config: PipelineConfig) -> None:
    """Interleaved 1F1B needs V >= 2 (V = 1 is plain 1F1B); it runs any M >= 1."""
    require_chunks("interleaved-1f1b", config, 2, None)


def gpipe(config: PipelineConfig) -> Schedule:
    """All forwards, then all backwards (in micro-batch order) on every rank."""
    check_gpipe(config)
    p, m = config.stages, config.microbatches
    orders = [[Action(Op.F, i, k) for k in range(m)] + [Action(Op.B, i, k) for k in range(m)] for i in range(p)]
    return assemble("gpipe", config, list(range(p)), orders, split_backward=False)


def one_f_one_b(config: PipelineConfig) -> Schedule:
    """PipeDream-flush 1F1B: rank i runs min(P-1-i, M) warm-up forwards, then alternates
    one forward and one backward, then drains the remaining backwards.

    Invariant: rank i never holds more than min(P-i, M) micro-batches' stashes.
    """
    check_1f1b(config)
    p, m = config.stages, config.microbatches
    F, B = Op.F, Op.B
    orders = []
    for i in range(p):
        warm = min(p - 1 - i, m)
        fwd = [compute_action(F, i, (k,)) for k in range(m)]
        bwd = [compute_action(B, i, (k,)) for k in range(m)]
        steady = m - warm
        acts = fwd[:warm] + [None] * (2 * steady) + bwd[steady:]
        acts[warm:warm + 2 * steady:2] = fwd[warm:]    # F of micro-batch warm + k, then B of k
        acts[warm + 1:warm + 2 * steady:2] = bwd[:steady]
        orders.append(acts)
    return assemble("1f1b", config, list(range(p)), orders, split_backward=False)


def group_sizes(stages: int, microbatches: int) -> list[int]:
    """Micro-batches per group: torch's rounds (``max(1, M // P)`` groups) as equal as they can
    be, larger groups first. P when P divides M (Megatron), one group of M when M < 2P."""
    rounds = max(1, microbatches // stages)
    return [microbatches // rounds + (1 if k < microbatches % rounds else 0) for k in range(rounds)]


def interleaved_table(stages: int, microbatches: int, chunks: int) -> list[tuple[int, int]]:
    """Megatron's (micro-batch, chunk) order of the forwards on every rank.

    Micro-batches form consecutive groups (:func:`group_sizes`); within a group the rank runs
    chunk 0 for every micro-batch of the group, then chunk 1, and so on. The backwards follow
    the same table with chunk c replaced by V-1-c.
    """
    out, start = [], 0
    for g in group_sizes(stages, microbatches):
        out += [(mb, c) for c in range(chunks) for mb in range(start, start + g)]
        start += g
    return out


def interleaved_1f1b(config: PipelineConfig) -> Schedule:
    """Megatron-LM interleaved 1F1B (Narayanan et al. 2021).

    Rank i runs ``min(2(P-1-i) + (V-1)g, M*V)`` warm-up forwards (g: the first group's size
    of :func:`group_sizes`, P when P divides M), then alternates the next forward with the next
    backward of :func:`interleaved_table`, then drains the backwards. Chunk c of rank i is unit
    ``c*P + i``. Every M >= 1 gives a valid program (receives on different links never wait for
    each other, docs/semantics.md); ``tests/unit/test_schedules.py`` checks a range of P, M, V.
    """
    check_interleaved(config)
    p, m, v = config.stages, config.microbatches, config.chunks
    table = interleaved_table(p, m, v)
    g = group_sizes(p, m)[0]
    total = m * v
    orders = []
    for i in range(p):
        fwd = [Action(Op.F, c * p + i, mb) for mb, c in table]
        bwd = [Action(Op.B, (v - 1 - c) * p + i, mb) for mb, c in table]
        warm = min(2 * (p - 1 - i) + (v - 1) * g, total)
        acts = fwd[:warm]
        for k in range(total - warm):
            acts += [fwd[warm + k], bwd[k]]
        acts += bwd[total - warm:]
        orders.append(acts)
    unit_ranks = [u % p for u in range(p * v)]
    return assemble("interleaved-1f1b", config, unit_ranks, orders, split_backward=False)
