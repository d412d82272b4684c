"""Saved activations per stage at HelixPipe's switch from forward to backward: what the executor
measures (saved-tensor accounting, ``Instrumentation(measure_memory=True)``) is the documented stash
formula (``pipert.models.memory.helix_stash_bytes`` per unit and micro-batch) plus the received
QKV weights and the posted receive buffers, and it is the same on every stage but stage 0, which
also holds C(0) and C(L) (docs/helixpipe.md, "Stash per stage")."""
import pytest

from pipert.ir import Op, Payload
from pipert.models import model_config, model_from_config, partition
from pipert.models.memory import helix_stash_bytes
from pipert.pipeline import Pipeline
from pipert.exec.instrument import Instrumentation
from pipert.schedules import build_schedule
from pipert.testing import make_batch, sgd

B, S = 2, 8


def _switch_stash(model, P, M, V, F, recompute):
    cfg = model_config(model, dtype="float64", max_seq=16, layers=P * V, vocab=64)
    sched = build_schedule("helixpipe", stages=P, microbatches=M, chunks=V, folds=F)
    units = partition(model_from_config(cfg, seed=0), cut="helix", recompute=recompute)
    weight = sum(p.numel() * p.element_size() for p in units[1].parameters())
    pipe = Pipeline(units, sched, optimizer=sgd, instrument=Instrumentation(measure_memory=True))
    pipe.step(*make_batch(M, vocab=64))
    msg = 2 * B * S * cfg.hidden * 8          # an act/grad message per micro-batch: two [b, s, h] tensors
    stash = []
    for r in range(P):
        acts = pipe.program.actions[r]
        i = next(k for k, a in enumerate(acts) if a.op is Op.B)
        weights = weight * sum(1 for a in acts[:i] if a.op is Op.RECV and a.payload is Payload.WEIGHT)
        read = {(a.unit - 1, m) for a in acts[:i] if a.op is Op.F for m in a.mb}   # activations F has read
        posted = msg * sum(1 for a in acts[:i] if a.op is Op.RECV for m in a.mb
                           if a.payload is Payload.GRAD or a.payload is Payload.ACT and (a.unit, m) not in read)
        measured = pipe.last_results[r].memory[i - 1]
        formula = sum(helix_stash_bytes(cfg, a.unit, B, S, recompute) * len(a.mb) for a in acts[:i] if a.op is Op.F)
        assert measured == formula + weights + posted, (r, measured, formula, weights, posted)
        stash.append(formula)
    return cfg, stash


@pytest.mark.parametrize("model,P,M,V,F,recompute", [
    ("gpt-tiny", 2, 4, 2, 1, "none"), ("gpt-tiny", 4, 8, 1, 2, "no_attention"), ("tiny", 4, 4, 1, 1, "no_attention"),
    ("tiny", 2, 4, 1, 2, "none"),
])
def test_stash_at_the_switch_is_the_formula_and_balanced(model, P, M, V, F, recompute):
    cfg, stash = _switch_stash(model, P, M, V, F, recompute)
    L = P * V
    per_layer = helix_stash_bytes(cfg, 1, B, S, recompute) + helix_stash_bytes(cfg, 2, B, S, recompute)
    # every stage runs A(l) for M/P micro-batches of every layer and L/P C units for all M
    assert stash[1:] == [M * L // P * per_layer] * (P - 1)
    ends = helix_stash_bytes(cfg, 0, B, S, recompute) + helix_stash_bytes(cfg, 2 * L, B, S, recompute)
    assert stash[0] == stash[1] + M * (ends - helix_stash_bytes(cfg, 2, B, S, recompute))
