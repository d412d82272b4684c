"""README's figures, generated from the benchmark reports' data.

Each block of README.md between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` is
written from ``benchmarks/results/NAME.csv`` and ``NAME.context.json`` by ``BLOCKS[NAME]``. A
report measured on a tree with uncommitted changes is not cited: its block says so and names
the command that re-measures it.

    python benchmarks/readme_figures.py           # rewrite README.md's blocks
    python benchmarks/readme_figures.py --check   # exit 1 when README.md differs (CI)
"""
from __future__ import annotations

import argparse
import difflib
import re
import statistics
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, bandwidth_messages, is_clean, load_context, read_csv  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def _commit(ctx: dict) -> str:
    return ctx.get("commit", "unknown").split()[0][:10]


def _source(script: str, name: str, ctx: dict, command: str | None = None) -> str:
    run = command or f"python benchmarks/{script}"
    return f"(`{run}`; `benchmarks/results/{name}.md`, commit {_commit(ctx)}, {ctx['date'][:10]})"


def sim_speed(rows: list[dict], ctx: dict, cli: list[dict] = ()) -> str:
    top = max(rows, key=lambda r: r["P"] * r["M"])
    by = {r["what"]: r for r in cli}
    command = ""
    if "end_to_end" in by:
        e2e, cached = by["end_to_end"], by.get("end_to_end_bytecode")
        best = min(r["cpu_s"] for r in (e2e, cached) if r)
        command = (f"; the command `pipert {e2e['command'].split(' ', 2)[2]}` end to end {e2e['cpu_s']:.2f} s CPU"
                   + (f" ({cached['cpu_s']:.2f} s with bytecode cached)" if cached else "")
                   + f", target < 1 s {'met' if best < 1.0 else 'missed'}")
    return (f"- Simulator speed: 1F1B with P={top['P']}, M={top['M']} ({top['actions']:,} actions) simulated in "
            f"{top['wall_s']:.2f} s wall, {top['cpu_s']:.2f} s CPU{command} "
            + _source("bench_sim_speed.py", "sim_speed", ctx) + ".")


def vs_torch(rows: list[dict], ctx: dict) -> str:
    vs = [r for r in rows if r["kind"] == "vs_torch_pipelining"]
    one = [r for r in rows if r["kind"] == "single_stage_vs_plain"]
    ratios = [r["ratio"] for r in vs]
    out = [r for r in vs if r["met"] == "no"]
    worst = max(out, key=lambda r: r["ratio"]) if out else None
    systems = sorted({r["schedule"] for r in vs})
    return (f"- pipert vs `torch.distributed.pipelining` (same LLaMA units, gloo, P in "
            f"{{{', '.join(str(p) for p in sorted({r['P'] for r in vs}))}}}, {'/'.join(systems)}): step-time ratios "
            f"{min(ratios):.3f}-{max(ratios):.3f}, median {statistics.median(ratios):.3f}; "
            f"{sum(r['met'] == 'yes' for r in vs)} of {len(vs)} configurations at <= 1.0, "
            f"{sum(r['met'] == 'no (noise)' for r in vs)} above it within the noise interval, {len(out)} above it"
            + (f" (worst {worst['schedule']} P={worst['P']} M={worst['M']}, {worst['ratio']:.3f})" if worst else "")
            + "; single stage vs a plain loop "
            + " / ".join(f"{100 * (r['ratio'] - 1):+.1f} % (M={r['M']})" for r in one) + " "
            + _source("bench_vs_torch.py", "vs_torch", ctx) + ".")


def fidelity(rows: list[dict], ctx: dict) -> str:
    fid = [r for r in rows if r["part"] == "fidelity"]
    sweep = [r for r in rows if r["part"] == "crosspipe-sweep"]
    return (f"- Emulator fidelity (CPU host): measured makespan within {100 * max(abs(r['rel_error']) for r in fid):.1f} % "
            f"of the simulator for {', '.join(sorted({r['schedule'] for r in fid}))}, P in "
            f"{{{', '.join(str(p) for p in sorted({r['P'] for r in fid}))}}}, with and without a cross-DC link, and "
            f"within {100 * max(abs(r['rel_error']) for r in sweep):.1f} % on the CrossPipe P=4 sweep "
            + _source("bench_fidelity.py", "fidelity", ctx) + ".")


