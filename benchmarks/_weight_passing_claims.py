"""The papers' claims beside pipert's numbers: claims(rows) and the markdown report(rows, ctx).

Both are functions of bench_weight_passing.py's CSV rows (and the stored context), so every
number and every sentence of the report is computed from the CSV; a claim outside its goal
carries the computed reason.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from _common import report_header

__all__ = ["claims", "report", "PUBLISHED"]

WEI, DIRECT, TAW = "weipipe-interleave", "weipipe-interleave-direct", "tawpipe"
NAMES = {"1f1b": "1F1B", "zb-h1": "ZB-H1", WEI: "WeiPipe", DIRECT: "WeiPipe-direct", TAW: "TawPipe"}

PUBLISHED: dict[str, dict[tuple[int, int], dict[str, float | None]]] = {
    # tokens/s/GPU (Table 4: kilotokens/s/GPU); None: out of memory
    "weipipe-t2": {k: dict(zip(("1f1b", "zb-h1", WEI), v)) for k, v in {
        (1024, 4096): (8581.7, 7547.0, 15138.8), (1024, 8192): (7403.8, 6739.6, 12122.3),
        (1024, 16384): (5641.2, 5651.6, 8188.3), (2048, 4096): (4163.2, 3823.3, 6499.7),
        (2048, 8192): (3791.3, 3517.8, 6033.2), (2048, 16384): (3146.3, 3050.1, 4607.8),
        (4096, 4096): (1662.7, None, 2023.1), (4096, 8192): (1556.2, None, 2059.4),
        (4096, 16384): (1331.6, None, 1684.9)}.items()},
    "weipipe-t4": {k: dict(zip(("1f1b", WEI), v)) for k, v in {
        (1024, 4096): (32.0, 31.3), (1024, 16384): (15.9, 16.9), (2048, 4096): (15.0, 14.2),
        (2048, 16384): (9.4, 9.7), (4096, 4096): (5.2, 4.9), (4096, 16384): (3.7, 3.6)}.items()},
    "tawpipe-t2": {k: dict(zip(("1f1b", "zb-h1", WEI, TAW), v)) for k, v in {
        (1024, 4096): (7212.1, 5893.3, 12054.8, 13629.2), (1024, 8192): (6636.4, 5803.1, 10663.1, 11738.2),
        (1024, 16384): (5593.7, 5883.4, 8412.3, 8913.7), (2048, 4096): (3028.5, 2884.5, 4008.1, 5040.0),
        (2048, 8192): (2886.1, 2839.8, 4377.0, 4636.6), (2048, 16384): (2900.7, 2914.8, 3841.7, 4175.7),
        (4096, 4096): (1247.8, None, 1038.1, 1567.7), (4096, 8192): (1365.8, 1323.3, 1158.9, 1511.5),
        (4096, 16384): (1114.2, None, 1232.4, 1377.6)}.items()},
}
TOL = 0.10
"""A ratio claim is within its goal when pipert's ratio is within 10% of the paper's."""


def _grid(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(table, H, S) -> schedule -> row."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["table"] != "small":
            out[(r["table"], r["hidden"], r["seq"])][r["schedule"]] = r
    return out


def _claim(system: str, claim: str, paper: float, pipert: float, goal: str, ok: bool, reason: str = "",
           direct: float | str = "") -> dict:
    ratio = pipert / paper if paper else ""
    return {"system": system, "claim": claim, "paper": paper, "pipert": pipert, "pipert_direct": direct,
            "ratio": ratio, "goal": goal, "within_goal": ok, "reason": "" if ok else reason}


def _ring_reason(w: dict) -> str:
    """Why the paper's ring is slow in a row: its turn against the link time of its chunks."""
    link = 3 * w["chunk_GB"] / w["link_GBps"]
    bound = "link-bound" if link > w["turn_compute_s"] else "compute-bound"
    return (f"the ring's 3 chunks of a turn ({w['chunk_GB']:.2f} GB each) take {link:.2f} s on a "
            f"{w['link_GBps']:g} GB/s link against a turn's compute of {w['turn_compute_s']:.2f} s ({bound}); "
            f"the turn with the head (B of unit P-1 + F of unit 0) computes {w['head_turn_s']:.2f} s and, as the "
            f"gradient leaves after the turn and the next worker waits for it, turns follow the longest "
            f"(bubble {w['bubble']:.3f})")


def _small(rows: list[dict]) -> dict[str, dict]:
    return {r["schedule"]: r for r in rows if r["table"] == "small"}


