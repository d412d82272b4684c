"""The command line's contract (issue 20, item 5): every bad input of the review fails before any
work, in well under 5 s, with the flag, its value and what is allowed.

Each case runs ``pipert.cli.main`` in this process with the launcher and the training loop
replaced by functions that fail the test: a refusal that came after a rank process started, or
after a step ran, fails there. The 5 s bound is measured in this process (imports done)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipert import checkpoint
from pipert.cli import main
from pipert.train import TrainConfig, run_train

SEQ, BATCH, M = 16, 8, 4
LOCAL = ["--stages", "2", "--microbatches", str(M), "--batch-size", str(BATCH), "--seq", str(SEQ), "--dtype",
         "float64", "--backend", "local", "--json"]


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Starting a rank or running a step fails the test."""
    import pipert.launch
    import pipert.train

    def launched(*a, **k):
        raise AssertionError("a rank process was started before the input was refused")

    def stepped(*a, **k):
        raise AssertionError("a training step ran before the input was refused")
    monkeypatch.setattr(pipert.launch, "launch", launched)
    monkeypatch.setattr(pipert.train, "_loop", stepped)


def refused(capsys, argv: list[str], *needles: str) -> str:
    """Run ``pipert ARGV``: exit code 2 within 5 s, its one-line error holding every needle."""
    capsys.readouterr()
    t0 = time.monotonic()
    code = main(argv)
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 2, err
    assert took < 5.0, f"refused after {took:.1f} s"
    assert err.startswith(f"pipert {argv[0]}: error: "), err
    for needle in needles:
        assert needle in err, err
    return err


# --- times and rates take units; a bare number only where its unit is documented -------------
def test_train_refuses_a_latency_without_a_unit(capsys):
    refused(capsys, ["train", "--dcs", "2", "--dc-latency", "20"], "--dc-latency '20' has no unit",
            "allowed units: h, min, s, ms, us, ns")


def test_train_refuses_a_bandwidth_without_a_unit(capsys):
    refused(capsys, ["train", "--dcs", "2", "--dc-bandwidth", "10"], "--dc-bandwidth '10' has no unit",
            "allowed units: bps, Kbps, Mbps, Gbps")


def test_simulate_with_uniform_costs_refuses_seconds(capsys):
    """Uniform costs are in the time unit of --tf: a latency in seconds cannot be placed on them."""
    refused(capsys, ["simulate", "1f1b", "--dcs", "2", "--dc-latency", "20ms"], "--dc-latency '20ms'",
            "uniform costs have no seconds", "give a bare number in the time unit of --tf")


def test_simulate_with_the_analytic_model_refuses_a_bare_latency(capsys):
    refused(capsys, ["simulate", "1f1b", "--model", "7b", "--dcs", "2", "--dc-latency", "20"],
            "--dc-latency '20' has no unit", "allowed units:")


def test_simulate_with_the_analytic_model_takes_units(capsys):
    base = ["simulate", "1f1b", "--model", "7b", "-P", "4", "--json"]
    assert main(base) == 0
    free = json.loads(capsys.readouterr().out)["makespan"]
    assert main([*base, "--dcs", "2", "--dc-latency", "20ms", "--dc-bandwidth", "10Gbps"]) == 0
    slow = json.loads(capsys.readouterr().out)["makespan"]
    assert slow > free + 0.02  # at least one 20 ms crossing on the critical path


def test_a_bandwidth_on_uniform_costs_is_refused(capsys):
    refused(capsys, ["simulate", "1f1b", "--dcs", "2", "--dc-bandwidth", "10Gbps"], "--dc-bandwidth 10Gbps",
            "give --dc-transfer")


def test_timeout_takes_a_unit_or_seconds(capsys):
    from pipert.cli import build_parser
    args = build_parser("train").parse_args(["train", "--timeout", "2min"])
    assert args.timeout == 120.0
    assert build_parser("train").parse_args(["train", "--timeout", "30"]).timeout == 30.0
    with pytest.raises(SystemExit):
        build_parser("train").parse_args(["train", "--timeout", "30 parsecs"])
    assert "unknown time unit 'parsecs'; allowed: h, min, s, ms, us, ns" in capsys.readouterr().err


def test_emulate_time_unit_and_plan_latencies_take_units(capsys):
    refused(capsys, ["plan", "--pp-vs-dp", "--latencies", "4"], "--latencies '4' has no unit", "allowed units")
    refused(capsys, ["emulate", "1f1b", "--time-unit", "2 fortnights"], "--time-unit '2 fortnights'",
            "unknown time unit", "allowed: h, min, s, ms, us, ns")


# --- a link flag without the split it describes: refused the same way everywhere -------------
@pytest.mark.parametrize("argv", [["simulate", "1f1b", "--dc-latency", "2"],
                                  ["compare", "--dc-transfer", "1"],
                                  ["emulate", "1f1b", "--dc-latency", "2"],
                                  ["train", "--dc-latency", "2ms"]], ids=lambda a: a[0])
