"""WeiPipe and TawPipe against their papers: one table of claims per system, from data.

The analytic transformer cost model (pipert.cost.transformer, A800: 312 TFLOP/s bf16 at the
preset efficiency) and the simulator predict tokens/s/GPU on the papers' inputs:

- WeiPipe's Table 2: 16 GPUs in 2 nodes, L=32, N=64 micro-batches (our reading of its "batch
  size 64"; 64 sequences would leave fewer micro-batches than workers);
- WeiPipe's Table 4: 8 GPUs in one node (NVLink only), L=16, N=64;
- TawPipe's Table 2: 24 GPUs in 3 nodes, L=48, global batch 1536 sequences;

H in {1024, 2048, 4096}, micro-batch 65536/S sequences (ZB-H1: 4 at S=4096, else 1, same
tokens per iteration), 8 GPUs per node, NVLink (200 GB/s per direction) inside and 10 GbE
(1.25 GB/s, 50 us) between nodes, one NIC per node shared by its ranks in the simulation
(``simulate(..., nic_bandwidth=)``, pipert/sim/nic.py). Recomputation for 1F1B, WeiPipe and
TawPipe (B costs the forward of the unit's layers + B; embedding, LM head and loss are not rerun,
class Recompute), none for ZB-H1 (as TawPipe states). WeiPipe and TawPipe run the LM head and loss
in the backward of the last unit, as their codes do (``loss_in_backward``). WeiPipe runs the paper's ring
(``weipipe-interleave``) and pipert's direct variant (``weipipe-interleave-direct``) beside it.
Both papers ran 1F1B through Megatron-LM, whose boundary transfers block the next compute:
``1f1b-megatron`` is 1F1B with that blocking (benchmarks/_megatron_p2p.py), beside pipert's 1F1B
whose transfers overlap. For the activation-passing schedules a row also records the fullest
rank's memory: the simulator's running peak plus the static model state of its unit at
BYTES_PER_PARAM (against the papers' 80 GB A800), and 1F1B's rows on several nodes the makespan
with no NIC shared (every link its own bandwidth), which shows what the shared NIC costs. WeiPipe's
Table 2 rows are rerun (blocking 1F1B and WeiPipe, table ``weipipe-t2-implied``) at the boundary
bandwidth at which pipert's blocking 1F1B would run as slowly as the published 1F1B.
The claims with a number of their own (bubble, chunks per turn, TawPipe's bubble formula)
are simulated on their small settings.

Writes benchmarks/results/weight_passing.csv (one row per simulation), .context.json,
weight_passing_claims.csv (one row per claim: paper's number, pipert's, ratio, goal, the
computed reason for a row outside it) and .md (all of it computed from the first two);
``--from-csv`` rebuilds the claims and the .md from the stored CSV and context.

    python benchmarks/bench_weight_passing.py [--quick] [--from-csv]
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from _common import RESULTS, context, read_csv, rebuild, write_csv, write_results
from _megatron_p2p import blocking_p2p
from _weight_passing_claims import PUBLISHED, SLOW, claims, implied_bandwidth, report

from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.transformer import TransformerCost, UnitSpec, llama_like, partition_layers
from pipert.cost.uniform import UniformCost
from pipert.ir import Action, Op
from pipert.schedules import build_schedule
from pipert.schedules.tawpipe import TawPipeConfig, tawpipe_lockstep_makespan, tawpipe_plan
from pipert.schedules.weipipe import WeiPipeConfig, lockstep_makespan, weipipe_plan
from pipert.sim import simulate

GPN = 8
NVLINK = LinkSpec(5e-6, 200e9)
ETH = LinkSpec(50e-6, 1.25e9)
HS = [(h, s) for h in (1024, 2048, 4096) for s in (4096, 8192, 16384)]
MEGATRON = "1f1b-megatron"
BYTES_PER_PARAM = 18
"""Static model state per parameter in Megatron-LM's mixed precision without the distributed
optimizer: fp16/bf16 weight 2 + fp32 main gradient 4 + fp32 master weight 4 + Adam moments 8."""
T4_HS = [(h, s) for h in (1024, 2048, 4096) for s in (4096, 16384)]
TABLES = {  # table -> (GPUs, layers, sequences per iteration or None for 64 micro-batches, schedules, rows)
    "weipipe-t2": (16, 32, None, ("1f1b", MEGATRON, "weipipe-interleave", "weipipe-interleave-direct"), HS),
    "weipipe-t4": (8, 16, None, ("1f1b", MEGATRON, "weipipe-interleave", "weipipe-interleave-direct"), T4_HS),
    "tawpipe-t2": (24, 48, 1536, ("1f1b", MEGATRON, "zb-h1", "weipipe-interleave", "weipipe-interleave-direct", "tawpipe"),
                   HS),
}


class Recompute:
    """Activation checkpointing as the papers' runtimes do it: B (and D) first rerun the forward of
    the unit's transformer layers only, never the embedding, final norm, LM head or loss (Megatron-LM's
    ``--recompute-granularity full`` checkpoints the layers of ``ParallelTransformer`` in
    ``_checkpointed_forward``; the WeiPipe and TawPipe codes rerun their chunk's decoders); a stash
    is the unit's input."""

    def __init__(self, base: TransformerCost) -> None:
        self.base = base
        self.layers = TransformerCost(base.model, base.device, layers_apart(base.units or []))

    def compute_time(self, action: Action, rank: int) -> float:
        t = self.base.compute_time(action, rank)
        if action.op in (Op.B, Op.D):   # unit u's layers are unit u + 1 of ``self.layers``
            t += self.layers.compute_time(Action(Op.F, action.unit + 1, action.mb, sub=action.sub), rank)
        return t

    def message_bytes(self, payload: Any, unit: int, num_mbs: int = 1) -> float:
        return self.base.message_bytes(payload, unit, num_mbs)

    def memory(self, kind: str, unit: int) -> float:
        if kind == "stash":
            return self.base.memory("act", unit)
        return 0.0 if kind == "stash_w" else self.base.memory(kind, unit)


