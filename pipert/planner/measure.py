"""``plan --auto --profile``: plan with this machine's measurements instead of the analytic model.

- Units: the ``pipert train`` model preset of ``--model`` is cut into each unit count the search
  asks for (``pipert.models.build_units``) and every unit profiled on one micro-batch of ``b``
  sequences (``pipert.tools.profile.profile_units``: F, B, D, W, RECOMPUTE seconds and the bytes
  the executor accounts), once per (units, b); one AdamW step of each unit times its OPT.
- Link: two gloo processes of this machine ping-pong a 4-byte and a 4 MiB tensor; half the
  round trips give latency alpha and bandwidth beta (``bytes / (t_large - t_small)``) of the
  intra-node link. Links between nodes and datacenters stay as the flags or presets give them.

Layer units only (HelixPipe's pieces and recomputation are not profiled) and no tensor
parallelism (T = 1): the measured units are whole.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from ..cost.profiled import ProfiledCost
from ..cost.topology import LinkSpec
from .cluster import Cluster

__all__ = ["MeasuredCost", "measured_cluster", "measure_link"]

_SIZES = (4, 4 << 20)
"""Bytes of the two ping-pong messages."""


class MeasuredCost(ProfiledCost):
    """ProfiledCost with what the planner also reads: unit count, parameters, per-op seconds."""

    def __init__(self, profiles: list, params: list[float], opt: list[float]) -> None:
        super().__init__(profiles)
        self._params, self._opt = params, opt

    @property
    def num_units(self) -> int:
        return len(self.profiles)

    def params(self, unit: int) -> float:
        return self._params[unit]

    def unit_time(self, unit: int, op: str) -> float:
        return self._opt[unit] if op == "OPT" else self.profiles[unit].times[op]

    def compute_time(self, action: Any, rank: int) -> float:
        from ..ir.action import Op
        return self._opt[action.unit] if action.op is Op.OPT else super().compute_time(action, rank)


def _profile(name: str, units: int, b: int, seq: int, dtype: str) -> MeasuredCost:
    import torch

    from ..models import build_units, model_config
    from ..tools.profile import profile_units
    mods = build_units(name, units, seed=0, max_seq=seq, dtype=dtype)
    vocab = model_config(name).vocab
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (b, seq), generator=gen)
    y = torch.randint(0, vocab, (b, seq), generator=gen)
    profs = profile_units(mods, x, y, repeats=1)
    params, opt = [], []
    for m in mods:
        ps = [p for p in m.parameters() if p.requires_grad]
        params.append(float(sum(p.numel() for p in ps)))
        for p in ps:
            p.grad = torch.zeros_like(p)
        step = torch.optim.AdamW(ps, lr=1e-3)
        step.step()                                   # the first step allocates the moments
        t0 = time.perf_counter()
        step.step()
        opt.append(time.perf_counter() - t0)
    return MeasuredCost(profs, params, opt)


def measure_link(reps: int = 5) -> LinkSpec:
    """Latency and bandwidth between two gloo processes of this machine (module doc)."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_pingpong, args=(r, port, reps, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    if any(p.exitcode != 0 for p in procs) or q.empty():
        raise RuntimeError("--profile: the two gloo processes that measure the link failed")
    small, large = q.get()
    alpha = small / 2
    return LinkSpec(alpha, (_SIZES[1] - _SIZES[0]) / max((large - small) / 2, 1e-9))


def _pingpong(rank: int, port: int, reps: int, q: Any) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = []
    for n in _SIZES:
        t = torch.zeros(n // 4, dtype=torch.float32)
        times = []
        for _ in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times[1:]))
    if rank == 0:
        q.put(tuple(out))
    dist.destroy_process_group()


def measured_cluster(name: str, spec: Any, cluster: Cluster) -> tuple[Cluster, Any, dict]:
    """(the cluster with the measured intra-node link, a ``cost_for`` of measured units, what was
    measured) for ``pipert train``'s model ``name`` (a preset or LLaMA sizes, ``command.train_model``) at
    ``spec``'s sequence length."""
    try:
        from ..models import model_config, model_names
    except ImportError:
        raise ValueError("--profile measures the model with torch, which is not installed") from None
    if name not in model_names() and "=" not in name:
        raise ValueError(f"--profile runs --model on this machine: {name!r} is not a pipert train model; allowed: "
                         f"{', '.join(model_names())}")
    max_seq = model_config(name).max_seq
    if spec.seq > max_seq:
        raise ValueError(f"--profile: --seq {spec.seq} exceeds the {max_seq} positions of pipert train's {name!r}; "
                         f"allowed --seq: 1..{max_seq}")
    dtype = {8: "float64", 4: "float32"}.get(spec.dtype_bytes, "bfloat16")
    t0 = time.perf_counter()
    link = measure_link()
    cache: dict[tuple[int, int], MeasuredCost] = {}

    def cost_for(model: Any, lay: Any, recompute: str, units: int, loss_in_backward: bool = False) -> MeasuredCost:
        if lay.tp > 1 or recompute != "none" or units > model_config(name).layers or loss_in_backward:
            raise ValueError("--profile measures whole layer units: no tensor parallelism, recomputation or "
                             "HelixPipe pieces (nor their loss in backward)")
        key = (units, lay.micro_batch)
        if key not in cache:
            cache[key] = _profile(name, units, lay.micro_batch, spec.seq, dtype)
        return cache[key]
    from ..linkflags import format_bandwidth, format_duration
    measured = {"link": f"latency {format_duration(link.latency)}, {format_bandwidth(link.bandwidth)} (2 gloo "
                        f"processes)", "link_seconds": round(time.perf_counter() - t0, 2), "dtype": dtype}
    return replace(cluster, links={**cluster.links, "intra_node": link}), cost_for, measured
