"""What a Pipeline binds a Program to: its options and the helpers that check and bind them.

- :class:`RuntimeOptions`: how a process runs its ranks (queues, host staging, pinned pool);
- :class:`LinkEmulation`: emulated links and how their delays are applied;
- :func:`program_of`: the Program a Pipeline runs (compiled by ``pipert.compile`` when given a
  schedule or a name; under torch.distributed a named schedule is compiled once, on rank 0);
- :func:`check_same_program`: every rank of a job runs the same program;
- :func:`warm_up`: every communicator of a program created in one global order.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .comm.mesh import DEFAULT_MESH_ORDER, parse_mesh_order
from .compiler import compile
from .device.tensors import device_of, meta_tensors
from .errors import PipelineError
from .ir.program import Program, ProgramError
from .ir.schedule import Schedule

__all__ = ["BACKENDS", "QUEUES", "RuntimeOptions", "LinkEmulation", "program_of", "native_nccl", "check_same_program",
           "emulates_nccl", "warm_up", "check_materialized", "root_cause", "units_device"]

BACKENDS = ("local", "dist")
"""``Pipeline(backend=...)``: every rank a thread of this process, or this process one rank of a
torch.distributed job."""

QUEUES = ("streams", "host")
"""How a rank's queues run: on streams (``pipert._C`` workers, CUDA streams), or one action at a
time on the host."""


@dataclass(frozen=True)
class RuntimeOptions:
    """How a process runs its ranks' programs (``Pipeline(runtime=...)``)."""

    queues: str = "streams"
    """:data:`QUEUES`; instrumentation that snapshots every action runs on "host"."""
    staging: bool | None = None
    """Move point-to-point messages through host buffers of ``pool`` (``pipert.comm.staging``);
    None: when gloo carries GPU tensors."""
    pool: Any = None
    """The pinned pool of OFFLOAD/PREFETCH and of staged messages (None: one is made when needed)."""
    tp: int = 1
    """T processes run each program rank (tensor parallelism, torch.distributed only): the job has
    ``num_ranks * T`` processes, each runs one program rank at one tp coordinate t
    (``pipert.comm.mesh``); the units are the TP shards (``pipert.models.tpshard.shard_units``)."""
    mesh_order: str | tuple[str, ...] = DEFAULT_MESH_ORDER
    """The (dp, pp, tp) mesh's dimensions, outermost first ("dp,pp,tp" or a tuple of the names):
    which global rank runs which program rank and tp coordinate
    (``pipert.comm.mesh.ProcessLayout``; the default: global rank ``r*T + t``)."""

    def __post_init__(self) -> None:
        if self.queues not in QUEUES:
            raise ValueError(f"queues {self.queues!r} unknown; allowed: {', '.join(QUEUES)}")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1 (processes per program rank), got {self.tp}")
        object.__setattr__(self, "mesh_order", parse_mesh_order(self.mesh_order, "mesh_order"))


@dataclass(frozen=True)
class LinkEmulation:
    """Emulated links every point-to-point message and collective crosses (``Pipeline(links=...)``)."""

    links: Any
    """A ``pipert.comm.links.LinkEmulator``, a ``pipert.cost.Links`` (the simulator's numbers) or a
    ``pipert.linkflags.LinkOptions``."""
    path: str = "auto"
    """How delays are applied (``pipert.comm.delayed.DelayedTransport.PATHS``)."""
    clock: str = "auto"
    """The clock rule of the stream path under torch.distributed: auto, shared or estimate
    (``pipert.comm.linkframes.link_clock_offsets``)."""

    def __post_init__(self) -> None:
        from .comm.delayed import DelayedTransport
        if self.path not in DelayedTransport.PATHS:
            raise ValueError(f"link path {self.path!r} unknown; allowed: {', '.join(DelayedTransport.PATHS)}")
        if self.clock not in ("auto", "shared", "estimate"):
            raise ValueError(f"link clock {self.clock!r} unknown; allowed: auto, shared, estimate")

    @staticmethod
    def of(links: Any) -> "LinkEmulation | None":
        """``links`` as a LinkEmulation (plain links: default path and clock); None stays None."""
        return links if links is None or isinstance(links, LinkEmulation) else LinkEmulation(links)

    def emulator(self, num_ranks: int) -> Any:
        """The LinkEmulator of ``num_ranks`` ranks."""
        from .comm.links import LinkEmulator
        from .cost.topology import Links
        from .linkflags import LinkOptions
        links = self.links
        if isinstance(links, LinkOptions):
            links = links.links(num_ranks)
        if isinstance(links, Links):
            links = LinkEmulator.from_links(links)
        if not isinstance(links, LinkEmulator):
            raise TypeError(f"links must be a LinkEmulator, pipert.cost.Links or pipert.linkflags.LinkOptions, got "
                            f"{type(links).__name__}")
        if links.num_ranks != num_ranks:
            raise ValueError(f"links cover {links.num_ranks} ranks but the program has {num_ranks}")
        return links