def layers_apart(units: list[UnitSpec]) -> list[UnitSpec]:
    """``units`` with the embedding and the head each a unit of its own, first and last: unit u's
    layers become unit u + 1."""
    return ([UnitSpec("layers", (), embed=True)] + [UnitSpec("layers", u.layers) for u in units]
            + [UnitSpec("layers", (), head=True)])


def run_one(table: str, h: int, s: int, name: str, device: DeviceSpec, quick: bool, eth: LinkSpec) -> dict:
    """One simulation of ``name`` on row (H, S) of ``table`` (module doc)."""
    gpus, layers, sequences, _, _ = TABLES[table]
    zb = name == "zb-h1"
    b = 65536 // s
    mb = (4 if s == 4096 else 1) if zb else b
    seqs = (sequences or 64 * b) // (4 if quick else 1)
    n = seqs // mb
    paper = table.split("-")[0]
    model = llama_like(h, layers, seq=s, micro_batch=mb, tied_embedding=(paper == "tawpipe"))
    units = partition_layers(model, gpus)
    # The WeiPipe and TawPipe codes run the LM head and loss once per micro-batch, forward and
    # backward together just before the backward of the last chunk (``calc_grad`` in weipipe.py and
    # tawpipe.py); Megatron-LM runs the loss in the last stage's forward step.
    base = TransformerCost(model, device, units, loss_in_backward=name.startswith(("weipipe", "tawpipe")))
    cost: Any = base if zb and paper == "tawpipe" else Recompute(base)
    topo = Topology(gpus, ranks_per_node=GPN)
    links = Links(topo, {"intra_node": NVLINK, "inter_node": eth})
    opts = {"ranks_per_node": GPN} if name == "tawpipe" else {}
    t0 = time.perf_counter()
    sched = build_schedule("1f1b" if name == MEGATRON else name, stages=gpus, microbatches=n, **opts)
    if name == MEGATRON:
        sched = blocking_p2p(sched)
    res = simulate(sched, cost, links=links, topology=topo, nic_bandwidth=eth.bandwidth)
    own = (simulate(sched, cost, links=links, topology=topo).makespan
           if name in ("1f1b", MEGATRON) and gpus > GPN else "")   # every link its own bandwidth: no NIC shared
    def time_of(op: Op, u: int) -> float:
        return cost.compute_time(Action(op, u, (0,)), 0)

    mid = gpus // 2      # a middle unit: one turn's compute and one chunk's bytes
    turn = time_of(Op.F, mid) + time_of(Op.B, mid)
    chunk = cost.message_bytes("weight", mid)
    return {"table": table, "hidden": h, "seq": s, "micro_batch": mb, "microbatches": n, "schedule": name,
            "makespan_s": res.makespan, "bubble": res.bubble_ratio, "tok_s_gpu": seqs * s / (res.makespan * gpus),
            "inter_node_GB": res.comm_bytes["inter_node"] / 1e9, "intra_node_GB": res.comm_bytes["intra_node"] / 1e9,
            "turn_compute_s": turn, "head_turn_s": time_of(Op.B, gpus - 1) + time_of(Op.F, 0),
            "stage_max_s": max(time_of(Op.F, u) + time_of(Op.B, u) for u in range(gpus)), "chunk_GB": chunk / 1e9, "act_GB": cost.message_bytes("act", mid) / 1e9, "link_GBps": (eth if gpus > GPN else NVLINK).bandwidth / 1e9,
            "own_links_makespan_s": own, "peak_GB": _peak_gb(res, base) if name in ("1f1b", MEGATRON, "zb-h1") else "",
            "sim_wall_s": time.perf_counter() - t0}


