"""How `pipert train` decides where its ranks run: backend names, a torchrun environment that
does not fit the config, NCCL without enough GPUs - each refused before any work, naming what
is wrong."""
import subprocess
import sys

import pytest
import torch

import pipert.train as train
from pipert.train import TrainConfig, process_group_backend, resolve_backend, run_train

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def no_build(monkeypatch):
    """Building the program is the first work after the checks: reaching it fails the test."""
    def refuse(cfg):
        raise AssertionError("the program was built before the launch checks")
    monkeypatch.setattr(train, "build_program", refuse)


def _cpu_only(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_backend_names(monkeypatch):
    _cpu_only(monkeypatch)
    assert resolve_backend("auto") == "gloo" and resolve_backend("auto", launched=True) == "gloo"
    assert resolve_backend("nccl", launched=True) == "nccl"
    with pytest.raises(ValueError, match="--backend local runs every rank as a thread of one process"):
        resolve_backend("local", launched=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_backend("auto") == "local" and resolve_backend("auto", launched=True) == "nccl"
    assert [process_group_backend(b) for b in ("gloo", "nccl")] == ["gloo", "nccl"]


def test_a_torchrun_job_of_another_size_is_refused(monkeypatch, no_build):
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError) as err:
        run_train(TrainConfig(stages=4, backend="gloo"))
    assert "torchrun started 3 processes (WORLD_SIZE), but --stages 4 x --dp 1 needs 4" in str(err.value)


def test_a_partial_torchrun_environment_is_refused(monkeypatch, no_build):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for k in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="but not MASTER_ADDR, MASTER_PORT; start it with torchrun"):
        run_train(TrainConfig(backend="gloo"))


def test_nccl_names_the_gpus_found_before_any_work(monkeypatch, no_build):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError) as err:
        run_train(TrainConfig(stages=4, backend="nccl"))
    assert "backend nccl: 4 ranks need one GPU each, but this machine has 1 GPU(s): cuda:0 NVIDIA H100" \
        in str(err.value)
    for k, v in {**TORCHRUN, "WORLD_SIZE": "4", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="local rank 3 uses cuda:3, but this machine has 1 GPU"):
        run_train(TrainConfig(stages=4, backend="nccl"))


@pytest.mark.skipif(torch.cuda.device_count() >= 4, reason="this machine has a GPU for each of the 4 ranks")
def test_train_nccl_without_the_gpus_fails_at_once():
    out = subprocess.run([sys.executable, "-m", "pipert.cli", "train", "--backend", "nccl"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    n = torch.cuda.device_count()
    assert f"pipert train: error: backend nccl: 4 ranks need one GPU each, but this machine has {n} GPU(s)" \
        in out.stderr, out.stderr
