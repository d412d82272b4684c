"""bench_crosspipe_train's sentences follow its CSV: synthetic per-step rows, no processes."""
import random
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import bench_crosspipe_train as bench  # noqa: E402
from _crosspipe_train_stats import LOSS_TOL, comparison, kept_by_round, loss_check, ratio_of_medians  # noqa: E402

STEPS = 8


def _rows(times: dict[tuple[str, str], float], noise: float = 0.01, loss_shift: dict | None = None,
          rounds: int = 3) -> list[dict]:
    """Steps around ``times[(schedule, link)]`` seconds (uniform noise of relative size ``noise``);
    losses equal across runs except for ``loss_shift[(schedule, link)]`` added to them."""
    rng = random.Random(1)
    rows = []
    for rnd in range(rounds):
        for (schedule, link), t in times.items():
            for step in range(STEPS):
                rows.append({"round": rnd, "schedule": schedule, "link": link, "step": step, "kept": step > 0,
                             "step_s": t * (1 + noise * (2 * rng.random() - 1)) * (3 if step == 0 else 1),
                             "predicted_step_s": t, "compute_s": t, "loss": 5.0 - 0.1 * step + (loss_shift or {}).get((schedule, link), 0),
                             "program": f"{schedule}-{link}", "load_1min": 2.0, "processes": 2, "cores": 2,
                             "dc_bandwidth_Bps": 1e6 if link == "bw" else ""})
    return rows


def _ctx() -> dict:
    return {"commit": "0123456789abcdef", "date": "2026-11-28T00:00:00", "rounds": 3, "steps": STEPS, "warmup": 1,
            "seed": 0, "boundary message bytes": 32768}


def test_a_clearly_faster_crosspipe_is_said_faster_with_the_interval_below_one():
    rows = _rows({("1f1b", "lat"): 0.40, ("crosspipe-greedy", "lat"): 0.30})
    text = comparison(rows, "lat", "crosspipe-greedy", "1f1b", "the link")
    assert "ratio 0.750" in text and "faster: the interval lies below 1" in text
    assert "they ran different programs" in text


def test_equal_step_times_are_not_resolved_and_a_control_is_not_slower():
    rows = _rows({("1f1b", "none"): 0.30, ("crosspipe-greedy", "none"): 0.30}, noise=0.05)
    c = ratio_of_medians(*(kept_by_round(rows, s, "none") for s in ("crosspipe-greedy", "1f1b")))
    assert c["lo"] < 1 < c["hi"] and c["round_min"] <= c["ratio"] * 1.05
    assert "not resolved: the interval contains 1" in comparison(rows, "none", "crosspipe-greedy", "1f1b", "x")
    assert "not slower beyond noise" in comparison(rows, "none", "crosspipe-greedy", "1f1b", "x", control=True)


def test_a_control_slower_beyond_noise_is_reported_so():
    rows = _rows({("1f1b", "none"): 0.30, ("crosspipe-greedy", "none"): 0.36})
    assert "slower beyond noise" in comparison(rows, "none", "crosspipe-greedy", "1f1b", "x", control=True)


def test_losses_that_differ_beyond_float32_rounding_are_flagged():
    times = {("1f1b", "none"): 0.3, ("crosspipe-greedy", "lat"): 0.3}
    assert "within 1e-05: the same training" in loss_check(_rows(times), "1f1b")
    bad = loss_check(_rows(times, loss_shift={("crosspipe-greedy", "lat"): 100 * LOSS_TOL}), "1f1b")
    assert "NOT the same training" in bad and "crosspipe-greedy, link lat" in bad


def test_the_report_has_every_comparison_it_measured():
    times = {(s, link): 0.3 for link in ("none", "lat", "bw") for s in ("1f1b", "crosspipe-greedy")}
    times.update({("crosspipe-greedy link-blind", link): 0.35 for link in ("lat", "bw")})
    text = bench.report(_rows(times), _ctx())
    assert text.count("- crosspipe-greedy vs 1f1b") == 3 and text.count("vs crosspipe-greedy link-blind") == 2
    assert "bandwidth 1.00 MB/s" in text and "the same training" in text
