"""Tensor parallelism in one process: which parameter is split how, the shard shapes, the checks
of --tp/--sp before any process starts, and that T = 1 leaves the model as it was."""
import pytest
import torch

from pipert.models import build_units
from pipert.models.tp import TensorParallel
from pipert.models.tpshard import check_tp_sizes, shard_dim, shard_units, tp_divisors
from pipert.train import TrainConfig


@pytest.mark.parametrize("name, dim", [
    ("unit0.layers.1.attn.wq.weight", 0), ("layers.0.attn.wk.bias", 0), ("layers.0.mlp.w1.weight", 0),
    ("layers.0.mlp.w3.weight", 0), ("layers.0.mlp.fc.bias", 0), ("layers.0.attn.wo.weight", 1),
    ("layers.0.mlp.w2.weight", 1), ("layers.0.mlp.proj.weight", 1), ("unit0.embed.weight", 0),
    ("unit1.head.weight", 0), ("layers.0.attn.wo.bias", None), ("layers.0.mlp.proj.bias", None),
    ("layers.0.attn_norm.weight", None), ("layers.0.mlp_norm.bias", None), ("norm.weight", None),
    ("pos.weight", None)])
def test_shard_dim_follows_megatron(name, dim):
    assert shard_dim(name) == dim


def test_shards_have_local_heads_and_columns_and_meta_units_get_shard_shapes():
    units = build_units("tiny", 2, keep=[0], dtype="float64", max_seq=16)
    whole = {n: p.detach().clone() for n, p in units[0].named_parameters()}
    shard_units(units, TensorParallel(2, 1, None, sequence_parallel=True))
    got = dict(units[0].named_parameters())
    assert got["layers.0.attn.wq.weight"].shape == (32, 64) and got["layers.0.attn.wo.weight"].shape == (64, 32)
    assert got["embed.weight"].shape == (128, 64) and got["layers.0.mlp.w2.weight"].shape == (64, 88)
    # rank 1 holds the second half; replicated parameters are untouched
    assert torch.equal(got["layers.0.attn.wq.weight"], whole["layers.0.attn.wq.weight"][32:])
    assert torch.equal(got["layers.0.mlp.w2.weight"], whole["layers.0.mlp.w2.weight"][:, 88:])
    assert torch.equal(got["layers.0.attn_norm.weight"], whole["layers.0.attn_norm.weight"])
    attn = units[0].layers["0"].attn
    assert (attn.heads, attn.kv_heads) == (2, 1) and attn.tp.rank == 1
    meta = dict(units[1].named_parameters())  # not materialised: shapes only
    assert meta["head.weight"].is_meta and meta["head.weight"].shape == (128, 64)
    with pytest.raises(ValueError, match="unit 0 is a TP shard already"):
        shard_units(units, TensorParallel(2, 1))


def test_tp_of_one_changes_nothing():
    units = build_units("gpt-tiny", 2, dtype="float64", max_seq=8)
    x = torch.randint(0, 256, (2, 8))
    before = units[1](units[0](x), x)
    shard_units(units, TensorParallel(1))
    assert units[0].tp is None and torch.equal(units[1](units[0](x), x), before)


def test_user_modules_are_refused():
    from torch import nn

    from pipert.models import partition
    units = partition(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), 2, loss_fn=lambda o, t: o.sum())
    with pytest.raises(ValueError, match="unit 0 is 'modules' \\(allowed: layers, pre_attn"):
        shard_units(units, TensorParallel(2, 0))


@pytest.mark.parametrize("model, first, last, ffn", [("tiny", "w1", "w2", 176), ("gpt-tiny", "fc", "proj", 256)])
def test_the_chunked_mlp_shards_like_the_plain_one(model, first, last, ffn):
    """Same names, same split (first linear column-parallel, last row-parallel), and ``tp`` set on
    the module, which then runs ``pipert.kernels.chunked_tp``."""
    units = build_units(model, 2, keep=[0], max_seq=8, mlp_chunk=4)
    whole = {n: p.detach().clone() for n, p in units[0].named_parameters()}
    tp = TensorParallel(2, 1, None, sequence_parallel=True)
    shard_units(units, tp)
    mlp = units[0].layers["0"].mlp
    assert type(mlp).__name__.startswith("Chunked") and mlp.tp is tp
    got = dict(units[0].named_parameters())
    w_first, w_last = got[f"layers.0.mlp.{first}.weight"], got[f"layers.0.mlp.{last}.weight"]
    assert w_first.shape == (ffn // 2, 64) and w_last.shape == (64, ffn // 2)
    assert torch.equal(w_last, whole[f"layers.0.mlp.{last}.weight"][:, ffn // 2:])


def test_sizes_t_must_divide_are_named_with_what_is_allowed():
    from pipert.models import model_config
    cfg = model_config("tiny")  # heads 4, kv_heads 2, ffn 176, vocab 256
    with pytest.raises(ValueError, match=r"--tp 4 must divide kv_heads=2 \(LlamaConfig\); allowed --tp: 1, 2$"):
        check_tp_sizes(cfg, 4)
    with pytest.raises(ValueError, match=r"--tp 2 must divide seq=15 \(sequence-parallel"):
        check_tp_sizes(cfg, 2, seq=15)
    assert tp_divisors({"heads": 12, "ffn": 8}) == [1, 2, 4]


@pytest.mark.parametrize("flags, message", [
    ({"tp": 3}, "--tp 3 must divide heads=4, kv_heads=2, ffn=176, vocab=256"),
    ({"tp": 0}, "--tp must be >= 1"),
    ({"sp": True}, "--sp splits the sequence over the TP group: give --tp > 1"),
    ({"tp": 2, "sp": True, "seq": 15}, "--tp 2 must divide seq=15"),
    ({"tp": 2, "backend": "local"}, "--backend local not supported with tensor parallelism"),
])
def test_train_refuses_bad_tp_flags_before_any_work(flags, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{"stages": 2, "microbatches": 2, "batch_size": 2, "seq": 16, **flags}).validate()


def test_world_counts_tp_processes():
    cfg = TrainConfig(stages=2, dp=2, tp=2, microbatches=4, batch_size=4, seq=16)
    cfg.validate()
    assert cfg.world == 8


def test_train_takes_the_chunked_mlp_with_tp_and_sp():
    cfg = TrainConfig(stages=2, tp=2, sp=True, mlp_chunk=8, mlp_recompute=True, microbatches=4, batch_size=4,
                      seq=16, schedule="helixpipe-2fold", recompute="no_attention")
    cfg.validate()
    assert (cfg.world, cfg.mlp_chunk) == (4, 8)
