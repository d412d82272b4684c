"""Test-suite settings: one intra-op thread per process keeps CPU runs fast and repeatable
on small machines where several ranks share the cores."""
import torch

torch.set_num_threads(1)
