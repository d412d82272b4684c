"""Checkpoints (pipert.checkpoint) on the local backend: a resumed run equals an uninterrupted
one, whatever schedule reads the checkpoint; bad folders and other models are refused."""
import json

import pytest
import torch

from pipert import Pipeline, checkpoint
from pipert.checkpoint import CheckpointError
from pipert.data import ByteCorpus
from pipert.models import build_units
from pipert.train import TrainConfig, run_train

SEQ, BATCH, M = 16, 8, 4


def _opt(ps):
    return torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.0)


def _pipe(schedule: str, dtype: str = "float64", seed: int = 0, units: int = 2, **kw) -> Pipeline:
    made = build_units("tiny", units, seed=seed, dtype=dtype, max_seq=SEQ)
    return Pipeline(made, schedule, stages=2, microbatches=M, optimizer=_opt, **kw)


def _batches(steps):
    corpus = ByteCorpus(SEQ, seed=0)
    return [corpus.batch(k, BATCH) for k in steps]


@pytest.mark.parametrize("first, later, units", [
    ("1f1b", "1f1b", 2), ("1f1b", "zb-h1", 2), ("1f1b", "gpipe", 2),
    ("1f1b", "weipipe-interleave", 2),      # weights travel between the ranks
    ("interleaved-1f1b", "zb-v", 4),        # units 2 and 3 change owner (0, 1, 0, 1) -> (0, 1, 1, 0)
])
def test_resume_with_any_schedule_over_the_same_units_equals_an_uninterrupted_run(tmp_path, first, later, units):
    pipe = _pipe(first, units=units)
    losses = []
    for k, (x, y) in enumerate(_batches(range(4))):
        losses.append(pipe.step(x, y))
        if k == 1:
            checkpoint.save(pipe, checkpoint.step_dir(tmp_path, 2), {"step": 2})
    resumed = _pipe(later, seed=5, units=units)  # other initial weights: all must come from the checkpoint
    if later == "zb-v":
        assert resumed.program.placement.weight_owner != pipe.program.placement.weight_owner
    assert checkpoint.load(resumed, tmp_path) == {"step": 2}
    again = [resumed.step(x, y) for x, y in _batches(range(2, 4))]
    assert again == pytest.approx(losses[2:], rel=1e-10, abs=0)
    for k, v in pipe.named_parameters().items():
        assert torch.allclose(resumed.named_parameters()[k], v, rtol=1e-10, atol=0), k


def test_entries_are_keyed_by_parameter_name_and_the_whole_model_loads_in_one_process(tmp_path):
    pipe = _pipe("1f1b")
    for x, y in _batches(range(2)):
        pipe.step(x, y)
    checkpoint.save(pipe, tmp_path)
    from torch.distributed.checkpoint import FileSystemReader
    keys = set(FileSystemReader(str(tmp_path)).read_metadata().state_dict_metadata)
    names = set(pipe.named_parameters())
    assert {f"model.{n}" for n in names} <= keys
    assert {f"optim.{n}.exp_avg" for n in names} <= keys
    units = build_units("tiny", 2, seed=7, dtype="float64", max_seq=SEQ)
    opt = _opt([p for u in units for p in u.parameters()])
    checkpoint.load_units(units, opt, tmp_path)
    whole = {f"unit{i}.{n}": p for i, u in enumerate(units) for n, p in u.named_parameters()}
    for n, p in pipe.named_parameters().items():
        assert torch.equal(whole[n], p), n
    state = {id(p): s for p, s in opt.state.items()}
    for u in (0, 1):
        inner = pipe.optimizers[u][u]
        for p in inner.param_groups[0]["params"]:
            name = next(n for n, q in pipe.named_parameters().items() if q is p)
            assert torch.equal(state[id(whole[name])]["exp_avg_sq"], inner.state[p]["exp_avg_sq"]), name


