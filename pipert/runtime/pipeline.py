"""Pipeline: the user-facing object. One ``step(inputs, targets)`` = one training step.

Backends:
- ``"local"``: every rank in this process, one thread each (CPU) — tests and emulation;
- ``"dist"``: this process is one rank of an initialised torch.distributed job (torchrun or
  ``pipert.runtime.launch``); every process builds the same model and keeps its units.
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..ir import Op, Schedule
from ..sim import validate
from ..schedules import build_schedule
from .buffers import BoundarySpec
from .executor import Fault, PipelineError, PipelineTimeout, RankExecutor, StepResult
from .transport import DelayedTransport, DistTransport, LocalHub
from .optim import MasterWeightOptimizer, needs_master_weights
from .unit import UnitRunner

__all__ = ["Pipeline", "default_optimizer", "split_microbatches"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)


def split_microbatches(t: torch.Tensor, num: int) -> tuple[torch.Tensor, ...]:
    if t.shape[0] % num != 0:
        raise ValueError(f"a batch of {t.shape[0]} samples is not divisible into {num} micro-batches; "
                         f"use a batch size that is a multiple of {num}")
    return tuple(t.chunk(num, dim=0))


def _compute_units(schedule: Schedule, rank: int) -> set[int]:
    """Units whose module must exist on ``rank``: computed or owned there."""
    units = {a.unit for a in schedule.actions[rank] if a.unit is not None}
    return units | set(schedule.units_owned(rank))


def _owner_optimizer(params: list, factory: OptimizerFactory):
    """The owner's optimizer: on fp32 master copies when the parameters are bf16/fp16."""
    return MasterWeightOptimizer(params, factory) if needs_master_weights(params) else factory(params)


def _root_cause(errors: dict[int, BaseException]) -> int:
    """The failed rank to report: one that waited on a peer which did not fail itself (that
    peer is the stalled one); ranks waiting on other waiting ranks are echoes."""
    for r in sorted(errors):
        peer = getattr(errors[r], "peer", None)
        if peer is not None and peer not in errors:
            return r
    return min(errors)


