"""The process layout of a pipeline x data-parallel x tensor-parallel job, built with torch's DeviceMesh.

A job of P stages, D replicas and T-way tensor parallelism has ``P*D*T`` processes in a
``(D, P, T)`` mesh with dimensions ``("dp", "pp", "tp")`` (``(D, P)``, ``("dp", "pp")`` when
T = 1): program rank ``r = d*P + s`` is stage s of replica d (what
``pipert.schedules.data_parallel.replicate`` lays out) and the process of global rank
``r*T + t`` runs it at tp coordinate t. TP is innermost, so a TP group is T consecutive ranks
(one node, the fastest links); PP is outermost within a replica. Point-to-point messages travel
along "pp" between processes of the same tp coordinate; each unit's replica group is a "dp"
group (same stage, same tp coordinate), whose process group the mesh provides; a "tp" group
runs the collectives inside a stage's computes (``pipert.models.tp``).
"""
from __future__ import annotations

from typing import Any

__all__ = ["pipeline_mesh", "replica_process_groups", "tp_group"]


def pipeline_mesh(stages: int, dp: int, device_type: str = "cpu", tp: int = 1) -> Any:
    """The ``(dp, pp[, tp])`` DeviceMesh of an initialised torch.distributed job of
    ``stages * dp * tp`` processes (every process must call this)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    if world != stages * dp * tp:
        raise ValueError(f"a mesh of {stages} stages x {dp} replicas x {tp} TP ranks needs {stages * dp * tp} "
                         f"processes; the job has {world}")
    if tp == 1:
        return init_device_mesh(device_type, (dp, stages), mesh_dim_names=("dp", "pp"))
    return init_device_mesh(device_type, (dp, stages, tp), mesh_dim_names=("dp", "pp", "tp"))


def replica_process_groups(mesh: Any) -> dict[tuple[int, ...], Any]:
    """{program ranks of every "dp" group: its process group on its members (this process's
    tp coordinate), None elsewhere}: the mesh made every one of them (a rank holds the units of
    its stage, whose replica group is its "dp" group), so no rank makes them again."""
    dp, stages = mesh.mesh.shape[:2]
    tp = mesh.mesh.shape[2] if mesh.mesh.dim() == 3 else 1
    mine = mesh["dp"].get_group()
    own = tuple(sorted(int(r) // tp for r in mesh["dp"].mesh.tolist()))
    return {tuple(s + d * stages for d in range(dp)): (mine if tuple(s + d * stages for d in range(dp)) == own else None)
            for s in range(stages)}


def tp_group(mesh: Any) -> Any:
    """This process's "tp" process group (T consecutive global ranks)."""
    return mesh["tp"].get_group()
