"""Test-suite settings.

- One intra-op thread per process keeps CPU runs fast and repeatable on small machines
  where several ranks share the cores.
- Under CI (``CI`` set) Hypothesis runs derandomized: the same examples every run, so a
  result does not depend on the seed of the day; locally it explores new examples.
"""
import os

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# --- fixtures shared by several test files ----------------------------------------------
@pytest.fixture(params=["ext", "python"])
def backend(request):
    """CPU stream/link backend: pipert._C (skipped when not built) and pure Python."""
    from pipert import _ext
    if request.param == "ext" and not _ext.HAVE_EXT:
        pytest.skip("pipert._C not built")
    return request.param


@pytest.fixture
def run_gloo_cases(tmp_path):
    """``run(cases, P)``: trains ``cases`` (``pipert.testing.Case``) on P gloo processes and
    returns one result per case."""
    import json

    from pipert.launch import launch
    from pipert.testing import run_cases_dist

    def run(cases, P: int) -> list[dict]:
        out = tmp_path / "results.json"
        launch(run_cases_dist, P, args=(cases, str(out)))
        results = json.loads(out.read_text())
        assert len(results) == len(cases)
        return results
    return run

