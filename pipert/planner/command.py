"""The ``pipert train`` (or torchrun) command of a planned layout, and why a layout has none.

A command is printed only for what ``pipert train`` runs as planned: one process per device,
process ``(d * P + p) * T + t`` (replica-major, tensor parallelism innermost: a TP group is T
consecutive devices of one node, the layout the planner priced: ``--mesh-order``'s default).
"""
from __future__ import annotations

import shlex

from .auto import BUILD_OPTIONS, Candidate, family_default
from .cluster import Cluster

__all__ = ["train_argv", "not_runnable", "command_line", "runtime_models"]

_DEFAULT_CHUNKS = {"interleaved-1f1b": 2, "zb-v": 2, "pipemesh": 2}
_TORCH_DTYPE = {1: "bfloat16", 2: "bfloat16", 4: "float32", 8: "float64"}


def not_runnable(cand: Candidate) -> str:
    """Why ``pipert train`` cannot run ``cand`` as planned ('' when it can). Every layout the search
    makes runs: T > 1 with ``--tp`` (and ``--sp`` where the layout uses it), whatever the family."""
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


def runtime_models() -> list[str] | None:
    """The model presets of ``pipert train`` (None where torch is missing)."""
    try:
        from ..models import model_names
    except ImportError:
        return None
    return list(model_names())