def test_bf16_master_weights_and_their_optimizer_round_trip(tmp_path):
    pipe = _pipe("1f1b", dtype="bfloat16")
    for x, y in _batches(range(2)):
        pipe.step(x, y)
    checkpoint.save(pipe, tmp_path)
    other = _pipe("zb-h1", dtype="bfloat16", seed=3)
    checkpoint.load(other, tmp_path)
    for u in (0, 1):
        a, b = pipe.optimizers[u][u], other.optimizers[u][u]
        for ma, mb, pa, pb in zip(a.masters, b.masters, a.params, b.params):
            assert torch.equal(ma, mb)
            assert torch.equal(pa, pb) and pb.dtype == torch.bfloat16
            assert torch.equal(a.inner.state[ma]["exp_avg"], b.inner.state[mb]["exp_avg"])
    x, y = _batches([2])[0]
    assert pipe.step(x, y) == other.step(x, y)


def test_missing_empty_and_incomplete_folders_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        checkpoint.load(_pipe("1f1b"), tmp_path / "nope")
    (tmp_path / "other").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        checkpoint.resolve(tmp_path)
    (tmp_path / "step-3").mkdir()  # a save that never finished: no .metadata
    with pytest.raises(CheckpointError, match="its newest checkpoint step-3 is partial .*no complete one is left"):
        checkpoint.resolve(tmp_path)
    with pytest.raises(CheckpointError, match="step-3' is partial: it has no .metadata"):
        checkpoint.resolve(tmp_path / "step-3")


def test_a_checkpoint_of_another_model_is_refused_naming_the_entries(tmp_path):
    checkpoint.save(_pipe("1f1b"), tmp_path)
    four = build_units("tiny", 4, keep=[], dtype="float64", max_seq=SEQ)
    with pytest.raises(CheckpointError, match=r"\(2 units\) does not fit the model: .*entries missing"):
        checkpoint.check_model(tmp_path, four)
    wider = Pipeline(build_units("tiny", 2, dtype="float64", max_seq=SEQ, hidden=32), "1f1b", microbatches=M)
    with pytest.raises(CheckpointError, match=r"entries differ \(model\.unit0\..*checkpoint \(.*, model \("):
        checkpoint.load(wider, tmp_path)
    with pytest.raises(CheckpointError, match="float64, model .* torch.float32"):
        checkpoint.check_model(tmp_path, build_units("tiny", 2, keep=[], max_seq=SEQ))


MIXED_SPEC = "0:norm,3:mlp,2:attn,1"
"""Per-parameter ZeRO: norms whole, MLP weights ZeRO-3, attention ZeRO-2, the rest ZeRO-1."""


@pytest.mark.parametrize("saved, loaded", [(0, 1), (1, 0), (3, 0), (1, 3), (0, 2), (MIXED_SPEC, 0), (3, MIXED_SPEC),
                                           ("p=0.5,g=0.8", MIXED_SPEC)])
def test_zero_sharded_and_whole_units_read_each_others_checkpoints(tmp_path, saved, loaded):
    """A ZeRO unit is written whole (its holders gather their shards; with per-parameter stages,
    each ZeRO class its own); each holder of a resumed ZeRO run takes its shard. Both pipelines
    are dp=2 replicas of 1F1B over the same units."""
    def pipe(zero, seed):
        units = build_units("tiny", 2, seed=seed, dtype="float64", max_seq=SEQ)
        return Pipeline(units, "1f1b", microbatches=M, optimizer=_opt, dp=2, zero=zero)
    first = pipe(saved, 0)
    for x, y in _batches(range(2)):
        first.step(x, y)
    checkpoint.save(first, tmp_path)
    second = pipe(loaded, 4)
    checkpoint.load(second, tmp_path)
    for x, y in _batches(range(2, 4)):
        assert second.step(x, y) == pytest.approx(first.step(x, y), rel=1e-10, abs=0)
    for k, v in first.named_parameters().items():
        assert torch.allclose(second.named_parameters()[k], v, rtol=1e-10, atol=0), k


@pytest.mark.parametrize("kw, message", [
    (dict(save_every=2), "--save-every 2: give a step count >= 1 and a --save folder"),
    (dict(save="d", save_every=0), "--save-every 0"),
])
def test_train_rejects_bad_checkpoint_flags(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw).validate()


