"""The papers' claims beside pipert's numbers: claims(rows) and the markdown report(rows, ctx).

Both are functions of bench_weight_passing.py's CSV rows (and the stored context), so every
number and every sentence of the report is computed from the CSV; a claim outside its goal
carries the computed reason.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from _common import report_header

__all__ = ["claims", "report", "PUBLISHED", "implied_bandwidth"]

WEI, DIRECT, TAW, MEG = "weipipe-interleave", "weipipe-interleave-direct", "tawpipe", "1f1b-megatron"
NAMES = {"1f1b": "1F1B", "zb-h1": "ZB-H1", WEI: "WeiPipe", DIRECT: "WeiPipe-direct", TAW: "TawPipe",
         MEG: "1F1B (Megatron-LM)"}
SLOW = "weipipe-t2-implied"
"""WeiPipe's Table 2 rows rerun at the boundary bandwidth the published 1F1B implies (implied_bandwidth)."""
GPU_GB = 80.0
"""The papers' A800 memory: a row whose fullest rank needs more is out of memory in pipert's model."""

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


FIELDS = ("system", "claim", "paper", "pipert", "pipert_direct", "ratio", "goal", "within_goal", "pipert_megatron",
          "within_goal_megatron", "reason")
"""A claim's fields; ``pipert_megatron``/``within_goal_megatron``: pipert's number and verdict with
1F1B as Megatron-LM runs it (a claim without 1F1B keeps its own)."""


def _megatron(c: dict, megatron: float | str = "", ok_megatron: bool | None = None, reason: str = "") -> dict:
    """``c`` with the Megatron-LM baseline's number and verdict; a row outside the goal under either
    baseline keeps its reason."""
    ok_m = c["within_goal"] if ok_megatron is None else ok_megatron
    out = {**c, "pipert_megatron": megatron, "within_goal_megatron": ok_m}
    out["reason"] = c["reason"] or ("" if ok_m else reason)
    return {k: out[k] for k in FIELDS}


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
            meg = got[WEI]["tok_s_gpu"] / got[MEG]["tok_s_gpu"]
            direct = got[DIRECT]["tok_s_gpu"] / got["1f1b"]["tok_s_gpu"]
            ok, ok_m = abs(ours / paper - 1) <= TOL, abs(meg / paper - 1) <= TOL
            unit = 1000 if table == "weipipe-t4" else 1
            eff = {c: got[c]["tok_s_gpu"] / (pub["1f1b" if c == MEG else c] * unit) for c in ("1f1b", MEG, WEI)}
            reason = (f"pipert/published throughput: 1F1B {eff['1f1b']:.2f} (as Megatron-LM runs it {eff[MEG]:.2f}), "
                      f"WeiPipe {eff[WEI]:.2f}; " + _blocking_reason(got, meg, paper, ok_m) + "; "
                      + (_implied_link(got, grid.get((SLOW, h, s)), pub) + "; " if table == "weipipe-t2" else "")
                      + _ring_reason(got[WEI]))
            out.append(_megatron(_claim("WeiPipe", f"WeiPipe/1F1B throughput, {label}, H={h} S={s}", paper, ours,
                                        f"within {TOL:.0%}", ok, reason, direct=direct), meg, ok_m, reason))
    return out


def implied_bandwidth(blk: dict, one: dict, published: float) -> tuple[float, float]:
    """(seconds per micro-batch the published 1F1B takes beyond pipert's blocking 1F1B ``blk``,
    the boundary bandwidth in GB/s at which a boundary stage's blocked period would pace it so):
    from the rows of ``blk`` and pipert's 1F1B ``one`` and the published tokens/s/GPU. Where the
    published 1F1B is not slower, no slower link is implied: the bandwidth is the modelled one."""
    extra = blk["makespan_s"] * (blk["tok_s_gpu"] / published - 1) / blk["microbatches"]
    if extra <= 0:
        return extra, one["link_GBps"]
    period = max(one["stage_max_s"], one["turn_compute_s"] + one["act_GB"] / one["link_GBps"]) + extra
    return extra, one["act_GB"] / (period - one["turn_compute_s"])


