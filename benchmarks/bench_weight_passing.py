"""Weight passing on the papers' configurations: 1F1B, ZB-H1, WeiPipe-Interleave, TawPipe.

The analytic transformer cost model (pipert.cost.transformer, A800: 312 TFLOP/s bf16 at
the preset efficiency) and the simulator predict tokens/s/GPU for

- WeiPipe's Table 2: 16 GPUs in 2 nodes, L=32, N=64 micro-batches (our reading of its
  "batch size 64"; 64 sequences would leave fewer micro-batches than workers);
- TawPipe's Table 2: 24 GPUs in 3 nodes, L=48, global batch 1536 sequences;

both with H in {1024, 2048, 4096}, S in {4096, 8192, 16384}, micro-batch 65536/S
sequences (ZB: 4 at S=4096, else 1, same tokens per iteration), 8 GPUs per node, NVLink
(200 GB/s per direction) inside and 10 GbE (1.25 GB/s, 50 us) between nodes.
Recomputation for 1F1B, WeiPipe and TawPipe (B costs F + B), none for ZB (as TawPipe
states). The simulator models links per rank pair; a node's 10 GbE NIC is shared, so the
prediction is max(makespan, busiest NIC's inter-node bytes / NIC bandwidth).

Writes benchmarks/results/weight_passing.csv, .context.json and .md (hardware, date, commit);
``--from-csv`` rebuilds the .md from the first two.

    python benchmarks/bench_weight_passing.py [--quick] [--from-csv]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from _common import RESULTS, context, rebuild, report_header, write_results

from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.transformer import TransformerCost, paper_model, partition_layers
from pipert.ir import Action, Op, Payload
from pipert.schedules import build_schedule
from pipert.schedules import tawpipe as _taw, weipipe as _wei  # noqa: F401  (register the families)
from pipert.sim import simulate

GPN = 8
NVLINK = LinkSpec(5e-6, 200e9)
ETH = LinkSpec(50e-6, 1.25e9)
SCHEDULES = ("1f1b", "zb-h1", "weipipe-interleave", "tawpipe")
HS = [(h, s) for h in (1024, 2048, 4096) for s in (4096, 8192, 16384)]

# tokens/s/GPU as published (None: OOM or not run)
PAPER = {
    "weipipe": {  # WeiPipe Table 2: 1F1B, ZB1, WeiPipe
        (1024, 4096): (8581.7, 7547.0, 15138.8), (1024, 8192): (7403.8, 6739.6, 12122.3),
        (1024, 16384): (5641.2, 5651.6, 8188.3), (2048, 4096): (4163.2, 3823.3, 6499.7),
        (2048, 8192): (3791.3, 3517.8, 6033.2), (2048, 16384): (3146.3, 3050.1, 4607.8),
        (4096, 4096): (1662.7, None, 2023.1), (4096, 8192): (1556.2, None, 2059.4),
        (4096, 16384): (1331.6, None, 1684.9)},
    "tawpipe": {  # TawPipe Table 2: 1F1B, ZB1, WeiPipe, TawPipe
        (1024, 4096): (7212.1, 5893.3, 12054.8, 13629.2), (1024, 8192): (6636.4, 5803.1, 10663.1, 11738.2),
        (1024, 16384): (5593.7, 5883.4, 8412.3, 8913.7), (2048, 4096): (3028.5, 2884.5, 4008.1, 5040.0),
        (2048, 8192): (2886.1, 2839.8, 4377.0, 4636.6), (2048, 16384): (2900.7, 2914.8, 3841.7, 4175.7),
        (4096, 4096): (1247.8, None, 1038.1, 1567.7), (4096, 8192): (1365.8, 1323.3, 1158.9, 1511.5),
        (4096, 16384): (1114.2, None, 1232.4, 1377.6)},
}
SETUP = {"weipipe": dict(gpus=16, sequences=None, microbatches=64), "tawpipe": dict(gpus=24, sequences=1536)}


@dataclass
class Recompute:
    """Activation checkpointing per unit: B (and D) first rerun F; a stash is the unit's input."""

    base: TransformerCost
    """The cost model without recomputation."""

    def compute_time(self, action: Action, rank: int) -> float:
        t = self.base.compute_time(action, rank)
        if action.op in (Op.B, Op.D):
            t += self.base.compute_time(Action(Op.F, action.unit, action.mb, sub=action.sub), rank)
        return t

    def message_bytes(self, payload: Any, unit: int, num_mbs: int = 1) -> float:
        return self.base.message_bytes(payload, unit, num_mbs)

    def memory(self, kind: str, unit: int) -> float:
        if kind == "stash":
            return self.base.memory("act", unit)
        return 0.0 if kind == "stash_w" else self.base.memory(kind, unit)


