"""PipeMesh plan files: what `pipert plan --pipemesh --save` writes and `pipert train --plan` reads
(no processes started)."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main
from pipert.planner import Components, OpCost, plan
from pipert.planner.planfile import load_plan, plan_document, runtime_recompute, save_plan, train_settings
from pipert.train import TrainConfig


def _doc(tmp_path, **over):
    c = Components(stages=2, dp=2, chunks=2, microbatches=8, fwd=1.0, bwd=2.0, dp_comm=1.5, params=1000)
    ops = [OpCost("layer0.norm1", 10, 0.01), OpCost("layer0.gelu", 30, 0.02), OpCost("layer0.q_proj", 40, 1.0)]
    best = plan(c, ops, budget=11600.0, base_activation=5)
    doc = {**plan_document(best, "test", 1), **over}
    path = tmp_path / "plan.json"
    save_plan(str(path), doc)
    return best, doc, str(path)


def test_runtime_recompute_keeps_only_groups_the_plan_keeps_whole():
    assert runtime_recompute([]) == "none"
    assert runtime_recompute(["layer0.attn_dropout"]) == "none"          # no dropout in the runtime's models
    assert runtime_recompute(["layer0.gelu", "layer1.norm2"]) == "keep:attention,projection"
    assert runtime_recompute(["layer3.k_proj"]) == "keep:attention,activation,norm"
    with pytest.raises(ValueError, match="no runtime op group"):
        runtime_recompute(["layer0.conv"])


def test_plan_file_round_trip_and_train_settings(tmp_path):
    best, doc, path = _doc(tmp_path)
    got = load_plan(path)
    assert got["enqueue"] == list(best.queue.enqueue) and got["dequeue"] == list(best.queue.dequeue)
    s = train_settings(got)
    assert (s["schedule"], s["stages"], s["dp"], s["chunks"], s["microbatches"]) == ("pipemesh", 2, 2, 2, 16)
    e = ",".join(map(str, best.queue.enqueue))
    assert s["options"].startswith(f"enqueue={e};") and s["zero"] == doc["zero"]["spec"]
    assert s["recompute"] == runtime_recompute(best.recomputed)
    assert doc["buckets"]["units_per_chunk"] == max(1, doc["buckets"]["B_Z2"], doc["buckets"]["B_Z3_fwd"],
                                                    doc["buckets"]["B_Z3_bwd"])
    TrainConfig(plan=path, **s).validate()


def test_bad_plan_files_are_refused_naming_the_field(tmp_path):
    _, _, path = _doc(tmp_path, enqueue=[3, 3])
    with pytest.raises(ValueError, match=r"enqueue \[3, 3\] must be a list of integers summing to B=8"):
        load_plan(path)
    (tmp_path / "other.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(ValueError, match="format 'x'; allowed"):
        load_plan(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="no such file"):
        load_plan(str(tmp_path / "missing.json"))


def test_train_refuses_flags_that_conflict_with_the_plan(tmp_path, capsys):
    _, doc, path = _doc(tmp_path)
    assert main(["train", "--plan", path, "-P", "4"]) == 2
    assert "-P 4 conflicts with --plan" in capsys.readouterr().err
    assert main(["train", "--plan", path, "--schedule", "1f1b"]) == 2
    assert "--schedule 1f1b conflicts with --plan" in capsys.readouterr().err
    s = train_settings(doc)
    with pytest.raises(ValueError, match="--zero '0' conflicts with --plan"):
        TrainConfig(plan=path, **{**s, "zero": "0"}).validate()


def test_train_refuses_a_plan_whose_units_exceed_the_layers(tmp_path):
    _, doc, path = _doc(tmp_path)
    doc["buckets"]["units_per_chunk"] = 2
    save_plan(path, doc)
    with pytest.raises(ValueError, match="2 x 2 x 2 units, but model 'tiny' has 4 layers"):
        TrainConfig(plan=path, **train_settings(doc)).validate()
