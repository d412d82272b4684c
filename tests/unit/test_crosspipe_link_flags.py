"""CrossPipe's generators read the link flags of every command, in the unit of that command's
costs: a program built for the link beats the link-blind one on that link; --options
memory_budget reaches the builder from train's command line."""
from __future__ import annotations

import json

import pytest

from pipert.cli import main

SHAPE = ["-P", "4", "-M", "8"]
UNIFORM_LINK = ["--dcs", "2", "--dc-latency", "5"]              # time unit of --tf
MODEL_LINK = ["--model", "1b", "--dcs", "2", "--dc-latency", "20ms"]   # seconds


def _json(capsys, argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def blind(tmp_path_factory):
    """crosspipe-greedy built without links: uniform costs, and the 1b model's."""
    folder = tmp_path_factory.mktemp("blind")
    out = {}
    for name, extra in (("uniform", []), ("model", ["--model", "1b"])):
        out[name] = str(folder / f"{name}.json")
        assert main(["export", "crosspipe-greedy", *SHAPE, *extra, "-o", out[name]]) == 0
    return out


@pytest.mark.parametrize("mode,link", [("uniform", UNIFORM_LINK), ("model", MODEL_LINK)])
def test_simulate_and_export_build_for_the_link(mode, link, blind, tmp_path, capsys):
    told = _json(capsys, ["simulate", "crosspipe-greedy", *SHAPE, *link, "--json"])
    on_link = _json(capsys, ["simulate", blind[mode], *link, "--json"])
    assert told["makespan"] < on_link["makespan"]
    path = str(tmp_path / "told.json")
    assert main(["export", "crosspipe-greedy", *SHAPE, *link, "-o", path]) == 0
    with open(path) as f, open(blind[mode]) as g:
        assert f.read() != g.read()
    assert _json(capsys, ["simulate", path, *link, "--json"])["makespan"] == pytest.approx(told["makespan"])


def test_compare_ranks_the_program_built_for_the_link_above_the_blind_one(blind, capsys):
    rows = _json(capsys, ["compare", blind["uniform"], "--schedules", "crosspipe-greedy", *UNIFORM_LINK,
                          "--json", "--plot", ""])
    span = {r["schedule"]: r["makespan"] for r in rows}
    told = _json(capsys, ["simulate", "crosspipe-greedy", *SHAPE, *UNIFORM_LINK, "--json"])["makespan"]
    assert span["crosspipe-greedy"] == pytest.approx(told)
    assert len(span) == 2 and max(span.values()) > told


def test_emulate_predicts_the_program_built_for_the_link(blind, capsys):
    argv = [*UNIFORM_LINK, "--time-unit", "50us", "--json"]
    told = _json(capsys, ["emulate", "crosspipe-greedy", *SHAPE, *argv])["predicted_makespan"]
    assert told < _json(capsys, ["emulate", blind["uniform"], *argv])["predicted_makespan"]


def test_emulate_real_plans_with_measured_seconds():
    """--real's links are seconds: the generator reads the real units' measured times (as train's
    do), not uniform costs of 1 per F, beside which a 20 ms latency would be nothing."""
    from pipert.cli import build_parser
    from pipert.emulate.cli import _measured
    from pipert.scenario import load_or_build
    parser = build_parser("emulate")

    def build(*link: str):
        args = parser.parse_args(["emulate", "crosspipe-greedy", *SHAPE, "--real", "--seq", "16", *link])
        return load_or_build(args, args.schedule, _measured(args))[1]
    blind, told = build(), build("--dcs", "2", "--dc-latency", "20ms")
    assert told.meta["predicted_makespan"] > 2 * 20e-3       # both crossings of the 20 ms link, in seconds
    assert told.meta["predicted_makespan"] < blind.meta["predicted_makespan"] / 10   # blind: uniform units


def test_train_options_memory_budget_reaches_the_builder(capsys):
    from pipert.train import TrainConfig, build_program
    shape = dict(schedule="crosspipe-greedy", stages=4, microbatches=8, batch_size=8, seq=16, steps=1)
    paper = build_program(TrainConfig(**shape)).meta["memory_limit"]
    static = build_program(TrainConfig(**shape, options="memory_budget=static-max")).meta["memory_limit"]
    assert len(set(static)) == 1 and static[0] == max(static) != max(paper)
    flags = ["train", "--backend", "local", "--schedule", "crosspipe-greedy", "--stages", "2", "--microbatches", "4",
             "--batch-size", "4", "--seq", "16", "--steps", "1", "--dtype", "float64", "--json", "--check"]
    assert main([*flags, "--options", "memory_budget=static-max"]) == 0
    step = json.loads([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")][0])
    assert step["max_grad_rel_err"] <= 1e-10
    assert main([*flags, "--options", "memory_budget=loose"]) == 2
    assert "memory_budget='loose' unknown; allowed: paper, static-max" in capsys.readouterr().err
