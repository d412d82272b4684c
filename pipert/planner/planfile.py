"""A PipeMesh plan as a file: ``pipert plan --pipemesh ... --save FILE`` writes it and
``pipert train --plan FILE`` runs it.

The file (JSON) holds what the planner chose and what the runtime reads from it:

- ``P``, ``D``, ``M`` (chunks per stage), ``B`` (micro-batches per pipeline), ``q`` and the
  ``enqueue``/``dequeue`` sequences: the ``pipemesh`` schedule's shape and options;
- ``zero``: the ZeRO-3 / ZeRO-2 / ZeRO-1 shares and their runtime spec (``--zero p=..,g=..``:
  per unit, largest parameters first; ``pipert.schedules.zero_rules``), gathered ZeRO-3 copies
  kept apart for forward and backward (``--zero3-buffers 2``, the paper's separate buffers);
- ``buckets``: B_Z2, B_Z3^fwd, B_Z3^bwd, and ``units_per_chunk``, the largest of them (at least
  1): the runtime splits a chunk's collectives into one bucket per unit, each placed beside one
  pass (``pipert.schedules.pipemesh.overlap_collectives``), so every bucket the planner sized to
  one pass gets one;
- ``recompute``: the planner's recomputed operations and the runtime's recompute mode, which keeps
  an op group (``pipert.models.recompute.SAVE_GROUPS``) only if the plan recomputes none of its
  operations (never more memory than planned; ``RUNTIME_GROUP`` maps each operation);
- ``tp``: the tensor-parallel size it was planned for (with sequence parallelism when > 1).

Everything here is torch-free; ``train_settings`` gives the ``TrainConfig`` fields the plan fixes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .search import Plan

__all__ = ["FORMAT", "RUNTIME_GROUP", "runtime_recompute", "plan_document", "save_plan", "load_plan",
           "train_settings", "PLAN_FIELDS"]

FORMAT = "pipert-pipemesh-plan/1"
RUNTIME_GROUP = {"attention": "attention", "q_proj": "projection", "k_proj": "projection", "v_proj": "projection",
                 "residual1": "projection", "fc1": "projection", "gate_proj": "projection", "up_proj": "projection",
                 "gelu": "activation", "silu": "activation", "mul": "activation", "norm1": "norm", "norm2": "norm",
                 "attn_dropout": None, "mlp_dropout": None}
"""The runtime's op group of each planner operation (``pipert.planner.workload.layer_items``);
None: the runtime's models have no such operation (dropout)."""
_GROUPS = ("attention", "projection", "activation", "norm")
PLAN_FIELDS = ("schedule", "stages", "microbatches", "chunks", "dp", "options", "zero", "zero3_buffers", "recompute",
               "tp", "sp")
"""The ``TrainConfig`` fields a plan fixes."""


def _kind(name: str) -> str:
    return name.split(".", 1)[-1]


def runtime_recompute(recomputed: list[str]) -> str:
    """The runtime recompute mode of a plan that recomputes ``recomputed`` (op names, e.g.
    ``layer0.gelu``): ``none`` if no runtime group loses an operation, else ``keep:`` the groups
    none of whose operations is recomputed."""
    unknown = sorted({_kind(n) for n in recomputed} - set(RUNTIME_GROUP))
    if unknown:
        raise ValueError(f"recomputed operation(s) {unknown} have no runtime op group; known: {', '.join(RUNTIME_GROUP)}")
    dropped = {RUNTIME_GROUP[_kind(n)] for n in recomputed} - {None}
    if not dropped:
        return "none"
    return "keep:" + ",".join(g for g in _GROUPS if g not in dropped)