def weipipe_claims(rows: list[dict]) -> list[dict]:
    small, grid, out = _small(rows), _grid(rows), []
    p, d = small[WEI], small[DIRECT]
    out.append(_claim("WeiPipe", "Interleave bubble at P=4, N=8 = 1F1B's (P-1)/(N+P-1) (free links, tB = 2 tF)",
                      3 / 11, p["bubble"], "within 0.01", abs(p["bubble"] - 3 / 11) <= 0.01,
                      f"simulated bubble {p['bubble']:.4f}, lock-step analysis {small['weipipe-lockstep']['bubble']:.4f}",
                      direct=d["bubble"]))
    out.append(_claim("WeiPipe", "chunks a ring link carries per turn (2 W + 1 D, 36H^2 per layer)", 3,
                      p["max_chunks_per_turn"], "equal", p["max_chunks_per_turn"] == 3,
                      f"{p['max_chunks_per_turn']} chunks", direct=d["max_chunks_per_turn"]))
    for table, label in (("weipipe-t2", "Table 2"), ("weipipe-t4", "Table 4, NVLink only")):
        for (h, s), pub in PUBLISHED[table].items():
            got = grid.get((table, h, s))
            if not got:
                continue
            paper = pub[WEI] / pub["1f1b"]
            ours = got[WEI]["tok_s_gpu"] / got["1f1b"]["tok_s_gpu"]
            direct = got[DIRECT]["tok_s_gpu"] / got["1f1b"]["tok_s_gpu"]
            ok = abs(ours / paper - 1) <= TOL
            eff = {c: got[c]["tok_s_gpu"] / (pub[c] * (1000 if table == "weipipe-t4" else 1)) for c in ("1f1b", WEI)}
            one = got["1f1b"]
            reason = (f"pipert/published throughput: 1F1B {eff['1f1b']:.2f}, WeiPipe {eff[WEI]:.2f}; "
                      + _ring_reason(got[WEI]) + f"; 1F1B sends {one['act_GB']:.2f} GB per micro-batch over a stage "
                      f"boundary each way, {one['act_GB'] / one['link_GBps']:.2f} s on the slowest link against a "
                      f"stage's compute of {one['turn_compute_s']:.2f} s, overlapped in the model; its slowest stage (the "
                      f"head's) computes {one['stage_max_s']:.2f} s per micro-batch (bubble {one['bubble']:.3f})")
            out.append(_claim("WeiPipe", f"WeiPipe/1F1B throughput, {label}, H={h} S={s}", paper, ours,
                              f"within {TOL:.0%}", ok, reason, direct=direct))
    return out


def _ranking(values: dict[str, float]) -> list[str]:
    return [k for k, _ in sorted(values.items(), key=lambda kv: -kv[1])]


