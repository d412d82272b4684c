"""PipeMesh against Megatron-style interleaved 1F1B and breadth-first on a commodity cloud,
across memory budgets; and the paper's Table IV through the planner's equations.

Sweep: the paper's three models (Table III) on V100-32GB and A100-80GB nodes of 8 GPUs
(T = 8 inside a node, P = 4, D = 3, 24 micro-batches per pipeline), 100, 200 and 400 Gb/s
per node, memory budgets from 40 % to 100 % of the device. Each schedule gets its best
recomputation set under the budget from the same DP (pipert.planner): Megatron keeps
e = d = (P, ...) and ZeRO-1, breadth-first e = d = (B) with PipeMesh's ZeRO mix, PipeMesh
searches q. M follows the paper's rule (largest M with C_PP <= C^fwd), the same for all three.

At the middle budget each plan is also simulated: the pipemesh generator builds its sequences
(Megatron's are interleaved 1F1B, breadth-first one group) with 4 units per chunk, which get the
plan's ZeRO mix (ZeRO-3 units first, then ZeRO-2, then ZeRO-1); ``replicate`` adds PipeMesh's
collectives over the D replicas, and pipert's simulator times one step with the plan's forward
and backward(+recompute) times, C_PP on stage boundaries and the ring collectives on the
per-GPU NIC share. ``sim_pipeline`` is the same schedule on one replica without collectives.

Writes benchmarks/results/pipemesh.csv/.md and pipemesh_table4.csv/.md.

    python benchmarks/bench_pipemesh.py [--quick]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

from _common import RESULTS, context, context_markdown, write_csv

from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.uniform import UniformCost
from pipert.planner import GiB, plan, plan_fixed
from pipert.planner.cli import choose_chunks
from pipert.planner.paper import (MEGATRON_OVERLAP_A100, TABLE_IV, components, megatron_activation,
                                  megatron_implied_dp_comm, per_param_dp_time, predict)
from pipert.planner.workload import PAPER_MODELS, Cluster, chunk_ops, workload
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import simulate

SCHEDULES = ("pipemesh", "megatron", "breadth-first")
P, D, T, B = 4, 3, 8, 24


UNITS = 4


def simulated(p, cluster: Cluster) -> dict[str, float]:
    """One step of the plan in pipert's simulator: pipeline only, and over D replicas with
    PipeMesh's collectives (ranks d*P + s; a replica's stages are one 'node' of the topology so
    that stage links take C_PP and replica groups the NIC share)."""
    c, k, sh = p.components, UNITS, p.queue.sharding
    s = build_schedule("pipemesh", stages=c.stages, microbatches=c.microbatches, chunks=c.chunks,
                       enqueue=p.queue.enqueue, dequeue=p.queue.dequeue, units_per_chunk=k)
    n3 = round(k * sh.zero_param / c.params)
    n23 = round(k * sh.zero_grad / c.params)
    zeros = ([3] * n3 + [2] * (n23 - n3) + [1] * (k - n23)) * (c.stages * c.chunks)
    cost = UniformCost(tf=c.fwd / k, tb=(c.bwd + p.recompute.recompute_time) / k, weight_bytes=2 * c.params / (c.chunks * k))
    pipe = simulate(s, cost, Links(Topology(c.stages, ranks_per_node=1), {"inter_node": LinkSpec(c.pp_comm)}))
    mesh = Links(Topology(c.stages * c.dp, ranks_per_node=c.stages),
                 {"intra_node": LinkSpec(c.pp_comm), "inter_node": LinkSpec(cluster.latency, cluster.gpu_bandwidth)})
    step = simulate(replicate(s, c.dp, zeros), cost, mesh)
    # the generator gathers ZeRO-1/2 weights after the optimizer; Eq. 2 lets the next step hide them
    tail = c.chunks * c.dp_comm * (k - n3) / k
    ag_side = c.dp_comm + (c.chunks - 1) * max(0.0, c.dp_comm - p.queue.enqueue[0] * c.fwd)
    return {"sim_pipeline": pipe.makespan, "sim_step": step.makespan, "sim_dp": step.makespan - pipe.makespan,
            "tail_gathers": tail, "eq_dp_in_step": p.time["dp_crit"] - ag_side, "dp_traffic": dp_traffic(p)}


def dp_traffic(p) -> float:
    """Seconds one replica group's link is busy per step under the plan: a ZeRO-3 gather per
    forward and per backward group of every chunk, a ZeRO-2/3 reduce-scatter per backward group,
    and the optimizer's reduce-scatter and gather of the rest."""
    c, sh, q = p.components, p.queue.sharding, p.queue
    f3, f23 = sh.zero_param / c.params, sh.zero_grad / c.params
    per_chunk = (len(q.enqueue) + len(q.dequeue)) * f3 + len(q.dequeue) * f23 + (1 - f23) + (1 - f3)
    return c.chunks * c.dp_comm * per_chunk