def plan_document(best: Plan, setting: str, tp: int) -> dict[str, Any]:
    """The file's content for the planner's ``best`` plan (made for ``setting`` at TP size ``tp``)."""
    c, q = best.components, best.queue
    sh = q.sharding
    p3 = sh.zero_param / c.params if c.params else 0.0
    p23 = max(sh.zero_grad / c.params, p3) if c.params else 0.0
    bz2 = sh.bz2 if p23 > 0 else 0                                  # buckets of traffic that exists
    bz3 = (sh.bz3_fwd, sh.bz3_bwd) if p3 > 0 else (0, 0)
    return {"format": FORMAT, "setting": setting, "schedule": "pipemesh", "tp": tp,
            "P": c.stages, "D": c.dp, "M": c.chunks, "B": c.microbatches, "q": q.q,
            "enqueue": list(q.enqueue), "dequeue": list(q.dequeue), "case": q.case,
            "zero": {"zero3": p3, "zero2": p23 - p3, "zero1": 1 - p23, "spec": f"p={p3:.4f},g={p23:.4f}",
                     "zero3_buffers": 2},
            "buckets": {"B_Z2": bz2, "B_Z3_fwd": bz3[0], "B_Z3_bwd": bz3[1], "units_per_chunk": max(1, bz2, *bz3)},
            "recompute": {"ops": best.recomputed, "runtime": runtime_recompute(best.recomputed)},
            "predicted": {"time": dict(best.time), "memory_bytes": dict(best.memory), "budget_bytes": best.budget}}


def save_plan(path: str, doc: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def _field(doc: dict, path: str, *keys: str) -> Any:
    v: Any = doc
    for k in keys:
        if not isinstance(v, dict) or k not in v:
            raise ValueError(f"--plan {path}: field {'.'.join(keys)!r} missing (write the file with "
                             f"pipert plan --pipemesh ... --save FILE)")
        v = v[k]
    return v


def _count(doc: dict, path: str, *keys: str) -> int:
    v = _field(doc, path, *keys)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"--plan {path}: {'.'.join(keys)} = {v!r}; must be a positive integer")
    return v


def load_plan(path: str) -> dict[str, Any]:
    """The plan file at ``path``, checked: its format, counts, and sequences that sum to B."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--plan {path}: no such file") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--plan {path}: not a readable JSON plan ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"--plan {path}: format {doc.get('format') if isinstance(doc, dict) else None!r}; "
                         f"allowed: {FORMAT!r} (pipert plan --pipemesh ... --save FILE)")
    for k in ("P", "D", "M", "B", "tp"):
        _count(doc, path, k)
    _count(doc, path, "buckets", "units_per_chunk")
    for k in ("enqueue", "dequeue"):
        seq = _field(doc, path, k)
        if not isinstance(seq, list) or not seq or any(isinstance(x, bool) or not isinstance(x, int) for x in seq) \
                or sum(seq) != doc["B"]:
            raise ValueError(f"--plan {path}: {k} {seq!r} must be a list of integers summing to B={doc['B']}")
    if not isinstance(_field(doc, path, "zero", "spec"), str) or not isinstance(
            _field(doc, path, "recompute", "runtime"), str):
        raise ValueError(f"--plan {path}: zero.spec and recompute.runtime must be text")
    return doc


def train_settings(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``TrainConfig`` fields (``PLAN_FIELDS``) that run ``doc``: micro-batches per step are
    B per pipeline times D; one gathered copy where no weight is ZeRO-3 (train refuses two)."""
    seq = ";".join(f"{k}={','.join(map(str, doc[k]))}" for k in ("enqueue", "dequeue"))
    return {"schedule": "pipemesh", "stages": doc["P"], "microbatches": doc["B"] * doc["D"], "chunks": doc["M"],
            "dp": doc["D"], "options": f"{seq};units_per_chunk={doc['buckets']['units_per_chunk']}",
            "zero": doc["zero"]["spec"] if doc["D"] > 1 else "0",
            "zero3_buffers": doc["zero"].get("zero3_buffers", 2) if doc["D"] > 1 and doc["zero"]["zero3"] > 0 else 1,
            "recompute": doc["recompute"]["runtime"], "tp": doc["tp"], "sp": doc["tp"] > 1}