def tawpipe_claims(rows: list[dict]) -> list[dict]:
    small, grid, out = _small(rows), _grid(rows), []
    zb_oom = sum(pub["zb-h1"] is None for pub in PUBLISHED["tawpipe-t2"].values())
    for (h, s), pub in PUBLISHED["tawpipe-t2"].items():
        got = grid.get(("tawpipe-t2", h, s))
        if not got:
            continue
        ran = [c for c, v in pub.items() if v is not None]
        mine = {c: got[c]["tok_s_gpu"] for c in ran}
        want, have = _ranking({c: pub[c] for c in ran}), _ranking(mine)
        ok = want == have
        wrong = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:] if (mine[a] > mine[b]) != (pub[a] > pub[b])]
        parts = [f"{NAMES[a]}/{NAMES[b]} {mine[a] / mine[b]:.2f} (paper {pub[a] / pub[b]:.2f})" for a, b in wrong]
        reason = "pairs ordered differently: " + "; ".join(parts) + "."
        if wrong and all("zb-h1" in pair for pair in wrong):
            reason += (f" Only ZB-H1 is placed differently: the model runs its micro-batch of "
                       f"{got['zb-h1']['micro_batch']} sequences at the GEMM efficiency of 1F1B's "
                       f"{got['1f1b']['micro_batch']} and has no memory limit (the paper's ZB1 ran out of memory in "
                       f"{zb_oom} of {len(PUBLISHED['tawpipe-t2'])} rows).")
        elif any(set(pair) == {WEI, "1f1b"} for pair in wrong):
            reason += " WeiPipe: " + _ring_reason(got[WEI]) + "."
        out.append({"system": "TawPipe", "claim": f"ranking (Table 2, H={h} S={s})",
                    "paper": " > ".join(NAMES[c] for c in want), "pipert": " > ".join(NAMES[c] for c in have),
                    "pipert_direct": "", "ratio": "", "goal": "equal", "within_goal": ok, "reason": "" if ok else reason})
    for (h, s), pub in PUBLISHED["tawpipe-t2"].items():
        got = grid.get(("tawpipe-t2", h, s))
        if not got:
            continue
        ours = got[TAW]["tok_s_gpu"] / got[WEI]["tok_s_gpu"]
        direct = got[TAW]["tok_s_gpu"] / got[DIRECT]["tok_s_gpu"]
        out.append(_claim("TawPipe", f"TawPipe/WeiPipe throughput > 1 (Table 2, H={h} S={s})", pub[TAW] / pub[WEI],
                          ours, "> 1", ours > 1, f"TawPipe bubble {got[TAW]['bubble']:.3f}, WeiPipe "
                          f"{got[WEI]['bubble']:.3f}; inter-node GB {got[TAW]['inter_node_GB']:.1f} vs "
                          f"{got[WEI]['inter_node_GB']:.1f}", direct=direct))
    head = grid.get(("tawpipe-t2", 4096, 16384))
    if head:
        pub = PUBLISHED["tawpipe-t2"][(4096, 16384)]
        for other, pct in ((WEI, "11.8%"), ("1f1b", "23.6%")):
            ours = head[TAW]["tok_s_gpu"] / head[other]["tok_s_gpu"]
            out.append(_claim("TawPipe", f"headline: TawPipe beats {NAMES[other]} by {pct} at H=4096 S=16384",
                              pub[TAW] / pub[other], ours, f"within {TOL:.0%}", abs(ours / (pub[TAW] / pub[other]) - 1)
                              <= TOL, f"TawPipe bubble {head[TAW]['bubble']:.3f}, {NAMES[other]} "
                              f"{head[other]['bubble']:.3f}"))
        ours = (head[TAW]["inter_node_GB"] + head[TAW]["intra_node_GB"]) / \
            (head[WEI]["inter_node_GB"] + head[WEI]["intra_node_GB"])
        out.append(_claim("TawPipe", "bytes moved vs WeiPipe: 24H^2 vs 36H^2 per layer and step (H=4096 S=16384)",
                          24 / 36, ours, f"within {TOL:.0%}", abs(ours / (24 / 36) - 1) <= TOL,
                          f"inter-node GB {head[TAW]['inter_node_GB']:.1f} vs {head[WEI]['inter_node_GB']:.1f}, "
                          f"intra-node GB {head[TAW]['intra_node_GB']:.1f} vs {head[WEI]['intra_node_GB']:.1f} (a "
                          f"broadcast or reduce counts its bytes on each of the G-1 links of its chain)"))
    t = small["tawpipe-lockstep"]
    P, D, N = int(t["stages"]), int(t["nodes"]), int(t["microbatches"])
    formula = ((D - 1) * P + N) / ((3 * N + D - 1) * P + N)
    out.append(_claim("TawPipe", f"bubble formula ((D-1)P+N)/((3N+D-1)P+N) at P={P}, D={D}, N={N} (lock-step steps)",
                      formula, t["bubble"], "within 0.01", abs(t["bubble"] - formula) <= 0.01,
                      f"lock-step bubble {t['bubble']:.4f}"))
    return out


def claims(rows: list[dict]) -> list[dict]:
    """One row per claim (module doc)."""
    return weipipe_claims(rows) + tawpipe_claims(rows)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _span(x: list[float]) -> str:
    return f"{min(x):.2f}-{max(x):.2f}" if x else "-"


def _rankings_without_zb(grid: dict[tuple, dict[str, dict]]) -> int:
    """Rows of TawPipe's Table 2 whose ranking of 1F1B, WeiPipe and TawPipe is the paper's."""
    same = 0
    for (h, s), pub in PUBLISHED["tawpipe-t2"].items():
        got = grid.get(("tawpipe-t2", h, s))
        if got:
            names = ("1f1b", WEI, TAW)
            same += _ranking({c: pub[c] for c in names}) == _ranking({c: got[c]["tok_s_gpu"] for c in names})
    return same


