"""Pipeline: the user-facing object. One ``step(inputs, targets)`` = one training step.

A Pipeline runs a ``pipert.ir.program.Program`` (``pipert.compile``; given a Schedule or a name it
compiles one) and never transforms it: it keeps the units each of its ranks needs, binds
transports, links and queues (``pipert.binding``) and builds one ``RankExecutor`` per rank.

Backends:
- ``"local"``: every rank in this process, one thread each (CPU) — tests and emulation;
- ``"dist"``: this process is one rank of an initialised torch.distributed job (torchrun or
  ``pipert.launch``); every process passes the same list of units and keeps the ones
  it computes or holds (``units_needed``). The others may stay on the meta device
  (``pipert.models.build_units``): a rank materialises only its own units.
"""
from __future__ import annotations

import copy
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .binding import (BACKENDS, LinkEmulation, RuntimeOptions, check_materialized, check_same_program, emulates_nccl,
                      program_of, root_cause, units_device, warm_up)
from .comm.delayed import DelayedTransport
from .comm.mesh import DEFAULT_MESH_ORDER, ProcessLayout
from .comm.dist import DistTransport
from .comm.local import LocalHub
from .device.tensors import device_of, reduction_device
from .errors import PipelineError, PipelineTimeout
from .exec.boundaries import infer_boundaries
from .exec.buffers import BoundarySpec
from .exec.executor import RankExecutor, StepResult
from .exec.optim import MasterWeightOptimizer, needs_master_weights
from .exec.state import UnitState
from .exec.unit import unit_runner
from .ir import COMPUTE_OPS, Payload, Schedule
from .ir.program import Program
from .ir.semantics import HOST_OPS
from .exec.instrument import NONE, Instrumentation
from .loop import TrainingLoop

__all__ = ["Pipeline", "default_optimizer", "split_microbatches", "units_needed", "RuntimeOptions", "LinkEmulation"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)


def _edges(results: dict, start: float, end: float) -> tuple[float, float]:
    """(seconds from the step's start to its first action, from its last action to its end) of a
    traced step on this process: the host's work around the program (splitting the batch,
    clearing gradients, issuing; the loss's reduction, with any wait for other processes)."""
    spans = [(t0, t1) for r in results.values() for _, t0, t1 in r.trace]
    if not spans:
        return 0.0, 0.0
    return min(t0 for t0, _ in spans) - start, end - max(t1 for _, t1 in spans)


def split_microbatches(t: torch.Tensor, num: int) -> tuple[torch.Tensor, ...]:
    if t.shape[0] % num != 0:
        raise ValueError(f"a batch of {t.shape[0]} samples is not divisible into {num} micro-batches; "
                         f"use a batch size that is a multiple of {num}")
    return tuple(t.chunk(num, dim=0))


_MODULE_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD, Payload.STASH})  # moved from/into a unit's module


def units_needed(program: Program | Schedule, rank: int) -> set[int]:
    """Units whose module must exist (be materialised) on ``rank``: the units it holds, computes,
    or moves weights, weight gradients or stashes of. Moving only a unit's activations or their
    gradients (``SEND act``, ``RECV grad``, ...) needs its boundary shape, not its module: every
    other unit may stay on the meta device in that process."""
    units = {a.unit for a in program.actions[rank] if a.unit is not None and
             (a.op in COMPUTE_OPS or a.payload in _MODULE_PAYLOADS)}
    return units | set(program.units_owned(rank))


def _owner_optimizer(params: list, factory: OptimizerFactory):
    """The owner's optimizer: on fp32 master copies when the parameters are bf16/fp16."""
    return MasterWeightOptimizer(params, factory) if needs_master_weights(params) else factory(params)


def _stage0(module: nn.Module, placement: Any, u: int) -> list[nn.Parameter]:
    """The unit's parameters of ZeRO stage 0 (those the owner's optimizer steps)."""
    params = list(module.parameters())
    return [p for p, z in zip(params, placement.param_zero(u, len(params))) if z == 0]


