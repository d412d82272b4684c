"""bf16 training keeps fp32 master weights on the owner (activation and weight passing)."""
import copy

import pytest
import torch

from pipert.exec.optim import MasterWeightOptimizer
from pipert.pipeline import Pipeline
from pipert.tools.reference import reference_step
from pipert.schedules import build_schedule
from pipert.testing import make_batch, tiny_units


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


@pytest.mark.parametrize("name", ["1f1b", "weipipe-interleave"])
def test_bf16_owner_steps_fp32_masters_that_track_an_fp32_reference(name):
    units = tiny_units(2, "bfloat16")
    ref = [copy.deepcopy(u).float() for u in units]
    pipe = Pipeline(units, build_schedule(name, stages=2, microbatches=4), optimizer=sgd)
    ref_opt = sgd([p for u in ref for p in u.parameters()])
    for step in range(3):
        x, y = make_batch(4, seed=step)
        pipe.step(x, y)
        out = reference_step(ref, x, y, 4, optimizer=ref_opt)
    owners = [(u, o) for per_rank in pipe.optimizers.values() for u, o in per_rank.items()]
    assert owners and all(isinstance(o, MasterWeightOptimizer) for _, o in owners)
    for u, opt in owners:
        names = [f"unit{u}.{n}" for n, _ in opt_named(pipe, u)]
        for n, p, m in zip(names, opt.params, opt.masters):
            assert m.dtype == torch.float32 and p.dtype == torch.bfloat16
            want = out.params_after[n]
            # masters follow the fp32 reference up to bf16 gradient rounding...
            assert (m - want).abs().max() <= 5e-3 * want.abs().max(), n
            # ...and the working weights are the masters rounded to bf16
            assert torch.equal(p.detach(), m.detach().to(torch.bfloat16)), n


def opt_named(pipe, u):
    for mods in pipe.modules.values():
        if u in mods:
            return list(mods[u].named_parameters())
    raise KeyError(u)


def test_master_weights_keep_updates_smaller_than_a_bf16_ulp():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = MasterWeightOptimizer([w], lambda ps: torch.optim.SGD(ps, lr=1.0))
    for _ in range(8):
        w.grad = torch.full_like(w, 1e-3)  # 1e-3 < half a bf16 ulp at 1.0 (3.9e-3)
        opt.step()
    assert torch.allclose(opt.masters[0], torch.full((4,), 1 - 8e-3), atol=1e-6)
    assert w.dtype == torch.bfloat16 and (w.detach().float() < 1.0).all()  # plain bf16 SGD would stay at 1.0