def test_a_dc_link_without_dcs_is_refused_by_every_command(capsys, argv):
    flag, value = argv[-2:]
    refused(capsys, argv, f"{flag} {value} describes the link between datacenters: give --dcs >= 2 as well")


def test_a_node_link_without_ranks_per_node_is_refused(capsys):
    refused(capsys, ["train", "--node-bandwidth", "100Gbps"],
            "--node-bandwidth 100Gbps describes the link between nodes of a datacenter: give --ranks-per-node")


# --- a flag that would do nothing is refused, naming the flags it needs ----------------------
@pytest.mark.parametrize("extra, zero", [([], "0"), (["--dp", "2", "--zero", "1"], "1"),
                                         (["--dp", "2", "--zero", "2:mlp,1"], "2:mlp,1"),
                                         (["--dp", "2", "--zero", "p=0,g=0.5"], "p=0,g=0.5")])
def test_zero3_buffers_without_zero3_weights_is_refused(capsys, extra, zero):
    refused(capsys, ["train", "--stages", "2", "--zero3-buffers", "2", *extra],
            f"--zero3-buffers 2 keeps two gathered copies of ZeRO-3 weights, but --dp {2 if extra else 1} "
            f"--zero {zero} shards no weight with ZeRO-3", "give --dp > 1 and --zero 3")


@pytest.mark.parametrize("zero", ["3", "3:mlp,1", "p=0.4,g=0.7"])
def test_zero3_buffers_with_zero3_weights_is_accepted(zero):
    TrainConfig(stages=2, dp=2, zero=zero, zero3_buffers=2, microbatches=4, batch_size=8).validate()


