"""The process layout of a pipeline x data-parallel x tensor-parallel job, built with torch's DeviceMesh.

A job of P stages, D replicas and T-way tensor parallelism has ``P*D*T`` processes. Program rank
``r = d*P + s`` is stage s of replica d (what ``pipert.schedules.data_parallel.replicate`` lays
out; the schedule, compiler, validator and simulator see only program ranks), and T processes
run it, one per tp coordinate t. Which global rank runs (d, s, t) is decided here and nowhere
else: :meth:`ProcessLayout.global_rank`, row-major over the mesh order (outermost first), which
is also how ``init_device_mesh`` numbers a mesh of that shape. The default order
``("dp", "pp", "tp")`` gives ``g = r*T + t``: TP innermost, so a TP group is T consecutive
ranks (one node, the fastest links).

Point-to-point messages travel along "pp" between processes of the same tp coordinate; each
unit's replica group is a "dp" group (same stage, same tp coordinate), whose process group the
mesh provides; a "tp" group runs the collectives inside a stage's computes (``pipert.models.tp``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["MESH_DIMS", "DEFAULT_MESH_ORDER", "ProcessLayout", "parse_mesh_order", "pipeline_mesh",
           "replica_process_groups", "tp_group"]

MESH_DIMS = ("dp", "pp", "tp")
"""The mesh's dimensions: data-parallel replica d, pipeline stage s, tensor-parallel coordinate t."""
DEFAULT_MESH_ORDER = ("dp", "pp", "tp")
"""Outermost first: TP innermost (a TP group on consecutive ranks, one node), DP outermost."""


def parse_mesh_order(value: str | Sequence[str], flag: str = "--mesh-order") -> tuple[str, ...]:
    """``value`` ("dp,pp,tp" or a sequence of names) as a tuple of the mesh's dimensions, outermost
    first; anything but a permutation of dp, pp, tp is a ValueError naming ``flag`` and ``value``."""
    names = tuple(n.strip() for n in value.split(",")) if isinstance(value, str) else tuple(value)
    if sorted(names) == sorted(MESH_DIMS):
        return names
    unknown = [n for n in names if n not in MESH_DIMS]
    why = (f"unknown name(s) {', '.join(map(repr, unknown))}" if unknown else
           f"each of {', '.join(MESH_DIMS)} must appear exactly once")
    shown = value if isinstance(value, str) else ",".join(map(str, names))
    raise ValueError(f"{flag} {shown!r}: {why}; "
                     f"allowed: a permutation of {','.join(MESH_DIMS)}, outermost first (default "
                     f"{','.join(DEFAULT_MESH_ORDER)}; tp last keeps each TP group on consecutive ranks, one node)")