def test_train_resume_refuses_other_data_settings_and_finished_runs(tmp_path):
    cfg = TrainConfig(stages=2, microbatches=M, batch_size=BATCH, seq=SEQ, dtype="float64", steps=2,
                      backend="local", json=True, save=str(tmp_path))
    run_train(cfg)
    meta = checkpoint.read_meta(tmp_path)
    assert meta["step"] == 2 and meta["seed"] == 0 and meta["schedule"] == "1f1b"
    base = dict(stages=2, microbatches=M, batch_size=BATCH, seq=SEQ, dtype="float64", backend="local",
                resume=str(tmp_path))
    with pytest.raises(CheckpointError, match="--seed 1 differs from the checkpoint's 0"):
        run_train(TrainConfig(**base, steps=3, seed=1))
    with pytest.raises(CheckpointError, match="--steps 2: the checkpoint .* is already at step 2"):
        run_train(TrainConfig(**base, steps=2))
    assert json.loads(json.dumps(meta)) == meta


def test_data_parallel_replicas_save_one_copy_and_resume_without_replicas(tmp_path):
    units = build_units("tiny", 2, dtype="float64", max_seq=SEQ)
    pipe = Pipeline(units, "1f1b", microbatches=M, optimizer=_opt, dp=2)
    losses = [pipe.step(x, y) for x, y in _batches(range(3))]
    checkpoint.save(pipe, tmp_path)
    single = _pipe("zb-h1", seed=9)
    checkpoint.load(single, tmp_path)
    x, y = _batches([3])[0]
    after = pipe.step(x, y)
    assert single.step(x, y) == pytest.approx(after, rel=1e-10, abs=0) and after < losses[0]


def test_the_random_state_is_restored(tmp_path):
    pipe = _pipe("1f1b")
    torch.manual_seed(123)
    checkpoint.save(pipe, tmp_path)
    expected = torch.rand(3)
    torch.manual_seed(7)
    checkpoint.load(_pipe("zb-h1"), tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_train_resumes_from_a_save_folder_with_another_schedule(tmp_path, capsys):
    base = dict(stages=2, microbatches=M, batch_size=BATCH, seq=SEQ, dtype="float64", backend="local", json=True)
    losses = run_train(TrainConfig(**base, steps=3, save=str(tmp_path), save_every=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "step-1", "step-2", "step-3"]
    capsys.readouterr()
    again = run_train(TrainConfig(**base, steps=3, schedule="zb-h1", check=True,
                                  resume=str(tmp_path / "step-1")))
    assert again == pytest.approx(losses[1:], rel=1e-10, abs=0)
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["max_param_rel_err"] <= 1e-10 for s in steps), steps  # the reference resumed too


def test_zero_units_with_master_weights_are_refused(tmp_path):
    units = build_units("tiny", 2, dtype="bfloat16", max_seq=SEQ)
    pipe = Pipeline(units, "1f1b", microbatches=M, optimizer=_opt, dp=2, zero=1)
    x, y = _batches([0])[0]
    pipe.step(x, y)
    with pytest.raises(CheckpointError, match="unit 0 is sharded with ZeRO and steps fp32 master copies"):
        checkpoint.save(pipe, tmp_path)


def test_tp_layout_shards_each_entry_like_its_parameter():
    """Weights, AdamW moments and fp32 masters of a TP-sharded parameter are sliced along the
    parameter's dimension (tpshard.shard_dim); its 0-d step, replicated parameters and the
    other entries stay whole; T = 1 leaves everything whole."""
    from pipert.ckpttp import TPLayout
    tp = TPLayout(2)
    shapes = {"model.unit0.layers.0.attn.wq.weight": ((64, 64), (32, 64)),
              "optim.unit1.layers.1.mlp.w2.weight.exp_avg_sq": ((64, 176), (64, 88)),
              "master.unit2.head.weight": ((256, 64), (128, 64)),
              "optim.unit1.layers.1.mlp.w2.weight.step": ((), ()),
              "optim.unit0.layers.0.attn_norm.weight.exp_avg": ((64,), (64,)),
              "rng.process0": ((5056,), (5056,))}
    for key, (whole, mine) in shapes.items():
        assert tp.local_shape(key, whole) == mine and tp.global_shape(key, mine) == whole, key
        assert TPLayout(1).local_shape(key, whole) == whole, key
