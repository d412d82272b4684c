"""Kernel tests run on CUDA when present, else on CPU through Triton's interpreter.

TRITON_INTERPRET is set here, at conftest import, before any test module of
this folder imports pipert.kernels (the kernels also decorate lazily, at first
launch, so an earlier import elsewhere does not defeat it).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    # The interpreter evaluates exp() with numpy, which warns on overflow where
    # a GPU silently returns inf (sigmoid of a large negative input is then 0).
    config.addinivalue_line("filterwarnings", "ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
