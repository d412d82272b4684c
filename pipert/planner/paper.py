"""The PipeMesh paper's Table IV (PipeMesh and Megatron rows) and what the planner's equations
predict from its component times.

Read as the paper's data: times are ms per iteration (the table says microseconds; the
magnitudes are ms), memory GiB of the first stage, B is the global batch. What we derive:

- B per pipeline = batch / D (the paper's "B/P micro-batches per device" reads as B/D);
- C^fwd = T_fwd / (M B), C^bwd = T_bwd / (M B): per chunk and micro-batch;
- psi = params per layer x layers / (T P) (weight matrices, no embedding: Table IV's Megatron
  M_p = 2 psi matches it to 0.1 GiB);
- C_DP = t_p psi / M with t_p, the data-parallel time per parameter, taken from one number per
  cluster: on A100 the paper's "Megatron overlaps 31.3 % of DP communication" (total DP time
  = its exposed DP / 0.687 = 2 t_p psi), on V100 Llama2's Megatron row (M = 1, so Eq. 2 is
  exactly 2 C_DP = 2 t_p psi). Every other exposed-DP value is then a prediction.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .pipemesh import Components, QueuePlan, megatron_plan, queue_plan, split_even, state_memory
from .workload import PAPER_MODELS, LayerShape, layer_items

__all__ = ["Row", "Config", "TABLE_IV", "MEGATRON_OVERLAP_A100", "PAPER_ZERO3", "per_param_dp_time", "components",
           "predict", "pipemesh_queue", "layer_activation", "megatron_activation",
           "megatron_implied_dp_comm", "GIB", "megatron_budget", "problem", "iteration", "paper_gain"]

GIB = float(1 << 30)
MEGATRON_OVERLAP_A100 = 0.313
"""Section VI-A: Megatron overlaps 31.3 % of its DP communication (GPT-3, A100)."""
PAPER_ZERO3 = {"gpt3-v100": 0.844, "llama2-v100": 0.909, "falcon-v100": 0.869}
"""Section VI: the share of parameters PipeMesh's plans set to ZeRO-3 on V100 (the rest ZeRO-2)."""


@dataclass(frozen=True)
class Row:
    """One system's line of Table IV."""

    system: str
    chunks: int
    q: int | None
    fwd: float
    bwd: float
    bubble: float
    dp_crit: float
    pp_crit: float
    mem_gpu: float
    mem_act: float
    mem_grad: float
    mem_param: float
    tflops: float


@dataclass(frozen=True)
class Config:
    """One model/cluster block of Table IV."""

    key: str
    model: LayerShape
    cluster: str
    batch: int
    tp: int
    stages: int
    dp: int
    pipemesh: Row
    megatron: Row

    @property
    def microbatches(self) -> int:
        """B per pipeline: the global batch over D."""
        return self.batch // self.dp

    @property
    def params(self) -> float:
        """psi: parameters of one device."""
        return self.model.params_per_layer * self.model.layers / (self.tp * self.stages)

    def row(self, system: str) -> Row:
        return {"pipemesh": self.pipemesh, "megatron": self.megatron}[system]


def _r(system, M, q, *v) -> Row:
    return Row(system, M, q, *v)


