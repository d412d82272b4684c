"""The process layout of a pipeline x data-parallel job, built with torch's DeviceMesh.

A job of P stages and D replicas has ``P*D`` ranks in a ``(D, P)`` mesh with dimensions
``("dp", "pp")``: rank ``d*P + s`` is stage s of replica d (what
``pipert.schedules.data_parallel.replicate`` lays out). Point-to-point messages travel along
"pp"; each unit's replica group is a "dp" group, whose process group the mesh provides.
"""
from __future__ import annotations

from typing import Any

__all__ = ["pipeline_mesh", "replica_process_groups"]


def pipeline_mesh(stages: int, dp: int, device_type: str = "cpu") -> Any:
    """The ``(dp, pp)`` DeviceMesh of an initialised torch.distributed job of ``stages * dp``
    ranks (every rank must call this)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    if world != stages * dp:
        raise ValueError(f"a mesh of {stages} stages x {dp} replicas needs {stages * dp} ranks; the job has {world}")
    return init_device_mesh(device_type, (dp, stages), mesh_dim_names=("dp", "pp"))


def replica_process_groups(mesh: Any) -> dict[tuple[int, ...], Any]:
    """{ranks of every "dp" group: its process group on its members, None elsewhere}: the mesh
    made every one of them (a rank holds the units of its stage, whose replica group is its
    "dp" group), so no rank makes them again."""
    dp, stages = mesh.mesh.shape
    mine = mesh["dp"].get_group()
    own = tuple(sorted(int(r) for r in mesh["dp"].mesh.tolist()))
    return {tuple(s + d * stages for d in range(dp)): (mine if tuple(s + d * stages for d in range(dp)) == own else None)
            for s in range(stages)}
