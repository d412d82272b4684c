"""Pipeline: the user-facing object. One ``step(inputs, targets)`` = one training step.

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
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .comm.delayed import DelayedTransport
from .comm.dist import DistTransport
from .comm.local import LocalHub
from .device.tensors import device_of, meta_tensors, reduction_device
from .errors import PipelineError, PipelineTimeout
from .exec.boundaries import infer_boundaries
from .exec.buffers import BoundarySpec
from .exec.executor import Fault, RankExecutor, StepResult
from .exec.optim import MasterWeightOptimizer, needs_master_weights
from .exec.state import UnitState
from .exec.unit import UnitRunner
from .ir import COMPUTE_OPS, Payload, Schedule
from .ir.passes import merge_sub_blocks
from .ir.semantics import HOST_OPS
from .schedules import build_schedule
from .sim import validate

__all__ = ["Pipeline", "default_optimizer", "split_microbatches", "program_for", "check_same_program",
           "program_digest", "units_needed"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)


def split_microbatches(t: torch.Tensor, num: int) -> tuple[torch.Tensor, ...]:
    if t.shape[0] % num != 0:
        raise ValueError(f"a batch of {t.shape[0]} samples is not divisible into {num} micro-batches; "
                         f"use a batch size that is a multiple of {num}")
    return tuple(t.chunk(num, dim=0))


_MODULE_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD, Payload.STASH})  # moved from/into a unit's module


def units_needed(schedule: Schedule, rank: int) -> set[int]:
    """Units whose module must exist (be materialised) on ``rank``: the units it holds, computes,
    or moves weights, weight gradients or stashes of. Moving only a unit's activations or their
    gradients (``SEND act``, ``RECV grad``, ...) needs its boundary shape, not its module: every
    other unit may stay on the meta device in that process."""
    units = {a.unit for a in schedule.actions[rank] if a.unit is not None and
             (a.op in COMPUTE_OPS or a.payload in _MODULE_PAYLOADS)}
    return units | set(schedule.units_owned(rank))


def program_for(schedule: Schedule) -> Schedule:
    """The program the executor runs for ``schedule``: pieces of computes other than W merged
    (``pipert.ir.passes.merge_sub_blocks``); everything else as given."""
    return merge_sub_blocks(schedule)


def _owner_optimizer(params: list, factory: OptimizerFactory):
    """The owner's optimizer: on fp32 master copies when the parameters are bf16/fp16."""
    return MasterWeightOptimizer(params, factory) if needs_master_weights(params) else factory(params)


def program_digest(program: Schedule) -> str:
    """A digest of what every rank runs: shape, placement, every action and the meta entries the
    executor reads (generator statistics such as solve times are left out)."""
    import hashlib
    import json
    d = program.to_dict()
    d = {k: d[k] for k in ("num_ranks", "num_units", "num_microbatches", "placement", "actions")}
    d["meta"] = {"update_every": program.meta.get("update_every")}   # the queue of collectives: the placement's
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _device_of(units: Iterable[nn.Module]) -> torch.device:
    return device_of(units) or torch.device("cpu")


def _check_materialized(units: Sequence[nn.Module], needed: Iterable[int], rank: int) -> None:
    """Every unit ``rank`` computes or holds has real tensors (none on the meta device)."""
    for u in needed:
        on_meta = meta_tensors(units[u])
        if on_meta:
            more = ", ..." if len(on_meta) > 3 else ""
            raise ValueError(f"unit {u} is needed on rank {rank} (it computes or holds it) but is on the meta device "
                             f"({', '.join(on_meta[:3])}{more}); materialise it first "
                             f"(pipert.models.materialize, or build_units(keep=units_needed(program, {rank})))")


def check_same_program(program: Schedule) -> None:
    """Every rank of a torch.distributed job must run the same program: compare a digest of it
    across ranks and fail naming the ranks that disagree."""
    digest = program_digest(program)
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) > 1:
        by: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            by.setdefault(d, []).append(r)
        groups = "; ".join(f"ranks {rs} have program {d[:12]}" for d, rs in sorted(by.items(), key=lambda x: x[1]))
        raise PipelineError(f"ranks disagree on the program to run ({groups}); build the schedule once and "
                            f"share it (a solver must be deterministic)")


def _built_once(name: str, options: dict) -> Schedule:
    """The named schedule, built on rank 0 and sent to every rank (a solver's result is decided
    once; a failure to build is raised on every rank)."""
    if not dist.is_initialized():
        raise RuntimeError("backend 'dist' needs torch.distributed initialised (torchrun or pipert.launch)")
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = build_schedule(name, **options).to_json()
        except (ValueError, RuntimeError) as e:
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return Schedule.from_json(box[0])