def _implied_link(got: dict[str, dict], slow: dict[str, dict] | None, pub: dict) -> str:
    """What the published 1F1B implies beyond pipert's blocking 1F1B, and what pipert gives at the
    boundary bandwidth that would explain it alone (the runs ``slow``, if made)."""
    blk, one = got[MEG], got["1f1b"]
    extra, gbs = implied_bandwidth(blk, one, pub["1f1b"])
    xfer = one["act_GB"] / one["link_GBps"]
    if extra <= 0:
        return f"the published 1F1B is {pub['1f1b'] / blk['tok_s_gpu']:.2f}x as fast as the blocking one: no slower link is implied"
    text = (f"the published 1F1B's iteration is {blk['tok_s_gpu'] / pub['1f1b']:.2f}x as long as the blocking one's, "
            f"{extra:.2f} s more per micro-batch ({extra / xfer:.1f} boundary transfers); were the boundary link the "
            f"only cause, its effective bandwidth would be about {gbs:.2f} GB/s against the modelled "
            f"{one['link_GBps']:g}")
    if slow and MEG in slow and WEI in slow:
        m, w = slow[MEG]["tok_s_gpu"] / pub["1f1b"], slow[WEI]["tok_s_gpu"] / pub[WEI]
        both = "reproduces both" if abs(m - 1) <= TOL and abs(w - 1) <= TOL else "does not reproduce both"
        text += (f"; run at {slow[MEG]['link_GBps']:.2f} GB/s, pipert's blocking 1F1B gives {m:.2f} of the published "
                 f"1F1B and its WeiPipe {w:.2f} of the published WeiPipe (WeiPipe/1F1B "
                 f"{slow[WEI]['tok_s_gpu'] / slow[MEG]['tok_s_gpu']:.2f}): one link speed {both} columns")
    return text


def _blocking_reason(got: dict[str, dict], meg: float, paper: float, ok_m: bool) -> str:
    """What Megatron-LM's blocking transfers change in 1F1B: a boundary stage's period against
    the head stage's, and the throughput they cost."""
    one, blk = got["1f1b"], got[MEG]
    xfer = one["act_GB"] / one["link_GBps"]
    period = one["turn_compute_s"] + xfer
    pace = ("the blocked boundary stages set the pace" if period > one["stage_max_s"]
            else "the head stage still sets the pace")
    verdict = "within the goal" if ok_m else "outside the goal"
    return (f"with 1F1B's transfers blocking as in Megatron-LM, WeiPipe/1F1B is {meg:.2f} ({meg / paper:.2f} of "
            f"the paper's, {verdict}): a boundary stage computes {one['turn_compute_s']:.2f} s per micro-batch and "
            f"blocks {xfer:.2f} s on its {one['act_GB']:.2f} GB exchange over the slowest link, {period:.2f} s "
            f"against the head stage's {one['stage_max_s']:.2f} s, so {pace} and blocking changes 1F1B's "
            f"throughput by {blk['tok_s_gpu'] / one['tok_s_gpu'] - 1:+.1%} (bubble {one['bubble']:.3f} -> "
            f"{blk['bubble']:.3f})")