def _peak_gb(res: Any, base: TransformerCost) -> float:
    """The fullest rank's memory in GB when rank r holds unit r: running peak + static state."""
    return max(p + BYTES_PER_PARAM * base.params(r) for r, p in enumerate(res.peak_memory)) / 1e9


def implied_rows(rows: list[dict], device: DeviceSpec, quick: bool, eth: LinkSpec) -> list[dict]:
    """WeiPipe's Table 2 rows rerun (blocking 1F1B and WeiPipe) at the boundary bandwidth at which
    pipert's blocking 1F1B would run as slowly as the published 1F1B (implied_bandwidth), each
    row at its own (none where the published 1F1B is not slower); table SLOW."""
    got = {(r["hidden"], r["seq"], r["schedule"]): r for r in rows if r["table"] == "weipipe-t2"}
    out = []
    for h, s in TABLES["weipipe-t2"][4]:
        extra, gbs = implied_bandwidth(got[(h, s, MEGATRON)], got[(h, s, "1f1b")], PUBLISHED["weipipe-t2"][(h, s)]["1f1b"])
        if extra <= 0:
            continue
        for name in (MEGATRON, "weipipe-interleave"):
            out.append({**run_one("weipipe-t2", h, s, name, device, quick, LinkSpec(eth.latency, gbs * 1e9)),
                        "table": SLOW})
            print(f"{SLOW} H={h:5} S={s:6} {name:26} at {gbs:.2f} GB/s: {out[-1]['tok_s_gpu']:9.1f} tok/s/GPU", flush=True)
    return out