class Pipeline:
    """Pipeline-parallel training of ``units`` (a partitioned model) with one schedule.

    ``units`` is the list of unit modules (see ``pipert.models.partition``); the last one
    returns the loss given (x, targets). Parameters of unit u live on
    ``schedule.placement.weight_owner[u]``, which also runs its optimizer.
    """

    def __init__(self, units: Sequence[nn.Module], schedule: Schedule | str = "1f1b", *,
                 stages: int | None = None, microbatches: int | None = None, chunks: int | None = None,
                 optimizer: OptimizerFactory = default_optimizer, backend: str = "local",
                 timeout: float = 60.0, schedule_options: dict | None = None, fault: Fault | None = None,
                 trace: bool = False, links: Any = None) -> None:
        if backend not in ("local", "dist"):
            raise ValueError(f"backend {backend!r} unknown; allowed: 'local', 'dist'")
        if isinstance(schedule, str):
            if microbatches is None:
                raise ValueError("microbatches is required when the schedule is given by name")
            schedule = build_schedule(schedule, stages=stages or len(units), microbatches=microbatches,
                                      chunks=chunks, **(schedule_options or {}))
        validate(schedule)
        if schedule.num_units != len(units):
            raise ValueError(f"schedule {schedule.name!r} has {schedule.num_units} units but the model was "
                             f"partitioned into {len(units)}")
        self.schedule = schedule
        self.backend = backend
        self.timeout = timeout
        self.fault = fault
        self.trace = trace
        self.links = links  # a LinkEmulator delaying the local transport's messages (emulation)
        if links is not None and backend != "local":
            raise ValueError("links (delay injection) applies to the local backend; for torch.distributed "
                             "runs put LinkEmulator.dist_isend in front of the sends")
        self._all_units = list(units)
        self._boundary: dict[tuple[int, int], BoundarySpec] = {}
        self.last_results: dict[int, StepResult] = {}
        if backend == "local":
            self.ranks = list(range(schedule.num_ranks))
        else:
            if not dist.is_initialized():
                raise RuntimeError("backend 'dist' needs torch.distributed initialised (torchrun or pipert.runtime.launch)")
            if dist.get_world_size() != schedule.num_ranks:
                raise ValueError(f"schedule {schedule.name!r} needs {schedule.num_ranks} ranks, "
                                 f"the job has {dist.get_world_size()}")
            self.ranks = [dist.get_rank()]
        self.modules: dict[int, dict[int, nn.Module]] = {}
        self.optimizers: dict[int, dict[int, torch.optim.Optimizer]] = {}
        for r in self.ranks:
            owned = set(schedule.units_owned(r))
            self.modules[r] = {u: (units[u] if u in owned else copy.deepcopy(units[u]))
                               for u in sorted(_compute_units(schedule, r))}
            self.optimizers[r] = {u: _owner_optimizer(list(self.modules[r][u].parameters()), optimizer)
                                  for u in sorted(owned) if list(self.modules[r][u].parameters())}
        groups = sorted({tuple(sorted(a.group)) for _, _, a in schedule if a.group})
        dist_transport = DistTransport(groups) if backend == "dist" else None
        # Built once: runners and the executor's per-program tables do not depend on the step.
        # The local backend gives each step a fresh hub (set as the executor's transport).
        self._executors = {r: self._executor(r, dist_transport) for r in self.ranks}

    # ------------------------------------------------------------------ queries
    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Parameters of the units this process owns, named ``unit{u}.{name}``."""
        out = {}
        for r in self.ranks:
            for u in self.schedule.units_owned(r):
                for n, p in self.modules[r][u].named_parameters():
                    out[f"unit{u}.{n}"] = p
        return out

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Accumulated gradients of owned parameters from the last step (kept until the next)."""
        return {n: (p.grad if p.grad is not None else torch.zeros_like(p))
                for n, p in self.named_parameters().items()}

    # ------------------------------------------------------------------ step
    def _infer_boundaries(self, inputs: Sequence[torch.Tensor]) -> None:
        """Shapes of every unit's output per micro-batch, from one no-grad pass of micro-batch 0."""
        if self._boundary:
            return
        with torch.no_grad():
            x = inputs[0]
            for u, unit in enumerate(self._all_units[:-1]):
                x = unit(x)
                spec = BoundarySpec.of(x)
                for m in range(self.schedule.num_microbatches):
                    self._boundary[(u, m)] = spec
        self._all_units = []  # keep only the units this process needs

    def _executor(self, rank: int, transport) -> RankExecutor:
        runners = {u: UnitRunner(mod, is_first=(u == 0), is_last=(u == self.schedule.num_units - 1))
                   for u, mod in self.modules[rank].items()}
        return RankExecutor(rank, self.schedule, runners, transport, self.optimizers[rank],
                            lambda u, m: self._boundary[(u, m)], timeout=self.timeout, fault=self.fault,
                            trace=self.trace)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One training step on the batch; returns the mean loss over all micro-batches."""
        M = self.schedule.num_microbatches
        xs, ys = split_microbatches(inputs, M), split_microbatches(targets, M)
        self._infer_boundaries(xs)
        for r in self.ranks:
            for mod in self.modules[r].values():
                for p in mod.parameters():
                    p.grad = None
        if self.backend == "local":
            results = self._run_local(xs, ys)
        else:
            results = {self.ranks[0]: self._executors[self.ranks[0]].run(xs, ys)}
        self.last_results = results
        total = sum(sum(r.losses.values()) for r in results.values())
        count = sum(len(r.losses) for r in results.values())
        if self.backend == "dist":
            t = torch.tensor([total, float(count)], dtype=torch.float64)
            dist.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        if count != M:
            raise PipelineError(f"step produced {count} losses for {M} micro-batches")
        return total / M

    def _run_local(self, xs, ys) -> dict[int, StepResult]:
        hub = LocalHub(self.schedule.num_ranks)
        results: dict[int, StepResult] = {}
        errors: dict[int, BaseException] = {}

        def work(rank: int) -> None:
            try:
                executor = self._executors[rank]
                executor.transport = hub.transport(rank)
                if self.links is not None:
                    executor.transport = DelayedTransport(executor.transport, self.links)
                results[rank] = executor.run(xs, ys)
            except BaseException as e:  # noqa: BLE001 - reported below, after all threads stop
                errors[rank] = e
                if not isinstance(e, PipelineTimeout):
                    # A crash stops the others at once; a timeout lets each rank time out on
                    # its own peer, so the report can name the rank that stalled.
                    hub.fail(f"rank {rank} failed: {e}")

        threads = [threading.Thread(target=work, args=(r,), daemon=True, name=f"pipert-rank{r}") for r in self.ranks]
        for t in threads:
            t.start()
        # After the first failure every other rank either fails within `timeout` (it waits
        # on the failed one) or is itself the stalled rank: stop waiting after that.
        first_error_at = None
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.05)
            if errors and first_error_at is None:
                first_error_at = time.monotonic()
            if first_error_at is not None and time.monotonic() - first_error_at > self.timeout + 1.0:
                break
        if errors:
            raise errors[_root_cause(errors)]
        return results