@dataclass
class ReplicatedEmbedding:
    """The papers' code: embedding and head stay on every rank; only the layers' weights
    and gradients travel (the gradients of the replicated part are all-reduced at the end,
    see ``allreduce_s``)."""

    base: Any
    """Cost model whose units 0 and P-1 hold the embedding and the head."""
    model: Any
    """The ModelSpec (for the layer parameter count)."""
    layers: list[int]
    """Layers per unit."""

    def compute_time(self, action: Action, rank: int) -> float:
        return self.base.compute_time(action, rank)

    def message_bytes(self, payload: Any, unit: int, num_mbs: int = 1) -> float:
        if Payload(payload) in (Payload.WEIGHT, Payload.WGRAD):
            return self.model.params_per_layer * self.layers[unit] * self.model.dtype_bytes
        return self.base.message_bytes(payload, unit, num_mbs)

    def memory(self, kind: str, unit: int) -> float:
        return self.message_bytes(kind, unit) if kind in ("weight", "wgrad") else self.base.memory(kind, unit)


def nic_bound(res: Any, topo: Topology, bandwidth: float) -> float:
    """Seconds the busiest node NIC needs for its inter-node bytes, in or out."""
    out: dict[tuple[int, str], float] = defaultdict(float)
    for (s, d), b in res.graph.link_bytes.items():
        if topo.link_class(s, d) in ("inter_node", "inter_dc"):
            out[(topo.node_of(s), "out")] += b
            out[(topo.node_of(d), "in")] += b
    return max(out.values(), default=0.0) / bandwidth


def run_one(paper: str, h: int, s: int, name: str, device: DeviceSpec, quick: bool, embedding: str,
            eth: LinkSpec = ETH) -> dict:
    """One simulation; ``embedding`` is "travels" (our schedules) or "replicated" (the papers' code)."""
    setup = SETUP[paper]
    P = setup["gpus"]
    zb = name == "zb-h1"
    b = 65536 // s
    mb = (4 if s == 4096 else 1) if zb else b
    seqs = setup["sequences"] or setup["microbatches"] * b
    if quick:
        seqs //= 4
    n = seqs // mb
    model = paper_model(paper, h, seq=s, micro_batch=mb)
    units = partition_layers(model, P)
    base = TransformerCost(model, device, units)
    # WeiPipe ran every strategy with recomputation; TawPipe all but Zero Bubble
    cost: Any = base if zb and paper == "tawpipe" else Recompute(base)
    topo = Topology(P, ranks_per_node=GPN)
    links = Links(topo, {"intra_node": NVLINK, "inter_node": eth})
    extra = 0.0
    if embedding == "replicated" and name in ("weipipe-interleave", "tawpipe"):
        cost = ReplicatedEmbedding(cost, model, [len(u.layers) for u in units])
        emb = (model.vocab * h * (1 if model.tied_embedding else 2) + h) * model.dtype_bytes
        extra = links.collective("allreduce", tuple(range(P)), emb)
    opts = {"ranks_per_node": GPN} if name == "tawpipe" else {}
    t0 = time.perf_counter()
    sched = build_schedule(name, stages=P, microbatches=n, **opts)
    res = simulate(sched, cost, links=links, topology=topo)
    nic = nic_bound(res, topo, eth.bandwidth)
    pred = max(res.makespan, nic) + extra
    return {"paper": paper, "embedding": embedding, "hidden": h, "seq": s, "micro_batch": mb, "microbatches": n,
            "schedule": name, "makespan_s": res.makespan, "nic_bound_s": nic, "allreduce_s": extra, "time_s": pred,
            "bubble": res.bubble_ratio,
            "inter_node_GB": res.comm_bytes["inter_node"] / 1e9, "intra_node_GB": res.comm_bytes["intra_node"] / 1e9,
            "peak_mem_GB": max(res.peak_memory) / 1e9, "tok_s_gpu": seqs * s / (pred * P),
            "sim_wall_s": time.perf_counter() - t0}