def _t4_direction(grid: dict[tuple, dict[str, dict]], t4: list[dict]) -> str:
    """Why pipert's WeiPipe/1F1B on Table 4 is or is not below 1, from the rows: both run at the
    pace of the step that holds the LM head and loss."""
    keys = [k for k in grid if k[0] == "weipipe-t4" and "1f1b" in grid[k] and WEI in grid[k]]
    if not keys:
        return ""
    head = [grid[k]["1f1b"]["stage_max_s"] / grid[k]["1f1b"]["turn_compute_s"] for k in keys]
    turn = [grid[k][WEI]["head_turn_s"] / grid[k]["1f1b"]["stage_max_s"] for k in keys]
    text = (f"Both run at the pace of the step with the LM head and loss: 1F1B's last stage computes "
            f"{_span(head)}x a body stage per micro-batch, and WeiPipe's turn with the loss (B of unit P-1 with "
            f"the head's forward and backward, + F of unit 0) {_span(turn)}x that last stage, so the head's share "
            f"moves both alike and the ratio's distance from 1 is the fill and drain")
    need = [c["paper"] / c["pipert"] for c in t4 if c["paper"] < 1 <= c["pipert"]]
    if need:
        text += (f"; where the paper has WeiPipe slower and pipert does not ({len(need)} rows), WeiPipe would have "
                 f"to run at {_span(need)} of its modelled speed: costs of the WeiPipe runtime that pipert does "
                 f"not model")
    return text + "."


def _ranking(values: dict[str, float]) -> list[str]:
    return [k for k, _ in sorted(values.items(), key=lambda kv: -kv[1])]


ZB1_MEMORY_GB = {(1024, 4096): 34.3, (1024, 8192): 19.0, (1024, 16384): 36.7, (2048, 4096): 67.6,
                 (2048, 8192): 35.9, (2048, 16384): 69.3, (4096, 4096): None, (4096, 8192): 71.1,
                 (4096, 16384): None}
"""TawPipe's Table 2: ZB1's peak memory in GB (None: out of memory)."""


def _wrong_pairs(ran: list[str], mine: dict[str, float], pub: dict) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:] if (mine[a] > mine[b]) != (pub[a] > pub[b])]


def _nic_cost(r: dict) -> float:
    """How much longer a run is with its node's ranks sharing one NIC than with a link each."""
    return r["makespan_s"] / r["own_links_makespan_s"] - 1


def _zb_reason(got: dict[str, dict], pub: dict, h: int, s: int) -> str:
    """ZB-H1 in one row of TawPipe's Table 2: its speed against 1F1B's and its memory, computed."""
    zb, one, meg = got["zb-h1"], got["1f1b"]["tok_s_gpu"], got[MEG]["tok_s_gpu"]
    mem = zb["peak_GB"]
    paper_mem = ZB1_MEMORY_GB[(h, s)]
    measured = f"the paper measured {paper_mem:g} GB" if paper_mem else "the paper's ZB1 ran out of memory"
    text = (f"ZB-H1 (no recompute, micro-batches of {zb['micro_batch']} sequences against 1F1B's "
            f"{got['1f1b']['micro_batch']}, {zb['microbatches']} of them) runs {zb['tok_s_gpu'] / one:.2f}x pipert's "
            f"1F1B and {zb['tok_s_gpu'] / meg:.2f}x 1F1B as Megatron-LM runs it")
    if pub["zb-h1"] is not None:
        need = (pub["zb-h1"] / pub["1f1b"]) / (zb["tok_s_gpu"] / meg)
        text += (f", the paper's {pub['zb-h1'] / pub['1f1b']:.2f}x: it would have to run at {need:.2f} of its "
                 f"modelled speed (pipert models every micro-batch size at one GEMM efficiency)")
    fits = "over" if mem > GPU_GB else "within"
    return text + f"; its fullest rank needs {mem:.1f} GB in pipert's memory model, {fits} the {GPU_GB:g} GB ({measured})"


