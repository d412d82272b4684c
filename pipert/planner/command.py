"""The ``pipert train`` (or torchrun) command of a planned layout, and why a layout has none.

A command is printed only for what ``pipert train`` runs as planned: one process per device,
process ``(d * P + p) * T + t`` (replica-major, tensor parallelism innermost: a TP group is T
consecutive devices of one node, the layout the planner priced: ``--mesh-order``'s default).
"""
from __future__ import annotations

import functools
import shlex
from dataclasses import replace
from typing import Any

from .auto import BUILD_OPTIONS, Candidate
from .layouts import family_default
from .cluster import Cluster

__all__ = ["train_argv", "not_runnable", "command_line", "runtime_models", "train_model"]

_DEFAULT_CHUNKS = {"interleaved-1f1b": 2, "zb-v": 2, "pipemesh": 2}
_TORCH_DTYPE = {1: "bfloat16", 2: "bfloat16", 4: "float32", 8: "float64"}


def not_runnable(cand: Candidate) -> str:
    """Why ``pipert train`` cannot run ``cand`` as planned ('' when it can): T > 1 runs with ``--tp``
    (and ``--sp``) whatever the family; D > 1 where ``pipert.schedules.data_parallel.replicate``
    takes the family's schedule with the candidate's ZeRO stage (tried on the family's CPU-sized
    schedule, :func:`cpu_argv`: what it refuses depends on the family, not on P or M)."""
    if cand.layout.dp == 1:
        return ""
    small, _ = _cpu_layout(cand)
    return _replica_refusal(small.family, small.stages, small.microbatches, small.chunks, cand.zero)


@functools.lru_cache(maxsize=None)
def _replica_refusal(name: str, stages: int, microbatches: int, chunks: int, zero: int) -> str:
    from ..schedules import build_schedule, family
    from ..schedules.data_parallel import replicate
    opts = {"ranks_per_node": stages} if "ranks_per_node" in (family(name).options() or ()) else {}
    try:
        replicate(build_schedule(name, stages=stages, microbatches=microbatches, chunks=chunks, **opts), 2, zero=zero)
    except ValueError as e:
        return f"--dp: {str(e).splitlines()[0]}"
    return ""


def train_argv(cand: Candidate, model: str, seq: int, dtype_bytes: int, schedule: str | None = None) -> list[str]:
    """The arguments after ``pipert train`` for ``cand`` (``schedule``: a saved schedule file run
    instead of the family's name; its file gives stages, micro-batches and chunks)."""
    lay = cand.layout
    argv = ["--schedule", schedule or lay.family]
    if schedule is None:
        argv += ["--stages", str(lay.stages)]
        if lay.family in _DEFAULT_CHUNKS:
            argv += ["--chunks", str(lay.chunks)]
    if schedule is None and lay.family in BUILD_OPTIONS:
        argv += ["--options", ";".join(f"{k}={v}" for k, v in BUILD_OPTIONS[lay.family].items())]
    if lay.dp > 1:
        argv += ["--dp", str(lay.dp)]
    if lay.tp > 1:
        argv += ["--tp", str(lay.tp)] + (["--sp"] if lay.sp else [])
    if lay.family == "tawpipe":
        argv += ["--ranks-per-node", str(lay.ranks_per_node)]
    # train's --microbatches counts every replica's; --batch-size is the global batch
    argv += ["--microbatches", str(lay.microbatches * lay.dp),
             "--batch-size", str(lay.microbatches * lay.dp * lay.micro_batch), "--seq", str(seq),
             "--model", model, "--dtype", _TORCH_DTYPE.get(dtype_bytes, "bfloat16")]
    if cand.zero:
        argv += ["--zero", str(cand.zero)]
    # train recomputes as the generator's ``recompute`` default says (helixpipe-2fold: no_attention)
    if cand.recompute != family_default(lay.family, "recompute", "none"):
        argv += ["--recompute", cand.recompute]
    return argv