def delay_cpu(rows: list[dict], ctx: dict) -> str:
    judged = [r for r in rows if r["section"] != "issue"]
    return (f"- Delay injection on CPU: {sum(r['pass'] for r in judged)} of {len(judged)} rows within target "
            + _source("bench_delay.py", "delay_cpu", ctx) + ".")


def crosspipe_sweep(rows: list[dict], ctx: dict) -> str:
    from _crosspipe_tables import within_count
    k, n = within_count(rows)
    p4 = [r for r in rows if r["P"] == 4 and r.get("status") not in (None, "")]
    optimal = [r for r in p4 if r["status"] == "OPTIMAL"]
    return (f"- CrossPipe sweep: CP-SAT proves {len(optimal)} of {len(p4)} P=4, M=8 cells optimal (within its 1 % "
            f"gap), in <= {max(r['solver_s'] for r in optimal):.1f} s per cell; the greedy is within "
            f"{100 * max(r['greedy_gap'] for r in optimal):.1f} % of them"
            + (f"; the paper's Tables 5 and 6 (P=8): {k} of {n} figures within 10 %" if n else "") + " "
            + _source("bench_crosspipe.py", "crosspipe_sweep", ctx) + ".")


def weight_passing(rows: list[dict], ctx: dict) -> str:
    from _weight_passing_claims import claims
    cl = claims(rows)
    parts = [f"{system}: {sum(c['within_goal'] for c in cl if c['system'] == system)} of "
             f"{sum(c['system'] == system for c in cl)} claims within their goal "
             f"({sum(c['within_goal_megatron'] for c in cl if c['system'] == system)} with 1F1B's transfers blocking "
             f"as in Megatron-LM)" for system in ("WeiPipe", "TawPipe")]
    bubble = next(c for c in cl if c["claim"].startswith("Interleave bubble"))
    order = [c for c in cl if c["claim"].startswith("ranking")]
    return ("- WeiPipe/TawPipe against their papers (analytic A800 model + simulator): " + "; ".join(parts)
            + f"; WeiPipe-Interleave bubble at P=4, N=8 {bubble['pipert']:.3f} (paper {bubble['paper']:.3f}, "
            f"pipert's direct variant {bubble['pipert_direct']:.3f}); TawPipe's Table 2 ranking on "
            f"{sum(c['within_goal'] for c in order)} of {len(order)} rows "
            f"({sum(c['within_goal_megatron'] for c in order)} with the blocking 1F1B) "
            + _source("bench_weight_passing.py", "weight_passing", ctx) + ".")


def zbv(rows: list[dict], ctx: dict) -> str:
    n = len(rows)
    at_peak = sum(r["zbv_at_authors_peak_makespan"] <= r["authors_makespan"] + 1e-9
                  and r["zbv_at_authors_peak_peak"] <= r["authors_peak"] + 1e-9 for r in rows)
    faster = sum(r["zbv_makespan"] < r["authors_makespan"] - 1e-9 for r in rows)
    return (f"- ZB-V against the zero-bubble authors' scheduler (simulated; P in "
            f"{{{', '.join(str(p) for p in sorted({r['P'] for r in rows}))}}}, M in {{P, 2P, 4P}}, F:D:W "
            f"{', '.join(sorted({r['F:D:W'] for r in rows}))}): with the authors' peak memory as its limit pipert's "
            f"zb-v is no slower and no larger in {at_peak} of {n} rows; with its default limit it is strictly faster "
            f"in {faster} of {n} " + _source("bench_zbv.py", "zbv", ctx) + ".")


