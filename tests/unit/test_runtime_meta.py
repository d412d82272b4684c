"""Runtime pieces of a rank that materialises only its units: the device of the loss
reduction, boundary shapes from meta-device units, the units a rank needs, and the error
for a needed unit left on the meta device."""
import pytest
import torch

from pipert.models import build_units, model_config, partition, LlamaModel
from pipert.exec.boundaries import infer_boundaries
from pipert.exec.buffers import BoundarySpec
from pipert.device.tensors import backend_device_types, reduction_device
from pipert.pipeline import Pipeline, units_needed
from pipert.schedules import build_schedule

CPU, GPU1 = torch.device("cpu"), torch.device("cuda", 1)


@pytest.mark.parametrize("backend, compute, expected", [
    ("gloo", CPU, CPU),
    ("gloo", GPU1, CPU),               # gloo reduces host tensors: the scalar stays off the GPU
    ("nccl", GPU1, GPU1),              # NCCL reduces CUDA tensors only: this rank's GPU
    ("NCCL", GPU1, GPU1),
    ("cpu:gloo,cuda:nccl", GPU1, CPU),
    ("mpi", CPU, CPU),
    ("my-plugin", GPU1, GPU1),         # unknown to torch's table: where the units are
])
def test_reduction_device_follows_the_backend(backend, compute, expected):
    assert reduction_device(backend, compute) == expected


def test_reduction_device_rejects_a_backend_that_cannot_reduce_there():
    assert backend_device_types("nccl") == ["cuda"]
    with pytest.raises(RuntimeError, match="'nccl' reduces tensors on cuda only, but this rank computes on cpu"):
        reduction_device("nccl", CPU)


def _real_specs(units, x):
    out = []
    with torch.no_grad():
        for unit in units[:-1]:
            x = unit(x)
            out.append(BoundarySpec.of(x))
    return out


@pytest.mark.parametrize("num_units, fine, kept", [(4, False, 1), (12, True, 2)])
def test_boundaries_from_meta_units_equal_a_real_pass(num_units, fine, kept):
    x = torch.randint(0, 256, (2, 16))
    real = partition(LlamaModel(model_config("tiny", dtype="float64"), seed=0), num_units, fine=fine)
    expected = _real_specs(real, x)
    assert infer_boundaries(real, x, CPU) == expected
    # a rank that holds only unit `kept`: every other unit is a meta skeleton
    mixed = build_units("tiny", num_units, keep=[kept], fine=fine, dtype="float64")
    assert infer_boundaries(mixed, x, CPU) == expected
    # units on meta put their outputs on this process's device; units without tensors (attention
    # pieces) where their input is
    on_gpu = infer_boundaries(mixed, x, GPU1)
    assert [s.device for s in on_gpu] == [GPU1] * kept + [CPU] + [GPU1] * (num_units - 2 - kept)
    assert [(s.shapes, s.dtype, s.packed) for s in on_gpu] == [(s.shapes, s.dtype, s.packed) for s in expected]


def test_units_needed_are_the_units_a_rank_computes_holds_or_moves_weights_of():
    s = build_schedule("1f1b", stages=4, microbatches=8)
    assert [units_needed(s, r) for r in range(4)] == [{0}, {1}, {2}, {3}]  # RECV act u0 needs no unit 0
    v = build_schedule("zb-v", stages=4, microbatches=8, chunks=2)
    assert [units_needed(v, r) for r in range(4)] == [{0, 7}, {1, 6}, {2, 5}, {3, 4}]
    w = build_schedule("weipipe-naive", stages=4, microbatches=8)
    assert all(units_needed(w, r) == set(range(4)) for r in range(4))  # weights travel to every rank


def test_pipeline_names_a_needed_unit_left_on_meta():
    units = build_units("tiny", 4, keep=[0, 1, 3])
    with pytest.raises(ValueError, match=r"unit 2 is needed on rank 2 \(it computes or holds it\) but is on the "
                                         r"meta device \(layers\.2\."):
        Pipeline(units, "1f1b", microbatches=4)


def test_local_pipeline_trains_units_built_on_meta_like_a_full_build():
    x = torch.randint(0, 256, (8, 16))
    y = torch.randint(0, 256, (8, 16))
    a = Pipeline(build_units("tiny", 4, seed=2), "1f1b", microbatches=4)
    b = Pipeline(partition(LlamaModel(model_config("tiny"), seed=2), 4), "1f1b", microbatches=4)
    assert a.step(x, y) == b.step(x, y)
    pa, pb = a.named_parameters(), b.named_parameters()
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


class _ReadsValues(torch.nn.Module):
    """A module whose forward reads tensor values: it cannot run on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w * (1.0 if float(x.sum()) >= 0 else -1.0)


def test_boundaries_fall_back_to_a_real_pass_only_when_every_unit_is_real():
    units = [_ReadsValues(), _ReadsValues(), _ReadsValues()]
    x = torch.ones(2, 4)
    assert infer_boundaries(units, x, CPU) == [BoundarySpec(((2, 4),), torch.float32, CPU, False)] * 2
    units[2] = units[2].to("meta")
    with pytest.raises(RuntimeError, match="unit 0 cannot run on the meta device"):
        infer_boundaries(units, x, CPU)


@pytest.fixture
def one_rank_gloo(tmp_path):
    """A torch.distributed job of one gloo rank in this process."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_dist_step_reduces_the_loss_on_the_device_the_backend_names(one_rank_gloo, monkeypatch):
    import pipert.pipeline as pipeline
    seen = []
    real = pipeline.reduction_device
    monkeypatch.setattr(pipeline, "reduction_device", lambda b, d: seen.append((b, d)) or real(b, d))
    x, y = torch.randint(0, 256, (4, 8)), torch.randint(0, 256, (4, 8))
    pipe = Pipeline(build_units("tiny", 1), "1f1b", stages=1, microbatches=2, backend="dist")
    assert pipe.step(x, y) > 0
    assert seen == [("gloo", CPU)]
    # under NCCL the scalar must be on this rank's GPU: a rank on the CPU is told so
    monkeypatch.setattr(pipeline.dist, "get_backend", lambda *a: "nccl")
    with pytest.raises(RuntimeError, match="'nccl' reduces tensors on cuda only, but this rank computes on cpu"):
        pipe.step(x, y)
