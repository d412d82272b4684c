"""README's figure blocks agree with the benchmark reports' data (benchmarks/readme_figures.py)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import readme_figures  # noqa: E402
from _common import DIRTY, is_clean, report_header  # noqa: E402


def test_readme_agrees_with_the_reports():
    text = readme_figures.README.read_text()
    assert readme_figures.render(text) == text, "run: python benchmarks/readme_figures.py"
    assert all(f"<!-- figures:{name} -->" in text for name in readme_figures.BLOCKS)


@pytest.fixture
def results(tmp_path):
    for f in (BENCH / "results").iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _set_commit(folder: Path, name: str, commit: str) -> None:
    path = folder / f"{name}.context.json"
    ctx = json.loads(path.read_text())
    ctx["commit"] = commit
    path.write_text(json.dumps(ctx))


@pytest.mark.parametrize("name", sorted(readme_figures.BLOCKS))
def test_a_clean_report_is_cited_with_its_figures_and_a_dirty_one_is_not(results, name):
    _set_commit(results, name, "0123456789abcdef")
    clean = readme_figures.block(name, results)
    assert "not cited" not in clean and "commit 0123456789" in clean
    assert any(ch.isdigit() for ch in clean.split("(`python")[0])  # figures, not only words
    _set_commit(results, name, f"0123456789abcdef {DIRTY}")
    dirty = readme_figures.block(name, results)
    assert "is not cited here" in dirty and f"benchmarks/{readme_figures.BLOCKS[name][0]}" in dirty


def test_the_sim_speed_block_reads_the_largest_row(results):
    _set_commit(results, "sim_speed", "feedface00")
    (results / "sim_speed.csv").write_text(
        "P,M,actions,wall_s,cpu_s,us_per_action,makespan,expected_makespan,source\n"
        "4,8,164,0.001,0.001,2.0,33.0,33.0,registry\n64,512,194624,0.5,0.25,2.5,1725.0,1725.0,registry\n")
    assert "P=64, M=512 (194,624 actions) simulated in 0.50 s wall, 0.25 s CPU" in \
        readme_figures.block("sim_speed", results)


@pytest.mark.parametrize("e2e,cached,verdict", [(1.47, 1.33, "missed"), (1.2, 0.95, "met"), (0.9, None, "met")])
def test_the_sim_speed_block_gives_the_commands_time_and_its_verdict(results, e2e, cached, verdict):
    _set_commit(results, "sim_speed", "feedface00")
    cmd = "-m pipert.cli simulate 1f1b -P 64 -M 512 --json"
    rows = [f"end_to_end,{cmd},{e2e},{e2e}"] + ([f"end_to_end_bytecode,{cmd},{cached},{cached}"] if cached else [])
    (results / "sim_speed_cli.csv").write_text("what,command,wall_s,cpu_s\n" + "\n".join(rows) + "\n")
    text = readme_figures.block("sim_speed", results)
    assert f"`pipert simulate 1f1b -P 64 -M 512 --json` end to end {e2e:.2f} s CPU" in text
    assert ("with bytecode cached" in text) == (cached is not None)
    assert cached is None or f"({cached:.2f} s with bytecode cached)" in text
    assert f"target < 1 s {verdict}" in text


def test_unknown_blocks_are_refused():
    with pytest.raises(ValueError, match=r"\['nope'\] have no generator"):
        readme_figures.render("<!-- figures:nope -->\nx\n<!-- /figures:nope -->\n")


def test_a_report_from_a_dirty_tree_says_so_at_the_top():
    dirty = {"date": "d", "commit": f"abc {DIRTY}"}
    assert not is_clean(dirty) and not is_clean({"commit": "unknown"}) and is_clean({"commit": "abc"})
    assert report_header("T", dirty)[2].startswith("> **WARNING: measured on a tree with uncommitted changes")
    assert not any("WARNING" in line for line in report_header("T", {"date": "d", "commit": "abc"}))