def tawpipe_claims(rows: list[dict]) -> list[dict]:
    small, grid, out = _small(rows), _grid(rows), []
    for (h, s), pub in PUBLISHED["tawpipe-t2"].items():
        got = grid.get(("tawpipe-t2", h, s))
        if not got:
            continue
        ran = [c for c, v in pub.items() if v is not None]
        mine = {c: got[c]["tok_s_gpu"] for c in ran}
        mine_m = {**mine, "1f1b": got[MEG]["tok_s_gpu"]}
        want, have, have_m = _ranking({c: pub[c] for c in ran}), _ranking(mine), _ranking(mine_m)
        wrong, wrong_m = _wrong_pairs(ran, mine, pub), _wrong_pairs(ran, mine_m, pub)
        parts = [f"{NAMES[a]}/{NAMES[b]} {mine[a] / mine[b]:.2f} (paper {pub[a] / pub[b]:.2f})" for a, b in wrong]
        parts_m = [f"{NAMES[a]}/{NAMES[b]} {mine_m[a] / mine_m[b]:.2f}" for a, b in wrong_m]
        reason = ("pairs ordered differently: " + ("; ".join(parts) or "none") + "; with 1F1B as Megatron-LM runs "
                  "it: " + ("; ".join(parts_m) or "none") + ".")
        if wrong_m and all("zb-h1" in pair for pair in wrong_m):
            reason += " Only ZB-H1 is placed differently."
        if any("zb-h1" in pair for pair in wrong + wrong_m):
            reason += " " + _zb_reason(got, pub, h, s) + "."
        if any("1f1b" in pair for pair in wrong + wrong_m):
            reason += (f" 1F1B: the shared NICs lengthen pipert's overlapped 1F1B by {_nic_cost(got['1f1b']):.1%} and "
                       f"the blocking one by {_nic_cost(got[MEG]):.1%} (the middle node's one NIC sends activations to "
                       f"the next node and gradients to the previous one).")
        if any(set(pair) == {WEI, "1f1b"} for pair in wrong + wrong_m):
            reason += " WeiPipe: " + _ring_reason(got[WEI]) + "."
        row = {"system": "TawPipe", "claim": f"ranking (Table 2, H={h} S={s})", "paper": " > ".join(NAMES[c] for c in want),
               "pipert": " > ".join(NAMES[c] for c in have), "pipert_direct": "", "ratio": "", "goal": "equal",
               "within_goal": want == have, "reason": "" if want == have else reason}
        out.append(_megatron(row, " > ".join(NAMES[c] for c in have_m), want == have_m, reason))
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
            paper = pub[TAW] / pub[other]
            ours = head[TAW]["tok_s_gpu"] / head[other]["tok_s_gpu"]
            meg = head[TAW]["tok_s_gpu"] / head[MEG]["tok_s_gpu"] if other == "1f1b" else ""
            why = f"TawPipe bubble {head[TAW]['bubble']:.3f}, {NAMES[other]} {head[other]['bubble']:.3f}"
            if meg:
                why += f" ({NAMES[MEG]} {head[MEG]['bubble']:.3f})"
            out.append(_megatron(_claim("TawPipe", f"headline: TawPipe beats {NAMES[other]} by {pct} at H=4096 "
                                        f"S=16384", paper, ours, f"within {TOL:.0%}", abs(ours / paper - 1) <= TOL, why),
                                 meg, abs(meg / paper - 1) <= TOL if meg else None, why))
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
    return [_megatron(c) if "pipert_megatron" not in c else c for c in weipipe_claims(rows) + tawpipe_claims(rows)]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _span(x: list[float]) -> str:
    return f"{min(x):.2f}-{max(x):.2f}" if x else "-"


def _rankings_without_zb(grid: dict[tuple, dict[str, dict]], one: str = "1f1b") -> int:
    """Rows of TawPipe's Table 2 whose ranking of 1F1B (pipert's run ``one``), WeiPipe and TawPipe
    is the paper's."""
    same = 0
    for (h, s), pub in PUBLISHED["tawpipe-t2"].items():
        got = grid.get(("tawpipe-t2", h, s))
        if got:
            names = ("1f1b", WEI, TAW)
            mine = {c: got[one if c == "1f1b" else c]["tok_s_gpu"] for c in names}
            same += _ranking({c: pub[c] for c in names}) == _ranking(mine)
    return same


