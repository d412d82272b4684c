"""Files that ``pipert export --format torch-csv --comms`` writes run in torch's own runtime
(``_PipelineScheduleRuntime._load_csv(path, format="compute_comms")``, ``PipelineStage``s on two
gloo processes) and give the loss and gradients of pipert's execution of the same file
(``Pipeline``, local backend; itself checked against the single-process reference), float64, to
1e-10: 1F1B, interleaved 1F1B (receives kept a compute early where torch runs them, moved to
their consumers elsewhere; and with every receive at its consumer, ``--receives consumer``) and
ZB-V (I/W split, two stages of one rank passing locally). The same
1F1B file without its REDUCE_GRAD actions gives M times pipert's gradients: REDUCE_GRAD is where
torch's runtime scales a stage's gradients by 1/M."""
from __future__ import annotations

import csv
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipert.cli import main
from pipert.ir.files import load_schedule
from pipert.launch import launch
from pipert.pipeline import Pipeline
from pipert.tools.reference import reference_step
from pipert.tools.reference import rel_err
from pipert.testing import sgd

P, M, WIDTH = 2, 4, 6
SCHEDULES = {"1f1b": 2, "interleaved-1f1b": 4, "zb-v": 4}   # name -> units (stages of torch's runtime)


class _Unit(nn.Module):
    """One pipeline unit: ``core`` is what torch's PipelineStage runs; the last unit also takes
    the targets and returns the loss (pipert's unit contract), which torch computes with ``loss_fn``."""

    def __init__(self) -> None:
        super().__init__()
        self.core = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        y = self.core(x)
        return y if targets is None else F.mse_loss(y, targets)


def _units(count: int) -> list[_Unit]:
    torch.manual_seed(0)
    return [_Unit().double() for _ in range(count)]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(3 * M, WIDTH, dtype=torch.float64, generator=g),
            torch.randn(3 * M, WIDTH, dtype=torch.float64, generator=g))


def _stages_of(path: str, rank: int) -> list[int]:
    from pipert.ir.torch_format import parse_torch_action
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return sorted({parse_torch_action(a)[0] for a in rows[rank] if a})


def _torch_step(rank: int, world: int, files: dict[str, tuple[str, int]], out: str) -> None:
    """On each rank: every file's step in torch's runtime; this rank's losses and gradients saved."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    torch.set_num_threads(1)
    x, y = _batch()
    for name, (path, units_count) in files.items():
        units = _units(units_count)
        mine = _stages_of(path, rank)
        stages = [PipelineStage(units[s].core, s, units_count, torch.device("cpu")) for s in mine]
        runtime = _PipelineScheduleRuntime(stages, M, loss_fn=F.mse_loss)
        runtime._load_csv(path, format="compute_comms")
        losses: list[torch.Tensor] = []
        runtime.step(*((x,) if 0 in mine else ()), target=y if units_count - 1 in mine else None, losses=losses)
        grads = {f"unit{s}.core.{n}": p.grad.detach().clone() for s in mine
                 for n, p in units[s].core.named_parameters()}
        torch.save({"grads": grads, "losses": [float(v) for v in losses]}, f"{out}/{name}.{rank}.pt")


def _export(name: str, path: Path, *flags: str) -> None:
    assert main(["export", name, "-P", str(P), "-M", str(M), "--format", "torch-csv", "--comms",
                 "-o", str(path), *flags]) == 0


def _without_reduce_grad(src: Path, dst: Path) -> None:
    with open(src, newline="") as f:
        rows = list(csv.reader(f))
    kept = [[a for a in row if not a.endswith("REDUCE_GRAD")] for row in rows]
    assert [len(row) - len(k) for row, k in zip(rows, kept)] == [1] * P   # one stage per rank
    with open(dst, "w", newline="") as f:
        csv.writer(f).writerows(kept)


def test_exported_files_run_in_torch_runtime_with_pipert_gradients(tmp_path):
    files = {}
    for name, units_count in SCHEDULES.items():
        path = tmp_path / f"{name}.csv"
        _export(name, path)
        files[name] = (str(path), units_count)
    _export("interleaved-1f1b", tmp_path / "at-consumer.csv", "--receives", "consumer")
    assert (tmp_path / "at-consumer.csv").read_text() != (tmp_path / "interleaved-1f1b.csv").read_text()
    files["at-consumer"] = (str(tmp_path / "at-consumer.csv"), SCHEDULES["interleaved-1f1b"])
    _without_reduce_grad(tmp_path / "1f1b.csv", tmp_path / "1f1b-unscaled.csv")
    files["1f1b-unscaled"] = (str(tmp_path / "1f1b-unscaled.csv"), SCHEDULES["1f1b"])
    launch(_torch_step, P, args=(files, str(tmp_path)), backend="gloo", timeout=60.0)

    x, y = _batch()
    for name, (path, units_count) in files.items():
        parts = [torch.load(f"{tmp_path}/{name}.{r}.pt") for r in range(P)]
        theirs = {k: v for part in parts for k, v in part["grads"].items()}
        losses = [v for part in parts for v in part["losses"]]
        pipe = Pipeline(_units(units_count), load_schedule(path), optimizer=sgd, backend="local")
        loss = pipe.step(x, y)
        ours = pipe.named_grads()
        ref = reference_step(_units(units_count), x, y, M, sgd)
        assert set(theirs) == set(ours) == set(ref.grads), name
        assert rel_err(ours, ref.grads) <= 1e-10 and abs(loss - ref.loss) <= 1e-12, name
        assert len(losses) == M and abs(sum(losses) / M - loss) <= 1e-12, (name, losses, loss)
        if name.endswith("-unscaled"):
            assert rel_err(theirs, {k: M * g for k, g in ours.items()}) <= 1e-10, name
            assert rel_err(theirs, ours) > 0.5, name
        else:
            assert rel_err(theirs, ours) <= 1e-10, name