TABLE_IV: dict[str, Config] = {c.key: c for c in [
    Config("gpt3-a100", PAPER_MODELS["gpt3-58b"], "a100", 36, 8, 3, 3,
           _r("pipemesh", 6, 6, 1554.1, 2567.2, 114.5, 245.1, 140.3, 29.9, 11.5, 3.0, 3.9, 120.6),
           _r("megatron", 2, None, 1492.2, 2485.4, 331.5, 993.6, 262.8, 30.1, 9.6, 4.5, 4.5, 100.4)),
    Config("gpt3-v100", PAPER_MODELS["gpt3-58b"], "v100", 72, 8, 4, 3,
           _r("pipemesh", 6, 12, 5012.0, 9217.1, 296.4, 757.9, 505.9, 25.3, 11.4, 2.3, 2.7, 52.1),
           _r("megatron", 2, None, 4914.5, 9109.6, 876.5, 3923.1, 922.7, 25.6, 9.9, 3.4, 3.4, 42.1)),
    Config("llama2-v100", PAPER_MODELS["llama2-55b"], "v100", 48, 8, 4, 3,
           _r("pipemesh", 5, 8, 4883.6, 8841.1, 514.7, 859.2, 635.6, 25.6, 11.8, 2.4, 2.8, 46.2),
           _r("megatron", 1, None, 4789.0, 8664.1, 2522.5, 4263.8, 1155.1, 25.7, 10.6, 3.2, 3.2, 34.8)),
    Config("falcon-v100", PAPER_MODELS["falcon-66b"], "v100", 72, 8, 4, 3,
           _r("pipemesh", 8, 12, 6035.9, 10805.4, 263.1, 638.8, 548.7, 26.5, 11.6, 2.2, 2.7, 52.2),
           _r("megatron", 3, None, 5911.3, 10676.7, 691.1, 4595.8, 967.5, 26.9, 9.3, 3.8, 3.8, 42.3)),
]}


def per_param_dp_time(cluster: str) -> tuple[float, str]:
    """(t_p in ms per parameter, where it comes from) for ``cluster`` (see the module doc)."""
    if cluster == "a100":
        cfg = TABLE_IV["gpt3-a100"]
        total = cfg.megatron.dp_crit / (1 - MEGATRON_OVERLAP_A100)
        return total / (2 * cfg.params), "GPT-3 A100 Megatron exposed DP / (1 - 0.313)"
    if cluster == "v100":
        cfg = TABLE_IV["llama2-v100"]
        assert cfg.megatron.chunks == 1
        return cfg.megatron.dp_crit / (2 * cfg.params), "Llama2 V100 Megatron exposed DP (M = 1: Eq. 2 = 2 C_DP)"
    raise ValueError(f"cluster={cluster!r}; allowed: a100, v100")


def components(cfg: Config, system: str, t_p: float | None = None) -> Components:
    """The Components of ``cfg``'s ``system`` row (ms, parameters)."""
    row = cfg.row(system)
    B, M = cfg.microbatches, row.chunks
    t_p = per_param_dp_time(cfg.cluster)[0] if t_p is None else t_p
    return Components(cfg.stages, cfg.dp, M, B, row.fwd / (M * B), row.bwd / (M * B), t_p * cfg.params / M,
                      0.0, cfg.params)


def pipemesh_queue(cfg: Config, c: Components) -> QueuePlan:
    """The paper's schedule: e = d = two equal halves of B (section VI-A), e_1 = q, sharding
    by cases A/B."""
    qp = queue_plan(c, cfg.pipemesh.q)
    assert qp.enqueue == split_even(c.microbatches, 2), qp.enqueue
    return qp


def predict(cfg: Config, system: str, t_p: float | None = None) -> dict[str, float]:
    """Bubble, exposed DP and memory predicted for ``cfg``'s ``system`` row."""
    c = components(cfg, system, t_p)
    qp = pipemesh_queue(cfg, c) if system == "pipemesh" else megatron_plan(c)
    mem = state_memory(c, qp.sharding)
    out = {"bubble": (c.stages - 1) * c.comp, "dp_crit": qp.dp_crit, "C_DP": c.dp_comm,
           "mem_grad": mem["gradients"] / GIB, "mem_param": mem["parameters"] / GIB,
           "zero3_share": qp.sharding.zero_param / c.params, "case": qp.case, "bz3_bwd": qp.sharding.bz3_bwd}
    if system == "megatron":
        out["mem_act"] = megatron_activation(cfg) / GIB
    return out


def layer_activation(m: LayerShape, tp: int) -> float:
    """Bytes one layer keeps per micro-batch on one shard (sequence parallel), nothing recomputed
    but self-attention: the paper's 34, 203/6, 53/2 s b h / T."""
    return float(sum(i[1] for i in layer_items(m))) * m.seq * m.hidden / tp


