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
  with its own optimizer; ``OPT u`` steps the shard with the reduce-scattered gradient shard;
- ``free``/``offload``/``prefetch`` of weights: parameters are rebound to a one-element
  placeholder of their shape (reading it before an ALLGATHER, RECV or PREFETCH is an error the
  validator rules out), or to host buffers from the pinned pool.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch import nn

from ..ir import Action, Payload, Schedule
from .buffers import flatten_grads, flatten_params, load_grads, load_params
from .stash import StashLedger, tensor_key

__all__ = ["UnitState", "shard_size"]


def shard_size(numel: int, parts: int) -> int:
    """Elements of one ZeRO shard of a flat tensor of ``numel`` elements over ``parts`` ranks."""
    return -(-numel // parts)


class UnitState:
    """Weights, gradients, shards and pending weight transfers of one rank (module doc)."""

    def __init__(self, rank: int, schedule: Schedule, runners: dict, optimizers: dict,
                 shard_optimizer: Callable[[list], torch.optim.Optimizer] | None = None, pool: Any = None) -> None:
        self.rank = rank
        self.schedule = schedule
        self.runners = runners
        self.optimizers = optimizers
        self.pool = pool
        pl = schedule.placement
        self.held = {u for u in runners if rank in pl.holders(u)}
        self.zero = {u: pl.zero_stage(u) for u in runners}
        self.pending: dict[int, list] = {}        # unit -> [(handle, on_done, index, action, buffer)]
        self._cursor = threading.local()
        self._lock = threading.Lock()
        self.stepped: set[int] = set()
        self.freed: dict[int, int] = {}           # unit -> index of the FREE/OFFLOAD that took its weights
        self.host: dict[tuple, Any] = {}          # offloaded (payload, unit[, mb]) -> (buffer, dtype, shape)
        self.shards: dict[int, nn.Parameter] = {}
        self.shard_grads: dict[int, torch.Tensor] = {}
        self.last_shard_grads: dict[int, torch.Tensor | None] = {}  # the gradient shard the last OPT used
        self.shard_opt: dict[int, torch.optim.Optimizer] = {}
        for u in sorted(self.held):
            if self.zero[u] >= 1:
                flat = self._padded(u, flatten_params(runners[u].module))
                k, n = self.position(u)
                s = flat.numel() // n
                self.shards[u] = nn.Parameter(flat[k * s:(k + 1) * s].clone())
                if shard_optimizer is not None and self.shards[u].numel():
                    self.shard_opt[u] = shard_optimizer([self.shards[u]])
                if self.zero[u] >= 3:
                    self.free(u, -1)
        for u in runners:
            if u not in self.held:  # another rank's weights arrive before they are used
                self.free(u, -1)
        self.stash = StashLedger(self._static_tensors, self._gathered_params)

    def _gathered_params(self, u: int) -> list[torch.Tensor]:
        """Parameters a stash of unit u refers to rather than keeps: a held ZeRO-3 unit's, gathered
        again (same values within a step) before every use that the validator allows."""
        if u in self.held and self.zero.get(u, 0) >= 3:
            return list(self.runners[u].module.parameters())
        return []

    def _static_tensors(self) -> list[torch.Tensor]:
        out = []
        for r in self.runners.values():
            out += list(r.module.parameters()) + list(r.module.buffers())
        return out

    # --- shards --------------------------------------------------------------------------------
    def group(self, u: int) -> tuple[int, ...]:
        return tuple(sorted(self.schedule.placement.holders(u)))

    def position(self, u: int) -> tuple[int, int]:
        """(index of this rank in unit u's sorted holder group, group size)."""
        g = self.group(u)
        return g.index(self.rank), len(g)

    def numel(self, u: int) -> int:
        return sum(p.numel() for p in self.runners[u].module.parameters())

    def _padded(self, u: int, flat: torch.Tensor) -> torch.Tensor:
        n = len(self.group(u))
        size = shard_size(flat.numel(), n) * n
        if size == flat.numel():
            return flat
        return torch.cat([flat, flat.new_zeros(size - flat.numel())])

    def padded_flat(self, u: int, payload: Payload) -> torch.Tensor:
        """The unit's weights or (moved-away) gradient, zero-padded to whole shards."""
        t = self.flat(u, payload) if payload is Payload.WEIGHT else self.take_wgrad(u)
        return self._padded(u, t)

    def shard_buffer(self, u: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_empty(shard_size(self.numel(u), len(self.group(u))))

    # --- lifecycle -------------------------------------------------------------------------------
    def begin_step(self) -> None:
        for runner in self.runners.values():
            runner.clear()  # nothing carries over from a step that failed midway
        self.stash.clear()
        self.stepped.clear()
        self.pending.clear()

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
                from .executor import PipelineError
                raise PipelineError(f"rank {rank}: action {i} ({a}) brought unit {u}'s {a.payload}, "
                                    f"which nothing used")

    # --- weights and gradients in flight -----------------------------------------------------
    def expect(self, u: int, handle: Any, on_done: Callable[[], None], i: int, a: Action,
               complete: Callable, buffer: torch.Tensor | None = None) -> None:
        """A receive or collective bringing unit u's weights or gradient (into ``buffer``)."""
        with self._lock:
            self.pending.setdefault(u, []).append((handle, on_done, i, a, buffer))
        self._complete = complete

    def ready(self, u: int) -> None:
        """Complete what brings unit u's weights (before a compute)."""
        self.settle_weights(u)
        if u in self.freed:
            from .executor import PipelineError
            raise PipelineError(f"rank {self.rank}: unit {u}'s weights were freed or offloaded at action "
                                f"{self.freed[u]} and not brought back (was the schedule validated?)")

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

    def bind(self, u: int, flat: torch.Tensor) -> None:
        """Unit u's parameters become views of ``flat`` (no copy)."""
        load_params(self.runners[u].module, flat[:self.numel(u)])
        self.freed.pop(u, None)

    def add_grads(self, u: int, flat: torch.Tensor, accumulate: bool = True) -> None:
        self.fresh_grads(u)
        load_grads(self.runners[u].module, flat[:self.numel(u)], accumulate=accumulate)

    def fresh_grads(self, u: int) -> None:
        """Gradients stay readable after OPT until the next step; a unit that accumulates again
        in the same step (several updates per step) starts from zero."""
        if u in self.stepped:
            self.stepped.discard(u)
            for p in self.runners[u].module.parameters():
                p.grad = None

    def flat(self, u: int, payload: Payload) -> torch.Tensor:
        """Unit u's weights (after what brings them) or gradient (after everything in flight)."""
        self.settle_weights(u) if payload is Payload.WEIGHT else self.settle(u)
        module = self.runners[u].module
        return flatten_params(module) if payload is Payload.WEIGHT else flatten_grads(module)

    def take_wgrad(self, u: int) -> torch.Tensor:
        """Unit u's accumulated gradient, which leaves this rank (its accumulators are cleared)."""
        self.settle(u)
        self.fresh_grads(u)
        module = self.runners[u].module
        t = flatten_grads(module)
        for p in module.parameters():
            p.grad = None
        return t

    def new_flat(self, u: int) -> torch.Tensor:
        p = next(self.runners[u].module.parameters())
        return torch.empty(self.numel(u), dtype=p.dtype, device=p.device)

    # --- optimizer -----------------------------------------------------------------------------
    def optimize(self, a: Action) -> None:
        units = [a.unit] if a.unit is not None else sorted(self.held)
        for u in units:
            self.settle(u)
            if self.zero[u] >= 1:
                shard = self.shards[u]
                grad = self.shard_grads.pop(u, None)
                self.last_shard_grads[u] = grad
                if u in self.shard_opt and grad is not None:
                    shard.grad = grad
                    self.shard_opt[u].step()
                    shard.grad = None
            elif u in self.optimizers:  # units without parameters have no optimizer
                self.optimizers[u].step()
            self.stepped.add(u)

    def add_shard_grad(self, u: int, g: torch.Tensor) -> None:
        if u in self.shard_grads:
            self.shard_grads[u].add_(g)
        else:
            self.shard_grads[u] = g

    # --- free / offload / prefetch of weights --------------------------------------------------
    def free(self, u: int, i: int) -> None:
        """Unit u's parameters become one-element placeholders of their shape."""
        for p in self.runners[u].module.parameters():
            p.data = p.data.new_zeros(1).expand(p.shape)
        self.freed[u] = i

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
            from .executor import PipelineError
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
        for u, runner in self.runners.items():
            params = list(runner.module.parameters())
            held, z = u in self.held, self.zero.get(u, 0)
            if (not held or z >= 3) and u not in self.freed:
                total += sum(p.numel() * p.element_size() for p in params)
            if not held or z >= 2:
                total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
            for item in self.pending.get(u, ()):
                buf, weights = item[4], item[3].payload is Payload.WEIGHT
                if buf is not None and (not held or z >= (3 if weights else 2)):
                    total += buf.numel() * buf.element_size()
        return total
