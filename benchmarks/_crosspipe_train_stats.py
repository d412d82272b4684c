"""The figures and sentences of bench_crosspipe_train's report, from its per-step CSV rows alone.

A row is one step of one run: ``round``, ``schedule``, ``link``, ``kept`` (False: a warm-up step),
``step_s`` (measured), ``predicted_step_s``, ``compute_s`` (the computes of all ranks), ``loss``,
``program`` (digest of the program the run ran). A run is the rows of one (round, schedule, link).
"""
from __future__ import annotations

import random
import statistics

__all__ = ["LOSS_TOL", "BOOTSTRAP", "kept_by_round", "ratio_of_medians", "median_table", "compare", "verdict",
           "comparison", "loss_difference", "loss_check"]

LOSS_TOL = 1e-5
"""Largest relative difference between two runs' losses at one step that counts as the same
training in float32 (the schedules sum the micro-batches' gradients in different orders)."""
BOOTSTRAP = 2000
"""Resamples of the bootstrap interval (seeded: the report is a function of the CSV)."""


def kept_by_round(rows: list[dict], schedule: str, link: str, key: str = "step_s") -> list[list[float]]:
    """``key`` of the kept steps of each run of (schedule, link), one list per round in round order."""
    runs: dict[int, list[float]] = {}
    for r in rows:
        if r["schedule"] == schedule and r["link"] == link and r["kept"]:
            runs.setdefault(r["round"], []).append(r[key])
    return [runs[k] for k in sorted(runs)]


def _pooled(runs: list[list[float]]) -> list[float]:
    return [x for run in runs for x in run]


def _resample(runs: list[list[float]], rng: random.Random) -> float:
    """The median of a pool in which every run's steps are drawn with replacement from that run."""
    return statistics.median(x for run in runs for x in rng.choices(run, k=len(run)))


def _interval(draws: list[float]) -> tuple[float, float]:
    draws = sorted(draws)
    return draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]


