"""HelixPipe's part-time and recomputation claims in pipert's analytic model: the split of a layer
into pre-attention, attention and post-attention (the paper's Figure 3: one A800, h = 4096, b = 1,
FlashAttention; its text gives no numbers, only that attention "dominates" and pre- plus
post-attention are "a marginal fraction" at long sequences, section 4.4.1) and the cost of
recomputation without attention (section 5.5 / Figure 11: 3B, 4 stages, m = 2p = 8; "up to 20%"
at 32k or 64k, "near zero for 96k sequence length on the A800 cluster").

Part times are the analytic model's (``pipert.cost.transformer``): FLOPs at one efficiency for
GEMMs and FlashAttention alike, causal attention halved (FlashAttention skips masked blocks), the
attention backward 2.5x its forward (FlashAttention recomputes QK^T), plus elementwise bytes /
memory bandwidth. Used by ``bench_helixpipe.py``; writes nothing itself.
"""
from __future__ import annotations

from typing import Callable

from pipert.cost.devices import GiB, DeviceSpec
from pipert.cost.transformer import ModelSpec, TransformerCost, partition_fine

FIG3_DEVICE, FIG3_MODEL = "a800", "gpt-3b"     # Figure 3: an A800, h = 4096 (the 3B and 7B width)
FIG11_MODEL, FIG11_P = "3B", 4
PAPER_FIG11 = "recomputation costs up to 20% at 32k/64k and near zero at 96k on the A800 cluster (section 5.5)"


def layer_parts(seqs: tuple[int, ...]) -> list[dict]:
    """Forward and backward seconds of pre-attention, attention and post-attention of one middle
    layer on one GPU (no tensor parallelism), Figure 3's setting."""
    out = []
    dev = DeviceSpec.preset(FIG3_DEVICE)
    for seq in seqs:
        m = ModelSpec.preset(FIG3_MODEL, seq=seq, layers=3)
        cost = TransformerCost(m, dev, partition_fine(m))
        row = {"device": dev.name, "hidden": m.hidden, "seq": seq}
        for i, part in enumerate(("pre", "attn", "post")):
            u = 3 + i                   # layer 1: neither embedding nor head
            row[f"{part}_f_s"] = cost.unit_time(u, "F")
            row[f"{part}_b_s"] = cost.unit_time(u, "B")
        total = sum(row[f"{p}_{k}_s"] for p in ("pre", "attn", "post") for k in "fb")
        row["attn_share_f"] = row["attn_f_s"] / sum(row[f"{p}_f_s"] for p in ("pre", "attn", "post"))
        row["attn_share"] = (row["attn_f_s"] + row["attn_b_s"]) / total
        row["rerun_share"] = (row["pre_f_s"] + row["post_f_s"]) / total
        out.append(row)
    return out


def recompute_rows(seqs: tuple[int, ...], clusters: dict, simulate_variant: Callable) -> list[dict]:
    """Figure 11: HelixPipe (the paper's configuration) with and without recomputation without
    attention, 3B on 4 stages, m = 8, per cluster and sequence length. ``simulate_variant(cluster,
    model, seq, stages, microbatches, recompute)`` returns (seconds, peak GiB per GPU, GPU GiB)."""
    out = []
    for cluster in clusters:
        for seq in seqs:
            t_rc, mem_rc, cap = simulate_variant(cluster, FIG11_MODEL, seq, FIG11_P, 2 * FIG11_P, "no_attention")
            t_no, mem_no, _ = simulate_variant(cluster, FIG11_MODEL, seq, FIG11_P, 2 * FIG11_P, "none")
            out.append({"cluster": cluster, "model": FIG11_MODEL, "stages": FIG11_P, "seq": seq,
                        "seconds_recompute": t_rc, "seconds_no_recompute": t_no,
                        "throughput_loss": 1 - t_no / t_rc, "mem_gib_recompute": mem_rc,
                        "mem_gib_no_recompute": mem_no, "gpu_memory_gib": cap})
    return out


