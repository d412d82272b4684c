"""The HelixPipe report's sentences about the baseline choice, the exposed hops and recomputation
are computed from its rows: changing a row changes the sentence (benchmarks/bench_helixpipe.py,
benchmarks/_helix_paper.py)."""
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

KEY = ("A800", "3B", 131072)


def _by() -> dict:
    from _common import RESULTS, read_csv
    rows = read_csv(RESULTS / "helixpipe.csv")
    return {(r["cluster"], r["model"], r["seq"], r["schedule"]): dict(r) for r in rows}


def test_reason_names_the_baseline_choice_only_when_the_best_is_not_1f1b():
    import bench_helixpipe as hp
    by = _by()
    best = hp.best_baseline(by, KEY)
    text = hp.paper_reason(by, KEY, 9.0)
    assert ("against 1F1B HelixPipe gains" in text) == (best != "1F1B")
    # every other baseline slower than 1F1B: 1F1B is the best and the clause goes
    for b in hp.BASELINES[1:]:
        by[KEY + (b,)]["tokens_per_s"] = 0.5 * by[KEY + ("1F1B",)]["tokens_per_s"]
    assert hp.best_baseline(by, KEY) == "1F1B"
    assert "against 1F1B" not in hp.paper_reason(by, KEY, 9.0)
    assert hp.paper_terms(by, KEY)["baseline"] == pytest.approx(0.0, abs=1e-9)


def test_baseline_term_is_the_speedup_gained_against_1f1b():
    import bench_helixpipe as hp
    by = _by()
    h, one = by[KEY + ("HelixPipe",)]["tokens_per_s"], by[KEY + ("1F1B",)]["tokens_per_s"]
    assert hp.paper_terms(by, KEY)["baseline"] == pytest.approx(
        100 * (h / one - 1) - 100 * hp._speedup(by, KEY, "HelixPipe"), rel=1e-12)


def test_hops_sentence_reads_fill_and_drain_from_the_rows():
    import bench_helixpipe as hp
    by = _by()
    seq = KEY[2]
    for model in hp.MODELS:       # links free of cost: no hop exposed, attention hides every hop
        by[("A800", model, seq, "HelixPipe free links")]["seconds"] = by[("A800", model, seq, "HelixPipe")]["seconds"]
        by[("A800", model, seq, "HelixPipe")]["unit1_f_s"] = 10 * by[("A800", model, seq, "HelixPipe")]["hop_s"]
    line = next(x for x in hp.hops_discussion(by, seq) if x.startswith("- A800"))
    assert "links cost HelixPipe 0, 0, 0 hop times" in line and "no more than the pipeline's fill and drain" in line
    for model in hp.MODELS:       # 10 x the fill and drain exposed
        r = by[("A800", model, seq, "HelixPipe")]
        r["seconds"] += 10 * r["fill_hops"] * r["hop_s"]
    line = next(x for x in hp.hops_discussion(by, seq) if x.startswith("- A800"))
    assert "hops are exposed in steady state too" in line


def test_recompute_sentence_uses_the_96k_row():
    from _helix_paper import recompute_discussion
    rows = [{"cluster": c, "seq": q, "throughput_loss": loss} for c in ("H20", "A800")
            for q, loss in ((32768, 0.18), (65536, 0.15), (98304, 0.11))]
    # pre+post forward 1 + 1, backward 2 + 2, attention 2 + 4: rerun share 2 / 12
    times = dict(pre_f_s=1.0, post_f_s=1.0, pre_b_s=2.0, post_b_s=2.0, attn_f_s=2.0, attn_b_s=4.0)
    parts = [{"seq": 98304, "rerun_share": 0.09, **times}, {"seq": 131072, "rerun_share": 0.08, **times}]
    text = "\n".join(recompute_discussion(rows, parts))
    assert "at most 18% at 32k/64k" in text and "at 96k on the A800 it still costs 11%" in text
    assert "9% of a layer's forward and backward at 96k" in text and "8% at 128k" in text
    # 2 / (6 + 6k) = 0.02  <=>  k = (100 - 6) / 6
    assert f"attention would have to run {(100 - 6) / 6:.1f}x slower per FLOP" in text
    assert "still costs" not in "\n".join(recompute_discussion([r for r in rows if r["seq"] != 98304], parts))
