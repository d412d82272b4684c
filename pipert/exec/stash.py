"""Saved tensors of every stash, held through autograd's saved-tensor hooks.

While a unit's forward (or RECOMPUTE) runs inside :meth:`StashLedger.capture`, every tensor
autograd saves for its backward is packed into a :class:`_Held` that this ledger tracks, keyed
by the (unit, micro-batch) of the stash. That gives, at any time:

- the live bytes of each stash (the holders autograd still references; a freed graph drops them),
  counted once per storage within a stash, parameters and module buffers excluded;
- OFFLOAD/PREFETCH of a stash: the held tensors move to host buffers and back (backward reads
  them through ``unpack``; reading an offloaded stash raises).

Selective-recompute regions (``pipert.models.recompute``) keep the outputs of the ops they save in
their own cache, outside the hooks; the ledger collects those caches per stash and counts their
live tensors too (they stay on the device: OFFLOAD moves only what the hooks packed).

Parameters are never packed into holders (they are the unit's weights, not its activations);
they are saved as detached aliases, so a graph keeps the weights it was built with even when the
parameter is rebound to new storage afterwards. The exception are the parameters ``by_reference``
names for the unit being captured (a ZeRO-3 unit's, whose values do not change within a step):
they are saved as a :class:`_ParamView` of the parameter, resolved against its storage when the
backward reads it, so a FREE of the gathered weights frees them while stashes are alive, and the
next ALLGATHER's buffer is what the backward reads.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from ..device.tensors import tensor_key
from ..ir.action import Action, Op, Payload
from ..ir.semantics import UNIT_COMPUTE_OPS

__all__ = ["StashLedger", "hooked_units"]


class _Held:
    """One saved tensor; ``tensor`` is None while offloaded (``host`` holds it then)."""

    __slots__ = ("tensor", "host", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.host: Any = None


class _ParamView:
    """A saved view of a parameter, kept as (parameter, shape, strides, offset in the parameter)."""

    __slots__ = ("param", "shape", "stride", "offset")

    def __init__(self, param: torch.Tensor, t: torch.Tensor) -> None:
        self.param, self.shape, self.stride = param, t.shape, t.stride()
        self.offset = t.storage_offset() - param.storage_offset()

    def resolve(self) -> torch.Tensor:
        base = self.param.detach()
        return base.as_strided(self.shape, self.stride, base.storage_offset() + self.offset)


def _region(t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The bytes a view spans, as a uint8 tensor, and their identity (device, first byte, bytes)."""
    es = t.element_size()
    span = (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * es if t.numel() else 0
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage(), t.storage_offset() * es,
                                                                  (span,), (1,))
    return raw, (t.device.type, t.device.index, t.data_ptr(), span)


def hooked_units(actions: Sequence[Action]) -> set[int]:
    """Units whose stashes a rank running ``actions`` must hold through the saved-tensor hooks:
    those whose weights can be rebound, or whose stash moves, while one of their stashes is alive.
    That is a unit with an action carrying its weights or its stash (a received weight, a FREE,
    OFFLOAD or PREFETCH, a ZeRO gather) or with a compute after an OPT of it (an OPT may rebind
    its weights: mixed precision). The graph of any other unit saves its weights as they are."""
    hooked: set[int] = set()
    stepped: set[int] = set()
    every = False   # an OPT without a unit steps them all
    for a in actions:
        if a.op is Op.OPT:
            every = every or a.unit is None
            if a.unit is not None:
                stepped.add(a.unit)
        elif a.unit is None:
            continue
        elif a.payload is Payload.WEIGHT or a.payload is Payload.STASH:
            hooked.add(a.unit)
        elif a.op in UNIT_COMPUTE_OPS and (every or a.unit in stepped):
            hooked.add(a.unit)
    return hooked