@dataclass(frozen=True)
class ProcessLayout:
    """Which global rank runs program rank ``d*stages + s`` at tp coordinate t."""

    stages: int
    """P: pipeline stages."""
    dp: int = 1
    """D: data-parallel replicas."""
    tp: int = 1
    """T: tensor-parallel processes per program rank."""
    order: tuple[str, ...] = DEFAULT_MESH_ORDER
    """The mesh's dimensions, outermost first (a permutation of :data:`MESH_DIMS`)."""

    def __post_init__(self) -> None:
        for name in ("stages", "dp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProcessLayout.{name} must be >= 1, got {getattr(self, name)}")
        object.__setattr__(self, "order", parse_mesh_order(self.order, "mesh_order"))

    @property
    def size(self) -> int:
        """Processes: P x D x T."""
        return self.stages * self.dp * self.tp

    @property
    def program_ranks(self) -> int:
        """Program ranks: P x D."""
        return self.stages * self.dp

    def _sizes(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.stages, "tp": self.tp}

    def global_rank(self, d: int, s: int, t: int) -> int:
        """The global rank of replica d's stage s at tp coordinate t (row-major over ``order``)."""
        coord, sizes = {"dp": d, "pp": s, "tp": t}, self._sizes()
        g = 0
        for name in self.order:
            if not 0 <= coord[name] < sizes[name]:
                raise ValueError(f"{name} coordinate {coord[name]} out of range 0..{sizes[name] - 1}")
            g = g * sizes[name] + coord[name]
        return g

    def coords(self, g: int) -> tuple[int, int, int]:
        """(d, s, t) of global rank ``g`` (inverse of :meth:`global_rank`)."""
        if not 0 <= g < self.size:
            raise ValueError(f"global rank {g} out of range 0..{self.size - 1}")
        sizes, coord = self._sizes(), {}
        for name in reversed(self.order):
            g, coord[name] = divmod(g, sizes[name])
        return coord["dp"], coord["pp"], coord["tp"]

    def process(self, rank: int, t: int) -> int:
        """The global rank that runs program rank ``rank`` at tp coordinate t."""
        return self.global_rank(rank // self.stages, rank % self.stages, t)

    def group(self, ranks: Sequence[int], t: int, ordered: bool = True) -> list[int]:
        """The global ranks of program ranks ``ranks`` (sorted) at tp coordinate t. ``ordered``:
        torch numbers a group's members by global rank, and collectives that place data by member
        (all-gather, reduce-scatter) need that to be program-rank order: ValueError otherwise."""
        ranks = sorted(ranks)
        members = [self.process(r, t) for r in ranks]
        if ordered and members != sorted(members):
            raise ValueError(f"program ranks {ranks} run on global ranks {members} under mesh order "
                             f"{self.describe()}: a collective's processes must be in program-rank order; "
                             f"use a mesh order with pp inside dp (dp,pp,tp, dp,tp,pp or tp,dp,pp) for this program")
        return members

    def program_rank(self, g: int) -> int:
        """The program rank global rank ``g`` runs."""
        d, s, _ = self.coords(g)
        return d * self.stages + s

    def tp_rank(self, g: int) -> int:
        """The tp coordinate of global rank ``g``."""
        return self.coords(g)[2]

    def canonical(self, g: int) -> int:
        """Global rank ``g``'s process under the default order (``r*T + t``): a name for a
        process that does not depend on the mesh order (checkpoints key per-process state by it)."""
        return self.program_rank(g) * self.tp + self.tp_rank(g)

    def mesh_dims(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The DeviceMesh's dimension names and shape (without "tp" when T = 1)."""
        names = tuple(n for n in self.order if n != "tp" or self.tp > 1)
        return names, tuple(self._sizes()[n] for n in names)

    def describe(self) -> str:
        return ",".join(self.order)


def pipeline_mesh(stages: int, dp: int, device_type: str = "cpu", tp: int = 1,
                  order: str | Sequence[str] = DEFAULT_MESH_ORDER) -> Any:
    """The DeviceMesh of an initialised torch.distributed job of ``stages * dp * tp`` processes,
    dimensions in ``order`` outermost first ("tp" left out when T = 1); every process must call
    this."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    layout = ProcessLayout(stages, dp, tp, parse_mesh_order(order, "order"))
    world = dist.get_world_size()
    if world != layout.size:
        raise ValueError(f"a mesh of {stages} stages x {dp} replicas x {tp} TP ranks needs {layout.size} "
                         f"processes; the job has {world}")
    names, shape = layout.mesh_dims()
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    if mesh.mesh.flatten().tolist() != list(range(world)):  # the layout's global_rank is row-major
        raise RuntimeError(f"init_device_mesh numbered the {shape} mesh {mesh.mesh.tolist()}, not row-major")
    return mesh


def layout_of(mesh: Any) -> ProcessLayout:
    """The :class:`ProcessLayout` a :func:`pipeline_mesh` mesh was built with."""
    names, shape = tuple(mesh.mesh_dim_names), tuple(mesh.mesh.shape)
    sizes = dict(zip(names, shape))
    order = names if "tp" in names else names + ("tp",)  # at T = 1 where "tp" stands changes no rank
    return ProcessLayout(sizes["pp"], sizes["dp"], sizes.get("tp", 1), order)


def replica_process_groups(mesh: Any) -> dict[tuple[int, ...], Any]:
    """{program ranks of every "dp" group: its process group on its members (this process's
    tp coordinate), None elsewhere}: the mesh made every one of them (a rank holds the units of
    its stage, whose replica group is its "dp" group), so no rank makes them again."""
    layout = layout_of(mesh)
    mine = mesh["dp"].get_group()
    own = tuple(sorted(layout.program_rank(int(g)) for g in mesh["dp"].mesh.tolist()))
    groups = [tuple(s + d * layout.stages for d in range(layout.dp)) for s in range(layout.stages)]
    return {g: (mine if g == own else None) for g in groups}


def tp_group(mesh: Any) -> Any:
    """This process's "tp" process group (T consecutive global ranks under the default order)."""
    return mesh["tp"].get_group()
