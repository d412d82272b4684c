"""Link emulation in real gloo runs: delayed messages do not change what is trained.

Every message between the two datacenters (ranks 0,1 | 2,3) occupies its link and arrives
one latency later; the step must still equal the single-process reference exactly, with the
C++ timer threads of pipert._C and with the pure-Python fallback (``PIPERT_NO_EXT=1``).
"""
import pytest

from pipert.testing import Case

LINKS = (("dcs", 2), ("dc_latency", "3ms"), ("dc_bandwidth", "200Mbps"))
SCHEDULES = (("1f1b", ()), ("zb-h1", ()),
             ("crosspipe-greedy", (("num_dcs", 2), ("dc_latency", 2.0), ("dc_transfer", 1.0))))


@pytest.mark.parametrize("ext", ["ext", "python"])
def test_link_emulation_keeps_gradients_exact_on_gloo(ext, run_gloo_cases, monkeypatch):
    from pipert import _ext
    if ext == "ext" and not _ext.HAVE_EXT:
        pytest.skip("pipert._C not built")
    if ext == "python":
        monkeypatch.setenv("PIPERT_NO_EXT", "1")  # the spawned ranks load the fallback
    cases = [Case(name, 4, 8, "float64", steps=2, options=opts, links=LINKS) for name, opts in SCHEDULES]
    for r in run_gloo_cases(cases, 4):
        assert "error" not in r, r
        label = f"{r['case']['schedule']} ({ext})"
        assert r["loss_err"] <= 1e-10, label
        assert r["grad_err"] <= 1e-10, label
        assert r["param_err"] <= 1e-10, label
        assert r["sent_bytes"]["act"] > 0 and r["sent_bytes"]["grad"] > 0, label
        # 2 steps x 8 micro-batches: act 1->2 and grad 2->1 cross the datacenters
        assert r["delayed"] == {"backend": ext, "messages": 2 * 2 * 8}, label


def test_stream_path_with_estimated_clock_offsets_is_exact_on_gloo(run_gloo_cases):
    """The CPU mirror of the GPU path: frames carry their link timing, the receiver waits for the
    arrival in its own clock (offsets estimated by ping-pong over gloo)."""
    case = Case("1f1b", 2, 4, "float64", steps=2, links=LINKS, link_path="stream")
    (r,) = run_gloo_cases([case], 2)
    assert "error" not in r, r
    assert max(r["loss_err"], r["grad_err"], r["param_err"]) <= 1e-10, r
    assert r["delayed"]["messages"] == 2 * 2 * 4  # act 0->1 and grad 1->0 per micro-batch, 2 steps