def parts_section(parts: list[dict]) -> list[str]:
    """Figure 3's table in the model, and what it implies for recomputation."""
    if not parts:
        return []
    lines = ["", f"## A layer's parts on one {parts[0]['device']} (Figure 3's setting: h = {parts[0]['hidden']}, b = 1, "
             "FlashAttention, causal; model, not a measurement)", "",
             "| seq | pre F (ms) | attention F (ms) | post F (ms) | pre B | attention B | post B | "
             "attention share of F | attention share of F+B | pre+post F / layer F+B |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in parts:
        lines.append(f"| {r['seq'] // 1024}k | {1e3 * r['pre_f_s']:.1f} | {1e3 * r['attn_f_s']:.1f} | "
                     f"{1e3 * r['post_f_s']:.1f} | {1e3 * r['pre_b_s']:.1f} | {1e3 * r['attn_b_s']:.1f} | "
                     f"{1e3 * r['post_b_s']:.1f} | {r['attn_share_f']:.2f} | {r['attn_share']:.2f} | "
                     f"{r['rerun_share']:.2f} |")
    return lines


def recompute_section(rows: list[dict]) -> list[str]:
    """Figure 11's comparison in the model."""
    if not rows:
        return []
    lines = ["", f"## Recomputation without attention (Figure 11's setting: {FIG11_MODEL}, p = {FIG11_P}, m = "
             f"{2 * FIG11_P}; the paper: {PAPER_FIG11})", "",
             "| cluster | seq | step with recompute (s) | step without (s) | throughput lost to recompute | "
             "peak GiB with / without (of the GPU's) |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['cluster']} | {r['seq'] // 1024}k | {r['seconds_recompute']:.2f} | "
                     f"{r['seconds_no_recompute']:.2f} | {100 * r['throughput_loss']:.1f}% | "
                     f"{r['mem_gib_recompute']:.0f} / {r['mem_gib_no_recompute']:.0f} ({r['gpu_memory_gib']:.0f}) |")
    return lines


def recompute_discussion(rows: list[dict], parts: list[dict]) -> list[str]:
    """What the model says about section 5.5's claims, decided from the rows."""
    if not rows or not parts:
        return []
    a800 = {r["seq"]: r["throughput_loss"] for r in rows if r["cluster"] == "A800"}
    short = max(r["throughput_loss"] for r in rows if r["seq"] <= 65536)
    q96 = 98304
    share = {r["seq"]: r["rerun_share"] for r in parts}
    out = [f"- Figure 11 in the model: recomputation costs at most {100 * short:.0f}% at 32k/64k (the paper: up to "
           f"20%) and falls with the sequence length, as the paper says"
           + (f"; at 96k on the A800 it still costs {100 * a800[q96]:.0f}% where the paper measures near zero." if q96 in a800
              else ".")]
    if q96 in share:
        k = attention_slowdown_for(next(r for r in parts if r["seq"] == q96), NEAR_ZERO)
        out.append(f"- Why: recomputation reruns pre- and post-attention forward, {100 * share[q96]:.0f}% of a layer's "
                   f"forward and backward at 96k in the model (Figure 3's setting; {100 * share[max(share)]:.0f}% at "
                   f"{max(share) // 1024}k), from FLOPs at one efficiency for GEMMs and attention. For that share to be "
                   f"{100 * NEAR_ZERO:.0f}% at 96k, attention would have to run {k:.1f}x slower per FLOP than the GEMMs; "
                   f"neither the paper's text (Figure 3 has no numbers in it) nor a datasheet gives such a ratio, so the "
                   f"model keeps one efficiency.")
    out.append("- Where the rerun sits: the authors' code (code-tunnel/Megatron-LM, branch dev, "
               "megatron/model/flatten_transformer_layer.py) wraps pre-attention in an autograd checkpoint "
               "function and post-attention in Megatron's checkpoint, so the rerun runs inside autograd's "
               "backward, after the gradient has arrived, as in pipert's units (a unit's backward carries it); "
               "it cannot hide in a wait for the gradient.")
    return out


NEAR_ZERO = 0.02
"""The rerun share read as section 5.5's "near zero" throughput gap."""


def attention_slowdown_for(row: dict, share: float) -> float:
    """How many times slower attention must run (same FLOPs) for the rerun of pre- and
    post-attention forward to be ``share`` of a layer's forward and backward."""
    rerun = row["pre_f_s"] + row["post_f_s"]
    rest = rerun + row["pre_b_s"] + row["post_b_s"]
    return (rerun / share - rest) / (row["attn_f_s"] + row["attn_b_s"])