def small_rows() -> list[dict]:
    """The claims with a number of their own, on their small settings (free links, tf=1, tb=2)."""
    rows = []
    cost = UniformCost(1.0, 2.0, weight_bytes=1.0)
    for name in ("weipipe-interleave", "weipipe-interleave-direct", "1f1b"):
        s = build_schedule(name, stages=4, microbatches=8)
        res = simulate(s, cost)
        sends = [(r, a) for r, _, a in s if a.op is Op.SEND]
        rows.append({"table": "small", "schedule": name, "hidden": 0, "seq": 0, "microbatches": 8,
                     "makespan_s": res.makespan, "bubble": res.bubble_ratio, "messages": len(sends),
                     "ring_messages": sum(a.peer == (r + 1) % 4 for r, a in sends),
                     "max_chunks_per_turn": _max_chunks_per_turn(s) if name != "1f1b" else 0})
    plan = weipipe_plan(WeiPipeConfig(4, 8, "interleave"))
    rows.append({"table": "small", "schedule": "weipipe-lockstep", "microbatches": 8,
                 "makespan_s": lockstep_makespan(plan, cost), "bubble": 1 - 24 / lockstep_makespan(plan, cost)})
    p, g, n = 6, 3, 6     # TawPipe's Fig. 3 setting: P=6, D=2, one micro-batch per rank
    t = tawpipe_lockstep_makespan(tawpipe_plan(TawPipeConfig(p, n, g)), cost)
    rows.append({"table": "small", "schedule": "tawpipe-lockstep", "microbatches": n, "makespan_s": t,
                 "bubble": 1 - 3 * n / t, "stages": p, "nodes": p // g})
    return rows


def _max_chunks_per_turn(s: Any) -> int:
    """Most messages one ring link carries in one turn (meta['turn_start'] marks the turns)."""
    best = 0
    for r, starts in enumerate(s.meta["turn_start"]):
        marks = [i for i in starts if i >= 0] + [len(s.actions[r])]
        for a, b in zip(marks, marks[1:]):
            best = max(best, sum(1 for x in s.actions[r][a:b] if x.op is Op.SEND and x.peer == (r + 1) % s.num_ranks))
    return best


def write_claims(rows: list[dict]) -> None:
    write_csv(RESULTS / "weight_passing_claims.csv", claims(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the micro-batches")
    ap.add_argument("--from-csv", action="store_true", help="rebuild claims and report from the stored CSV and context")
    ap.add_argument("--efficiency", type=float, default=None, help="GEMM efficiency (default: the preset's)")
    ap.add_argument("--inter-gbs", type=float, default=ETH.bandwidth / 1e9,
                    help="inter-node bandwidth per NIC in GB/s (default 1.25, 10 GbE)")
    args = ap.parse_args(argv)
    if args.from_csv:
        write_claims(read_csv(RESULTS / "weight_passing.csv"))
        print(f"wrote {rebuild('weight_passing', report)} from the stored CSV")
        return 0
    eth = LinkSpec(ETH.latency, args.inter_gbs * 1e9)
    device = DeviceSpec.preset("a800", **({"efficiency": args.efficiency} if args.efficiency else {}))
    t0 = time.perf_counter()
    rows = small_rows()
    for table, (_, _, _, names, hs) in TABLES.items():
        for h, s in hs:
            for name in names:
                rows.append(run_one(table, h, s, name, device, args.quick, eth))
                r = rows[-1]
                print(f"{table:10} H={h:5} S={s:6} {name:26} {r['tok_s_gpu']:9.1f} tok/s/GPU (makespan "
                      f"{r['makespan_s']:.2f} s, bubble {r['bubble']:.3f}, {r['sim_wall_s']:.1f} s)", flush=True)
    rows += implied_rows(rows, device, args.quick, eth)
    ctx = context(extra={
        "wall time of the model runs": f"{time.perf_counter() - t0:.0f} s",
        "modelled hardware": f"{device.name}, {device.peak_tflops:g} TFLOP/s x efficiency {device.efficiency}, "
                             f"{GPN} GPUs/node, NVLink {NVLINK.bandwidth / 1e9:g} GB/s per direction, 10 GbE "
                             f"{eth.bandwidth / 1e9:g} GB/s + {eth.latency * 1e6:g} us between nodes, one NIC "
                             f"per node shared by its ranks (simulated)",
        "quick run (a quarter of the micro-batches)": args.quick})
    rows = [{k: r.get(k, "") for k in _fields(rows)} for r in rows]
    write_results("weight_passing", rows, ctx, report)
    write_claims(rows)
    print(f"wrote {RESULTS / 'weight_passing.csv'}, weight_passing_claims.csv and weight_passing.md")
    return 0


def _fields(rows: list[dict]) -> list[str]:
    out: list[str] = []
    for r in rows:
        out += [k for k in r if k not in out]
    return out


if __name__ == "__main__":
    sys.exit(main())
