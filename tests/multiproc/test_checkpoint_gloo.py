"""`pipert train --save/--resume` on gloo processes (P=2, float64): a resumed run gives the
losses of an uninterrupted one, with the same schedule or another over the same units."""
import pytest

from pipert.clirun import run_cli

ARGS = ("--stages", "2", "--microbatches", "4", "--batch-size", "8", "--seq", "16", "--dtype", "float64",
        "--backend", "gloo", "--json", "--steps", "4")


def _train(*args: str) -> list[dict]:
    return run_cli("train", *ARGS, *args).rows()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted runs of 1F1B and ZB-H1, each saving a checkpoint every 2 steps."""
    out = {}
    for name in ("1f1b", "zb-h1"):
        d = tmp_path_factory.mktemp(name)
        out[name] = (d, {s["step"]: s["loss"] for s in _train("--schedule", name, "--save", str(d),
                                                              "--save-every", "2")})
    return out


def test_each_rank_writes_the_units_it_owns(runs):
    from torch.distributed.checkpoint import FileSystemReader
    d, _ = runs["1f1b"]
    assert sorted(p.name for p in d.iterdir()) == ["run.json", "step-2", "step-4"]
    md = FileSystemReader(str(d / "step-2")).read_metadata()
    files = {i.fqn.split(".")[1]: s.relative_path for i, s in md.storage_data.items() if i.fqn.startswith("model.")}
    assert files == {"unit0": "__0_0.distcp", "unit1": "__1_0.distcp"}


@pytest.mark.parametrize("saved, resumed", [("1f1b", "1f1b"), ("1f1b", "zb-h1")])
def test_resume_gives_the_losses_of_an_uninterrupted_run(runs, saved, resumed):
    d, _ = runs[saved]
    again = _train("--schedule", resumed, "--resume", str(d / "step-2"), "--check")
    assert [s["step"] for s in again] == [2, 3]
    uninterrupted = runs[resumed][1]
    for s in again:
        assert s["loss"] == pytest.approx(uninterrupted[s["step"]], rel=1e-10, abs=0)
        # the reference on rank 0 resumed from the same checkpoint (weights and AdamW state)
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s


def test_zero_sharded_units_resume_under_another_zero_stage(tmp_path):
    """dp=2 x P=2 (4 processes): the checkpoint of a run with ZeRO stages per parameter (norms 0,
    MLP 3, attention 2, the rest 1; each ZeRO class gathered whole from its holders' shards)
    resumed with ZeRO-3 for every unit, where each holder keeps only its shard, and with other
    per-parameter stages and separate forward and backward ZeRO-3 copies."""
    zero = ("--dp", "2", "--steps", "3")
    full = {s["step"]: s["loss"] for s in _train(*zero, "--zero", "0:norm,3:mlp,2:attn,1", "--save", str(tmp_path),
                                                  "--save-every", "1")}
    again = _train(*zero, "--zero", "3", "--resume", str(tmp_path / "step-1"), "--check")
    again_mixed = _train(*zero, "--zero", "p=0.5,g=0.8", "--zero3-buffers", "2", "--resume",
                         str(tmp_path / "step-2"), "--check")
    assert [s["step"] for s in again] == [1, 2] and [s["step"] for s in again_mixed] == [2]
    for s in again + again_mixed:
        assert s["loss"] == pytest.approx(full[s["step"]], rel=1e-10, abs=0)
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s


def test_tensor_parallel_checkpoints_resume_at_another_tp(runs, tmp_path):
    """T=1 -> T=2 -> T=1: the T=1 run's checkpoint resumed at T=2 (P=1 x D=2 with ZeRO-3, 4
    processes: each ZeRO shard is a shard of a TP shard; mesh order tp,dp,pp, so a TP group is
    global ranks {g, g + 2}), whose own checkpoint resumed at T=1 (P=2): every resumed step has
    the uninterrupted T=1 run's loss."""
    from torch.distributed.checkpoint import FileSystemReader
    d, uninterrupted = runs["1f1b"]
    at_tp2 = _train("--tp", "2", "--stages", "1", "--schedule", "interleaved-1f1b", "--chunks", "2", "--dp", "2",
                    "--zero", "3", "--steps", "3", "--resume", str(d / "step-2"), "--save", str(tmp_path), "--check",
                    "--mesh-order", "tp,dp,pp")
    at_tp1 = _train("--schedule", "1f1b", "--resume", str(tmp_path / "step-3"), "--check")
    assert [s["step"] for s in at_tp2] == [2] and [s["step"] for s in at_tp1] == [3]
    assert [tuple(c) for c in at_tp2[0]["process_coords"]] == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
    for s in at_tp2 + at_tp1:
        assert s["loss"] == pytest.approx(uninterrupted[s["step"]], rel=1e-10, abs=0)
        assert s["max_grad_rel_err"] <= 1e-10 and s["max_param_rel_err"] <= 1e-10, s
    # the T=2 checkpoint holds whole tensors: one chunk per TP rank of a sharded entry (its AdamW
    # moments too), one of a replicated one
    md = FileSystemReader(str(tmp_path / "step-3")).read_metadata().state_dict_metadata
    chunks = {k: (tuple(md[k].size), [tuple(c.sizes) for c in md[k].chunks])
              for k in ("model.unit0.layers.0.attn.wq.weight", "optim.unit0.layers.0.mlp.w2.weight.exp_avg",
                        "model.unit0.layers.0.attn_norm.weight")}
    assert chunks == {"model.unit0.layers.0.attn.wq.weight": ((64, 64), [(32, 64), (32, 64)]),
                      "optim.unit0.layers.0.mlp.w2.weight.exp_avg": ((64, 176), [(64, 88), (64, 88)]),
                      "model.unit0.layers.0.attn_norm.weight": ((64,), [(64,)])}