# --- checked before any process starts: save folder, bf16 + ZeRO, batch size -----------------
def test_an_unwritable_save_folder_is_refused_before_any_step(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused(capsys, ["train", *LOCAL, "--save", str(blocker / "ckpt")], f"--save {blocker / 'ckpt'}",
            "is a file, so the folder cannot be created there", "allowed: a folder this user can write")
    refused(capsys, ["train", *LOCAL, "--save", str(blocker)], "is a file, not a folder")


def test_save_with_bf16_and_zero_is_refused_before_any_step(capsys, tmp_path):
    refused(capsys, ["train", "--dtype", "bfloat16", "--dp", "2", "--zero", "1", "--save", str(tmp_path / "c")],
            f"--save {tmp_path / 'c'} with --dtype bfloat16 and --zero 1", "allowed: --zero 0, --dtype float32")
    assert not (tmp_path / "c").exists()


def test_a_batch_beyond_the_machines_memory_is_refused_naming_the_largest(capsys):
    err = refused(capsys, ["train", "--batch-size", "100000000"], "--batch-size 100000000: a step needs at least",
                  "allowed: --batch-size <=")
    largest = int(err.split("allowed: --batch-size <= ")[1].split()[0])
    assert largest % 8 == 0 and 0 < largest < 100000000
    TrainConfig(batch_size=largest).validate()  # the limit it names is accepted


def test_the_batch_bound_counts_every_process(capsys):
    from pipert.trainchecks import check_batch_fits
    cfg = TrainConfig(stages=4, batch_size=1024, backend="gloo")
    check_batch_fits(cfg, memory=1 << 40)
    with pytest.raises(ValueError, match=r"--batch-size 1024: .*\(4 process\(es\).*allowed: --batch-size <= "):
        check_batch_fits(cfg, memory=1 << 20)


# --- simulate shapes bounded, the limit named ----------------------------------------------------
@pytest.mark.parametrize("argv,needles", [
    (["simulate", "1f1b", "-P", "64", "-M", "100000"],
     ["--stages 64", "--microbatches 100000", "allowed: at most 32768 pairs"]),
    (["simulate", "1f1b", "-P", "5000"], ["--stages 5000", "allowed: 1..1024"]),
    (["simulate", "interleaved-1f1b", "-P", "64", "-V", "64", "-M", "64"], ["--chunks 64", "at most 32768 pairs"]),
    (["compare", "-P", "64", "-M", "4096"], ["--microbatches 4096", "at most 32768 pairs"]),
    (["plan", "-P", "64", "-M", "4096"], ["--microbatches 4096", "at most"]),
    (["emulate", "1f1b", "-P", "64", "-M", "100000"], ["--microbatches 100000", "at most 32768 pairs"]),
    (["simulate", "crosspipe-optimal", "-P", "8", "-M", "32"],
     ["crosspipe-optimal --stages 8 --microbatches 32", "allowed: at most 128 pairs for crosspipe-optimal"]),
], ids=["simulate-pairs", "simulate-ranks", "simulate-chunks", "compare", "plan", "emulate", "solver"])
def test_huge_shapes_are_refused_naming_the_limit(capsys, argv, needles):
    refused(capsys, argv, *needles)


def test_the_largest_allowed_shape_is_accepted(capsys):
    """The limit is inclusive: P=64 M=512 of 1F1B (its time is the benchmarks' to measure)."""
    assert main(["simulate", "1f1b", "-P", "64", "-M", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["microbatches"] == 512


# --- checkpoints: overrides on resume, folder ownership, partial and truncated checkpoints ------
def _config(*flags: str, steps: int) -> TrainConfig:
    from dataclasses import fields

    from pipert.cli import build_parser
    args = build_parser("train").parse_args(["train", *LOCAL, "--steps", str(steps), *flags])
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A save folder holding step-1 and step-2 of a real local run with --lr 1e-3 (built once,
    before the function fixtures replace the loop; tests change copies of it)."""
    d = tmp_path_factory.mktemp("run") / "ckpt"
    run_train(_config("--save", str(d), "--save-every", "1", "--lr", "1e-3", steps=2))
    return d


def test_lr_on_resume_replaces_the_checkpoints_and_is_said(capsys, tmp_path, saved, monkeypatch):
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    seen = {}

    def loop(cfg, *a, **k):
        seen["lr"] = cfg.lr
        return []
    import pipert.train
    monkeypatch.setattr(pipert.train, "_loop", loop)
    assert main(["train", *LOCAL, "--steps", "3", "--resume", str(d)]) == 0
    assert seen["lr"] == 1e-3  # left out: the checkpoint's
    assert main(["train", *LOCAL, "--steps", "3", "--resume", str(d), "--lr", "5e-4", "--save", str(d)]) == 0
    assert seen["lr"] == 5e-4
    assert "--lr 0.0005 replaces the checkpoint's learning rate 0.001" in capsys.readouterr().err
    assert json.loads((d / "run.json").read_text())["settings"]["lr"] == 5e-4  # the folder's run goes on


def test_the_resumed_optimizer_takes_the_given_lr(saved):
    import torch
    from pipert.models import build_units
    units = build_units("tiny", 2, dtype="float64", max_seq=SEQ)
    opt = torch.optim.AdamW([p for u in units for p in u.parameters()], lr=7.0)
    checkpoint.load_units(units, opt, saved)
    assert opt.param_groups[0]["lr"] == 1e-3
    checkpoint.load_units(units, opt, saved, {"lr": 5e-4})
    assert opt.param_groups[0]["lr"] == 5e-4 and opt.state  # the moments loaded as well


def test_another_runs_save_folder_is_refused(capsys, tmp_path, saved):
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    before = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    refused(capsys, ["train", *LOCAL, "--seed", "5", "--save", str(d)], f"--save {d}: the folder holds the "
            f"checkpoints of another run", "--seed 5 (the folder's: 0)", "save into another folder")
    refused(capsys, ["train", *LOCAL, "--lr", "1e-2", "--save", str(d)], "--lr 0.01 (the folder's: 0.001)")
    assert {p.name: p.stat().st_mtime_ns for p in d.iterdir()} == before


def test_a_partial_newest_checkpoint_is_reported(capsys, tmp_path, saved):
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    (d / "step-2" / ".metadata").unlink()  # a save that did not finish
    refused(capsys, ["train", *LOCAL, "--steps", "3", "--resume", str(d)],
            f"--resume {d}: ", "its newest checkpoint step-2 is partial", f"resume from {str(d / 'step-1')!r}, the newest complete one")


def test_a_truncated_shard_is_named_before_any_process_starts(capsys, tmp_path, saved):
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    shard = max((d / "step-2").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:100])
    refused(capsys, ["train", *LOCAL, "--steps", "3", "--resume", str(d)], f"--resume {d}: ",
            f"file {str(shard)!r} has 100 bytes",
            "it is truncated")


def test_a_missing_resume_folder_is_refused_naming_the_flag(capsys, tmp_path):
    refused(capsys, ["train", *LOCAL, "--resume", str(tmp_path / "none")], f"--resume {tmp_path / 'none'}: ",
            "does not exist or is not a folder")


def test_step_folders_are_named_as_the_readme_says(saved):
    assert sorted(p.name for p in saved.iterdir()) == ["run.json", "step-1", "step-2"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "`DIR/step-N`" in readme
    from pipert.ckptfolder import steps
    padded = saved.parent / "padded"
    padded.mkdir()
    (padded / "step-00000004").mkdir()
    (padded / "step-3").mkdir()
    assert [s for s, _, _ in steps(padded)] == [3, 4]  # a zero-padded name is the same step


def test_a_corrupt_shard_fails_naming_the_folder_and_its_files(tmp_path, saved):
    """Bytes that are all there but not what DCP wrote: DCP's own failure (a BaseException that
    error files miss) becomes a CheckpointError naming the checkpoint and its files."""
    import shutil

    import torch
    from pipert.models import build_units
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    for shard in (d / "step-2").glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size)
    units = build_units("tiny", 2, dtype="float64", max_seq=SEQ)
    opt = torch.optim.AdamW([p for u in units for p in u.parameters()])
    with pytest.raises(checkpoint.CheckpointError, match=rf"reading checkpoint '{d / 'step-2'}' \(files "
                                                         rf"__0_0\.distcp.*\) failed: \w+"):
        checkpoint.load_units(units, opt, d)