def _prose(rows: list[dict], cl: list[dict]) -> list[str]:
    """The summary: every count and figure computed from the rows and claims."""
    grid, small = _grid(rows), _small(rows)
    lines = ["## Summary", ""]
    for system in ("WeiPipe", "TawPipe"):
        mine = [c for c in cl if c["system"] == system]
        lines.append(f"- {system}: {sum(c['within_goal'] for c in mine)} of {len(mine)} claims within their goal.")
    t4 = [c for c in cl if "Table 4" in c["claim"]]
    if t4:
        below = sum(c["paper"] < 1 for c in t4)
        lines.append(f"- WeiPipe's Table 4 (NVLink only): WeiPipe/1F1B published {_span([c['paper'] for c in t4])} "
                     f"(below 1 in {below} of {len(t4)} rows), pipert's paper ring {_span([c['pipert'] for c in t4])}, "
                     f"pipert's direct variant {_span([c['pipert_direct'] for c in t4])}.")
    t2 = [c for c in cl if c["system"] == "WeiPipe" and "Table 2" in c["claim"]]
    if t2:
        lines.append(f"- WeiPipe's Table 2 (2 nodes, 10 GbE): WeiPipe/1F1B published {_span([c['paper'] for c in t2])},"
                     f" pipert's paper ring {_span([c['pipert'] for c in t2])}, direct variant "
                     f"{_span([c['pipert_direct'] for c in t2])}.")
    order = [c for c in cl if c["claim"].startswith("ranking")]
    if order:
        zb_only = sum(not c["within_goal"] and "Only ZB-H1" in c["reason"] for c in order)
        lines.append(f"- TawPipe's Table 2: ranking equal in {sum(c['within_goal'] for c in order)} of {len(order)} "
                     f"rows ({_rankings_without_zb(grid)} of {len(order)} with ZB-H1 left out); of the "
                     f"{sum(not c['within_goal'] for c in order)} others, {zb_only} differ only in where ZB-H1 "
                     f"stands.")
    beats = [c for c in cl if c["claim"].startswith("TawPipe/WeiPipe")]
    if beats:
        lines.append(f"- TawPipe beats WeiPipe (paper ring) in {sum(c['pipert'] > 1 for c in beats)} of {len(beats)} "
                     f"rows (paper: {sum(c['paper'] > 1 for c in beats)}), pipert's direct variant in "
                     f"{sum(c['pipert_direct'] > 1 for c in beats)}.")
    gain = [grid[k][DIRECT]["tok_s_gpu"] / grid[k][WEI]["tok_s_gpu"] for k in grid if WEI in grid[k] and DIRECT in grid[k]]
    extra = [grid[k][DIRECT]["inter_node_GB"] / grid[k][WEI]["inter_node_GB"] for k in grid
             if WEI in grid[k] and DIRECT in grid[k] and grid[k][WEI]["inter_node_GB"]]
    p, d = small[WEI], small[DIRECT]
    lines.append(f"- pipert's direct variant (`weipipe-interleave-direct`: first copies straight from the owner, "
                 f"finished gradients straight to it, turns not enforced): bubble {d['bubble']:.3f} against the "
                 f"paper ring's {p['bubble']:.3f} at P=4, N=8; {d['messages'] - d['ring_messages']} of its "
                 f"{d['messages']} messages there leave the ring ({p['messages'] - p['ring_messages']} of "
                 f"{p['messages']} for the paper ring); on the papers' tables it runs {_span(gain)}x the paper "
                 f"ring's throughput with {_span(extra)}x its inter-node bytes.")
    return lines + [""]


def report(rows: list[dict], ctx: dict[str, str], rebuilt: bool = False) -> str:
    """The markdown report: a function of the CSV rows and the stored context only."""
    cl = claims(rows)
    lines = report_header("WeiPipe and TawPipe against their papers (analytic model + simulator)", ctx, rebuilt)
    lines += ["", "One row per claim: the paper's number, pipert's under the paper's inputs (WeiPipe: the paper's "
              "ring, `weipipe-interleave`; pipert's direct variant beside it), their ratio, the goal, and for a "
              "row outside it the computed reason. Ratios of throughputs are of the same row of the table.", ""]
    lines += _prose(rows, cl)
    for system in ("WeiPipe", "TawPipe"):
        lines += [f"## {system}", "", "| claim | paper | pipert | pipert direct | pipert/paper | goal | within | reason |",
                  "|---|---:|---:|---:|---:|---|:---:|---|"]
        for c in cl:
            if c["system"] == system:
                lines.append("| " + " | ".join(_fmt(c[k]) for k in ("claim", "paper", "pipert", "pipert_direct", "ratio",
                                                                      "goal", "within_goal", "reason")) + " |")
        lines.append("")
    lines += ["## Simulated runs", "", "| table | H | S | schedule | N | makespan s | bubble | tok/s/GPU | "
              "inter-node GB | intra-node GB |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["table"] != "small":
            lines.append(f"| {r['table']} | {r['hidden']} | {r['seq']} | {r['schedule']} | {r['microbatches']} | "
                         f"{r['makespan_s']:.2f} | {r['bubble']:.3f} | {r['tok_s_gpu']:.0f} | {r['inter_node_GB']:.1f} | "
                         f"{r['intra_node_GB']:.1f} |")
    return "\n".join(lines) + "\n"