def median_interval(runs: list[list[float]], seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of the pooled median (each run resampled within itself)."""
    rng = random.Random(seed)
    return _interval([_resample(runs, rng) for _ in range(BOOTSTRAP)])


def ratio_of_medians(a: list[list[float]], b: list[list[float]], seed: int = 0) -> dict[str, float]:
    """median(a) / median(b) over the pooled kept steps, its 95 % bootstrap interval, and the
    smallest and largest ratio of one round's medians (rounds paired by position)."""
    rng = random.Random(seed)
    draws = [_resample(a, rng) / _resample(b, rng) for _ in range(BOOTSTRAP)]
    lo, hi = _interval(draws)
    per_round = [statistics.median(x) / statistics.median(y) for x, y in zip(a, b)]
    return {"ratio": statistics.median(_pooled(a)) / statistics.median(_pooled(b)), "lo": lo, "hi": hi,
            "round_min": min(per_round), "round_max": max(per_round)}


def _runs(rows: list[dict]) -> list[tuple[str, str]]:
    """(schedule, link) in the order the CSV first names them."""
    return list(dict.fromkeys((r["schedule"], r["link"]) for r in rows))


def _programs(rows: list[dict], schedule: str, link: str) -> set[str]:
    return {r["program"] for r in rows if r["schedule"] == schedule and r["link"] == link}


def median_table(rows: list[dict]) -> list[str]:
    """One markdown row per (schedule, link): medians, interval, per-round range, prediction."""
    out = ["| link | schedule | programs run | median step s | 95 % interval | per-round medians | "
           "predicted s | predicted / measured | compute of all ranks s |", "|---|---|---|---|---|---|---|---|---|"]
    for schedule, link in _runs(rows):
        runs = kept_by_round(rows, schedule, link)
        med = statistics.median(_pooled(runs))
        lo, hi = median_interval(runs)
        per = [statistics.median(run) for run in runs]
        pred = statistics.median(_pooled(kept_by_round(rows, schedule, link, "predicted_step_s")))
        compute = statistics.median(_pooled(kept_by_round(rows, schedule, link, "compute_s")))
        progs = ", ".join(sorted(_programs(rows, schedule, link)))
        out.append(f"| {link} | {schedule} | {progs} | {med:.4f} | {lo:.4f}-{hi:.4f} | {min(per):.4f}-{max(per):.4f} | "
                   f"{pred:.4f} | {pred / med:.3f} | {compute:.4f} |")
    return out


def compare(rows: list[dict], link: str, a: str, b: str) -> dict:
    """``a`` against ``b`` under ``link``: :func:`ratio_of_medians` of the measured steps, the
    ratio of the predicted and of the computes of all ranks (medians), and whether any run of
    the two ran the same program (``same_program``)."""
    c = ratio_of_medians(kept_by_round(rows, a, link), kept_by_round(rows, b, link))
    for key, name in (("predicted_step_s", "predicted"), ("compute_s", "compute")):
        pa, pb = (statistics.median(_pooled(kept_by_round(rows, s, link, key))) for s in (a, b))
        c[name] = pa / pb
    c["same_program"] = bool(_programs(rows, a, link) & _programs(rows, b, link))
    return c


def verdict(c: dict[str, float], control: bool = False) -> str:
    """What the interval of a ratio says; ``control``: only whether ``a`` is slower beyond noise."""
    if control:
        return ("slower beyond noise: the whole interval lies above 1" if c["lo"] > 1 else
                "not slower beyond noise: the interval reaches 1 or lies below it")
    if c["hi"] < 1:
        return "faster: the interval lies below 1"
    if c["lo"] > 1:
        return "slower: the interval lies above 1"
    return "not resolved: the interval contains 1"


def comparison(rows: list[dict], link: str, a: str, b: str, link_text: str, control: bool = False) -> str:
    """One sentence: ``a`` against ``b`` under ``link`` (:func:`compare`)."""
    c = compare(rows, link, a, b)
    return (f"- {a} vs {b}, {link_text}: measured step ratio {c['ratio']:.3f} (95 % interval {c['lo']:.3f}-"
            f"{c['hi']:.3f}; per round {c['round_min']:.3f}-{c['round_max']:.3f}), {verdict(c, control)}; "
            f"predicted ratio {c['predicted']:.3f}; compute of all ranks ratio {c['compute']:.3f}; "
            + ("they ran the same program in some run" if c["same_program"] else "they ran different programs") + ".")


def loss_difference(rows: list[dict], reference: str) -> tuple[float, str]:
    """The largest relative difference between a step's loss and that of ``reference`` without
    link at the same step of the same round, and where it is ("" when 0); KeyError where the
    reference run lacks that step."""
    ref = {(r["round"], r["step"]): r["loss"] for r in rows if r["schedule"] == reference and r["link"] == "none"}
    worst, where = 0.0, ""
    for r in rows:
        base = ref[r["round"], r["step"]]
        d = abs(r["loss"] - base) / abs(base)
        if d > worst:
            worst, where = d, f"{r['schedule']}, link {r['link']}, round {r['round']}, step {r['step']}"
    return worst, where


def loss_check(rows: list[dict], reference: str) -> str:
    """Whether every run's loss sequence equals that of ``reference`` without link in its round."""
    try:
        worst, where = loss_difference(rows, reference)
    except KeyError as e:
        return f"Losses not compared: no {reference} run without link at (round, step) {e.args[0]}."
    runs = len({(r["round"], r["schedule"], r["link"]) for r in rows})
    verdict = "the same training" if worst <= LOSS_TOL else "NOT the same training"
    return (f"Losses, every step of all {runs} runs against {reference} without link in the same round: largest "
            f"relative difference {worst:.1e}" + (f" ({where})" if where else "") + f"; within {LOSS_TOL:.0e}: "
            f"{verdict}.")
