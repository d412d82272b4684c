"""send_early places every SEND exactly where the list-insertion definition does (the reference
below: insert each SEND into the rank's list right after its value's last writer or its peer's
last SEND), on every registered family and on HelixPipe's expanded folds."""
import pytest
from hypothesis import given, settings, strategies as st

from pipert.ir.action import Op
from pipert.ir.passes import _values, expand_folds, send_early, split_folds
from pipert.ir.semantics import Semantics
from pipert.schedules import available, build_schedule, family
from pipert.schedules.registry import PipelineConfig


def _reference(schedule) -> list[list]:
    sem = Semantics.of(schedule)
    out = []
    for r, acts in enumerate(schedule.actions):
        new: list = []
        last_send_at: dict[int, int] = {}
        writer_at: dict[tuple, int] = {}
        for a in acts:
            if a.op is Op.SEND:
                pos = max([writer_at.get(k, -1) for k in _values(a)] + [last_send_at.get(a.peer, -1)]) + 1
                new.insert(pos, a)
                for index in (writer_at, last_send_at):
                    for k, v in index.items():
                        if v >= pos:
                            index[k] = v + 1
                last_send_at[a.peer] = pos
                continue
            new.append(a)
            if a.sub is None or a.sub[0] == a.sub[1] - 1:
                for key in sem.writes(a, r):
                    writer_at[key] = len(new) - 1
        out.append(new)
    return out


def _built(name: str, p: int, m: int, v: int):
    try:
        family(name).validate(PipelineConfig(p, m, v))
        opts = {"ranks_per_node": 2} if "ranks_per_node" in (family(name).options() or ()) else {}
        return build_schedule(name, stages=p, microbatches=m, chunks=v, **opts)
    except (ValueError, TypeError) as e:
        pytest.skip(f"{name} P={p} M={m} V={v}: {e}")


@pytest.mark.parametrize("name", [n for n in available() if not n.endswith("optimal")])
def test_every_family_matches_the_reference(name):
    fam = family(name)
    v = max(fam.min_chunks, min(2, fam.max_chunks or 2))
    s = _built(name, 4, 8, v)
    assert send_early(s).actions == _reference(s)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]))
def test_helixpipe_expanded_folds_match_the_reference(p, groups, v):
    """The asynchronous two-fold: the synchronous one's folds split, then send_early."""
    sync = build_schedule("helixpipe-2fold", stages=p, microbatches=2 * p * groups, chunks=v, asynchronous=False)
    split = split_folds(sync)
    assert split is not sync
    assert expand_folds(sync).actions == _reference(split)