def rank_order(values: dict[str, float]) -> list[str]:
    return [k for k, _ in sorted(values.items(), key=lambda kv: -kv[1])]


NAMES = {"1f1b": "1F1B", "zb-h1": "ZB-H1", "weipipe-interleave": "WeiPipe", "tawpipe": "TawPipe"}


def published(paper: str, h: int, s: int) -> dict[str, float | None]:
    cols = [c for c in SCHEDULES if paper == "tawpipe" or c != "tawpipe"]
    return dict(zip(cols, PAPER[paper][(h, s)]))


def table(rows: list[dict], paper: str, embedding: str) -> tuple[list[str], int, int, int, int, int]:
    """Markdown rows and (rows ranked alike, rows, pairs ordered alike, pairs, rows whose
    ranking without ZB-H1 is alike)."""
    out = [f"### {paper.capitalize()} Table 2 ({SETUP[paper]['gpus']} GPUs), embedding/head {embedding}", "",
           "| H | S | " + " | ".join(f"{NAMES[c]} pred (paper)" for c in SCHEDULES) +
           " | ratio to 1F1B: pred (paper) | ranking ok |",
           "|---:|---:|" + "---:|" * len(SCHEDULES) + "---|:---:|"]
    rank_ok = n_rows = pair_ok = n_pairs = wp_ok = 0
    for h, s in HS:
        got = {r["schedule"]: r for r in rows
               if (r["paper"], r["embedding"], r["hidden"], r["seq"]) == (paper, embedding, h, s)}
        if not got:
            continue
        pub = published(paper, h, s)
        cells, ratios = [], []
        for c in SCHEDULES:
            p = pub.get(c, "-")
            cells.append(f"{got[c]['tok_s_gpu']:.0f} ({'OOM' if p is None else p})")
            if c != "1f1b":
                pr = f"{p / pub['1f1b']:.2f}" if isinstance(p, float) else "-"
                ratios.append(f"{NAMES[c]} {got[c]['tok_s_gpu'] / got['1f1b']['tok_s_gpu']:.2f} ({pr})")
        ran = [c for c in SCHEDULES if isinstance(pub.get(c), float)]
        ok = rank_order({c: got[c]["tok_s_gpu"] for c in ran}) == rank_order({c: pub[c] for c in ran})
        rank_ok, n_rows = rank_ok + ok, n_rows + 1
        wp = [c for c in ran if c != "zb-h1"]
        wp_ok += rank_order({c: got[c]["tok_s_gpu"] for c in wp}) == rank_order({c: pub[c] for c in wp})
        for i, a in enumerate(ran):
            for b in ran[i + 1:]:
                n_pairs += 1
                pair_ok += (got[a]["tok_s_gpu"] > got[b]["tok_s_gpu"]) == (pub[a] > pub[b])
        out.append(f"| {h} | {s} | " + " | ".join(cells) + f" | {'; '.join(ratios)} | {'yes' if ok else 'no'} |")
    return out + [""], rank_ok, n_rows, pair_ok, n_pairs, wp_ok


def _ratios(rows: list[dict], a: str, b: str, embedding: str = "travels") -> tuple[list[float], list[float]]:
    """Predicted and published a/b throughput ratios over the rows where the paper has both."""
    pred, pub = [], []
    for paper in ("weipipe", "tawpipe"):
        for h, s in HS:
            p = published(paper, h, s)
            if not (isinstance(p.get(a), float) and isinstance(p.get(b), float)):
                continue
            got = {r["schedule"]: r["tok_s_gpu"] for r in rows
                   if (r["paper"], r["embedding"], r["hidden"], r["seq"]) == (paper, embedding, h, s)}
            pred.append(got[a] / got[b])
            pub.append(p[a] / p[b])
    return pred, pub


def _span(x: list[float], fmt: str = ".2f") -> str:
    return f"{min(x):{fmt}}-{max(x):{fmt}}" if x else "-"


