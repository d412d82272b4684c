"""Selective activation recomputation: a unit keeps the outputs of the ops it is told to save
and recomputes everything else in backward.

Built on PyTorch's selective activation checkpointing: ``torch.utils.checkpoint.checkpoint``
(non-reentrant) with ``create_selective_checkpoint_contexts`` and a policy that answers
``MUST_SAVE`` for the ops of the named groups below and ``PREFER_RECOMPUTE`` for the rest.
A region may be differentiated by several backward passes (D then W): each recomputes
the region's forward again (W costs one more recomputation).

Op groups (``SAVE_GROUPS``; an op is matched by its schema name, all overloads):

    attention   the fused scaled-dot-product attention kernels; they return the attention
                output and the softmax statistics (logsumexp), which is what is kept
    projection  matrix products (aten mm, addmm, bmm): linear layers
    activation  GeLU and SiLU outputs
    norm        LayerNorm (output and statistics); RMSNorm's inverse rms (its statistic)

Recompute modes (``RECOMPUTE_MODES``) name the sets a run can select:
``none`` (no checkpoint: autograd saves what it saves), ``no_attention`` (HelixPipe: keep
``{"attention"}``), ``full`` (keep nothing; the unit's inputs only).

What a checkpointed region holds between forward and backward: its inputs (kept by the
checkpoint for the recomputation) and the cached outputs of the saved ops. The cached outputs
are outside autograd's saved-tensor hooks; ``collect_caches`` hands them to a meter
(``pipert.models.memory``).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

__all__ = ["stochastic", "SAVE_GROUPS", "RECOMPUTE_MODES", "KEEP_PREFIX", "save_set", "recompute_save_set",
           "units_recompute", "save_policy",
           "selective_context", "selective_checkpoint", "collect_caches", "cached_tensors", "selective_recompute"]

SAVE_GROUPS: dict[str, frozenset[str]] = {
    "attention": frozenset({
        "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
        "flash_attn::_flash_attn_forward"}),
    "projection": frozenset({"aten::mm", "aten::addmm", "aten::bmm"}),
    "activation": frozenset({"aten::gelu", "aten::silu"}),
    "norm": frozenset({"aten::native_layer_norm", "aten::rsqrt"}),
}

RECOMPUTE_MODES: dict[str, frozenset[str] | None] = {
    "none": None,
    "no_attention": frozenset({"attention"}),
    "full": frozenset(),
}

_local = threading.local()


def save_set(save: Iterable[str]) -> frozenset[str]:
    """The group names of ``save``, checked against ``SAVE_GROUPS``."""
    names = frozenset(save)
    bad = sorted(names - set(SAVE_GROUPS))
    if bad:
        raise ValueError(f"unknown op group(s) to save {bad}; allowed: {', '.join(SAVE_GROUPS)}")
    return names


KEEP_PREFIX = "keep:"
"""A recompute mode ``keep:GROUP,...`` keeps the named ``SAVE_GROUPS`` and recomputes the rest
(``keep:`` alone: the unit's inputs only, as ``full``); a PipeMesh plan's recomputation set
reaches the runtime this way (``pipert.planner.planfile``)."""


def recompute_save_set(mode: str) -> frozenset[str] | None:
    """The op groups recompute mode ``mode`` keeps (None: no recomputation)."""
    if isinstance(mode, str) and mode.startswith(KEEP_PREFIX):
        groups = [g.strip() for g in mode[len(KEEP_PREFIX):].split(",") if g.strip()]
        try:
            return save_set(groups)
        except ValueError as e:
            raise ValueError(f"recompute={mode!r}: {e}") from None
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={mode!r}; allowed: {', '.join(RECOMPUTE_MODES)}, or {KEEP_PREFIX}GROUP,... "
                         f"with groups of {', '.join(SAVE_GROUPS)}")
    return RECOMPUTE_MODES[mode]


def units_recompute(given: str | None, meta: Any) -> str:
    """The recompute mode to build a program's units with: ``given`` (``--recompute``), else the
    one its schedule records (``meta["recompute"]``: helixpipe-2fold's paper default), else none.
    A program that rebuilds each stash with RECOMPUTE actions (``meta["recompute_ops"] == "full"``:
    CrossPipe's recompute="full") gets units that keep their whole graph, unless ``given`` names
    another mode."""
    if meta.get("recompute_ops") == "full" and given in (None, "", "full"):
        return "none"
    mode = given or meta.get("recompute") or "none"
    recompute_save_set(mode)
    return mode


def _op_name(op: Any) -> str:
    schema = getattr(op, "_schema", None)
    return schema.name if schema is not None else str(op)


@functools.cache
def save_policy(save: frozenset[str]) -> Callable[..., CheckpointPolicy]:
    """The selective-checkpoint policy that saves the outputs of the ops in groups ``save``."""
    ops = frozenset().union(*(SAVE_GROUPS[g] for g in save_set(save)))

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if _op_name(op) in ops else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


class _Replayable:
    """The recompute context of a selective region, re-enterable by several backward passes.

    PyTorch's cached mode consumes each saved output at its first recomputation, so a second
    backward through the region (the W pass after the D pass of a zero-bubble split) would fail.
    The first entry snapshots the cache (references, no copies); every later entry restores it.
    The snapshot lives as long as the region's graph does."""

    def __init__(self, cached: Any, storage: dict) -> None:
        self.cached, self.storage, self.snapshot = cached, storage, None

    def __enter__(self) -> Any:
        if self.snapshot is None:
            self.snapshot = {k: dict(v) for k, v in self.storage.items()}
        else:
            for k, v in self.snapshot.items():
                self.storage[k] = dict(v)
        return self.cached.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.cached.__exit__(*exc)


def selective_context(save: Iterable[str]) -> Callable[[], tuple[Any, Any]]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` keeping the op groups ``save``;
    the cache of every region it opens is reported to the innermost ``collect_caches``."""
    policy = save_policy(save_set(save))

    def context_fn() -> tuple[Any, Any]:
        caching, cached = create_selective_checkpoint_contexts(policy)
        stack = getattr(_local, "collectors", None)
        if stack:
            stack[-1].append(caching.storage)
        return caching, _Replayable(cached, caching.storage)
    return context_fn


def selective_checkpoint(fn: Callable[..., Any], *args: Any, save: Iterable[str], rng: bool | None = None) -> Any:
    """``fn(*args)`` keeping only the outputs of the op groups ``save`` (and the inputs) for
    backward; everything else is recomputed when backward first needs it.

    ``rng``: whether the recomputation must replay the random numbers of the forward (None: when
    ``fn`` is a module's method and the module draws random numbers, see :func:`stochastic`).
    A deterministic region does not save and restore the generator's state: besides its cost,
    torch's get/set of that state deadlocks when two threads of one process do it at once (the
    generator's mutex against the GIL), which ranks run as threads (the local backend) would."""
    if rng is None:
        rng = _replays_rng(fn)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=selective_context(save), preserve_rng_state=rng)


def _replays_rng(fn: Callable[..., Any]) -> bool:
    """A region running ``fn`` replays the generator unless ``fn`` is a deterministic module's method."""
    owner = getattr(fn, "__self__", None)
    return stochastic(owner) if isinstance(owner, nn.Module) else True


def stochastic(module: nn.Module) -> bool:
    """Whether ``module`` draws random numbers in its forward (a dropout with p > 0 in training
    mode); pipert's built-in models do not."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training for m in module.modules())


@contextlib.contextmanager
def collect_caches(into: list) -> Iterator[list]:
    """Append to ``into`` the cache (a dict) of every selective region opened in the block."""
    stack = _local.__dict__.setdefault("collectors", [])
    stack.append(into)
    try:
        yield into
    finally:
        stack.pop()


def cached_tensors(caches: Iterable[dict]) -> list[Tensor]:
    """The tensors the caches still hold (a cache entry is dropped once backward consumed it)."""
    out: list[Tensor] = []

    def visit(v: Any) -> None:
        if isinstance(v, (tuple, list)):
            for x in v:
                visit(x)
        elif isinstance(getattr(v, "val", None), Tensor):
            out.append(v.val)
    for cache in caches:
        for per_op in list(cache.values()):
            for entry in list(per_op.values()):
                visit(entry)
    return out


class _Checkpointed:
    """A unit's own forward run as a selective region (deep copies follow the module they are
    copied with: the bound forward is rebound to the copy; picklable for spawned ranks).

    ``relays`` (the unit's, ``pipert.exec.unit``): input i returned unchanged as output j.
    A relayed input stays outside the region: the region sees a zero-byte placeholder of its
    shape in its place (the forward only passes it through), and the real input is put back
    as output j, so the region neither keeps nor recomputes it."""

    def __init__(self, forward: Callable[..., Any], save: frozenset[str], relays: dict[int, int] | None = None) -> None:
        self.forward = forward
        self.save = save
        self.relays = dict(relays or {})

    def __call__(self, *args: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing is saved, nothing to recompute
            return self.forward(*args)
        if not self.relays:
            return selective_checkpoint(self.forward, *args, save=self.save)
        return self._relaying(*args)

    def _relaying(self, xs: tuple[Tensor, ...]) -> Any:
        relays, forward = self.relays, self.forward
        if not isinstance(xs, tuple) or max(relays) >= len(xs):
            raise TypeError(f"a unit with relays {relays} takes one tuple of at least {max(relays) + 1} tensors; "
                            f"got {type(xs).__name__}")
        stand_in = {i: xs[i].detach().new_zeros(()).expand(xs[i].shape) for i in relays}
        rest = [t for i, t in enumerate(xs) if i not in relays]

        def region(*others: Tensor) -> Any:
            it = iter(others)
            return forward(tuple(stand_in[i] if i in stand_in else next(it) for i in range(len(stand_in) + len(others))))

        outs = list(selective_checkpoint(region, *rest, save=self.save, rng=_replays_rng(forward)))
        for i, j in relays.items():
            outs[j] = xs[i]
        return tuple(outs)


def selective_recompute(unit: nn.Module, save: Iterable[str]) -> nn.Module:
    """``unit`` (returned, changed in place) with its whole forward one selective region keeping
    the op groups ``save``: for any unit of a partition, whatever model it was cut from; its
    parameters and their names are unchanged. Inputs the unit relays (``relays``) pass around
    the region: neither kept nor recomputed."""
    groups = save_set(save)
    forward = unit.forward.forward if isinstance(unit.forward, _Checkpointed) else unit.forward
    unit.forward = _Checkpointed(forward, groups, getattr(unit, "relays", None))
    return unit
