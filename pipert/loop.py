"""The user's training loop around a Pipeline (``Pipeline`` inherits :class:`TrainingLoop`).

    loss = pipe.forward_backward(x, y)      # forward and backward of every micro-batch
    pipe.clip_grad_norm_(1.0)               # global norm over every stage and replica
    pipe.optimizer_step()                   # every rank's update
    sched.step()                            # sched = pipe.lr_scheduler(lambda opt: ...)
    out = pipe.eval(x)                      # the last unit's outputs, no graph

``forward_backward`` and ``optimizer_step`` run the two parts of the one validated program that
``pipert.ir.phases.update_split`` finds (each rank's actions before its first OPT, then the
rest); a program whose update cannot run apart (weights that travel after their update:
WeiPipe, TawPipe, HelixPipe) raises ``SplitError`` saying why, and trains with ``step``.
``eval`` runs the program's evaluation program (``pipert.ir.phases.forward_only``), validated
like any other.

Gradients between the two calls are where the update reads them: the parameters' ``.grad`` of
ZeRO-0 parameters on each holder (all replicas hold the same reduced gradient) and the reduced
gradient shard of ZeRO-1/2/3 parameters on each holder. The global norm counts each once.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .device.tensors import reduction_device
from .errors import PipelineError
from .ir.phases import forward_only, update_split

__all__ = ["TrainingLoop", "LRSchedulers"]


class LRSchedulers:
    """One LR scheduler per optimizer of this process's ranks; ``step()`` steps them all."""

    def __init__(self, schedulers: list[Any]) -> None:
        self.schedulers = schedulers

    def step(self) -> None:
        for s in self.schedulers:
            s.step()

    def get_last_lr(self) -> list[float]:
        """The learning rates the first scheduler set last (every scheduler follows the same rule)."""
        return self.schedulers[0].get_last_lr() if self.schedulers else []

    def state_dict(self) -> list[dict]:
        return [s.state_dict() for s in self.schedulers]

    def load_state_dict(self, states: list[dict]) -> None:
        if len(states) != len(self.schedulers):
            raise ValueError(f"{len(states)} scheduler states for {len(self.schedulers)} schedulers")
        for s, st in zip(self.schedulers, states):
            s.load_state_dict(st)


