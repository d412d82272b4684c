"""Every committed benchmark report is what its generator builds from the stored CSV and
context alone (``--from-csv``): no sentence of a report is written by hand."""
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from _common import RESULTS, load_context, read_csv  # noqa: E402

REPORTS = {"sim_speed": "bench_sim_speed", "weight_passing": "bench_weight_passing", "fidelity": "bench_fidelity",
           "delay_cpu": "bench_delay", "delay_cuda": "bench_delay", "vs_torch": "bench_vs_torch",
           "crosspipe_sweep": "bench_crosspipe", "zbv": "bench_zbv", "helixpipe": "bench_helixpipe",
           "overlap_cpu": "bench_overlap", "overlap_cuda": "bench_overlap", "train_fidelity": "bench_train_fidelity",
           "emulate_real": "bench_emulate_real", "crosspipe_train": "bench_crosspipe_train",
           "gpu_checks": "gpu_checks", "chunked_mlp": "bench_chunked_mlp", "chunked_mlp_quick": "bench_chunked_mlp",
           "pipemesh": "bench_pipemesh", "pipemesh_table4": "bench_pipemesh:table4_report",
           "crosspipe_paper": "bench_crosspipe_paper",
           "crosspipe_paper_recompute": "bench_crosspipe_paper:recompute_report"}
"""Report name -> its generator: a module of benchmarks/ with ``report(rows, ctx, rebuilt)``, or
``module:function`` for a module's other report."""


def _body(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("- report rebuilt from the stored CSV")]


@pytest.mark.parametrize("name", sorted(n for n in REPORTS if (RESULTS / f"{n}.md").exists()))
def test_committed_report_equals_its_rebuild_from_the_csv(name):
    module, _, function = REPORTS[name].partition(":")
    make = getattr(importlib.import_module(module), function or "report")
    rebuilt = make(read_csv(RESULTS / f"{name}.csv"), load_context(name), True)
    assert _body(rebuilt) == _body((RESULTS / f"{name}.md").read_text()), \
        f"run: python benchmarks/{module}.py --from-csv"


def test_every_report_in_results_is_covered():
    missing = {p.stem for p in RESULTS.glob("*.md")} - set(REPORTS)
    assert not missing, (f"reports {sorted(missing)} are not checked: give the generator report(rows, ctx, rebuilt) "
                         f"and --from-csv (benchmarks/_common.py: write_results, rebuild) and add it to REPORTS")
