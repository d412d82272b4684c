"""Model state of one rank: unit weights and gradients, ZeRO shards, weights in flight.

The executor reads and writes whole-unit values through this object:

- ``flat``/``bind``: a unit's parameters as one flat tensor, and binding a received flat tensor
  as the parameters without a copy (graphs of earlier micro-batches keep their storage);
- ``expect``/``ready``/``settle``: receives and collectives whose result is a unit's weights or
  gradient complete where the program first needs them (``ready``: the weights, for a compute;
  ``settle``: everything, for OPT, SEND and collectives of the unit);
- ``take_wgrad``: the unit's accumulated gradient leaves the rank (a SEND or a reduction moves the
  contributions away);
- ZeRO (``Placement.zero``): unit u's flat parameters are cut into ``len(holders)`` equal shards
  (zero-padded); the holder at position k of the sorted group keeps shard k as a flat parameter
  with its own optimizer; ``OPT u`` steps the shard with the reduce-scattered gradient shard.
  A unit with per-parameter stages is handled part by part: each ZeRO class (the parameters of
  one stage, in module order) has its own flat tensor, shards and shard optimizer, and actions
  naming a class (``zclass``) read and write that class alone. With separate ZeRO-3 buffers
  (``Placement.zero3_buffers == 2``) each ZeRO-3 part keeps its gathered ``fwd`` and ``bwd`` copies
  apart; a compute binds the parameters to its side's copy before it runs (a stash's saved
  parameters resolve against the bound storage when the backward reads them);
- ``free``/``offload``/``prefetch`` of weights: parameters are rebound to a one-element
  placeholder of their shape (reading it before an ALLGATHER, RECV or PREFETCH is an error the
  validator rules out), or to host buffers from the pinned pool.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch import nn

from ..device.tensors import tensor_key
from ..ir import Action, Payload
from ..ir.program import Program
from .buffers import flatten_grads, flatten_params, load_grads, load_params
from .stash import StashLedger

__all__ = ["UnitState", "shard_size"]

Part = tuple  # (unit, ZeRO class or None for the whole unit)


STALE = -2
"""``freed`` index of whole ZeRO-1/2 weights after their OPT (not placeholders: stale values)."""


def shard_size(numel: int, parts: int) -> int:
    """Elements of one ZeRO shard of a flat tensor of ``numel`` elements over ``parts`` ranks."""
    return -(-numel // parts)


class UnitState:
    """Weights, gradients, shards and pending weight transfers of one rank (module doc)."""

    def __init__(self, rank: int, program: Program, runners: dict, optimizers: dict,
                 shard_optimizer: Callable[[list], torch.optim.Optimizer] | None = None, pool: Any = None) -> None:
        self.rank = rank
        self.program = program
        self.runners = runners
        self.optimizers = optimizers
        self.pool = pool
        pl = program.placement
        self.held = {u for u in runners if rank in pl.holders(u)}
        self.parts = {u: pl.zero_parts(u) for u in runners}   # unit -> [(class, stage)]
        self.split = pl.zero3_buffers == 2
        self.copies: dict[tuple, torch.Tensor] = {}   # (unit, class, side) -> gathered flat ZeRO-3 weights
        self.bound: dict[Part, str] = {}              # part -> side of the copy its parameters are views of
        self._part_params = {(u, zc): self._select(u, zc) for u in runners for zc, _ in self.parts[u]}
        self.pending: dict[int, list] = {}        # unit -> [(handle, on_done, index, action, buffer)]
        self._cursor = threading.local()
        self._lock = threading.Lock()
        self.stepped: set[int] = set()
        self.freed: dict[Part, int] = {}          # part -> index of the FREE/OFFLOAD that took its weights, or STALE
        self.host: dict[tuple, Any] = {}          # offloaded (payload, unit[, mb or class]) -> (buffer, dtype, shape)
        self.shards: dict[Part, nn.Parameter] = {}
        self.shard_grads: dict[Part, torch.Tensor] = {}
        self.last_shard_grads: dict[Part, torch.Tensor | None] = {}  # the gradient shard the last OPT used
        self.shard_opt: dict[Part, torch.optim.Optimizer] = {}
        for u in sorted(self.held):
            for zc, z in self.parts[u]:
                if z < 1:
                    continue
                key = (u, zc)
                flat = self._padded(u, self.flat_params(u, zc))
                k, n = self.position(u)
                s = flat.numel() // n
                self.shards[key] = nn.Parameter(flat[k * s:(k + 1) * s].clone())
                if shard_optimizer is not None and self.shards[key].numel():
                    self.shard_opt[key] = shard_optimizer([self.shards[key]])
                if z >= 3:
                    self.free(u, -1, zc)
        for u in runners:
            if u not in self.held:  # another rank's weights arrive before they are used
                self.free(u, -1)
        self.stash = StashLedger(self._static_tensors, self._gathered_params)

    def _select(self, u: int, zc: int | None) -> list[nn.Parameter]:
        params = list(self.runners[u].module.parameters())
        if zc is None:
            return params
        stages = self.program.placement.param_zero(u, len(params))
        return [p for p, z in zip(params, stages) if z == zc]

    def params(self, u: int, zc: int | None = None) -> list[nn.Parameter]:
        """The parameters of unit u's ZeRO class ``zc`` (None: all), in module order."""
        return self._part_params[(u, zc)] if (u, zc) in self._part_params else self._select(u, zc)

    def flat_params(self, u: int, zc: int | None = None) -> torch.Tensor:
        return flatten_params(self.runners[u].module, self.params(u, zc))

    def part_stage(self, u: int, zc: int | None) -> int:
        return next(z for c, z in self.parts[u] if c == zc)

    def _gathered_params(self, u: int) -> list[torch.Tensor]:
        """Parameters a stash of unit u refers to rather than keeps: a held unit's ZeRO-3 ones,
        gathered again (same values within a step) before every use that the validator allows."""
        if u not in self.held:
            return []
        return [p for zc, z in self.parts.get(u, ()) if z >= 3 for p in self.params(u, zc)]

    def _static_tensors(self) -> list[torch.Tensor]:
        out = []
        for r in self.runners.values():
            out += list(r.module.parameters()) + list(r.module.buffers())
        return out

    # --- shards --------------------------------------------------------------------------------
    def group(self, u: int) -> tuple[int, ...]:
        return tuple(sorted(self.program.placement.holders(u)))

    def position(self, u: int) -> tuple[int, int]:
        """(index of this rank in unit u's sorted holder group, group size)."""
        g = self.group(u)
        return g.index(self.rank), len(g)

    def numel(self, u: int, zc: int | None = None) -> int:
        return sum(p.numel() for p in self.params(u, zc))

    def _padded(self, u: int, flat: torch.Tensor) -> torch.Tensor:
        n = len(self.group(u))
        size = shard_size(flat.numel(), n) * n
        if size == flat.numel():
            return flat
        return torch.cat([flat, flat.new_zeros(size - flat.numel())])

    def padded_flat(self, u: int, payload: Payload, zc: int | None = None) -> torch.Tensor:
        """The part's weights or (moved-away) gradient, zero-padded to whole shards."""
        t = self.flat(u, payload, zc) if payload is Payload.WEIGHT else self.take_wgrad(u, zc)
        return self._padded(u, t)

    def shard_buffer(self, u: int, like: torch.Tensor, zc: int | None = None) -> torch.Tensor:
        return like.new_empty(shard_size(self.numel(u, zc), len(self.group(u))))

    # --- lifecycle -------------------------------------------------------------------------------
    def begin_step(self) -> None:
        for runner in self.runners.values():
            runner.clear()  # nothing carries over from a step that failed midway
        self.stash.clear()
        self.stepped.clear()
        self.pending.clear()
        self.copies.clear()  # gathered ZeRO-3 copies live within a step (bound parameters rebind at use)
        self.bound.clear()
        for part in [p for p, at in self.freed.items() if at == STALE]:
            del self.freed[part]   # a step starts with the whole weights of its ZeRO-1/2 classes

    def pending_check(self, rank: int) -> None:
        """End of a step: a held unit's weights or gradient still in flight are model state for
        the next step (e.g. the ALLGATHER after a ZeRO OPT) and complete here; anything else
        received and never used is an error."""
        self._cursor.index = None
        for u in sorted(self.held):
            self.settle(u)
        for u, items in self.pending.items():
            if items:
                _, _, i, a, _ = items[0]
                from ..errors import PipelineError
                raise PipelineError(f"rank {rank}: action {i} ({a}) brought unit {u}'s {a.payload}, "
                                    f"which nothing used")

    # --- weights and gradients in flight -----------------------------------------------------
    def expect(self, u: int, handle: Any, on_done: Callable[[], None], i: int, a: Action,
               complete: Callable, buffer: torch.Tensor | None = None) -> None:
        """A receive or collective bringing unit u's weights or gradient (into ``buffer``)."""
        with self._lock:
            self.pending.setdefault(u, []).append((handle, on_done, i, a, buffer))
        self._complete = complete

    def ready(self, u: int, side: str = "fwd") -> None:
        """Complete what brings unit u's weights (before a compute of ``side``, fwd or bwd)."""
        self.settle_weights(u)
        for zc, z in self.parts[u]:
            if self.split and z >= 3 and u in self.held:
                self._bind_copy(u, zc, side)
            elif (u, zc) in self.freed:
                from ..errors import PipelineError
                what = "weights" if zc is None else f"ZeRO-{zc} weights"
                if self.freed[(u, zc)] == STALE:
                    raise PipelineError(f"rank {self.rank}: unit {u}'s {what} are stale after its OPT until an "
                                        f"ALLGATHER (was the schedule validated?)")
                raise PipelineError(f"rank {self.rank}: unit {u}'s {what} were freed or offloaded at action "
                                    f"{self.freed[(u, zc)]} and not brought back (was the schedule validated?)")

    def settle(self, u: int) -> None:
        """Complete everything in flight for unit u (weights and gradients)."""
        self._settle(u, weights_only=False)

    def settle_weights(self, u: int) -> None:
        """Complete what brings unit u's weights; gradients in flight stay pending."""
        self._settle(u, weights_only=True)

    def at(self, index: int) -> None:
        """The calling thread now runs action ``index``: it completes only what earlier actions
        posted (with stream queues, later receives may already be posted)."""
        self._cursor.index = index

    def _settle(self, u: int, weights_only: bool) -> None:
        before = getattr(self._cursor, "index", None)
        with self._lock:  # receive queues add to the list while a compute completes from it
            items = self.pending.get(u, [])
            mine = [it for it in items if not (weights_only and it[3].payload is Payload.WGRAD or
                                               before is not None and it[2] >= before)]
            for it in mine:
                items.remove(it)
        for handle, on_done, i, a, _ in sorted(mine, key=lambda it: it[2]):  # in list order
            self._complete(handle, i, a)
            on_done()

    def bind(self, u: int, flat: torch.Tensor, zc: int | None = None) -> None:
        """The part's parameters become views of ``flat`` (no copy)."""
        load_params(self.runners[u].module, flat[:self.numel(u, zc)], self.params(u, zc))
        self.freed.pop((u, zc), None)

    def keep_copy(self, u: int, zc: int | None, side: str, flat: torch.Tensor) -> None:
        """A gathered copy of ZeRO-3 weights for computes of ``side`` (bound by :meth:`ready`)."""
        self.copies[(u, zc, side)] = flat

    def _bind_copy(self, u: int, zc: int | None, side: str) -> None:
        flat = self.copies.get((u, zc, side))
        if flat is None:
            from ..errors import PipelineError
            raise PipelineError(f"rank {self.rank}: unit {u}'s ZeRO-3 weights{'' if zc is None else f' (z{zc})'} "
                                f"have no gathered {side} copy (was the schedule validated?)")
        if self.bound.get((u, zc)) != side or (u, zc) in self.freed:
            load_params(self.runners[u].module, flat[:self.numel(u, zc)], self.params(u, zc))
            self.bound[(u, zc)] = side
            self.freed.pop((u, zc), None)

    def free_copy(self, u: int, i: int, zc: int | None, side: str) -> None:
        """Drop the ``side`` copy of gathered ZeRO-3 weights; parameters bound to it move to the
        other copy, or become placeholders when there is none."""
        self.copies.pop((u, zc, side), None)
        if self.bound.get((u, zc)) != side:
            return
        other = "bwd" if side == "fwd" else "fwd"
        if (u, zc, other) in self.copies:
            self._bind_copy(u, zc, other)
        else:
            self.bound.pop((u, zc))
            self.free(u, i, zc)

    def add_grads(self, u: int, flat: torch.Tensor, accumulate: bool = True, zc: int | None = None) -> None:
        self.fresh_grads(u)
        load_grads(self.runners[u].module, flat[:self.numel(u, zc)], accumulate=accumulate, params=self.params(u, zc))

    def fresh_grads(self, u: int) -> None:
        """Gradients stay readable after OPT until the next step; a unit that accumulates again
        in the same step (several updates per step) starts from zero."""
        if u in self.stepped:
            self.stepped.discard(u)
            for p in self.runners[u].module.parameters():
                p.grad = None

    def flat(self, u: int, payload: Payload, zc: int | None = None) -> torch.Tensor:
        """The part's weights (after what brings them) or gradient (after everything in flight)."""
        self.settle_weights(u) if payload is Payload.WEIGHT else self.settle(u)
        module, params = self.runners[u].module, self.params(u, zc)
        return flatten_params(module, params) if payload is Payload.WEIGHT else flatten_grads(module, params)

    def take_wgrad(self, u: int, zc: int | None = None) -> torch.Tensor:
        """The part's accumulated gradient, which leaves this rank (its accumulators are cleared)."""
        self.settle(u)
        self.fresh_grads(u)
        params = self.params(u, zc)
        t = flatten_grads(self.runners[u].module, params)
        for p in params:
            p.grad = None
        return t

    def new_flat(self, u: int, zc: int | None = None) -> torch.Tensor:
        p = next(self.runners[u].module.parameters())
        return torch.empty(self.numel(u, zc), dtype=p.dtype, device=p.device)

    # --- optimizer -----------------------------------------------------------------------------
    def optimize(self, a: Action) -> None:
        units = [a.unit] if a.unit is not None else sorted(self.held)
        for u in units:
            self.settle(u)
            for zc, z in self.parts[u]:
                key = (u, zc)
                if z >= 1:
                    shard = self.shards[key]
                    grad = self.shard_grads.pop(key, None)
                    self.last_shard_grads[key] = grad
                    if key in self.shard_opt and grad is not None:
                        shard.grad = grad
                        self.shard_opt[key].step()
                        shard.grad = None
                    if z <= 2:   # the whole weights lag the stepped shard until an ALLGATHER binds them
                        self.freed[key] = STALE
                elif u in self.optimizers:  # over the stage-0 parameters; none without parameters
                    self.optimizers[u].step()
            self.stepped.add(u)

    def add_shard_grad(self, u: int, g: torch.Tensor, zc: int | None = None) -> None:
        if (u, zc) in self.shard_grads:
            self.shard_grads[(u, zc)].add_(g)
        else:
            self.shard_grads[(u, zc)] = g

    # --- free / offload / prefetch of weights --------------------------------------------------
    def has_weights(self, u: int, zc: int | None = None, side: str | None = None) -> bool:
        """Whether the part's whole weights (a ``side``: that gathered ZeRO-3 copy) are on the device
        and current (pipert.ir.semantics: the WEIGHT value of the part, or of its copy)."""
        if side is not None:
            return (u, zc, side) in self.copies
        return (u, zc) not in self.freed

    def free(self, u: int, i: int, zc: int | None = None) -> None:
        """The part's parameters become one-element placeholders of their shape."""
        for p in self.params(u, zc):
            p.data = p.data.new_zeros(1).expand(p.shape)
        self.freed[(u, zc)] = i

    def stage(self, t: torch.Tensor) -> tuple:
        """A host copy of ``t`` (a buffer of the pinned pool when there is one)."""
        t = t.detach()
        buf = self.pool.stage_out(t) if self.pool is not None else t.to("cpu", copy=True)
        return (buf, t.dtype, t.shape, t.device)

    @staticmethod
    def unstage(host: tuple, device: torch.device | None = None) -> torch.Tensor:
        """The tensor back from :meth:`stage` (on its device, or ``device``); frees the buffer."""
        buf, dtype, shape, dev = host
        dev = device if device is not None else dev
        if isinstance(buf, torch.Tensor):
            return buf.to(dev, copy=True)
        t = buf.view(dtype, shape).to(dev, copy=True)
        buf.release()
        return t

    def offload_stash(self, u: int, m: int) -> None:
        """The stash of (u, m) to host memory: what autograd saved and the inputs its runner keeps."""
        self.stash.offload(u, m, self.stage, self.runners[u].held_inputs().get(m, ()))

    def prefetch_stash(self, u: int, m: int) -> None:
        self.stash.prefetch(u, m, self.unstage)

    def offload(self, key: tuple, t: torch.Tensor) -> None:
        self.host[key] = self.stage(t)

    def restore(self, key: tuple) -> torch.Tensor:
        try:
            return self.unstage(self.host.pop(key))
        except KeyError:
            from ..errors import PipelineError
            raise PipelineError(f"rank {self.rank}: PREFETCH of {key} which is not offloaded") from None

    # --- measurement -----------------------------------------------------------------------------
    def stash_bytes(self) -> int:
        """Bytes of every live stash: what autograd saved for it plus the inputs its runner keeps
        (a forward awaiting RECOMPUTE keeps only those), each stash counted on its own."""
        total = 0
        for u, runner in self.runners.items():
            for m, inputs in runner.held_inputs().items():
                keys = self.stash.keys(u, m) | {tensor_key(t) for t in inputs}
                total += sum(k[3] for k in keys)
        return total

    def held_bytes(self) -> int:
        """Bytes of weights and gradients counted in the running memory (docs/semantics.md): the
        weights and gradients of units this rank does not hold, the gathered weights of ZeRO-3
        units, the whole gradients of ZeRO-2/3 units, and weights or gradients in flight to it."""
        total = 0
        for u in self.runners:
            held = u in self.held
            for zc, z in self.parts[u]:
                params = self.params(u, zc)
                if self.split and held and z >= 3:  # the gathered copies present
                    size = sum(p.numel() for p in params) * (params[0].element_size() if params else 0)
                    total += size * sum((u, zc, side) in self.copies for side in ("fwd", "bwd"))
                elif (not held or z >= 3) and (u, zc) not in self.freed:
                    total += sum(p.numel() * p.element_size() for p in params)
                if not held or z >= 2:
                    total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
            for item in self.pending.get(u, ()):
                buf, a = item[4], item[3]
                z = self.part_stage(u, a.zclass) if held else 0
                if buf is not None and (not held or z >= (3 if a.payload is Payload.WEIGHT else 2)):
                    total += buf.numel() * buf.element_size()
        return total