class TrainingLoop:
    """forward_backward, clip_grad_norm_, optimizer_step, lr_scheduler and eval (module doc)."""

    _split: tuple[int, ...] | None = None
    _update_due = False
    _eval_executors: dict | None = None

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of every micro-batch of the batch; the weights are not updated
        (``optimizer_step``). Returns the mean loss as a 0-d float64 tensor on the device the
        job reduces on, the same on every rank; it is not read by the host (``.item()`` is the
        step's one device read)."""
        if self._split is None:
            self._split = update_split(self.program)
        xs, ys = self._batch(inputs, targets)
        self._update_due = False
        parts = {r: (0, self._split[r]) for r in self.ranks}
        results = self._execute(self._executors, xs, ys, parts)
        self._update_due = True
        M = self.program.num_microbatches
        return self._loss_vector(results, self._compute_device(inputs))[:M].sum() / M

    def optimizer_step(self) -> None:
        """Every rank's update for the gradients of the last ``forward_backward``."""
        if not self._update_due:
            raise PipelineError("optimizer_step() needs a forward_backward() before it (once per step)")
        parts = {r: (self._split[r], len(self.program.actions[r])) for r in self.ranks}
        self._update_due = False
        self._execute(self._executors, None, None, parts)

    # ------------------------------------------------------------------ gradients
    def _grads(self) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
        """(gradient, its pieces counted in the global norm) of every part this process's ranks
        update: each element of the model once over all stages, replicas and TP ranks."""
        once = _tp_once(self)
        for r in self.ranks:
            st = self._executors[r].state
            for u in sorted(st.held):
                first = st.position(u)[0] == 0
                counted = once(st.runners[u].module)
                for zc, z in st.parts[u]:
                    if z >= 1:
                        g = st.shard_grads.get((u, zc))
                        if g is not None:
                            yield g, _shard_pieces(g, st.params(u, zc), st.position(u)[0], counted)
                        continue
                    for p in st.params(u, zc):
                        if p.grad is not None:
                            yield p.grad, [p.grad] if first and counted(p) else []

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale every gradient of the step by ``max_norm / (norm + 1e-6)`` when that is below 1,
        where ``norm`` is the ``norm_type``-norm of all gradients of all stages and replicas, each
        counted once (a TP shard's elements on its TP rank, a replicated parameter's on TP rank
        0): ``torch.nn.utils.clip_grad_norm_`` of the single-process model. Call it between
        ``forward_backward`` and ``optimizer_step``; returns the norm (float64, on the device the
        job reduces on; in a torch.distributed job every rank must call it)."""
        if not self._update_due:
            raise PipelineError("clip_grad_norm_() reads the gradients of a forward_backward(); call it after "
                                "forward_backward() and before optimizer_step()")
        norm_type = float(norm_type)
        if not (norm_type > 0):
            raise ValueError(f"norm_type must be positive or inf, got {norm_type}")
        grads = list(self._grads())
        device = grads[0][0].device if grads else torch.device("cpu")
        total = torch.zeros((), dtype=torch.float64, device=device)
        for _, pieces in grads:
            for g in pieces:
                if g.numel():
                    a = g.detach().to(device, torch.float64).abs()
                    total = torch.maximum(total, a.max()) if math.isinf(norm_type) else total + a.pow(norm_type).sum()
        if self.backend == "dist":
            total = total.to(reduction_device(dist.get_backend(), total.device))
            dist.all_reduce(total, op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM)
        norm = total if math.isinf(norm_type) else total.pow(1.0 / norm_type)
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g, _ in grads:
            g.mul_(coef.to(g.device, g.dtype))
        return norm

    # ------------------------------------------------------------------ schedules of the rate
    def lr_scheduler(self, factory: Callable[[torch.optim.Optimizer], Any]) -> LRSchedulers:
        """``factory(optimizer)`` for every optimizer of this process's ranks (owners' and ZeRO
        shards'; the fp32 inner optimizer of master weights), e.g.
        ``lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)``."""
        made = []
        for r in self.ranks:
            st = self._executors[r].state
            for opt in [*self.optimizers[r].values(), *st.shard_opt.values()]:
                made.append(factory(getattr(opt, "inner", opt)))
        return LRSchedulers(made)

    # ------------------------------------------------------------------ evaluation
    def eval(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> Any:
        """The last unit's outputs for the batch (its micro-batches' outputs concatenated along
        dimension 0), or with ``targets`` the mean loss (a 0-d float64 tensor); no graph, no
        update. In a torch.distributed job the ranks that compute the last unit get the outputs
        of the whole batch (with data parallelism, every replica's, gathered through the host),
        the others None."""
        if self._eval_executors is None:
            from .compiler import compile as compile_program
            program = compile_program(forward_only(self.program), rules=self.program.rules)
            self._eval_executors = {r: self._executor(r, self._executors[r].transport, program, like=self._executors[r])
                                    for r in self.ranks}
        xs, ys = self._batch(inputs, targets, clear_grads=False)
        results = self._execute(self._eval_executors, xs, ys)
        M = self.program.num_microbatches
        if targets is not None:
            return self._loss_vector(results, self._compute_device(inputs))[:M].sum() / M
        outputs = {m: o for res in results.values() for m, o in res.outputs.items()}
        if self.backend == "dist" and self.program.placement.replicas is not None:
            outputs = _replicas_outputs(outputs)
        if not outputs:
            return None
        return _concat([outputs[m] for m in range(M)])


def _tp_once(pipe) -> Callable[[torch.nn.Module], Callable[[torch.Tensor], bool]]:
    """module -> (parameter -> whether this process counts its gradient in the norm): every
    parameter without TP; with it, the shards (``pipert.models.tpshard.shard_dim``: each TP rank
    holds its own slice) and, on TP rank 0 only, the replicated ones (equal on every TP rank)."""
    tp = getattr(pipe, "tp", 1)
    if tp == 1:
        return lambda module: lambda p: True
    from .models.tpshard import shard_dim
    lead = pipe.layout.tp_rank(dist.get_rank()) == 0

    def of(module: torch.nn.Module) -> Callable[[torch.Tensor], bool]:
        sharded = {id(p) for n, p in module.named_parameters() if shard_dim(n) is not None}
        return lambda p: lead or id(p) in sharded
    return of


def _shard_pieces(g: torch.Tensor, params: list, k: int, counted: Callable[[torch.Tensor], bool]) -> list[torch.Tensor]:
    """The pieces of ZeRO holder ``k``'s gradient shard ``g`` (slice k of the flat, padded
    concatenation of ``params``) that belong to parameters ``counted`` says this process counts."""
    if all(counted(p) for p in params):
        return [g]
    lo, hi, off, out = k * g.numel(), (k + 1) * g.numel(), 0, []
    for p in params:
        a, b = max(off, lo), min(off + p.numel(), hi)
        if a < b and counted(p):
            out.append(g[a - lo:b - lo])
        off += p.numel()
    return out


def _replicas_outputs(mine: dict[int, Any]) -> dict[int, Any]:
    """Every replica's last-stage outputs on each rank that computed some (through the host:
    evaluation is not the hot path); an empty dict on the other ranks."""
    device = next((o if isinstance(o, torch.Tensor) else o[0]).device for o in mine.values()) if mine else None
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {m: _to(o, "cpu") for m, o in mine.items()})
    if device is None:
        return {}
    return {m: _to(o, device) for got in everyone for m, o in got.items()}


def _to(o: Any, device: Any) -> Any:
    return o.to(device) if isinstance(o, torch.Tensor) else type(o)(t.to(device) for t in o)


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return type(parts[0])(torch.cat(list(xs)) for xs in zip(*parts))