def train_fidelity(rows: list[dict], ctx: dict) -> str:
    errs = sorted(r["rel_error"] for r in rows)
    under = sum(e < 0 for e in errs)
    loads = [r["load_1min"] for r in rows]
    return (f"- Training fidelity (`pipert train --profile`, {rows[0]['processes']} gloo processes, "
            f"{', '.join(dict.fromkeys(r['schedule'] for r in rows))}, links: "
            f"{', '.join(dict.fromkeys(r['link'] for r in rows))}): measured step vs the simulator fed with the job's "
            f"own measurements (computes, messages, the time around them), errors {100 * errs[0]:+.1f} % to {100 * errs[-1]:+.1f} % (median "
            f"{100 * statistics.median(errs):+.1f} %), {sum(abs(e) <= 0.10 for e in errs)} of {len(errs)} within 10 %, "
            f"{under} under-predicted" + _shared_fidelity(rows) + f", load average {min(loads):.0f}-{max(loads):.0f} "
            f"on {rows[0]['cores']} cores " + _source("bench_train_fidelity.py", "train_fidelity", ctx) + ".")


def _shared_fidelity(rows: list[dict]) -> str:
    errs = sorted(r["rel_error_shared"] for r in rows if isinstance(r.get("rel_error_shared"), float))
    if not errs:
        return ""
    return (f"; with the ranks sharing the host's cores in the prediction: {100 * errs[0]:+.1f} % to "
            f"{100 * errs[-1]:+.1f} % (median {100 * statistics.median(errs):+.1f} %), "
            f"{sum(abs(e) <= 0.10 for e in errs)} of {len(errs)} within 10 %")


def emulate_real(rows: list[dict], ctx: dict) -> str:
    import bench_emulate_real
    errs = sorted(bench_emulate_real.judged(r) for r in rows)
    read = ", ".join(dict.fromkeys(r["read"] for r in rows))
    return (f"- Emulation with real units (`pipert emulate --real`, {rows[0]['ranks']} ranks as threads on "
            f"{rows[0]['cores']} cores, {', '.join(dict.fromkeys(r['schedule'] for r in rows))}, links: "
            f"{', '.join(dict.fromkeys(r['link'] for r in rows))}): measured step vs the prediction it says to read "
            f"({read}), errors {100 * errs[0]:+.1f} % to {100 * errs[-1]:+.1f} % (median "
            f"{100 * statistics.median(errs):+.1f} %), {sum(abs(e) <= 0.10 for e in errs)} of {len(errs)} within 10 % "
            + _source("bench_emulate_real.py", "emulate_real", ctx) + ".")


def overlap_cpu(rows: list[dict], ctx: dict) -> str:
    parts = []
    for be in dict.fromkeys(r["streams"] for r in rows):
        mine = [r for r in rows if r["streams"] == be]
        ratios = [r["both_s"] / r["limit_s"] for r in mine]
        parts.append(f"{be} streams median {100 * statistics.median(r['overlap'] for r in mine):.0f} % of the possible "
                     f"saving, both/limit {min(ratios):.2f}-{max(ratios):.2f}")
    return (f"- Overlap of GEMMs with messages on the CPU queues ({len(rows)} cases): " + "; ".join(parts) + " "
            + _source("bench_overlap.py", "overlap_cpu", ctx) + ".")