def _link_emulator(links: Any, num_ranks: int) -> Any:
    """``links`` as a LinkEmulator of ``num_ranks`` ranks: a LinkEmulator, a ``pipert.cost.Links``
    (the simulator's numbers) or a ``pipert.linkflags.LinkOptions``; None stays None."""
    if links is None:
        return None
    from .cost.topology import Links
    from .linkflags import LinkOptions
    from .comm.links import LinkEmulator
    if isinstance(links, LinkOptions):
        links = links.links(num_ranks)
    if isinstance(links, Links):
        links = LinkEmulator.from_links(links)
    if not isinstance(links, LinkEmulator):
        raise TypeError(f"links must be a LinkEmulator, pipert.cost.Links or pipert.linkflags.LinkOptions, got "
                        f"{type(links).__name__}")
    if links.num_ranks != num_ranks:
        raise ValueError(f"links cover {links.num_ranks} ranks but the schedule has {num_ranks}")
    return links


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

    With ``backend="dist"`` a process uses only the units it computes or holds
    (``units_needed(program, rank)``); every other entry of ``units`` may be a skeleton on the
    meta device (``pipert.models.build_units(..., keep=units_needed(...))``), read only for its
    boundary shapes, which are found by running micro-batch 0 on the meta device. A unit this
    rank needs that still has tensors on meta is an error naming the unit and the rank. The
    local backend runs every rank, so it needs every unit materialised.

    ``dp=D`` trains D data-parallel replicas of the pipeline (``stages * D`` ranks, laid out as a
    ``(dp, pp)`` DeviceMesh under torch.distributed); ``zero`` is the ZeRO stage (0-3) of every
    unit, one per unit, per parameter, or a rule or share spec such as ``"3:mlp,2:attn,1"``
    (``pipert.schedules.zero_rules``; ``pipert.schedules.data_parallel``); ``zero3_buffers=2`` keeps
    the gathered ZeRO-3 weights of forward and backward computes apart. ``microbatches`` counts all
    replicas' micro-batches. ``measure_memory`` records the bytes each rank's program holds after
    every action (``last_results[r].memory``); ``program`` is what the ranks run.

    ``links`` delays every point-to-point message by an emulated link, on either backend: a
    ``pipert.cost.Links`` (the simulator's numbers), a ``pipert.linkflags.LinkOptions`` or a
    ``pipert.comm.links.LinkEmulator`` (rules: ``pipert.comm.delayed.DelayedTransport``).
    ``link_path`` picks how (DelayedTransport's ``path``); ``link_clock`` is the clock rule of its
    stream path under torch.distributed (``pipert.comm.linkframes.link_clock_offsets``).
    ``rules="nccl"`` makes messages and collectives follow NCCL's rules on gloo or the local hub
    (``pipert.comm.ncclsim``): communicators created by a blocking rendezvous (all of them before the
    first step, in one global order), a send complete only when its receive runs. ``check=False``
    runs a schedule the validator rejects (tests of what the transports then do).
    ``staging`` moves messages through host buffers of ``pool`` (``pipert.comm.staging``;
    None: when gloo carries GPU tensors). ``trace`` also records each compute's own time
    (``StepResult.op_times``, read by ``pipert.tools.fidelity``).
    """

    def __init__(self, units: Sequence[nn.Module], schedule: Schedule | str = "1f1b", *,
                 stages: int | None = None, microbatches: int | None = None, chunks: int | None = None,
                 optimizer: OptimizerFactory = default_optimizer, backend: str = "local",
                 timeout: float = 60.0, schedule_options: dict | None = None, fault: Fault | None = None,
                 trace: bool = False, links: Any = None, measure_memory: bool = False, record: bool = False,
                 pool: Any = None, dp: int = 1, zero: int | str | Sequence = 0, queues: str = "streams",
                 staging: bool | None = None, zero3_buffers: int = 1, link_path: str = "auto",
                 link_clock: str = "auto", rules: str = "native", check: bool = True) -> None:
        if backend not in ("local", "dist"):
            raise ValueError(f"backend {backend!r} unknown; allowed: 'local', 'dist'")
        if rules not in RULES:
            raise ValueError(f"rules {rules!r} unknown; allowed: {', '.join(RULES)}")
        if backend == "dist" and not dist.is_initialized():
            raise RuntimeError("backend 'dist' needs torch.distributed initialised (torchrun or pipert.launch)")
        native_nccl = backend == "dist" and dist.get_backend() == "nccl"
        self.rules = "nccl" if rules == "nccl" or native_nccl else "gloo"
        """The communication rules the program runs under: "nccl" (NCCL, or ``rules="nccl"``: NCCL's
        rules on gloo or the local hub, ``pipert.comm.ncclsim``) or "gloo" (gloo, the local hub)."""
        self.simulated_nccl = rules == "nccl" and not native_nccl
        self.warmup = warmup_enabled()
        """Whether every communicator is created before the first step, in one global order
        (``pipert.comm.nccl.warmup_order``); off only through PIPERT_NO_WARMUP=1, for tests that
        show what happens without it."""
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise ValueError(f"dp must be a positive integer (data-parallel replicas), got {dp!r}")
        if isinstance(schedule, str):
            if microbatches is None:
                raise ValueError("microbatches is required when the schedule is given by name")
            if microbatches % dp:
                raise ValueError(f"{microbatches} micro-batches do not split over dp={dp} replicas; use a multiple "
                                 f"of {dp}")
            name, opts = schedule, dict(stages=stages or len(units), microbatches=microbatches // dp,
                                        chunks=chunks, **(schedule_options or {}))
            schedule = _built_once(name, opts) if backend == "dist" else build_schedule(name, **opts)
        if dp > 1:
            from .schedules.data_parallel import replicate
            from .schedules.zero_rules import resolve_zero
            zeros, numel = resolve_zero(zero, [[(n, p.numel()) for n, p in m.named_parameters()] for m in units])
            schedule = replicate(schedule, dp, zeros, numel, zero3_buffers)
        elif (zero not in (0, None, "0") or zero3_buffers != 1) and schedule.placement.replicas is None:
            raise ValueError(f"zero={zero!r} needs data-parallel replicas (dp > 1)")
        if check:
            validate(schedule, transport=self.rules)
        if schedule.num_units != len(units):
            raise ValueError(f"schedule {schedule.name!r} has {schedule.num_units} units but the model was "
                             f"partitioned into {len(units)}")
        self.schedule = schedule
        self.program = program_for(schedule)
        """The program every rank runs (``schedule`` after the executor's lowering passes)."""
        self.backend = backend
        self.timeout = timeout
        self.fault = fault
        self.trace = trace
        self.measure_memory = measure_memory
        self.record = record
        if queues not in ("streams", "host"):
            raise ValueError(f"queues {queues!r} unknown; allowed: 'streams', 'host'")
        # a snapshot after every action needs the actions to run one at a time
        self.queues = "host" if (measure_memory or record) else queues
        self.links = _link_emulator(links, schedule.num_ranks)
        if link_path not in DelayedTransport.PATHS:
            raise ValueError(f"link_path {link_path!r} unknown; allowed: {', '.join(DelayedTransport.PATHS)}")
        self.link_path = link_path
        if link_clock not in ("auto", "shared", "estimate"):
            raise ValueError(f"link_clock {link_clock!r} unknown; allowed: auto, shared, estimate")
        """The LinkEmulator every point-to-point message crosses (None: messages are not delayed)."""
        self._all_units = list(units)
        self._boundary: dict[tuple[int, int], BoundarySpec] = {}
        self.last_results: dict[int, StepResult] = {}
        if backend == "local":
            self.ranks = list(range(schedule.num_ranks))
        else:
            if dist.get_world_size() != schedule.num_ranks:
                raise ValueError(f"schedule {schedule.name!r} needs {schedule.num_ranks} ranks, "
                                 f"the job has {dist.get_world_size()}")
            self.ranks = [dist.get_rank()]
            check_same_program(self.program)
        if staging is None:  # gloo cannot read GPU memory: stage GPU tensors in host buffers
            from .comm.staging import needs_staging
            staging = backend == "dist" and needs_staging(
                dist.get_backend(), _device_of(units[u] for u in units_needed(schedule, self.ranks[0])))
        self.staging = staging
        """Whether point-to-point messages go through host buffers of ``pool`` (pipert.comm.staging)."""
        if pool is None and (staging or any(a.op in HOST_OPS for _, _, a in self.program)):
            from .device.pinned import PinnedPool
            pool = PinnedPool()
        self.pool = pool
        """The pinned pool of OFFLOAD/PREFETCH and of staged messages (None when nothing needs one)."""
        self.modules: dict[int, dict[int, nn.Module]] = {}
        self.optimizers: dict[int, dict[int, torch.optim.Optimizer]] = {}
        pl = schedule.placement
        for r in self.ranks:
            needed = sorted(units_needed(schedule, r))
            _check_materialized(units, needed, r)
            owned = set(schedule.units_owned(r))
            # the owner keeps the given module; every other rank that names the unit gets a copy
            self.modules[r] = {u: (units[u] if pl.weight_owner[u] == r or backend == "dist" else
                                   copy.deepcopy(units[u])) for u in needed}
            # the owner's optimizer steps the stage-0 parameters (ZeRO classes step their shards)
            self.optimizers[r] = {u: _owner_optimizer(ps, optimizer) for u in sorted(owned)
                                  if (ps := _stage0(self.modules[r][u], pl, u))}
        self._optimizer_factory = optimizer
        groups = sorted({tuple(sorted(a.group)) for _, _, a in self.program if a.group})
        dist_transport = None
        self._closers: list = []
        self._comms: Any = None
        if backend == "dist":
            made = None
            stages_ = schedule.meta.get("pp_stages")
            if schedule.placement.replicas is not None and stages_:
                from .comm.mesh import pipeline_mesh, replica_process_groups
                local = self.modules[self.ranks[0]].values()
                made = replica_process_groups(pipeline_mesh(stages_, schedule.num_ranks // stages_,
                                                            _device_of(local).type))
            base = DistTransport(groups, process_groups=made)
            if self.simulated_nccl:
                from .comm.ncclsim import NcclSim, StoreRendezvous
                base = NcclSim(base, StoreRendezvous(), timeout)
                self._closers.append(base.close)
            self._comms = base
            if self.warmup:
                warm_up(base, self.program, self.ranks[0])
            dist_transport = self._staged(base)
            if self.links is not None:
                dist_transport = self._delayed(dist_transport, _device_of(self.modules[self.ranks[0]].values()),
                                               link_clock)
        # Built once: runners and the executor's per-program tables do not depend on the step.
        # The local backend gives each step a fresh hub (set as the executor's transport).
        self._executors = {r: self._executor(r, dist_transport) for r in self.ranks}
        # the queues' worker threads and nccl-sim's streams end with the Pipeline (close(), or when
        # it is garbage-collected), not at interpreter exit
        self._finalizer = weakref.finalize(self, _close_each, self._closers)

    def _delayed(self, transport: Any, device: torch.device, link_clock: str) -> DelayedTransport:
        """``transport`` behind the emulated links; on the stream path with this rank's clock offsets
        to every peer (every rank calls this at the same point)."""
        delayed = DelayedTransport(transport, self.links, path=self.link_path)
        if delayed.takes_stream_path(device):
            from .comm.linkframes import dist_clock_offsets
            delayed.clock_offsets.update(dist_clock_offsets(transport, delayed.ops(device), device, link_clock))
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
            for u in self.schedule.units_owned(r):
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
        device (``pipert.exec.boundaries``): no unit is computed for real."""
        if self._boundary:
            return
        specs = infer_boundaries(self._all_units, inputs[0], self._compute_device(inputs[0]))
        for u, spec in enumerate(specs):
            for m in range(self.schedule.num_microbatches):
                self._boundary[(u, m)] = spec
        self._all_units = []  # keep only the units this process needs

    def _executor(self, rank: int, transport) -> RankExecutor:
        runners = {u: UnitRunner(mod, is_first=(u == 0), is_last=(u == self.schedule.num_units - 1))
                   for u, mod in self.modules[rank].items()}
        state = UnitState(rank, self.program, runners, self.optimizers[rank],
                          lambda ps: _owner_optimizer(ps, self._optimizer_factory), pool=self.pool)
        from .device.queues import make_queues
        queues = make_queues(self.queues, _device_of(self.modules[rank].values()), name=f"rank{rank}")
        self._closers.append(queues.close)
        return RankExecutor(rank, self.program, runners, transport, self.optimizers[rank],
                            lambda u, m: self._boundary[(u, m)], timeout=self.timeout, fault=self.fault,
                            trace=self.trace, state=state, measure_memory=self.measure_memory, record=self.record,
                            queues=queues, comms=self._comms)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One training step on the batch; returns the mean loss over all micro-batches."""
        M = self.schedule.num_microbatches
        xs, ys = split_microbatches(inputs, M), split_microbatches(targets, M)
        self._infer_boundaries(xs)
        for r in self.ranks:
            for mod in self.modules[r].values():
                for p in mod.parameters():
                    p.grad = None
        cpu0 = time.process_time()
        if self.backend == "local":
            results = self._run_local(xs, ys)
        else:
            results = {self.ranks[0]: self._executors[self.ranks[0]].run(xs, ys)}
        self.last_process_cpu = time.process_time() - cpu0  # every thread of this process, in the run
        self.last_results = results
        return self._mean_loss(results, self._compute_device(inputs))

    def _mean_loss(self, results: dict[int, StepResult], device: torch.device) -> float:
        """The mean loss over the step's micro-batches, read from the devices once: every rank's
        losses go into one vector (per micro-batch: loss, count) on their device, summed over the
        job (torch.distributed: on the device the backend reduces), read by the host in one copy.
        Fills each result's ``losses`` from it."""
        M = self.schedule.num_microbatches
        found = [t for r in results.values() for t in r.loss_values.values()]
        vec = torch.zeros(2 * M, dtype=torch.float64, device=found[0].device if found else device)
        for r in results.values():
            for m, t in r.loss_values.items():
                vec[m].add_(t.to(vec.device, torch.float64))  # stays on the device: no host read
                vec[M + m].add_(1.0)
        if self.backend == "dist":
            # on a device the process group's backend reduces: the CPU for gloo, the GPU for NCCL
            vec = vec.to(reduction_device(dist.get_backend(), vec.device))
            dist.all_reduce(vec)
        values = vec.tolist()  # the step's one read of the device
        losses, counts = values[:M], values[M:]
        for r in results.values():
            r.losses = {m: losses[m] for m in r.loss_values}
        count = round(sum(counts))
        if count != M:
            raise PipelineError(f"step produced {count} losses for {M} micro-batches")
        return sum(losses) / M

    def _run_local(self, xs, ys) -> dict[int, StepResult]:
        hub = LocalHub(self.schedule.num_ranks)
        results: dict[int, StepResult] = {}
        errors: dict[int, BaseException] = {}

        rendezvous = None
        if self.simulated_nccl:
            from .comm.ncclsim import LocalRendezvous
            rendezvous = LocalRendezvous()
            hub.on_fail.append(rendezvous.fail)

        def work(rank: int) -> None:
            executor = self._executors[rank]
            try:
                base = hub.transport(rank)
                if rendezvous is not None:  # the hub is new every step: so are its communicators
                    from .comm.ncclsim import NcclSim
                    base = executor.comms = NcclSim(base, rendezvous, self.timeout)
                    if self.warmup:
                        warm_up(base, self.program, rank)
                executor.transport = self._staged(base)
                if self.links is not None:
                    executor.transport = DelayedTransport(executor.transport, self.links, path=self.link_path)
                results[rank] = executor.run(xs, ys)
            except BaseException as e:  # noqa: BLE001 - reported below, after all threads stop
                errors[rank] = e
                if not isinstance(e, PipelineTimeout):
                    # A crash stops the others at once; a timeout lets each rank time out on
                    # its own peer, so the report can name the rank that stalled.
                    hub.fail(f"rank {rank} failed: {e}")
            finally:
                if rendezvous is not None:
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
                self._executors[r].abort()
            for t in stuck:
                t.join(timeout=self.timeout + 1.0)
        if report:
            raise report[_root_cause(report)]
        return results


RULES = ("native", "nccl")
"""``Pipeline(rules=...)``: the backend's own communication rules, or NCCL's (on gloo and the local
hub emulated by ``pipert.comm.ncclsim``; on NCCL itself the same as native)."""


def _close_each(closers: list) -> None:
    for close in closers:
        close()


def warmup_enabled() -> bool:
    """Communicators are warmed up unless PIPERT_NO_WARMUP=1 (a switch for tests only)."""
    import os
    return os.environ.get("PIPERT_NO_WARMUP", "") != "1"


def warm_up(comms: Any, program: Schedule, rank: int) -> None:
    """Create every communicator of ``program`` that ``rank`` belongs to, in the one global order
    of ``pipert.comm.nccl.warmup_order`` (no rank can wait on one another has yet to reach)."""
    from .comm.nccl import warmup_order
    for c in warmup_order(program):
        if rank in c.ranks:
            comms.connect(c, "warm-up")


def _stage0(module: nn.Module, placement: Any, u: int) -> list[nn.Parameter]:
    """The unit's parameters of ZeRO stage 0 (those the owner's optimizer steps)."""
    params = list(module.parameters())
    return [p for p, z in zip(params, placement.param_zero(u, len(params))) if z == 0]
