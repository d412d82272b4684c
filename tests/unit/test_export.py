"""Exporters: Chrome trace JSON, PNG Gantt chart, text grid."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipert.cost import LinkSpec, Links, Topology, UniformCost
from pipert.sim import chrome_trace, gantt_png, simulate, text_grid, write_chrome_trace
from unit_testutil import one_f_one_b


@pytest.fixture(scope="module")
def result():
    links = Links(Topology(3, ranks_per_node=1), {"inter_node": LinkSpec(latency=0.25, bandwidth=4.0)})
    return simulate(one_f_one_b(3, 4), UniformCost(tf=1, tb=2), links)


def test_chrome_trace_has_one_x_event_per_action(result, tmp_path: Path) -> None:
    path = write_chrome_trace(result, tmp_path / "trace.json", us_per_unit=1000.0)
    trace = json.loads(path.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == result.schedule.num_actions()
    by_key = {(e["pid"], e["name"]): e for e in xs}
    assert len(by_key) == len(xs)
    for r, q, a, s, e in result.events:
        ev = by_key[(r, str(a))]
        assert ev["tid"] == ("compute", "send", "recv").index(q)
        assert ev["ts"] == pytest.approx(s * 1000.0) and ev["dur"] == pytest.approx((e - s) * 1000.0)
    assert by_key[(0, "F u0 m0")]["dur"] == pytest.approx(1000.0)
    assert by_key[(1, "B u1 m0")]["dur"] == pytest.approx(2000.0)
    # a message of 1 unit at 4 units/time: occupancy 0.25, then latency 0.25
    assert by_key[(1, "RECV act u0 m0 <-0")]["dur"] == pytest.approx(500.0)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names[(2, 1)] == "send"
    assert chrome_trace(result)["otherData"]["makespan"] == result.makespan


def test_gantt_png_is_written_and_drawn(result, tmp_path: Path) -> None:
    import matplotlib.image as mpimg
    import numpy as np

    path = gantt_png(result, tmp_path / "gantt.png")
    assert path.stat().st_size > 10_000
    img = mpimg.imread(path)
    colors = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colors) > 20  # bars, legend, text: not a blank canvas
    # the F colour (#4C72B0) is present
    assert np.any(np.all(np.abs(img[..., :3] * 255 - [0x4C, 0x72, 0xB0]) < 3, axis=-1))


def test_text_grid_is_time_aligned(result) -> None:
    grid = text_grid(result, step=1.0, width=9)
    lines = grid.splitlines()
    assert lines[0].split("|")[1].split() == ["rank", "0", "rank", "1", "rank", "2"]
    assert len(lines) == 1 + int(result.makespan / 1.0 + 0.999)
    first = lines[1].split("|")[1]
    assert first.split()[:3] == ["F", "u0", "m0"] and first.count(".") == 2
    # rank 2's first forward starts at 3: two forwards plus two messages of 0.5 each
    cells = [lines[k + 1].split("|")[1][20:].strip() for k in range(4)]
    assert cells[:3] == [".", ".", "."] and cells[3] == "F u2 m0"
    assert "more rows" in text_grid(result, step=0.25, max_rows=5)
