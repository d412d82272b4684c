"""Component times and per-operation activation sizes of a transformer chunk for the PipeMesh
planner, from a model shape, a device and a commodity-cloud topology.

One device holds one tensor-parallel shard (T-way, with sequence parallelism: every stored
activation is divided by T, Korthikanti et al. 2022) of ``layers / (P M)`` layers per chunk.
Per layer and micro-batch (``n = s b h`` elements, 2-byte activations, 1-byte dropout masks)
each operation keeps its output for the backward (the paper's Tables I and II): summed they
give 34 n (GPT-3), 203/6 n (Llama2, GQA 8/64) and 53/2 n (Falcon, parallel blocks, two norms)
bytes, the paper's section II-B. The layer input is always kept (recomputation starts from
it); the attention scores are never kept (self-attention is always recomputed, as in the
paper's runs). Recomputing an operation reruns what produces its output from kept tensors:
e.g. the residual after attention reruns the out-projection, dropout and add.

Times: matmul FLOPs / (peak x efficiency), elementwise bytes / memory bandwidth; a backward
pass costs twice the forward. Tensor-parallel traffic (Megatron SP, inside a node): per layer
2 all-gathers and 2 reduce-scatters of ``[s, h]`` in the forward and as many in the backward (one
of each in Falcon's parallel blocks), ring collectives on the cluster's intra-node link
(``pipert.cost.tensor_parallel``), added to C^fwd and C^bwd; recomputing an operation is
priced without its collective. C_DP is the ring reduce-scatter of a chunk's 2-byte gradients
over the D replicas, one per node, each GPU getting ``1/gpus_per_node`` of the node's NIC (all
GPUs of a node run their data-parallel collectives at once); C_PP one [s/T, h] message over
the same share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import ClassVar

from ..cost.devices import DeviceSpec
from ..cost.tensor_parallel import collectives_time, layer_collectives
from ..cost.topology import Links, LinkSpec, Topology, default_link_specs
from .pipemesh import Components
from .recompute import OpCost

__all__ = ["LayerShape", "PAPER_MODELS", "Cluster", "layer_items", "chunk_ops", "workload", "tp_layer_times"]


@dataclass(frozen=True)
class LayerShape:
    """A decoder layer as the planner sizes it."""

    name: str
    layers: int
    """Decoder layers in the model."""
    hidden: int
    """h."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (GQA)."""
    seq: int
    """Tokens per sequence s (micro-batch size 1)."""
    ffn: int
    """MLP inner width."""
    mlp: str = "gelu"
    """"gelu" (two matrices) or "swiglu" (three)."""
    norm: str = "layernorm"
    """"layernorm" or "rmsnorm" (cost only)."""
    parallel: bool = False
    """Attention and MLP read the same input (Falcon): no residual between them, two norms of it;
    their summed output is the next layer's input."""
    dropout: bool = False
    """Dropout after attention and MLP (GPT-3)."""
    dtype_bytes: ClassVar[int] = 2
    """Bytes per activation element (fp16/bf16)."""

    def __post_init__(self) -> None:
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"LayerShape.mlp={self.mlp!r}; allowed: gelu, swiglu")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"LayerShape {self.name}: heads must divide hidden and kv_heads divide heads")

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch (one sequence)."""
        return self.seq

    @property
    def params_per_layer(self) -> int:
        """Weight matrices only (norms and biases are < 0.1 %)."""
        h, f = self.hidden, self.ffn
        return 2 * h * h + 2 * h * self.kv_dim + (3 if self.mlp == "swiglu" else 2) * h * f


# The paper's Table III (Llama2's 8/3 h MLP kept exact: 21845.33 rounds to 21845 here).
PAPER_MODELS: dict[str, LayerShape] = {
    "gpt3-58b": LayerShape("GPT-3 58B", 72, 8192, 64, 64, 3072, 4 * 8192, "gelu", "layernorm", dropout=True),
    "llama2-55b": LayerShape("Llama2 55B", 80, 8192, 64, 8, 4096, 8 * 8192 // 3, "swiglu", "rmsnorm"),
    "falcon-66b": LayerShape("Falcon 66B", 96, 8192, 64, 8, 3072, 4 * 8192, "gelu", "layernorm", parallel=True),
}


def layer_items(m: LayerShape) -> list[tuple[str, Fraction, Fraction, Fraction]]:
    """Per layer: (operation, kept bytes / (s h), matmul FLOPs / (s h), elementwise bytes / (s h)),
    whole layer (divide by T for one shard). The first item, ``input``, is always kept."""
    h, f, kv = m.hidden, Fraction(m.ffn, m.hidden), Fraction(m.kv_dim, m.hidden)
    s = m.seq
    gelu = m.mlp == "gelu"
    out = [("input", Fraction(2), Fraction(0), Fraction(0)),
           ("norm1", Fraction(2), Fraction(0), Fraction(4)),
           ("q_proj", Fraction(2), Fraction(2 * h), Fraction(0)),
           ("k_proj", 2 * kv, 2 * h * kv, Fraction(0)),
           ("v_proj", 2 * kv, 2 * h * kv, Fraction(0)),
           ("attention", Fraction(2), Fraction(4 * s), 2 + 4 * kv + 2)]
    if m.dropout:
        out.append(("attn_dropout", Fraction(1), Fraction(0), Fraction(5)))
    if m.parallel:
        out.append(("norm2", Fraction(2), Fraction(0), Fraction(4)))
    else:
        # the residual feeding norm2: out-projection, dropout and add rerun
        out.append(("residual1", Fraction(2), Fraction(2 * h), Fraction(6)))
        out.append(("norm2", Fraction(2), Fraction(0), Fraction(4)))
    if gelu:
        out += [("fc1", 2 * f, 2 * h * f, Fraction(0)), ("gelu", 2 * f, Fraction(0), 4 * f)]
    else:
        out += [("gate_proj", 2 * f, 2 * h * f, Fraction(0)), ("up_proj", 2 * f, 2 * h * f, Fraction(0)),
                ("silu", 2 * f, Fraction(0), 4 * f), ("mul", 2 * f, Fraction(0), 6 * f)]
    if m.dropout:
        out.append(("mlp_dropout", Fraction(1), Fraction(0), Fraction(5)))
    return out


def _forward_per_layer(m: LayerShape) -> tuple[Fraction, Fraction]:
    """(matmul FLOPs, elementwise bytes) / (s h) of one layer's forward: every item plus the
    down-projection (and, in parallel blocks, the out-projection: elsewhere residual1 carries
    it), whose outputs nobody keeps, and the closing residual add."""
    items = layer_items(m)
    flops = sum(i[2] for i in items) + 2 * m.ffn + (2 * m.hidden if m.parallel else 0)
    return flops, sum(i[3] for i in items) + 6


@dataclass(frozen=True)
class Cluster:
    """A commodity cloud: nodes of ``gpus_per_node`` devices sharing one NIC."""

    device: DeviceSpec
    gpus_per_node: int = 8
    """GPUs per node; the tensor-parallel group lies inside one node."""
    inter_node_gbps: float = 100.0
    """The node's network bandwidth in Gbit/s (shared by its GPUs)."""
    latency: float = 10e-6
    """Seconds per inter-node message or ring step."""
    intra_node: LinkSpec = field(default_factory=lambda: default_link_specs()["intra_node"])
    """The link between two GPUs of a node (tensor-parallel collectives)."""

    @property
    def gpu_bandwidth(self) -> float:
        """Bytes/s of the NIC one GPU gets while all GPUs of its node communicate."""
        return self.inter_node_gbps * 1e9 / 8 / self.gpus_per_node


