"""``pipert export --format torch-csv --comms``: torch's ``compute_comms`` form, checked against
torch 2.13's own rules for every registered schedule the export accepts (P/M = 2/4, 3/6, 4/8), with
either placement of receives (``--receives program``, the default, and ``consumer``):

- the file passes ``_validate_schedule`` (what ``_PipelineScheduleRuntime._load_csv`` checks) and
  ``_simulate_comms_compute`` (torch's dry run, whose receives block); it holds one REDUCE_GRAD per
  stage, after the stage's last backward, on its rank;
- it reads back as the exported program: the schedule itself where torch runs it as it is, else the
  schedule with some (``program``) or all (``consumer``) receives moved down to their consumers;
- pipert's stall check (``pipert.ir.torch_receives``) agrees with torch's dry run on the files and
  on the programs' own receive positions, which torch rejects for most schedules.
The torch runtime itself runs such files in tests/multiproc/test_torch_runtime.py."""
from __future__ import annotations

import contextlib
import io

import pytest
from torch.distributed.pipelining.schedules import _Action, _simulate_comms_compute, _validate_schedule

from pipert.cli import build_parser, main
from pipert.cost import UniformCost
from pipert.ir import Op, ScheduleFormatError
from pipert.ir.files import RECEIVES, dump_schedule
from pipert.ir.lowering import add_optimizer_steps, lower
from pipert.ir.passes import receives_at_consumer
from pipert.ir.torch_format import from_torch, parse_torch_action, read_torch_csv, to_torch
from pipert.ir.torch_receives import receives_for_torch, torch_stalls
from pipert.scenario import load_or_build
from pipert.schedules import available
from pipert.sim import simulate, validate

SHAPES = [(2, 4), (3, 6), (4, 8)]
TORCH_EXPRESSIBLE = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "crosspipe-greedy", "crosspipe-wave",
                     "crosspipe-optimal"}


def _exports():
    """(name, P, M, schedule, {receives: file rows}) for every registered schedule the export
    accepts, built as ``pipert export NAME -P P -M M --format torch-csv --comms`` builds it, and
    the (name, P) refused for W sub-blocks (pieces ``/s0``: torch's format has none)."""
    out, pieces = [], set()
    for P, M in SHAPES:
        for name in available():
            args = build_parser("export").parse_args(["export", name, "-P", str(P), "-M", str(M)])
            try:
                _, s = load_or_build(args, name)
            except ValueError:            # the family's own constraints on this shape (e.g. tawpipe's nodes)
                continue
            try:
                files = {k: read_torch_csv(dump_schedule(s, "torch-csv", comms=True, receives=k)) for k in RECEIVES}
            except ScheduleFormatError as e:
                assert "has no torch equivalent" in str(e), (name, P, e)
                if "s0/" in str(e):
                    pieces.add((name, P))
                continue
            out.append((name, P, M, s, files))
    return out, pieces


@pytest.fixture(scope="module")
def exports():
    got, pieces = _exports()
    for P, _ in SHAPES:  # the expressible families are exported unless their program has W pieces
        assert {name for name, p, *_ in got if p == P} >= TORCH_EXPRESSIBLE - {n for n, p in pieces if p == P}, P
    return got


def _torch_actions(rows: list[list[str]]) -> dict[int, list[_Action]]:
    return {r: [_Action.from_str(a) for a in row if a] for r, row in enumerate(rows)}


def _torch_simulates(rows: list[list[str]]) -> bool:
    """Whether torch's dry run gets through ``rows``. It has no rule for REDUCE_GRAD (it raises
    on the action), which acts on its own rank only: left out here."""
    actions = {r: [a for a in acts if a.computation_type.value != "REDUCE_GRAD"]
               for r, acts in _torch_actions(rows).items()}
    stage_rank = {a.stage_index: r for r, acts in actions.items() for a in acts}
    try:
        with contextlib.redirect_stdout(io.StringIO()):          # it prints its partial schedule
            _simulate_comms_compute(actions, lambda s: stage_rank[s], len(stage_rank))
    except ValueError as e:
        assert "not progressing" in str(e), e
        return False
    return True