def sweep(quick: bool) -> list[dict]:
    rows = []
    models = ["gpt3-58b"] if quick else list(PAPER_MODELS)
    devices = ["v100"] if quick else ["v100", "a100"]
    gbps = [100.0, 400.0] if quick else [100.0, 200.0, 400.0]
    fracs = [0.5, 0.75, 1.0] if quick else [0.4, 0.55, 0.7, 0.85, 1.0]
    for mname in models:
        m = PAPER_MODELS[mname]
        for dname in devices:
            dev = DeviceSpec.preset(dname)
            for bw in gbps:
                cluster = Cluster(dev, 8, bw)

                def make(M: int):
                    return workload(m, cluster, tp=T, stages=P, dp=D, chunks=M, microbatches=B)

                M = choose_chunks(m.layers, P, lambda k: make(k)[0])
                c, base, ops = make(M)
                for frac in fracs:
                    budget = frac * dev.memory
                    for kind in SCHEDULES:
                        row = {"model": mname, "device": dname, "gbps": bw, "M": M, "budget_gib": budget / GiB,
                               "schedule": kind}
                        try:
                            p = plan(c, ops, budget, base) if kind == "pipemesh" else \
                                plan_fixed(kind, c, ops, budget, base)
                        except ValueError:
                            row.update(fits=False)
                            rows.append(row)
                            continue
                        eq1 = p.time["compute"] + p.time["bubble"] + p.time["pp_crit"]
                        if frac == fracs[len(fracs) // 2]:
                            row.update(simulated(p, cluster), eq1_pipeline=eq1)
                        sh = p.queue.sharding
                        row.update(fits=True, q=p.queue.q, enqueue=" ".join(map(str, p.queue.enqueue)),
                                   dequeue=" ".join(map(str, p.queue.dequeue)), t_iter=p.time["total"],
                                   dp_crit=p.time["dp_crit"], recompute_ops=len(p.recomputed),
                                   recompute_per_pass=p.recompute.recompute_time, memory_gib=p.memory["total"] / GiB,
                                   activations_gib=p.memory["activations"] / GiB,
                                   zero3=sh.zero_param / c.params, zero2=(sh.zero_grad - sh.zero_param) / c.params)
                        rows.append(row)
    return rows


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def sweep_report(rows: list[dict], ctx: dict, seconds: float) -> str:
    cells = defaultdict(dict)
    for r in rows:
        cells[(r["model"], r["device"], r["gbps"], round(r["budget_gib"], 2))][r["schedule"]] = r
    wins, baseline_wins, speedup_mt, speedup_bf = Counter(), Counter(), [], []
    none_fit, only_pm = 0, 0
    lines = ["| model | device | Gb/s | M | budget GiB | PipeMesh s (q, recomputed ops) | Megatron s | breadth-first s "
             "| best | PipeMesh vs best baseline |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, by in cells.items():
        fit = {k: v for k, v in by.items() if v["fits"]}
        if not fit:
            none_fit += 1
            continue
        best = min(fit, key=lambda k: (fit[k]["t_iter"], SCHEDULES.index(k)))
        wins[best] += 1
        base = {k: v for k, v in fit.items() if k != "pipemesh"}
        if base:
            bb = min(base, key=lambda k: base[k]["t_iter"])
            baseline_wins[bb] += 1
        else:
            only_pm += 1
        pm = fit.get("pipemesh")
        for name, acc in (("megatron", speedup_mt), ("breadth-first", speedup_bf)):
            if pm and name in fit:
                acc.append(fit[name]["t_iter"] / pm["t_iter"])

        def cell(k: str) -> str:
            r = by[k]
            return "does not fit" if not r["fits"] else f"{r['t_iter']:.3f}"
        vs = "-" if not (pm and base) else f"{min(b['t_iter'] for b in base.values()) / pm['t_iter']:.3f}x"
        pmc = "does not fit" if not pm else f"{pm['t_iter']:.3f} (q={pm['q']}, {pm['recompute_ops']})"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | {by['pipemesh']['M']} | {key[3]:.1f} | {pmc} | "
                     f"{cell('megatron')} | {cell('breadth-first')} | {best} | {vs} |")
    simmed = [r for r in rows if r["fits"] and "sim_step" in r]
    dev = max(abs(r["sim_pipeline"] / r["eq1_pipeline"] - 1) for r in simmed)
    total = sum(wins.values())
    prose = [
        f"{len(cells)} settings (model x device x bandwidth x budget); in {none_fit} no schedule fits, in {only_pm} "
        f"only PipeMesh fits. Best schedule per setting: " + ", ".join(f"{k} {wins[k]}" for k in SCHEDULES) +
        f" of {total} (ties go to the schedule listed first).",
        "Between the two baselines: " + ", ".join(f"{k} is faster in {baseline_wins[k]}" for k in SCHEDULES[1:]) +
        " settings where at least one of them fits.",
    ]
    if speedup_mt:
        prose.append(f"Megatron / PipeMesh iteration time: {min(speedup_mt):.3f}-{max(speedup_mt):.3f} "
                     f"(median {sorted(speedup_mt)[len(speedup_mt) // 2]:.3f}) over {len(speedup_mt)} settings where "
                     f"both fit; breadth-first / PipeMesh: {min(speedup_bf, default=float('nan')):.3f}-"
                     f"{max(speedup_bf, default=float('nan')):.3f} over {len(speedup_bf)}.")
    split = defaultdict(Counter)
    for key, by in cells.items():
        if by["megatron"]["fits"] and by["breadth-first"]["fits"]:
            frac = key[3] * GiB / DeviceSpec.preset(key[1]).memory
            split[(key[1], round(frac, 2))][min(("megatron", "breadth-first"), key=lambda k: by[k]["t_iter"])] += 1
    if split:
        prose.append("Faster baseline by device and budget (share of device memory), where both fit: " + "; ".join(
            f"{dev} {frac:.0%}: Megatron {n['megatron']}, breadth-first {n['breadth-first']}"
            for (dev, frac), n in sorted(split.items())) + ".")
    by_bw = defaultdict(list)
    for key, by in cells.items():
        if by["pipemesh"]["fits"] and by["megatron"]["fits"]:
            by_bw[key[2]].append(by["megatron"]["t_iter"] / by["pipemesh"]["t_iter"])
    if by_bw:
        prose.append("Median Megatron / PipeMesh by bandwidth: " + ", ".join(
            f"{bw:g} Gb/s {sorted(v)[len(v) // 2]:.3f}" for bw, v in sorted(by_bw.items())) + ".")
    prose.append(f"Simulated pipeline (pipert's simulator on the pipemesh schedule, one replica) vs Eq. 1's compute + "
                 f"bubble + PP: largest deviation {dev:.2%} over {len(simmed)} plans.")
    for kind in SCHEDULES:
        rs = [r for r in simmed if r["schedule"] == kind]
        if rs:
            ratio = sorted((r["sim_dp"] - r["tail_gathers"]) / r["eq_dp_in_step"] for r in rs if r["eq_dp_in_step"] > 0)
            prose.append(
                f"{kind}, simulated with collectives ({len(rs)} plans): DP time added to the step "
                f"{min(r['sim_dp'] for r in rs):.3f}-{max(r['sim_dp'] for r in rs):.3f} s, of which the ZeRO-1/2 "
                f"gathers after the optimizer step (which Eq. 2 lets the next step's forward passes hide) are "
                f"{min(r['tail_gathers'] for r in rs):.3f}-{max(r['tail_gathers'] for r in rs):.3f} s; the rest over "
                f"Eqs. 2-5 without their all-gather side: "
                + (f"{ratio[0]:.2f}-{ratio[-1]:.2f} (median {ratio[len(ratio) // 2]:.2f})." if ratio else "n/a.")
                + f" DP link busy {min(r['dp_traffic'] / r['sim_step'] for r in rs):.0%}-"
                  f"{max(r['dp_traffic'] / r['sim_step'] for r in rs):.0%} of the simulated step.")
    sim_cells = defaultdict(dict)
    for r in simmed:
        sim_cells[(r["model"], r["device"], r["gbps"])][r["schedule"]] = r
    sim_best, flips = Counter(), []
    for key, by in sim_cells.items():
        sb = min(by, key=lambda k: (by[k]["sim_step"], SCHEDULES.index(k)))
        eb = min(by, key=lambda k: (by[k]["t_iter"], SCHEDULES.index(k)))
        sim_best[sb] += 1
        if sb != eb:
            flips.append(f"{key[0]} {key[1]} {key[2]:g} Gb/s ({sb} {by[sb]['sim_step']:.3f} s vs {eb} "
                         f"{by[eb]['sim_step']:.3f} s)")
    if sim_cells:
        prose.append(f"Fastest simulated step (with collectives, middle budget, {len(sim_cells)} settings): "
                     + ", ".join(f"{k} {sim_best[k]}" for k in SCHEDULES) + ". The simulator's winner differs from "
                     f"the equations' in {len(flips)}" + (": " + "; ".join(flips) if flips else "") + ".")
        pp = max(simmed, key=lambda r: r["sim_pipeline"] / r["eq1_pipeline"])
        prose.append(f"Without collectives the simulated pipeline exceeds Eq. 1 by up to "
                     f"{pp['sim_pipeline'] / pp['eq1_pipeline'] - 1:.1%} ({pp['schedule']} {pp['model']} {pp['device']} "
                     f"{pp['gbps']:g} Gb/s, M={pp['M']}, q={pp['q']}): PP waits that T_PP = 2(P-1) C_PP does not count "
                     f"(it assumes every receive but the first and last hides behind a pass).")
    if simmed:
        worst = max((r for r in simmed if r["eq_dp_in_step"] > 0),
                    key=lambda r: (r["sim_dp"] - r["tail_gathers"]) / r["eq_dp_in_step"])
        prose.append(
            f"Largest gap: {worst['schedule']} {worst['model']} {worst['device']} {worst['gbps']:g} Gb/s (q={worst['q']}, "
            f"ZeRO-3 {worst['zero3']:.0%}): the simulator exposes {worst['sim_dp'] - worst['tail_gathers']:.3f} s where "
            f"Eqs. 2-5 give {worst['eq_dp_in_step']:.3f} s, with the DP link busy "
            f"{worst['dp_traffic'] / worst['sim_step']:.0%} of the step. Eqs. 3-5 give every collective its own window "
            f"of passes, but in the 1F1B phase the forward and backward windows are the same wall time on the same "
            f"link, and one group's collectives run in order; where the ZeRO-3 gathers repeat for every group of "
            f"every chunk, the traffic approaches the step and the equations' windows overlap.")
    return "\n".join([
        "# PipeMesh vs Megatron interleaved 1F1B vs breadth-first (analytic model + simulator)", "",
        context_markdown(ctx), f"- wall time: {seconds:.1f} s", "",
        __doc__.split("\n\n")[1], "", "## Summary (computed from the rows)", "",
        *[f"- {p}" for p in prose], "", "## Iteration time per setting (seconds)", "", *lines, "",
        "Columns: PipeMesh's q and how many operations per chunk it recomputes; 'PipeMesh vs best baseline' is the "
        "best fitting baseline's time over PipeMesh's. Full rows (ZeRO shares, memory, simulated times) in "
        "pipemesh.csv.", ""])


def table4() -> tuple[list[dict], str]:
    rows, lines = [], []
    for key, cfg in TABLE_IV.items():
        for system in ("pipemesh", "megatron"):
            r, p = cfg.row(system), predict(cfg, system)
            rows.append({"config": key, "system": system, "M": r.chunks, "q": r.q or "",
                         "bubble_paper": r.bubble, "bubble_model": p["bubble"],
                         "dp_crit_paper": r.dp_crit, "dp_crit_model": p["dp_crit"], "C_DP": p["C_DP"],
                         "mem_grad_paper": r.mem_grad, "mem_grad_model": p["mem_grad"],
                         "mem_param_paper": r.mem_param, "mem_param_model": p["mem_param"],
                         "mem_act_paper": r.mem_act, "mem_act_model": p.get("mem_act", "")})
    for r in rows:
        e_b = r["bubble_model"] / r["bubble_paper"] - 1
        e_d = r["dp_crit_model"] / r["dp_crit_paper"] - 1
        act = "" if r["mem_act_model"] == "" else f"{r['mem_act_model']:.2f} / {r['mem_act_paper']}"
        lines.append(f"| {r['config']} | {r['system']} | {r['M']} | {r['q']} | {r['bubble_model']:.1f} / "
                     f"{r['bubble_paper']} ({e_b:+.1%}) | {r['dp_crit_model']:.1f} / {r['dp_crit_paper']} ({e_d:+.1%}) "
                     f"| {r['mem_grad_model']:.2f} / {r['mem_grad_paper']} | {r['mem_param_model']:.2f} / "
                     f"{r['mem_param_paper']} | {act} |")
    pm = [r for r in rows if r["system"] == "pipemesh"]
    mt = [r for r in rows if r["system"] == "megatron"]
    err = lambda r, k: abs(r[f"{k}_model"] / r[f"{k}_paper"] - 1)  # noqa: E731
    t_a, src_a = per_param_dp_time("a100")
    t_v, src_v = per_param_dp_time("v100")
    falcon = TABLE_IV["falcon-v100"]
    t_falcon = falcon.pipemesh.dp_crit / 2 * falcon.pipemesh.chunks / falcon.params
    implied = []
    for key in ("gpt3-v100", "falcon-v100"):
        cfg = TABLE_IV[key]
        c_mt = megatron_implied_dp_comm(cfg)
        floor = 2 * c_mt * cfg.megatron.chunks / cfg.pipemesh.chunks
        implied.append(f"{key}: Eq. 2 needs C_DP = {c_mt:.0f} ms per Megatron chunk (the per-parameter time "
                       f"gives {components(cfg, 'megatron').dp_comm:.0f}) to reach Megatron's {cfg.megatron.dp_crit}; "
                       f"that C_DP puts PipeMesh's floor 2 C_DP at {floor:.0f} ms against its measured "
                       f"{cfg.pipemesh.dp_crit} ({floor / cfg.pipemesh.dp_crit - 1:+.1%})")
    zero3 = []
    for key, cfg in TABLE_IV.items():
        c = components(cfg, "pipemesh")
        psi_p_fit = (2 - cfg.pipemesh.mem_param * GiB / cfg.params) / (2 - 2 / cfg.dp)
        zero3.append(f"{key} (M={c.chunks}): model M_p {predict(cfg, 'pipemesh')['mem_param']:.2f} GiB vs "
                     f"{cfg.pipemesh.mem_param}; with 8/M read as 0, the measured M_p implies a ZeRO-3 share of "
                     f"{psi_p_fit:.1%}")
    budget_lines = []
    for key, cfg in TABLE_IV.items():
        c = components(cfg, "pipemesh")
        cluster = Cluster(DeviceSpec.preset(cfg.cluster), 8, 400.0 if cfg.cluster == "a100" else 100.0)
        base, ops = chunk_ops(cfg.model, cfg.tp, cluster, cfg.model.layers // (cfg.stages * c.chunks))
        ops = [type(o)(o.name, o.size, o.time * 1e3) for o in ops]
        cm = components(cfg, "megatron")
        budget = 12 * cm.params / cm.dp + 4 * cm.params + megatron_activation(cfg)
        try:
            p = plan(c, ops, budget, base)
            kinds = sorted({n.split(".", 1)[1] for n in p.recomputed})
            budget_lines.append(f"{key}: budget {budget / GiB:.2f} GiB (modelled Megatron usage) -> q={p.queue.q} "
                                f"(paper {cfg.pipemesh.q}), enqueue {list(p.queue.enqueue)}, recomputes "
                                f"{len(p.recomputed)} of {len(ops)} ops ({', '.join(kinds) or 'none'}), "
                                f"exposed DP {p.time['dp_crit']:.1f} ms (paper {cfg.pipemesh.dp_crit})")
        except ValueError as e:
            budget_lines.append(f"{key}: {e}")
    md = [
        "# PipeMesh Table IV through the planner's equations", "",
        context_markdown(context()), "",
        "Inputs are the paper's Table IV component times (ms per iteration) and its Table III shapes; "
        "pipert/planner/paper.py states every derivation. Each cell: model / paper (relative error).", "",
        "## Summary (computed)", "",
        f"- Bubble, T_bubble = (P-1)(C^fwd + C^bwd) with B = batch / D: largest error "
        f"{max(err(r, 'bubble') for r in rows):.2%} over all {len(rows)} rows. Reading B as the global batch "
        f"would be off by the factor D = 3: B is micro-batches per pipeline.",
        f"- Exposed DP (Eqs. 2-5), PipeMesh: largest error {max(err(r, 'dp_crit') for r in pm):.2%} over "
        f"{len(pm)} rows. C_DP = t_p psi / M, t_p from one number per cluster: A100 {t_a * 1e9:.1f} ms per 1e9 "
        f"parameters ({src_a}, {MEGATRON_OVERLAP_A100:.1%}), V100 {t_v * 1e9:.1f} ({src_v}). Falcon's PipeMesh row "
        f"alone gives {t_falcon * 1e9:.1f} on V100 ({t_falcon / t_v - 1:+.2%}): the two systems send the same bytes.",
        f"- Exposed DP, Megatron: " + "; ".join(
            f"{r['config']} {r['dp_crit_model'] / r['dp_crit_paper'] - 1:+.1%}" for r in mt) +
        " (llama2-v100 is the V100 calibration point). Interleaved Megatron on V100 exposes more than Eq. 2 "
        "allows, and no single C_DP fits both rows:",
        *[f"  - {s}" for s in implied],
        "  Eq. 2 credits Megatron with hiding each chunk's all-gather behind P forward passes and its "
        "reduce-scatter behind P backward passes; the measured V100 rows hide only "
        + ", ".join(f"{1 - r['dp_crit_paper'] / (2 * r['C_DP'] * r['M']):.1%} ({r['config']})"
                    for r in mt if r["M"] > 1 and r["config"] != "gpt3-a100")
        + " of the 2 M C_DP they send, where Eq. 2 predicts "
        + ", ".join(f"{1 - r['dp_crit_model'] / (2 * r['C_DP'] * r['M']):.1%}"
                    for r in mt if r["M"] > 1 and r["config"] != "gpt3-a100")
        + ". The paper does not model Megatron separately; its measured rows include what Eq. 2 leaves out "
        "(contention of DP and PP traffic on the one 100 Gb/s NIC, Megatron's bucket boundaries).",
        f"- Memory: Megatron M_g = M_p = 2 psi and M_a (live passes x layers x the paper's per-layer bytes; "
        f"P live passes for M = 1) within {max(max(err(r, k) for k in ('mem_grad', 'mem_param', 'mem_act')) for r in mt):.1%}; "
        f"PipeMesh M_g = (2/D + 4/M) psi within {max(err(r, 'mem_grad') for r in pm):.1%}. PipeMesh's M_p does not "
        f"reproduce: with D = 3, 2/D + 8/M >= 2 for M <= 6, so the formula makes ZeRO-3 cost memory, yet the "
        f"paper reports 84-91 % ZeRO-3 and less parameter memory:",
        *[f"  - {s}" for s in zero3],
        "  The measured values fit a per-ZeRO-3-parameter cost well below 2/D + 8/M; we keep the paper's formula "
        "and use ZeRO-3 only where it saves memory under it (docs/pipemesh.md).",
        "- The planner under the paper's budget (Megatron's usage as our memory model gives it; op times from the "
        "analytic model on the cluster's GPU):",
        *[f"  - {s}" for s in budget_lines],
        "- PP crit is not compared: 2(P-1) C_PP with the table's values needs C_PP above C^fwd for PipeMesh on "
        "V100, which the planner's premise (C_PP < C^fwd) excludes; the column is measured stall time.", "",
        "## Rows", "",
        "| config | system | M | q | bubble ms | exposed DP ms | M_g GiB | M_p GiB | M_a GiB |",
        "|---|---|---|---|---|---|---|---|---|", *lines, ""]
    return rows, "\n".join(md)


def read_rows(path) -> list[dict]:
    """The rows of a pipemesh.csv, typed as ``sweep`` makes them."""
    import csv
    text, ints = {"model", "device", "schedule", "enqueue", "dequeue"}, {"M", "q", "recompute_ops"}
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v == "":
                    continue
                row[k] = v if k in text else (v == "True") if k == "fits" else int(v) if k in ints else float(v)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one model, one device, two bandwidths, three budgets")
    ap.add_argument("--report-only", action="store_true", help="rewrite pipemesh.md from pipemesh.csv (no sweep)")
    args = ap.parse_args()
    t0 = time.time()
    if args.report_only:
        rows = read_rows(RESULTS / "pipemesh.csv")
        ctx = context({"command": "python benchmarks/bench_pipemesh.py --report-only (rows from pipemesh.csv)"})
        (RESULTS / "pipemesh.md").write_text(sweep_report(rows, ctx, time.time() - t0))
        return
    t4rows, t4md = table4()
    write_csv(RESULTS / "pipemesh_table4.csv", t4rows)
    (RESULTS / "pipemesh_table4.md").write_text(t4md)
    rows = sweep(args.quick)
    fields = ["model", "device", "gbps", "M", "budget_gib", "schedule", "fits", "q", "enqueue", "dequeue", "t_iter",
              "dp_crit", "recompute_ops", "recompute_per_pass", "memory_gib", "activations_gib", "zero3", "zero2",
              "eq1_pipeline", "sim_pipeline", "sim_step", "sim_dp", "tail_gathers", "eq_dp_in_step", "dp_traffic"]
    write_csv(RESULTS / "pipemesh.csv", rows, fields)
    ctx = context({"command": "python benchmarks/bench_pipemesh.py" + (" --quick" if args.quick else "")})
    (RESULTS / "pipemesh.md").write_text(sweep_report(rows, ctx, time.time() - t0))
    print(f"wrote {RESULTS / 'pipemesh.md'} and {RESULTS / 'pipemesh_table4.md'} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