def gpu_checks(rows: list[dict], ctx: dict) -> str:
    def part(check: str) -> list[dict]:
        return [r for r in rows if r["check"] == check]

    def passed(rs: list[dict]) -> str:
        return f"{sum(bool(r['pass']) for r in rs)} of {len(rs)} within target"

    def us(rs: list[dict]) -> str:
        errs = [abs(r["error"]) * 1e6 for r in rs]
        return f"median errors {min(errs):.1f}-{max(errs):.1f} us"
    out = []
    if part("delay"):
        out.append(f"injected delays {us(part('delay'))} ({passed(part('delay'))})")
    if part("links"):
        out.append(f"the link path between two ranks (send stream -> receive stream) {us(part('links'))} "
                   f"({passed(part('links'))})")
    bw = part("bandwidth")
    if bw:
        per = [r["error"] / bandwidth_messages(r["case"]) * 1e6 for r in bw]
        out.append(f"k back-to-back messages {passed(bw)}, {min(per):.1f}-{max(per):.1f} us of error per message")
    if part("overlap"):
        ratios = ", ".join(f"{1 + r['error']:.3f}" for r in part("overlap"))
        out.append(f"GEMMs overlapped with messages on the dedicated streams at {ratios}x max(compute, comm) "
                   f"({passed(part('overlap'))})")
    tr = part("train")
    if tr:
        schedules = sorted({m.group(1) for r in tr if (m := re.search(r"--schedule (\S+)", r["case"]))})
        out.append(f"`pipert train --check` on the GPU ({len(tr)} runs; schedules {', '.join(schedules)}) "
                   f"{passed(tr)}, largest relative error {max(r['error'] for r in tr):.1e}")
    em = part("emulation")
    if em:
        errs = sorted(r["error"] for r in em)
        ranks = sorted({m.group(1) for r in em if (m := re.search(r"the (\d+) ranks sharing", r["note"]))})
        out.append(f"{'/'.join(ranks) or 'several'} ranks emulated on the one GPU against the prediction with the "
                   f"ranks sharing it: errors "
                   f"{100 * errs[0]:+.1f} % to {100 * errs[-1]:+.1f} % ({sum(bool(r['pass']) for r in em)} of "
                   f"{len(em)} within 10 %)")
    return (f"- GPU checks on one {ctx.get('gpu', 'GPU')}: " + "; ".join(out) + " "
            + _source("gpu_checks.py", "gpu_checks", ctx, "bash benchmarks/gpu_all.sh") + ".")


def _chunked_misses(misses: list[dict]) -> str:
    """Which bound each missed row exceeded, read from its target text ("time <= Rx, peak <= G GiB ...")."""
    if not misses:
        return ""
    from bench_chunked_mlp import bounds
    slow = sum(r["time_ratio"] > (bounds(r["target"])[0] or float("inf")) for r in misses)
    big = sum(r["peak_gib"] > (bounds(r["target"])[1] or float("inf")) for r in misses)
    chunks = sorted({r["chunk"] for r in misses})
    return (f" (misses at chunks of {', '.join(map(str, chunks))}: peak above its bound in {big}, "
            f"time above its bound in {slow})")


def chunked_mlp(rows: list[dict], ctx: dict) -> str:
    parts = []
    for mode in ("a", "b"):
        mine = [r for r in rows if r["variant"].startswith(f"ours ({mode})")]
        if not mine:
            continue
        ratios = [r["time_ratio"] for r in mine]
        base = {r["n"]: r["peak_gib"] for r in rows if r["variant"] == "torch unchunked"}
        mem = [r["peak_gib"] / base[r["n"]] for r in mine]
        misses = [r for r in mine if r["verdict"] != "PASS"]
        why = _chunked_misses(misses)
        parts.append(f"mode ({mode}) {min(ratios):.2f}-{max(ratios):.2f}x the unchunked time at "
                     f"{100 * min(mem):.0f}-{100 * max(mem):.0f} % of its peak memory, "
                     f"{len(mine) - len(misses)} of {len(mine)} rows within target" + why)
    seqs = sorted({r["n"] for r in rows})
    return (f"- Chunked MLP (Triton; {ctx.get('shape', '').split(';')[0]}, sequences {seqs[0]:,}-{seqs[-1]:,}) "
            f"on one {ctx.get('gpu', 'GPU')}: " + "; ".join(parts) + " "
            + _source("bench_chunked_mlp.py", "chunked_mlp", ctx) + ".")


