"""Test-suite settings.

- One intra-op thread per process keeps CPU runs fast and repeatable on small machines
  where several ranks share the cores.
- Under CI (``CI`` set) Hypothesis runs derandomized: the same examples every run, so a
  result does not depend on the seed of the day; locally it explores new examples.
"""
import os

import torch
from hypothesis import settings

torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