def native_nccl(backend: str) -> bool:
    """Whether this process runs on NCCL itself (a torch.distributed job of the NCCL backend)."""
    return backend == "dist" and dist.get_backend() == "nccl"


def program_of(program: Program | Schedule | str, units: Sequence[nn.Module], backend: str, check: bool,
               options: dict[str, Any]) -> Program:
    """The Program to run: ``program`` itself, or ``pipert.compile(program, units=units, **options)``
    under the job's rules (NCCL's on NCCL unless ``options`` name them); a name under
    torch.distributed is compiled on rank 0 only and sent to every rank (a solver decides once).
    ``check``: whether compile validates (False only through instrumentation)."""
    if isinstance(program, Program):
        if options:
            raise TypeError(f"{', '.join(sorted(options))} shape a schedule, but program {program.name!r} is "
                            f"compiled already: give them to pipert.compile")
        if program.num_units != len(units):
            raise ValueError(f"program {program.name!r} has {program.num_units} units but the model was partitioned "
                             f"into {len(units)}")
        return program
    if not isinstance(program, (str, Schedule)):
        raise TypeError(f"program must be a Program, a Schedule or a schedule name, got {type(program).__name__}")
    if "units" in options or "check" in options:
        raise TypeError("units and check are not compile options of a Pipeline: it compiles for its own units, "
                        "and an unvalidated program runs only through Instrumentation(check=False)")
    opts = {"rules": "nccl" if native_nccl(backend) else "gloo", **options}
    build: Callable[[], Program] = lambda: compile(program, units=units, check=check, **opts)  # noqa: E731
    return _compiled_on_rank0(build) if backend == "dist" and isinstance(program, str) else build()


def _compiled_on_rank0(build: Callable[[], Program]) -> Program:
    """``build()`` run on rank 0 and sent to every rank; its error is raised on every rank."""
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = build()
        except (ValueError, RuntimeError) as e:
            box[0] = e if _picklable(e) else ValueError(str(e))
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _picklable(e: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:  # noqa: BLE001 - any failure means: send its text instead
        return False


def check_same_program(program: Program) -> None:
    """Every rank of a torch.distributed job must run the same program: compare its digest across
    ranks and fail naming the ranks that disagree."""
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, program.digest)
    if len(set(digests)) > 1:
        by: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            by.setdefault(d, []).append(r)
        groups = "; ".join(f"ranks {rs} have program {d[:12]}" for d, rs in sorted(by.items(), key=lambda x: x[1]))
        raise PipelineError(f"ranks disagree on the program to run ({groups}); build the schedule once and "
                            f"share it (a solver must be deterministic)")


def emulates_nccl(program: Program, backend: str) -> bool:
    """Whether NCCL's rules are emulated (``pipert.comm.ncclsim``): a program compiled under them
    runs under them, on NCCL itself or emulated on gloo and the local hub. A program validated
    under gloo's rules may not run on NCCL."""
    if native_nccl(backend) and program.rules != "nccl":
        raise ProgramError(f"program {program.name!r} was validated under gloo's rules; this job runs NCCL: "
                           f"compile it with rules='nccl'")
    return program.rules == "nccl" and not native_nccl(backend)


def warm_up(comms: Any, program: Program, rank: int) -> None:
    """Create every communicator of ``program`` that ``rank`` belongs to, in the one global order
    of ``pipert.comm.nccl.warmup_order`` (no rank can wait on one another has yet to reach)."""
    from .comm.nccl import warmup_order
    for c in warmup_order(program):
        if rank in c.ranks:
            comms.connect(c, "warm-up")


def units_device(units: Iterable[nn.Module]) -> torch.device:
    """The device of ``units``' tensors (the CPU for units without any)."""
    return device_of(units) or torch.device("cpu")


def check_materialized(units: Sequence[nn.Module], needed: Iterable[int], rank: int) -> None:
    """Every unit ``rank`` computes or holds has real tensors (none on the meta device)."""
    for u in needed:
        on_meta = meta_tensors(units[u])
        if on_meta:
            more = ", ..." if len(on_meta) > 3 else ""
            raise ValueError(f"unit {u} is needed on rank {rank} (it computes or holds it) but is on the meta device "
                             f"({', '.join(on_meta[:3])}{more}); materialise it first "
                             f"(pipert.models.materialize, or build_units(keep=units_needed(program, {rank})))")


def root_cause(errors: dict[int, BaseException]) -> int:
    """The failed rank to report: one that waited on a peer which did not fail itself (that
    peer is the stalled one); ranks waiting on other waiting ranks are echoes."""
    for r in sorted(errors):
        peer = getattr(errors[r], "peer", None)
        if peer is not None and peer not in errors:
            return r
    return min(errors)