def test_exported_files_pass_torch_load_check_and_dry_run(exports):
    for name, P, M, s, files in exports:
        for receives, rows in files.items():
            where = (name, P, receives)
            mapping = _validate_schedule(_torch_actions(rows), P, s.num_units, M)
            assert mapping == {u: s.placement.rank(u, 0) for u in range(s.num_units)}, where
            assert _torch_simulates(rows), where
            assert torch_stalls(rows) == {}, where
            for r, row in enumerate(rows):
                acts = [parse_torch_action(a) for a in row]
                reduces = [i for i, (_, kind, _) in enumerate(acts) if kind == "REDUCE_GRAD"]
                assert sorted(acts[i][0] for i in reduces) == s.units_owned(r), (where, r)
                for i in reduces:
                    backwards = [a for a in acts[:i] if a[0] == acts[i][0] and a[1] in ("B", "W")]
                    assert len(backwards) == M, (where, row[i])


def test_exported_files_read_back_as_the_exported_program(exports):
    cost = UniformCost(1.0, 2.0)
    for name, P, M, s, files in exports:
        runs_as_is = not torch_stalls(to_torch(s, comms=True, check=False))
        exported = {"program": receives_for_torch(s), "consumer": receives_at_consumer(s)}
        assert (exported["program"] is s) == runs_as_is, (name, P)
        compute = [[a for a in acts if a.op not in (Op.SEND, Op.RECV, Op.OPT)] for acts in s.actions]
        at_consumer = lower(name, P, s.num_units, M, s.placement, add_optimizer_steps(compute, s.placement),
                            post_ahead=0)
        assert exported["consumer"].actions == at_consumer.actions, (name, P)   # lowering's receives at consumers
        ours = simulate(s, cost)
        for receives, program in exported.items():
            where = (name, P, receives)
            back = from_torch(files[receives], name=name)
            assert back.placement == s.placement and back.actions == program.actions, where
            for r in range(P):             # only receives move: every other action keeps its order
                assert [a for a in program.actions[r] if a.op is not Op.RECV] == \
                       [a for a in s.actions[r] if a.op is not Op.RECV], (where, r)
            validate(back)
            theirs = simulate(back, cost)
            assert theirs.makespan == ours.makespan, where
            # a receive's buffer is held from where it is posted: later, never more memory
            assert all(t <= o for t, o in zip(theirs.peak_memory, ours.peak_memory)), where


def test_stall_check_agrees_with_torch_dry_run_on_the_programs_own_receives(exports):
    stalled = 0
    for name, P, M, s, _ in exports:
        rows = to_torch(s, comms=True, check=False)
        stalls = torch_stalls(rows)
        assert (not stalls) == _torch_simulates(rows), (name, P, stalls)
        if stalls:
            stalled += 1
            with pytest.raises(ScheduleFormatError, match=r"torch's runtime would stall on these receives \(rank "):
                to_torch(s, comms=True)
    assert stalled > 0          # the check can fail: most schedules post a receive where torch blocks


def test_refusals_are_named(capsys):
    # rank 1 runs micro-batch 1 first, which rank 0 forwards only after micro-batch 0's backward
    s = from_torch([["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0F1", "0SEND_F1", "0RECV_B1", "0B1"],
                    ["1RECV_F1", "1F1", "1B1", "1SEND_B1", "1RECV_F0", "1F0", "1B0", "1SEND_B0"]], name="crossed")
    with pytest.raises(ScheduleFormatError, match=r"crossed: torch's runtime stalls \(rank 0 at action 2 \(0RECV_B0\), "
                                                  r"rank 1 at action 0 \(1RECV_F1\)\) even with every receive right "
                                                  r"before its consumer"):
        receives_for_torch(s)
    assert main(["export", "gpipe", "-P", "2", "-M", "4", "--format", "torch-csv", "--receives", "consumer"]) == 2
    assert "--receives consumer applies with --comms only" in capsys.readouterr().err


def test_reduce_grad_is_read_checked_and_dropped():
    good = [["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0",
                                                                     "1REDUCE_GRAD"]]
    s = from_torch(good)
    assert not any("REDUCE" in str(a) for _, _, a in s)
    early = [list(good[0]), ["1RECV_F0", "1F0", "1REDUCE_GRAD", "1B0", "1SEND_B0"]]
    with pytest.raises(ScheduleFormatError, match=r"rank 1: torch action 1REDUCE_GRAD follows 0 of the stage's 1 "
                                                  r"backwards \(B or W\); it must follow the last"):
        from_torch(early)
    with pytest.raises(ScheduleFormatError, match="rank 0: torch action 1REDUCE_GRAD names a stage this rank does "
                                                  "not compute"):
        from_torch([good[0] + ["1REDUCE_GRAD"], good[1]])
    with pytest.raises(ScheduleFormatError, match="is the stage's second"):
        from_torch([good[0] + ["0REDUCE_GRAD"], good[1]])