def command_line(argv: list[str], cluster: Cluster) -> str:
    """``pipert train ...`` on one node, else one torchrun per node meeting at the first node."""
    args = shlex.join(argv)
    if cluster.nodes == 1:
        return f"pipert train {args}"
    return (f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint HEAD:29500 -m pipert.cli train {args}")


@functools.lru_cache(maxsize=None)
def runtime_models() -> tuple[str, ...]:
    """The model presets of ``pipert train`` (``pipert.presets``, which imports no torch)."""
    from ..presets import model_names
    return tuple(model_names())


def train_model(name: str, spec: Any) -> str | None:
    """What ``pipert train --model`` takes for the planned model ``name`` of sizes ``spec``: the name
    where it is a train preset of those sizes (plan's ``tiny`` is not train's); else the train preset
    of the same sizes (layers, widths, heads, vocabulary, GPT or LLaMA shape, positions for
    ``spec.seq``); else, for a LLaMA-shaped model,
    its sizes (``pipert.presets.SIZES``); else None (no model of train's is that one)."""
    models = runtime_models()
    from ..presets import GPTConfig, model_config
    shape = (spec.layers, spec.hidden, spec.ffn, spec.heads, spec.kv_heads, spec.vocab)
    llama = spec.gated_mlp and not spec.positions and not spec.dropout and not spec.tied_embedding
    for other in sorted(models, key=lambda m: m != name):  # the same name first, if its sizes agree
        c = model_config(other)
        gpt = isinstance(c, GPTConfig)
        if (c.layers, c.hidden, c.ffn, c.heads, getattr(c, "kv_heads", c.heads), c.vocab) == shape and \
                c.max_seq >= spec.seq and (not gpt if llama else gpt and spec.positions and not spec.gated_mlp):
            return other
    if not llama:
        return None
    return (f"layers={spec.layers},hidden={spec.hidden},heads={spec.heads},kv_heads={spec.kv_heads},"
            f"ffn={spec.ffn},vocab={spec.vocab},max_seq={spec.seq}")


CPU_SCALE = {"model": "tiny", "seq": 16, "stages": 2, "dp": 2, "dtype_bytes": 4}
"""What a layout keeps when scaled down to a CPU host: its family, chunks, ZeRO stage, recomputation
and generator options; P = 2, D = min(D, 2), T = 1, b = 1, the fewest micro-batches its family
accepts (at least 2P), ``pipert train``'s tiny model at sequence 16 in float32, on gloo."""


def cpu_argv(cand: Candidate) -> list[str]:
    """The arguments after ``pipert train`` that run ``cand``'s schedule family and options scaled
    down to a CPU host (:data:`CPU_SCALE`): P x D processes of the tiny model, one or two steps'
    worth of seconds."""
    small, zero = _cpu_layout(cand)
    s = CPU_SCALE
    return train_argv(replace(cand, layout=small, zero=zero), s["model"], s["seq"], s["dtype_bytes"]) + \
        ["--backend", "gloo"]


def _cpu_layout(cand: Candidate) -> tuple[Any, int]:
    """(``cand``'s layout scaled down as :data:`CPU_SCALE` says, its ZeRO stage there)."""
    from ..schedules import PipelineConfig, family
    from ..scenario import LAYER_PER_CHUNK
    lay, s = cand.layout, CPU_SCALE
    p, d = s["stages"], min(lay.dp, s["dp"])
    v = 2 if lay.family in LAYER_PER_CHUNK else min(lay.chunks, 2)
    fam = family(lay.family)
    m = next(m for m in (2 * p, 4 * p, 8 * p, 16 * p) if fam.accepts(PipelineConfig(p, m, v)))
    small = replace(lay, stages=p, dp=d, tp=1, sp=False, chunks=v, microbatches=m, micro_batch=1,
                    ranks_per_node=p, dcs=1)
    return small, cand.zero if d > 1 else 0