class StashLedger:
    """Holders of saved tensors per (unit, micro-batch); see the module doc."""

    def __init__(self, excluded: Callable[[], list[torch.Tensor]],
                 by_reference: Callable[[int], list[torch.Tensor]] | None = None) -> None:
        self._excluded_fn = excluded
        self._by_reference_fn = by_reference
        self._excluded: set[int] | None = None
        self._refs: dict[int, torch.Tensor] = {}
        self._current: tuple[int, int] | None = None
        self._held: dict[tuple[int, int], weakref.WeakSet] = {}
        self._staged: dict[tuple[int, int], tuple[dict, list]] = {}
        self._caches: dict[tuple[int, int], list] = {}
        self.hooked: set[int] | None = None
        """Units whose stashes :meth:`capture` tracks (None: every unit). Elsewhere autograd keeps
        the saved tensors itself: no holders, no live bytes, no OFFLOAD (the hooks cost about 8%
        of a CPU step, each saved tensor going through Python twice)."""

    def _excluded_ptrs(self) -> set[int]:
        # recomputed lazily: received weights rebind parameters to new storage
        return {t.untyped_storage().data_ptr() for t in self._excluded_fn()}

    @contextlib.contextmanager
    def capture(self, unit: int, mb: int) -> Iterator[None]:
        """Track what autograd saves while the block runs as the stash of (unit, mb) (nothing for a
        unit outside ``hooked``)."""
        if self.hooked is not None and unit not in self.hooked:
            yield
            return
        self._current = (unit, mb)
        self._excluded = self._excluded_ptrs()
        refs = self._by_reference_fn(unit) if self._by_reference_fn is not None else []
        self._refs = {p.untyped_storage().data_ptr(): p for p in refs}
        self._held.setdefault((unit, mb), weakref.WeakSet())
        from ..models.recompute import collect_caches
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), \
                    collect_caches(self._caches.setdefault((unit, mb), [])):
                yield
        finally:
            self._current = None
            self._excluded = None
            self._refs = {}

    def _pack(self, t: torch.Tensor) -> Any:
        # a detached alias: the graph keeps this storage even when the parameter (or a buffer)
        # is later rebound to another one (received weights, FREE, OFFLOAD)
        t = t.detach()
        if self._current is None:
            return t
        ptr = t.untyped_storage().data_ptr()
        param = self._refs.get(ptr)
        if param is not None:
            return _ParamView(param, t)
        if ptr in self._excluded:
            return t
        h = _Held(t)
        self._held[self._current].add(h)
        return h

    @staticmethod
    def _unpack(h: Any) -> torch.Tensor:
        if isinstance(h, _ParamView):
            return h.resolve()
        if not isinstance(h, _Held):
            return h
        if h.tensor is None:
            raise RuntimeError("backward reads a stash that is offloaded; PREFETCH it before its backward")
        return h.tensor

    # --- queries ----------------------------------------------------------------------------
    def live_bytes(self, unit: int, mb: int) -> int:
        """Device bytes of the stash of (unit, mb) that autograd still holds."""
        return sum(k[3] for k in self.keys(unit, mb))

    def keys(self, unit: int, mb: int) -> set[tuple]:
        """:func:`tensor_key` of every live, on-device tensor of the stash of (unit, mb), the
        outputs cached by its selective-recompute regions included."""
        from ..models.recompute import cached_tensors
        keys = {tensor_key(h.tensor) for h in list(self._held.get((unit, mb), ())) if h.tensor is not None}
        return keys | {tensor_key(t) for t in cached_tensors(self._caches.get((unit, mb), ()))}

    def live(self) -> list[tuple[int, int]]:
        """(unit, micro-batch) of every stash that still holds an on-device saved tensor."""
        return [k for k in list(self._held) if self.keys(*k)]

    def total_bytes(self) -> int:
        """Sum over stashes of :meth:`live_bytes` (bytes shared by two stashes count twice)."""
        return sum(self.live_bytes(u, m) for (u, m) in list(self._held))

    def drop(self, unit: int, mb: int) -> None:
        self._held.pop((unit, mb), None)
        self._staged.pop((unit, mb), None)
        self._caches.pop((unit, mb), None)

    def clear(self) -> None:
        self._held.clear()
        self._staged.clear()
        self._caches.clear()

    # --- offload ----------------------------------------------------------------------------
    def offload(self, unit: int, mb: int, stage: Callable[[torch.Tensor], Any],
                extra: Sequence[torch.Tensor] = ()) -> None:
        """Move the stash of (unit, mb) off the device, with ``extra`` tensors (the inputs its
        runner keeps, rebound to placeholders). ``stage(t)`` returns a host copy of a uint8
        tensor; each distinct byte region is staged once, however many views share it."""
        views = [(h, h.tensor) for h in list(self._held.get((unit, mb), ())) if h.tensor is not None]
        views += [(t, t) for t in extra]
        staged: dict[tuple, Any] = {}
        layout = []
        for owner, t in views:
            region = _region(t)
            if region[1] not in staged:
                staged[region[1]] = stage(region[0])
            layout.append((owner, region[1], t.dtype, t.shape, t.stride()))
            if isinstance(owner, _Held):
                owner.tensor = None
            else:
                owner.data = owner.data.new_zeros(1).expand(owner.shape)
        self._staged[(unit, mb)] = (staged, layout)

    def prefetch(self, unit: int, mb: int, restore: Callable[[Any], torch.Tensor]) -> None:
        """Bring the stash of (unit, mb) (and its ``extra`` tensors) back: ``restore(host)`` returns
        the uint8 region on its device; every view is rebuilt on its region."""
        staged, layout = self._staged.pop((unit, mb), ({}, []))
        back = {k: restore(v) for k, v in staged.items()}
        for owner, k, dtype, shape, stride in layout:
            t = torch.empty(0, dtype=dtype, device=back[k].device).set_(back[k].untyped_storage(), 0, shape, stride)
            if isinstance(owner, _Held):
                owner.tensor = t
            else:
                owner.data = t

    def is_offloaded(self, unit: int, mb: int) -> bool:
        """Whether the stash of (unit, mb) is in host memory (OFFLOAD ran, PREFETCH has not)."""
        return (unit, mb) in self._staged