def chunk_ops(m: LayerShape, tp: int, cluster: Cluster, layers_per_chunk: int) -> tuple[int, list[OpCost]]:
    """(bytes every pass keeps, the chunk's recomputable operations) for one T-way shard."""
    n = Fraction(m.seq * m.hidden, tp)
    dev = cluster.device
    base = 0
    ops: list[OpCost] = []
    for layer in range(layers_per_chunk):
        for name, kept, mm, ew in layer_items(m):
            size = int(round(kept * n))
            if name == "input":
                base += size
                continue
            t = float(mm * n) / dev.flops + float(ew * n) / dev.mem_bandwidth
            ops.append(OpCost(f"layer{layer}.{name}", size, t))
    return base, ops


def workload(m: LayerShape, cluster: Cluster, *, tp: int, stages: int, dp: int, chunks: int,
             microbatches: int) -> tuple[Components, int, list[OpCost]]:
    """(Components, kept bytes per pass, chunk operations) of ``m`` on ``cluster``."""
    for name, v in (("tp", tp), ("stages", stages), ("dp", dp), ("chunks", chunks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}: must be a positive integer")
    if m.layers % (stages * chunks):
        raise ValueError(f"{m.name}: {m.layers} layers do not split into P*M = {stages}*{chunks} equal chunks; "
                         f"allowed M: {', '.join(str(c) for c in range(1, m.layers // stages + 1) if m.layers % (stages * c) == 0)}")
    if tp > cluster.gpus_per_node or cluster.gpus_per_node % tp:
        raise ValueError(f"tp={tp}: the tensor-parallel group must fit in a node of {cluster.gpus_per_node} GPUs")
    per_chunk = m.layers // (stages * chunks)
    base, ops = chunk_ops(m, tp, cluster, per_chunk)
    flops, ew = _forward_per_layer(m)
    n = Fraction(m.seq * m.hidden, tp)
    compute = per_chunk * (float(flops * n) / cluster.device.flops + float(ew * n) / cluster.device.mem_bandwidth)
    tp_f, tp_d = tp_layer_times(m, tp, cluster)
    fwd, bwd = compute + per_chunk * tp_f, 2 * compute + per_chunk * tp_d
    psi = m.params_per_layer * m.layers / (tp * stages)
    link = LinkSpec(cluster.latency, cluster.gpu_bandwidth)
    links = Links(Topology(dp, ranks_per_node=1), {"inter_node": link})
    dp_comm = links.collective("reducescatter", tuple(range(dp)), 2 * psi / chunks)
    pp_comm = link.latency + link.occupancy(2 * m.seq * m.hidden / tp)
    return Components(stages, dp, chunks, microbatches, fwd, bwd, dp_comm, pp_comm, psi), base, ops


def tp_layer_times(m: LayerShape, tp: int, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's tensor-parallel collectives (SP) per sequence."""
    coll = layer_collectives(m, sp=True, parallel=m.parallel)
    return tuple(collectives_time(coll[ph], tp, cluster.intra_node) for ph in ("F", "D"))  # type: ignore