def _pct_span(x: list[float]) -> str:
    """Fractions as a span of signed percentages."""
    return f"{100 * min(x):+.1f} to {100 * max(x):+.1f} %" if x else "-"


def _rows(keys: list[tuple]) -> str:
    return ", ".join(f"H={h} S={s}" for h, s in keys) or "none"


def _prose(rows: list[dict], cl: list[dict]) -> list[str]:
    """The summary: every count and figure computed from the rows and claims."""
    grid, small = _grid(rows), _small(rows)
    lines = ["## Summary", ""]
    for system in ("WeiPipe", "TawPipe"):
        mine = [c for c in cl if c["system"] == system]
        lines.append(f"- {system}: {sum(c['within_goal'] for c in mine)} of {len(mine)} claims within their goal "
                     f"against pipert's 1F1B (transfers overlapped), {sum(c['within_goal_megatron'] for c in mine)} "
                     f"of {len(mine)} against 1F1B as Megatron-LM runs it (transfers block).")
    t4 = [c for c in cl if "Table 4" in c["claim"]]
    if t4:
        below = sum(c["paper"] < 1 for c in t4)
        lines.append(f"- WeiPipe's Table 4 (NVLink only): WeiPipe/1F1B published {_span([c['paper'] for c in t4])} "
                     f"(below 1 in {below} of {len(t4)} rows), pipert's paper ring {_span([c['pipert'] for c in t4])} "
                     f"(below 1 in {sum(c['pipert'] < 1 for c in t4)}; {_span([c['pipert_megatron'] for c in t4])} "
                     f"against 1F1B as Megatron-LM runs it), pipert's direct variant "
                     f"{_span([c['pipert_direct'] for c in t4])}. " + _t4_direction(grid, t4))
    t2 = [c for c in cl if c["system"] == "WeiPipe" and "Table 2" in c["claim"]]
    if t2:
        lines.append(f"- WeiPipe's Table 2 (2 nodes, 10 GbE): WeiPipe/1F1B published {_span([c['paper'] for c in t2])},"
                     f" pipert's paper ring {_span([c['pipert'] for c in t2])} "
                     f"({_span([c['pipert_megatron'] for c in t2])} against 1F1B as Megatron-LM runs it), direct variant "
                     f"{_span([c['pipert_direct'] for c in t2])}.")
    slow = {k[1:]: v for k, v in grid.items() if k[0] == SLOW}
    if slow:
        pub = PUBLISHED["weipipe-t2"]
        lines.append(f"- WeiPipe's Table 2 at each row's implied boundary bandwidth "
                     f"({_span([v[MEG]['link_GBps'] for v in slow.values()])} GB/s, the speed at which pipert's "
                     f"blocking 1F1B would run as slowly as the published one): pipert's blocking 1F1B gives "
                     f"{_span([v[MEG]['tok_s_gpu'] / pub[k]['1f1b'] for k, v in slow.items()])} of the published "
                     f"1F1B, its WeiPipe {_span([v[WEI]['tok_s_gpu'] / pub[k][WEI] for k, v in slow.items()])} of the "
                     f"published WeiPipe.")
    order = [c for c in cl if c["claim"].startswith("ranking")]
    if order:
        zb_only = sum(not c["within_goal_megatron"] and "Only ZB-H1" in c["reason"] for c in order)
        lines.append(f"- TawPipe's Table 2: ranking equal in {sum(c['within_goal'] for c in order)} of {len(order)} "
                     f"rows with pipert's 1F1B ({_rankings_without_zb(grid)} with ZB-H1 left out), in "
                     f"{sum(c['within_goal_megatron'] for c in order)} with 1F1B as Megatron-LM runs it "
                     f"({_rankings_without_zb(grid, MEG)} with ZB-H1 left out); of the latter's "
                     f"{sum(not c['within_goal_megatron'] for c in order)} others, {zb_only} differ only in where "
                     f"ZB-H1 stands.")
        zb = {k[1:]: v["zb-h1"] for k, v in grid.items() if k[0] == "tawpipe-t2" and "zb-h1" in v}
        over = [k for k, r in zb.items() if r["peak_GB"] > GPU_GB]
        oom = [k for k, v in PUBLISHED["tawpipe-t2"].items() if v["zb-h1"] is None and k in zb]
        ratios = [zb[k]["peak_GB"] / v for k, v in ZB1_MEMORY_GB.items() if v and k in zb]
        lines.append(f"- ZB-H1's memory in TawPipe's Table 2 (pipert's model: the simulator's running peak plus "
                     f"18 B per parameter of static state): over the A800's {GPU_GB:g} GB in {len(over)} of {len(zb)} "
                     f"rows ({_rows(over)}), the paper's ZB1 out of memory in {len(oom)} ({_rows(oom)}); where the "
                     f"paper measured it, pipert's peak is {_span(ratios)}x the paper's.")
    for table, label in (("weipipe-t2", "WeiPipe's Table 2 (2 nodes)"), ("tawpipe-t2", "TawPipe's Table 2 (3 nodes)")):
        runs = [v for k, v in grid.items() if k[0] == table and "1f1b" in v and MEG in v]
        if runs:
            lines.append(f"- {label}: the shared NIC changes the makespan of pipert's overlapped 1F1B by "
                         f"{_pct_span([_nic_cost(v['1f1b']) for v in runs])}, of the blocking one by "
                         f"{_pct_span([_nic_cost(v[MEG]) for v in runs])}; blocking changes 1F1B's throughput by "
                         f"{_pct_span([v[MEG]['tok_s_gpu'] / v['1f1b']['tok_s_gpu'] - 1 for v in runs])}.")
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
              "row outside it the computed reason. Ratios of throughputs are of the same row of the table. Both papers ran "
              "1F1B through Megatron-LM, whose `forward_backward_pipelining_without_interleaving` "
              "(megatron/core/pipeline_parallel/schedules.py) waits on every boundary transfer before its next "
              "compute (`P2PCommunicator._communicate`, `wait_on_reqs=True`, p2p_communication.py): the column "
              "\"1F1B as Megatron-LM runs it\" uses pipert's 1F1B with that blocking (`1f1b-megatron`, "
              "benchmarks/_megatron_p2p.py) where the claim involves 1F1B. ZB-H1 keeps pipert's overlapped "
              "transfers: the authors' runtime (zerobubble/runtime.py) drops its send handles and waits on a "
              "receive only at its consumer.", ""]
    lines += _prose(rows, cl)
    for system in ("WeiPipe", "TawPipe"):
        lines += [f"## {system}", "", "| claim | paper | pipert | pipert direct | pipert/paper | goal | within | "
                  "pipert, 1F1B as Megatron-LM runs it (transfers block) | within | reason |",
                  "|---|---:|---:|---:|---:|---|:---:|---:|:---:|---|"]
        for c in cl:
            if c["system"] == system:
                lines.append("| " + " | ".join(_fmt(c[k]) for k in (
                    "claim", "paper", "pipert", "pipert_direct", "ratio", "goal", "within_goal", "pipert_megatron",
                    "within_goal_megatron", "reason")) + " |")
        lines.append("")
    lines += ["## Simulated runs", "", "| table | H | S | schedule | N | makespan s | bubble | tok/s/GPU | "
              "inter-node GB | intra-node GB | fullest rank GB |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["table"] != "small":
            lines.append(f"| {r['table']} | {r['hidden']} | {r['seq']} | {r['schedule']} | {r['microbatches']} | "
                         f"{r['makespan_s']:.2f} | {r['bubble']:.3f} | {r['tok_s_gpu']:.0f} | {r['inter_node_GB']:.1f} | "
                         f"{r['intra_node_GB']:.1f} | {_fmt(r['peak_GB']) if r['peak_GB'] != '' else ''} |")
    return "\n".join(lines) + "\n"