def _by(rows: list[dict], embedding: str = "travels") -> dict[tuple, dict[str, dict]]:
    """(paper, H, S) -> schedule -> row."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["embedding"] == embedding:
            out[(r["paper"], r["hidden"], r["seq"])][r["schedule"]] = r
    return out


def _zb_model_gaps(rows: list[dict]) -> str:
    """What the model leaves out that bears on ZB-H1, with the figures of these rows: micro-batch sizes
    (the model has one GEMM efficiency for every size) and the papers' out-of-memory cells (the model
    has no memory limit)."""
    mb = {name: sorted({r["micro_batch"] for r in rows if r["schedule"] == name}) for name in ("zb-h1", "1f1b")}
    cells = [published(paper, h, s).get("zb-h1", "-") for paper in ("weipipe", "tawpipe") for h, s in HS]
    return (f" The model runs every GEMM at one efficiency whatever the micro-batch (ZB-H1's here: "
            f"{'/'.join(map(str, mb['zb-h1']))} sequences, 1F1B's {'/'.join(map(str, mb['1f1b']))}) and has no "
            f"memory limit (the papers' ZB-H1 ran out of memory in {sum(c is None for c in cells)} of {len(cells)} "
            f"rows).")


def discussion(rows: list[dict]) -> list[str]:
    """Where the predicted order differs from the published one, with the numbers behind it;
    every figure and every count below is computed from ``rows``."""
    zb, zb_pub = _ratios(rows, "zb-h1", "1f1b")
    wp, wp_pub = _ratios(rows, "weipipe-interleave", "1f1b")
    tw, tw_pub = _ratios(rows, "tawpipe", "weipipe-interleave")
    by = _by(rows)
    zb_high = sum(a > b for a, b in zip(zb, zb_pub))
    flips = []  # rows where WeiPipe and 1F1B are ordered differently than published
    for (paper, h, s), got in sorted(by.items()):
        pub = published(paper, h, s)
        if isinstance(pub.get("weipipe-interleave"), float) and isinstance(pub.get("1f1b"), float):
            if (got["weipipe-interleave"]["tok_s_gpu"] > got["1f1b"]["tok_s_gpu"]) != \
                    (pub["weipipe-interleave"] > pub["1f1b"]):
                w = got["weipipe-interleave"]
                flips.append(f"{paper} H={h} S={s} (WeiPipe's busiest NIC is busy {w['nic_bound_s']:.1f} s, "
                             f"{100 * w['nic_bound_s'] / w['makespan_s']:.0f}% of its simulated makespan)")
    taw = {k: g["tawpipe"] for k, g in by.items() if k[0] == "tawpipe" and "tawpipe" in g}
    wei = {k: g["weipipe-interleave"] for k, g in by.items() if k in taw}
    nic = [taw[k]["nic_bound_s"] / wei[k]["nic_bound_s"] for k in taw]
    taw_bubble_higher = sum(taw[k]["bubble"] > wei[k]["bubble"] for k in taw)
    absolute: dict[int, list[float]] = defaultdict(list)
    for (paper, h, s), got in by.items():
        for c, p in published(paper, h, s).items():
            if isinstance(p, float) and c in got:
                absolute[h].append(got[c]["tok_s_gpu"] / p)
    moved = _by(rows, "replicated")
    change = [abs(moved[k][c]["tok_s_gpu"] / g[c]["tok_s_gpu"] - 1) * 100 for k, g in by.items() if k in moved
              for c in ("weipipe-interleave", "tawpipe") if c in g and c in moved[k]]
    return [
        "## Where the prediction and the papers disagree", "",
        f"- **ZB-H1 vs 1F1B**: predicted ZB-H1/1F1B {_span(zb)}, published {_span(zb_pub)}; the prediction is "
        f"above the published ratio in {zb_high} of {len(zb)} rows." + (_zb_model_gaps(rows) if zb_high else ""),
        f"- **WeiPipe vs 1F1B**: predicted {_span(wp)}, published {_span(wp_pub)}; ordered as published in "
        f"{len(wp) - len(flips)} of {len(wp)} rows" + (f", differently in {'; '.join(flips)}." if flips else "."),
        f"- **TawPipe vs WeiPipe**: predicted {_span(tw)}, published {_span(tw_pub)}. TawPipe moves {_span(nic)} of "
        f"WeiPipe's bytes through the busiest NIC; its simulated bubble (prefetch depth one, the paper's CCO) is "
        f"{_span([r['bubble'] for r in taw.values()], '.3f')} against WeiPipe's "
        f"{_span([r['bubble'] for r in wei.values()], '.3f')}, higher in {taw_bubble_higher} of {len(taw)} rows.",
        "- **Absolute numbers**: predicted / published tokens/s/GPU, by hidden size: "
        + "; ".join(f"H={h}: {_span(v)}" for h, v in sorted(absolute.items())) + ".",
        f"- **Embedding and head**: replicating them (the papers' code) instead of moving them with units 0 "
        f"and P-1 changes the WeiPipe and TawPipe predictions by {_span(change, '.1f')}% "
        f"(median {statistics.median(change):.1f}%)." if change else "",
    ]


def report(rows: list[dict], ctx: dict[str, str], rebuilt: bool = False) -> str:
    """The markdown report: a function of the CSV rows and the stored context only."""
    lines = report_header("Weight passing on the papers' configurations (analytic model + simulator)", ctx, rebuilt)
    lines += ["",
              "Predicted tokens/s/GPU beside the published ones (OOM: the paper ran out of memory; -: no "
              "published number); ratios are to 1F1B of the same row. `ranking ok`: the predicted ranking of "
              "the schedules the paper ran equals the paper's. \"travels\": our schedules (embedding in unit 0, "
              "head in unit P-1, moved like any shard); \"replicated\": the papers' code (only layers move; the "
              "embedding/head gradients are all-reduced over all GPUs at the end).", ""]
    summary = []
    for embedding in ("travels", "replicated"):
        lines += [f"## Embedding and head {embedding}", ""]
        for paper in ("weipipe", "tawpipe"):
            t, r_ok, r_n, p_ok, p_n, w_ok = table(rows, paper, embedding)
            lines += t
            summary.append(f"- {paper} table, embedding {embedding}: ranking equal on {r_ok}/{r_n} rows "
                           f"({w_ok}/{r_n} without ZB-H1), pairwise order equal on {p_ok}/{p_n} pairs")
    lines += ["## Agreement", ""] + summary + [""] + discussion(rows) + ["", "## Simulated details", "",
              "| paper | emb. | H | S | schedule | N | makespan s | NIC bound s | all-reduce s | bubble | "
              "inter-node GB | intra-node GB |",
              "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['paper']} | {r['embedding']} | {r['hidden']} | {r['seq']} | {r['schedule']} | "
                     f"{r['microbatches']} | {r['makespan_s']:.2f} | {r['nic_bound_s']:.2f} | {r['allreduce_s']:.2f} | "
                     f"{r['bubble']:.3f} | {r['inter_node_GB']:.1f} | {r['intra_node_GB']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the micro-batches")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    ap.add_argument("--efficiency", type=float, default=None, help="GEMM efficiency (default: the preset's)")
    ap.add_argument("--inter-gbs", type=float, default=ETH.bandwidth / 1e9,
                    help="inter-node bandwidth per NIC in GB/s (default 1.25, 10 GbE)")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild('weight_passing', report)} from the stored CSV")
        return 0
    eth = LinkSpec(ETH.latency, args.inter_gbs * 1e9)
    device = DeviceSpec.preset("a800", **({"efficiency": args.efficiency} if args.efficiency else {}))
    t0 = time.perf_counter()
    rows = []
    for embedding in ("travels", "replicated"):
        for paper in ("weipipe", "tawpipe"):
            for h, s in HS:
                for name in SCHEDULES:
                    if embedding == "replicated" and name in ("1f1b", "zb-h1"):
                        rows.append(dict(next(r for r in rows if (r["paper"], r["hidden"], r["seq"], r["schedule"])
                                              == (paper, h, s, name)), embedding=embedding))
                        continue
                    rows.append(run_one(paper, h, s, name, device, args.quick, embedding, eth))
                    r = rows[-1]
                    print(f"{paper:8} {embedding:10} H={h:5} S={s:6} {name:19} {r['tok_s_gpu']:9.1f} tok/s/GPU  "
                          f"(makespan {r['makespan_s']:.2f} s, NIC {r['nic_bound_s']:.2f} s)", flush=True)
    ctx = context(extra={
        "wall time of the model runs": f"{time.perf_counter() - t0:.0f} s",
        "modelled hardware": f"{device.name}, {device.peak_tflops:g} TFLOP/s x efficiency {device.efficiency}, "
                             f"{GPN} GPUs/node, NVLink {NVLINK.bandwidth / 1e9:g} GB/s per direction, 10 GbE "
                             f"{eth.bandwidth / 1e9:g} GB/s + {eth.latency * 1e6:g} us between nodes (one NIC per node)",
        "quick run (a quarter of the micro-batches)": args.quick})
    write_results("weight_passing", rows, ctx, report)
    print(f"wrote {RESULTS / 'weight_passing.csv'} and {RESULTS / 'weight_passing.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