def crosspipe_train(rows: list[dict], ctx: dict) -> str:
    from _crosspipe_train_stats import LOSS_TOL, compare, loss_difference, verdict
    from bench_crosspipe_train import BLIND, ONE_F1B, TOLD

    def ratio(link: str, b: str, control: bool = False) -> str:
        c = compare(rows, link, TOLD, b)
        return (f"{c['ratio']:.3f} (95 % interval {c['lo']:.3f}-{c['hi']:.3f}, {verdict(c, control).split(':')[0]}; "
                f"predicted {c['predicted']:.3f})")
    links = {r["link"] for r in rows}
    parts = [f"under 20 ms latency crosspipe-greedy / 1f1b step ratio {ratio('lat', ONE_F1B)}, told / link-blind "
             f"{ratio('lat', BLIND)}"]
    if "bw" in links:
        parts.append(f"bandwidth-bound (one message per forward) / 1f1b {ratio('bw', ONE_F1B)}, told / link-blind "
                     f"{ratio('bw', BLIND)}")
    parts.append(f"no link (control) / 1f1b {ratio('none', ONE_F1B, control=True)}")
    worst = loss_difference(rows, ONE_F1B)[0]
    loads = [r["load_1min"] for r in rows]
    return (f"- CrossPipe in `pipert train` ({rows[0]['processes']} gloo processes, one stage per datacenter, tiny "
            f"model, M=8, {ctx['rounds']} interleaved rounds, median step time): " + "; ".join(parts)
            + "; losses of every step of every run " + ("identical to 1f1b's without link" if worst == 0 else
            f"equal to 1f1b's within {worst:.0e} (tolerance {LOSS_TOL:.0e})") + f", load average "
            f"{min(loads):.1f}-{max(loads):.1f} on {rows[0]['cores']} cores "
            + _source("bench_crosspipe_train.py", "crosspipe_train", ctx) + ".")


BLOCKS: dict[str, tuple[str, Callable[[list[dict], dict], str]]] = {
    "zbv": ("bench_zbv.py", zbv),
    "sim_speed": ("bench_sim_speed.py", sim_speed),
    "vs_torch": ("bench_vs_torch.py", vs_torch),
    "fidelity": ("bench_fidelity.py", fidelity),
    "delay_cpu": ("bench_delay.py", delay_cpu),
    "crosspipe_sweep": ("bench_crosspipe.py", crosspipe_sweep),
    "weight_passing": ("bench_weight_passing.py", weight_passing),
    "train_fidelity": ("bench_train_fidelity.py", train_fidelity),
    "emulate_real": ("bench_emulate_real.py", emulate_real),
    "overlap_cpu": ("bench_overlap.py", overlap_cpu),
    "gpu_checks": ("gpu_checks.py", gpu_checks),
    "chunked_mlp": ("bench_chunked_mlp.py", chunked_mlp),
    "crosspipe_train": ("bench_crosspipe_train.py", crosspipe_train),
}
"""Block name (= report name) -> (the benchmark script, the block's text from CSV rows and context)."""

EXTRA_CSV: dict[str, dict[str, str]] = {"sim_speed": {"cli": "sim_speed_cli"}}
"""Block name -> keyword -> another CSV of the same report that its text also reads."""


def block(name: str, folder: Path = RESULTS) -> str:
    """The text of block ``name``: its figures, or why they are not cited."""
    script, make = BLOCKS[name]
    ctx = load_context(name, folder)
    if not is_clean(ctx):
        return (f"- `benchmarks/results/{name}.md` is not cited here: it was measured on a tree with uncommitted "
                f"changes (commit {_commit(ctx)}, {ctx.get('date', '?')[:10]}); re-run "
                f"`python benchmarks/{script}` at a clean commit.")
    extra = {k: read_csv(folder / f"{v}.csv") for k, v in EXTRA_CSV.get(name, {}).items()}
    return make(read_csv(folder / f"{name}.csv"), ctx, **extra)


_MARK = re.compile(r"(<!-- figures:(\w+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.S)


def render(text: str, folder: Path = RESULTS) -> str:
    """``text`` with every figures block regenerated; a block name without a generator is an error."""
    found = {m.group(2) for m in _MARK.finditer(text)}
    unknown = found - set(BLOCKS)
    if unknown:
        raise ValueError(f"README figure blocks {sorted(unknown)} have no generator; known: {', '.join(BLOCKS)}")
    return _MARK.sub(lambda m: f"{m.group(1)}{block(m.group(2), folder)}\n{m.group(4)}", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md differs from the reports")
    args = ap.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "README.md",
                                                       "README.md (from the reports)"))
            return 1
        return 0
    README.write_text(new)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