class Pipeline(TrainingLoop):
    """Pipeline-parallel training of ``units`` (a partitioned model) with one program.

    ``units`` is the list of unit modules (see ``pipert.models.partition``); the last one
    returns the loss given (x, targets). ``program`` is a Program (``pipert.compile``), or a
    Schedule or registered name that the Pipeline compiles with ``compile_options``
    (``pipert.compile``'s keywords: ``stages`` (default: one per unit), ``microbatches`` (over
    every replica), ``chunks``, ``schedule_options``, ``passes``, ``dp``, ``zero``,
    ``zero3_buffers``, ``replication``, ``rules``; by default NCCL's rules on NCCL, else gloo's).
    A program compiled under NCCL's rules runs under them: on NCCL itself, or on gloo and the local
    hub through ``pipert.comm.ncclsim`` (communicators created by a blocking rendezvous, all of
    them before the first step in one global order; a send complete only when its receive runs).
    Parameters of unit u live on ``program.placement.weight_owner[u]``, which also runs its
    optimizer (made by ``optimizer``; data-parallel replicas each step their own).

    With ``backend="dist"`` a process uses only the units it computes or holds
    (``units_needed(program, rank)``); every other entry of ``units`` may be a skeleton on the
    meta device (``pipert.models.build_units(..., keep=units_needed(...))``), read only for its
    boundary shapes, which are found by running micro-batch 0 on the meta device. A unit this
    rank needs that still has tensors on meta is an error naming the unit and the rank. The
    local backend runs every rank, so it needs every unit materialised. Every wait times out
    after ``timeout`` seconds, naming the rank, action and peer.

    ``links`` delays every point-to-point message by an emulated link, and holds every collective
    whose ring crosses one for the simulator's price (``pipert.comm.collectivelinks``), on either backend: a
    ``pipert.binding.LinkEmulation`` (links, the path that applies delays, the clock rule), or
    just its links (``pipert.cost.Links``, ``pipert.linkflags.LinkOptions``,
    ``pipert.comm.links.LinkEmulator``). ``runtime`` (``pipert.binding.RuntimeOptions``): queues,
    host staging of messages, the pinned pool. ``instrument``
    (``pipert.exec.instrument.Instrumentation``): test and measurement hooks (fault injection,
    records of computes, memory after every action, traces, no warm-up, running an unvalidated
    program; default None: no hook).
    """

    def __init__(self, units: Sequence[nn.Module], program: Program | Schedule | str = "1f1b", *,
                 optimizer: OptimizerFactory = default_optimizer, backend: str = "local", timeout: float = 60.0,
                 links: Any = None, runtime: RuntimeOptions | None = None, instrument: Instrumentation | None = None,
                 **compile_options: Any) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} unknown; allowed: {', '.join(BACKENDS)}")
        if backend == "dist" and not dist.is_initialized():
            raise RuntimeError("backend 'dist' needs torch.distributed initialised (torchrun or pipert.launch)")
        self.backend, self.timeout = backend, timeout
        self.instrument = instrument or NONE
        """Test and measurement hooks (none in production)."""
        self.program = program_of(program, units, backend, self.instrument.check, compile_options)
        """What every rank runs: the compiled program, as validated."""
        self.simulated_nccl = emulates_nccl(self.program, backend)
        """Whether NCCL's rules are emulated on gloo or the local hub (``pipert.comm.ncclsim``)."""
        self.warmup = self.instrument.warmup
        """Every communicator created before the first step (``nccl.warmup_order``); off only in tests."""
        runtime = runtime or RuntimeOptions()
        self.tp = _check_tp(runtime.tp, backend, links)
        """T: processes of this job that run each program rank (tensor parallelism)."""
        self.layout = _layout(self.program, self.tp, runtime.mesh_order, backend)
        """Which process of the job runs which program rank at which tp coordinate."""
        self.queues = "host" if self.instrument.serial else runtime.queues
        self.link_emulation = LinkEmulation.of(links)
        self.links = self.link_emulation.emulator(self.program.num_ranks) if self.link_emulation else None
        """The LinkEmulator every message and collective crosses (None: nothing is delayed)."""
        self.ranks = self._local_ranks()
        self._bind_units(units, optimizer)
        self.staging, self.pool = self._staging(runtime)
        self._boundary: dict[tuple[int, int], BoundarySpec] = {}
        self._boundary_of: tuple = ()  # (shape, dtype) of the micro-batch the boundaries are for
        self.last_results: dict[int, StepResult] = {}
        self._closers: list = []
        # the queues' worker threads and nccl-sim's streams end with the Pipeline (close(), or when
        # it is garbage-collected, also one whose construction failed), not at interpreter exit
        self._finalizer = weakref.finalize(self, _close_each, self._closers)
        self._comms: Any = None
        transport = self._dist_transport() if backend == "dist" else None
        # built once (runners, per-program tables); the local backend gives each step a fresh hub
        self._executors = {r: self._executor(r, transport) for r in self.ranks}

    @property
    def rules(self) -> str:
        """The communication rules the program runs under: "nccl" (NCCL, or emulated on gloo and the
        local hub) or "gloo" (gloo, the local hub)."""
        return self.program.rules

    def _local_ranks(self) -> list[int]:
        """The ranks this process runs (all of them on the local backend)."""
        n = self.program.num_ranks
        if self.backend == "local":
            return list(range(n))
        if dist.get_world_size() != n * self.tp:
            tp = f" x {self.tp} TP processes" if self.tp > 1 else ""
            raise ValueError(f"program {self.program.name!r} needs {n} ranks{tp}, the job has {dist.get_world_size()}")
        check_same_program(self.program)
        return [self.layout.program_rank(dist.get_rank())]

    def _bind_units(self, units: Sequence[nn.Module], optimizer: OptimizerFactory) -> None:
        """Each local rank's modules (the owner keeps the given one, other local ranks get a copy)
        and the owner's optimizer of each unit it holds."""
        self.modules: dict[int, dict[int, nn.Module]] = {}
        self.optimizers: dict[int, dict[int, torch.optim.Optimizer]] = {}
        pl = self.program.placement
        for r in self.ranks:
            needed = sorted(units_needed(self.program, r))
            check_materialized(units, needed, r)
            self.modules[r] = {u: (units[u] if pl.weight_owner[u] == r or self.backend == "dist" else
                                   copy.deepcopy(units[u])) for u in needed}
            # the owner's optimizer steps the stage-0 parameters (ZeRO classes step their shards)
            self.optimizers[r] = {u: _owner_optimizer(ps, optimizer) for u in sorted(self.program.units_owned(r))
                                  if (ps := _stage0(self.modules[r][u], pl, u))}
        self._optimizer_factory = optimizer
        self._all_units = list(units)

    def _staging(self, runtime: RuntimeOptions) -> tuple[bool, Any]:
        """Whether messages go through host buffers (``pipert.comm.staging``; by default when gloo
        carries GPU tensors), and the pinned pool of staging and OFFLOAD/PREFETCH (None: none needed)."""
        staging = runtime.staging
        if staging is None:
            from .comm.staging import needs_staging
            staging = self.backend == "dist" and needs_staging(
                dist.get_backend(), units_device(self.modules[self.ranks[0]].values()))
        pool = runtime.pool
        if pool is None and (staging or any(a.op in HOST_OPS for _, _, a in self.program)):
            from .device.pinned import PinnedPool
            pool = PinnedPool()
        return staging, pool

    def _dist_transport(self) -> Any:
        """This rank's transport in a torch.distributed job: process groups of the (dp, pp) mesh,
        NCCL's rules emulated if the program runs under them, communicators warmed up, then
        staging and emulated links."""
        program, rank = self.program, self.ranks[0]
        device = units_device(self.modules[rank].values())
        made = None
        stages = program.meta.get("pp_stages")
        if program.placement.replicas is not None and stages:
            from .comm.mesh import pipeline_mesh, replica_process_groups
            made = replica_process_groups(pipeline_mesh(stages, program.num_ranks // stages, device.type, self.tp,
                                                        self.layout.order))
        groups = sorted({tuple(sorted(a.group)) for _, _, a in program if a.group})
        base = DistTransport(groups, process_groups=made, layout=self.layout)
        if self.simulated_nccl:
            from .comm.ncclsim import NcclSim, StoreRendezvous
            # each tp coordinate is a pipeline of its own: its communicators rendezvous apart
            store = dist.PrefixStore(f"tp{base.tp_rank}/", dist.distributed_c10d._get_default_store())
            base = NcclSim(base, StoreRendezvous(store), self.timeout)
            self._closers.append(base.close)
        self._comms = base
        if self.warmup:
            warm_up(base, program, rank)
        transport = self._staged(base)
        return transport if self.links is None else self._delayed(transport, device)

    def _delayed(self, transport: Any, device: torch.device) -> DelayedTransport:
        """``transport`` behind the emulated links; on the stream path with this rank's clock offsets
        to every peer (every rank calls this at the same point)."""
        delayed = DelayedTransport(transport, self.links, path=self.link_emulation.path)
        if delayed.takes_stream_path(device):
            from .comm.linkframes import dist_clock_offsets
            delayed.clock_offsets.update(dist_clock_offsets(transport, delayed.ops(device), device,
                                                            self.link_emulation.clock))
        return delayed

    def _staged(self, transport: Any) -> Any:
        if not self.staging:
            return transport
        from .comm.staging import StagedTransport
        return StagedTransport(transport, self.pool)

    def close(self) -> None:
        """End the worker threads this Pipeline started (its queues and communicators); it cannot
        step afterwards. Also done when the Pipeline is garbage-collected."""
        self._finalizer()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ queries
    def links_delayed(self) -> int:
        """Messages this process's ranks sent over a delaying emulated link, since the start."""
        return 0 if self.links is None else sum(self.links.delivered(r) for r in self.ranks)

    def held_collectives(self, since: Mapping[int, int] | None = None) -> dict[int, list]:
        """Per rank of this process, the collectives it held on the emulated links
        (``pipert.comm.collectivelinks.HeldCollective``, those from its ``since[rank]``-th on);
        empty lists without links."""
        if self.links is None:
            return {r: [] for r in self.ranks}
        return {r: self.links.collectives.records(r, (since or {}).get(r, 0)) for r in self.ranks}

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Parameters of the units this process holds, named ``unit{u}.{name}``. ZeRO units are
        assembled from their shards (in a torch.distributed job every rank must call this:
        the holders of a unit gather its shards)."""
        return self._named(grads=False)

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Accumulated gradients of held parameters from the last step (kept until the next);
        ZeRO units' gradients assembled from the shards their replicas reduced (see
        :meth:`named_parameters` for torch.distributed jobs)."""
        return self._named(grads=True)

    def _named(self, grads: bool) -> dict[str, torch.Tensor]:
        out = {}
        for r in self.ranks:
            st = self._executors[r].state
            for u in self.program.units_owned(r):
                vals: dict[int, torch.Tensor] = {}
                for zc, z in st.parts[u]:
                    # the shards are current (whole weights may be stale after OPT)
                    flat = self._assemble(r, u, grads, zc) if z >= 1 else None
                    off = 0
                    for p in st.params(u, zc):
                        if flat is not None:
                            v = flat[off:off + p.numel()].view(p.shape)
                            off += p.numel()
                        elif grads:
                            v = p.grad if p.grad is not None else torch.zeros_like(p)
                        else:
                            v = p
                        vals[id(p)] = v
                for n, p in self.modules[r][u].named_parameters():
                    out[f"unit{u}.{n}"] = vals[id(p)]
        return out

    def _assemble(self, rank: int, u: int, grads: bool, zc: int | None = None) -> torch.Tensor:
        """The flat parameters (or last gradient) of unit u's ZeRO class ``zc`` (None: the whole
        unit) from the shards of its holders."""
        st = self._executors[rank].state
        def shard_of(s: UnitState) -> torch.Tensor:
            if not grads:
                return s.shards[(u, zc)].detach()
            g = s.last_shard_grads.get((u, zc))
            return g if g is not None else torch.zeros_like(s.shards[(u, zc)])
        group = st.group(u)
        if self.backend == "local":
            whole = torch.cat([shard_of(self._executors[h].state) for h in group])
        else:
            mine = shard_of(st)
            whole = mine.new_empty(mine.numel() * len(group))
            self._executors[rank].transport.collective("ALLGATHER", mine, group, None, out=whole).wait(self.timeout)
        return whole[:st.numel(u, zc)]

    # ------------------------------------------------------------------ step
    def _compute_device(self, inputs: torch.Tensor) -> torch.device:
        """The device this process computes on: its units' device (the inputs' for a process
        whose units have no tensors)."""
        return device_of(m for r in self.ranks for m in self.modules[r].values()) or inputs.device

    def _infer_boundaries(self, inputs: Sequence[torch.Tensor]) -> None:
        """Shapes of every unit's output per micro-batch, from micro-batch 0 run on the meta
        device (``pipert.exec.boundaries``): no unit is computed for real. Derived again, before
        any message, when the micro-batch's shape or dtype changes (a longer sequence, a bigger
        batch): every rank of a job must then be given a batch of the same new shape."""
        signature = (tuple(inputs[0].shape), inputs[0].dtype)
        if self._boundary and signature == self._boundary_of:
            return
        specs = infer_boundaries(self._all_units, inputs[0], self._compute_device(inputs[0]))
        for u, spec in enumerate(specs):
            for m in range(self.program.num_microbatches):
                self._boundary[(u, m)] = spec
        self._boundary_of = signature

    def _executor(self, rank: int, transport, program: Program | None = None,
                  like: RankExecutor | None = None) -> RankExecutor:
        """Rank ``rank``'s executor of ``program`` (default: the training program); ``like``: an
        executor whose unit runners and model state it shares (the evaluation program reads the
        training program's current weights and ZeRO shards)."""
        program = program or self.program
        if like is not None:
            runners, state = like.runners, like.state
        else:
            runners = {u: unit_runner(mod, u, program.num_units, program.meta) for u, mod in self.modules[rank].items()}
            state = UnitState(rank, program, runners, self.optimizers[rank],
                              lambda ps: _owner_optimizer(ps, self._optimizer_factory), pool=self.pool)
        from .device.queues import make_queues
        queues = make_queues(self.queues, units_device(self.modules[rank].values()), name=f"rank{rank}")
        self._closers.append(queues.close)
        return RankExecutor(rank, program, runners, transport, self.optimizers[rank],
                            lambda u, m: self._boundary[(u, m)], timeout=self.timeout, state=state, queues=queues,
                            comms=self._comms, instrument=self.instrument)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One training step on the batch (forward, backward and the optimizer, as the program
        orders them); returns the mean loss over all micro-batches."""
        t0 = time.perf_counter()
        results = self._execute(self._executors, *self._batch(inputs, targets))
        loss = self._mean_loss(results, self._compute_device(inputs))
        if self.instrument.trace:
            self.last_edges = _edges(results, t0, time.perf_counter())
        return loss

    def _batch(self, inputs: torch.Tensor, targets: torch.Tensor | None, clear_grads: bool = True) -> tuple:
        """The batch as micro-batches, with the boundaries for their shape; gradients cleared
        unless ``clear_grads`` is False (an evaluation)."""
        M = self.program.num_microbatches
        xs = split_microbatches(inputs, M)
        ys = split_microbatches(targets, M) if targets is not None else None
        self._infer_boundaries(xs)
        for r in self.ranks if clear_grads else ():
            for mod in self.modules[r].values():
                for p in mod.parameters():
                    p.grad = None
        return xs, ys

    def _execute(self, executors: dict[int, RankExecutor], xs: Any, ys: Any,
                 parts: dict[int, tuple[int, int]] | None = None) -> dict[int, StepResult]:
        """Run ``executors`` (this process's ranks) once, or their actions ``parts[rank]``."""
        cpu0 = time.process_time()
        if self.backend == "local":
            results = self._run_local(executors, xs, ys, parts)
        else:
            r = self.ranks[0]
            results = {r: executors[r].run(xs, ys, None if parts is None else parts[r])}
        self.last_process_cpu = time.process_time() - cpu0  # every thread of this process, in the run
        self.last_results = results
        return results

    def _loss_vector(self, results: dict[int, StepResult], device: torch.device) -> torch.Tensor:
        """Per micro-batch the loss, then per micro-batch the count of ranks that computed it,
        summed over the job (torch.distributed: on the device the backend reduces); no host read."""
        M = self.program.num_microbatches
        found = [t for r in results.values() for t in r.loss_values.values()]
        vec = torch.zeros(2 * M, dtype=torch.float64, device=found[0].device if found else device)
        for r in results.values():
            for m, t in r.loss_values.items():
                vec[m].add_(t.to(vec.device, torch.float64))  # stays on the device: no host read
                vec[M + m].add_(1.0)
        if self.backend == "dist":
            if self.layout.tp_rank(dist.get_rank()):  # a TP group computes each loss once: tp coordinate 0 counts it
                vec.zero_()
            # on a device the process group's backend reduces: the CPU for gloo, the GPU for NCCL
            vec = vec.to(reduction_device(dist.get_backend(), vec.device))
            dist.all_reduce(vec)
        return vec

    def _mean_loss(self, results: dict[int, StepResult], device: torch.device) -> float:
        """The mean loss over the step's micro-batches, read from the devices once: every rank's
        losses go into one vector (per micro-batch: loss, count) on their device, summed over the
        job (torch.distributed: on the device the backend reduces), read by the host in one copy.
        Fills each result's ``losses`` from it."""
        M = self.program.num_microbatches
        values = self._loss_vector(results, device).tolist()  # the step's one read of the device
        losses, counts = values[:M], values[M:]
        for r in results.values():
            r.losses = {m: losses[m] for m in r.loss_values}
        count = round(sum(counts))
        if count != M:
            raise PipelineError(f"step produced {count} losses for {M} micro-batches")
        return sum(losses) / M

    def _run_local(self, executors: dict[int, RankExecutor], xs: Any, ys: Any,
                   parts: dict[int, tuple[int, int]] | None) -> dict[int, StepResult]:
        """Every rank as a thread. A step gets a new hub (and, under NCCL's rules, new
        communicators) at its first part; later parts of the step go on over the same ones."""
        begins = parts is None or all(p[0] == 0 for p in parts.values())
        ends = parts is None or all(p[1] == len(executors[r].program) for r, p in parts.items())
        if begins:
            self._hub = LocalHub(self.program.num_ranks)
            self._rendezvous = None
            if self.simulated_nccl:
                from .comm.ncclsim import LocalRendezvous
                self._rendezvous = LocalRendezvous()
                self._hub.on_fail.append(self._rendezvous.fail)
        hub, rendezvous = self._hub, self._rendezvous
        results: dict[int, StepResult] = {}
        errors: dict[int, BaseException] = {}

        def work(rank: int) -> None:
            executor = executors[rank]
            try:
                if begins:
                    base = hub.transport(rank)
                    if rendezvous is not None:  # the hub is new every step: so are its communicators
                        from .comm.ncclsim import NcclSim
                        base = executor.comms = NcclSim(base, rendezvous, self.timeout)
                        if self.warmup:
                            warm_up(base, executor.compiled, rank)
                    executor.transport = self._staged(base)
                    if self.links is not None:
                        executor.transport = DelayedTransport(executor.transport, self.links,
                                                              path=self.link_emulation.path)
                results[rank] = executor.run(xs, ys, None if parts is None else parts[rank])
            except BaseException as e:  # noqa: BLE001 - reported below, after all threads stop
                errors[rank] = e
                if not isinstance(e, PipelineTimeout):
                    # A crash stops the others at once; a timeout lets each rank time out on
                    # its own peer, so the report can name the rank that stalled.
                    hub.fail(f"rank {rank} failed: {e}")
            finally:
                if rendezvous is not None and (ends or rank in errors):
                    executor.comms.close()

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
        stuck = [t for t in threads if t.is_alive()]
        report = dict(errors)  # what aborted ranks raise below is not part of the report
        if stuck:  # ranks still running after the others failed: end them before reporting
            hub.fail("the step was abandoned after another rank failed")
            for r in self.ranks:
                executors[r].abort()
            for t in stuck:
                t.join(timeout=self.timeout + 1.0)
        if report:
            raise report[root_cause(report)]
        return results


def _check_tp(tp: int, backend: str, links: Any) -> int:
    """``tp`` if this Pipeline can run T processes per program rank (torch.distributed, no
    emulated links)."""
    if tp > 1 and backend != "dist":
        raise ValueError(f"tp={tp} runs T processes per program rank: it needs backend 'dist', got {backend!r}")
    if tp > 1 and links is not None:
        raise ValueError(f"tp={tp}: emulated links are not supported with tensor parallelism; give links=None")
    return tp


def _layout(program: Program, tp: int, order: tuple[str, ...], backend: str) -> ProcessLayout:
    """The process layout of ``program`` run by ``tp`` processes per rank, mesh dimensions in
    ``order`` (program rank ``d*P + s``: P is the program's ``pp_stages``, else all its ranks)."""
    if backend != "dist" and order != DEFAULT_MESH_ORDER:
        raise ValueError(f"mesh_order {','.join(order)!r} places processes: it needs backend 'dist', got "
                         f"{backend!r} (allowed there: {','.join(DEFAULT_MESH_ORDER)})")
    stages = program.meta.get("pp_stages") or program.num_ranks
    return ProcessLayout(stages, program.num_ranks // stages, tp, order)


def _close_each(closers: list) -> None:
    """Run ``closers`` (a Pipeline's finalizer). The garbage collector may run it on any thread
    that allocates, a ``pipert._C`` worker included, and such a worker cannot join itself (its
    stream would be destroyed with its thread still joinable: std::terminate): on a thread that
    Python did not start, the closers run on a thread of their own."""
    def run() -> None:
        for close in closers:
            close()
    if isinstance(threading.current_thread(), threading._DummyThread):  # started outside Python
        threading.Thread(target=run, name="pipert-close", daemon=True).start()
    else:
        run()