def megatron_activation(cfg: Config) -> float:
    """Stage 1's activations under Megatron: P(M-1) + 2(P-1) + 1 live passes when interleaved,
    P with plain 1F1B (M = 1), each pass keeping layers/(P M) layers."""
    P, M = cfg.stages, cfg.megatron.chunks
    live = P * (M - 1) + 2 * (P - 1) + 1 if M > 1 else P
    return live * cfg.model.layers // (P * M) * layer_activation(cfg.model, cfg.tp)


def megatron_implied_dp_comm(cfg: Config) -> float:
    """The C_DP (per Megatron chunk) at which Eq. 2 gives Megatron's measured exposed DP time
    (Eq. 2 grows strictly with C_DP, so bisection finds it)."""
    c = components(cfg, "megatron")
    target = cfg.megatron.dp_crit
    lo, hi = 0.0, target
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if megatron_plan(replace(c, dp_comm=mid)).dp_crit < target else (lo, mid)
    return (lo + hi) / 2


def megatron_budget(cfg: Config) -> float:
    """The paper's memory budget, Megatron's usage, as the memory model gives it (bytes):
    optimizer 12 psi / D, gradients and parameters 2 psi each, Megatron's activations."""
    c = components(cfg, "megatron")
    return 12 * c.params / c.dp + 4 * c.params + megatron_activation(cfg)


def problem(cfg: Config, system: str, budget: float | None = None) -> tuple[Components, int, list, float]:
    """(components, kept bytes per pass, chunk ops in ms, budget in bytes) of ``cfg``'s ``system``
    row at that row's own M: its component times from the table, op sizes and times from the
    analytic model on the cluster's GPU; ``budget`` None: Megatron's usage (the paper's rule)."""
    from ..cost.devices import DeviceSpec
    from .workload import Cluster, chunk_ops
    c = components(cfg, system)
    cluster = Cluster(DeviceSpec.preset(cfg.cluster), 8, 400.0 if cfg.cluster == "a100" else 100.0)
    base, ops = chunk_ops(cfg.model, cfg.tp, cluster, cfg.model.layers // (cfg.stages * c.chunks))
    ops = [replace(o, time=o.time * 1e3) for o in ops]            # seconds -> ms, the table's unit
    return c, base, ops, megatron_budget(cfg) if budget is None else budget


def iteration(cfg: Config, system: str, planned=None) -> dict[str, float]:
    """One iteration (ms) of ``cfg``'s ``system`` at its own M, term by term: ``paper`` (Table IV's
    columns), ``equations`` (the row's measured compute, Eq. 1's bubble, Eqs. 2-5 with the paper's
    q and sequences) and, given ``planned`` (a ``pipert.planner.Plan`` of this row's problem), the
    planner's own choice. The PP column is the paper's in all three: read as 2(P-1) C_PP it gives
    C_PP above C^fwd, which the equations exclude, so it is an input, not a prediction."""
    r = cfg.row(system)
    out = {"paper": {"compute": r.fwd + r.bwd, "bubble": r.bubble, "dp_crit": r.dp_crit, "pp_crit": r.pp_crit}}
    p = predict(cfg, system)
    out["equations"] = {"compute": r.fwd + r.bwd, "bubble": p["bubble"], "dp_crit": p["dp_crit"], "pp_crit": r.pp_crit}
    if planned is not None:
        t = planned.time
        out["planner"] = {"compute": t["compute"], "bubble": t["bubble"], "dp_crit": t["dp_crit"], "pp_crit": r.pp_crit}
    for parts in out.values():
        parts["total"] = sum(parts.values())
    return out


def paper_gain(cfg: Config) -> float:
    """PipeMesh's throughput over Megatron's in the paper: the ratio of Table IV's TFLOPS."""
    return cfg.pipemesh.tflops / cfg.megatron.tflops
