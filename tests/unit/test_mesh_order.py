"""--mesh-order: the one map (d, s, t) -> global rank (pipert.comm.mesh.ProcessLayout) and its refusals."""
import itertools

import pytest
import torch

from pipert.binding import RuntimeOptions
from pipert.comm.mesh import DEFAULT_MESH_ORDER, MESH_DIMS, ProcessLayout, parse_mesh_order
from pipert.train import TrainConfig, run_train

ORDERS = list(itertools.permutations(MESH_DIMS))
SHAPES = [(1, 1, 1), (2, 1, 2), (3, 2, 1), (2, 3, 4), (4, 2, 3)]  # (P, D, T)


def _all(layout):
    return [(d, s, t) for d in range(layout.dp) for s in range(layout.stages) for t in range(layout.tp)]


@pytest.mark.parametrize("order", ORDERS, ids=",".join)
@pytest.mark.parametrize("P,D,T", SHAPES)
def test_every_process_once_and_coords_invert(order, P, D, T):
    layout = ProcessLayout(P, D, T, order)
    ranks = [layout.global_rank(*c) for c in _all(layout)]
    assert sorted(ranks) == list(range(P * D * T))
    for c, g in zip(_all(layout), ranks):
        d, s, t = c
        assert layout.coords(g) == c
        assert layout.program_rank(g) == d * P + s and layout.tp_rank(g) == t
        assert layout.process(d * P + s, t) == g
        assert layout.canonical(g) == (d * P + s) * T + t  # the same process name under every order


@pytest.mark.parametrize("order", ORDERS, ids=",".join)
@pytest.mark.parametrize("P,D,T", SHAPES)
def test_global_rank_is_init_device_mesh_numbering(order, P, D, T):
    """init_device_mesh numbers a mesh of shape mesh_dims() row-major: the process at each mesh
    coordinate is the layout's global rank of it ("tp" left out at T = 1)."""
    layout = ProcessLayout(P, D, T, order)
    names, shape = layout.mesh_dims()
    assert names == tuple(n for n in order if n != "tp" or T > 1)
    grid = torch.arange(layout.size).reshape(shape)
    for d, s, t in _all(layout):
        at = {"dp": d, "pp": s, "tp": t}
        assert grid[tuple(at[n] for n in names)].item() == layout.global_rank(d, s, t)


@pytest.mark.parametrize("P,D,T", SHAPES)
def test_default_order_is_r_times_T_plus_t(P, D, T):
    layout = ProcessLayout(P, D, T)
    assert layout.order == DEFAULT_MESH_ORDER == ("dp", "pp", "tp")
    assert all(layout.global_rank(d, s, t) == (d * P + s) * T + t for d, s, t in _all(layout))


def test_tp_last_keeps_each_tp_group_consecutive_and_tp_first_strides_it():
    for order in ORDERS:
        layout = ProcessLayout(2, 3, 4, order)
        group = [layout.global_rank(1, 1, t) for t in range(4)]
        consecutive = group == list(range(group[0], group[0] + 4))
        assert consecutive == (order[-1] == "tp"), (order, group)
    assert [ProcessLayout(2, 3, 4, "tp,pp,dp").global_rank(1, 1, t) for t in range(4)] == [4, 10, 16, 22]


def test_groups_across_replicas_and_stages_need_dp_outside_pp():
    """A collective's processes must be in program-rank order (torch orders members by global
    rank): a replica group always is; a group over two stages of two replicas only with dp
    outside pp."""
    for order in ORDERS:
        layout = ProcessLayout(2, 2, 2, order)
        assert layout.group([3, 1], 1) == [layout.process(1, 1), layout.process(3, 1)]  # stage 1's replicas
        if order.index("dp") < order.index("pp"):
            assert layout.group([0, 1, 2, 3], 0) == sorted(layout.group([0, 1, 2, 3], 0))
        else:
            with pytest.raises(ValueError, match=r"program ranks \[0, 1, 2, 3\] run on global ranks .*mesh order "):
                layout.group([0, 1, 2, 3], 0)
            tp0 = [g for g in range(layout.size) if layout.tp_rank(g) == 0]
            assert sorted(layout.group([0, 1, 2, 3], 0, ordered=False)) == tp0


@pytest.mark.parametrize("value,why", [("dp,pp", "each of dp, pp, tp must appear exactly once"),
                                       ("dp,pp,tp,dp", ".*exactly once"), ("dp,pp,xp", "unknown name.*'xp'"),
                                       ("", "unknown name"), ("pp,dp,tp,", "unknown name")])
def test_bad_orders_name_flag_value_and_allowed(value, why):
    with pytest.raises(ValueError, match=f"--mesh-order {value!r}: {why}.*allowed: a permutation of dp,pp,tp"):
        parse_mesh_order(value)
    with pytest.raises(ValueError, match=f"--mesh-order {value!r}: {why}"):
        TrainConfig(stages=2, tp=2, backend="gloo", mesh_order=value).validate()
    with pytest.raises(ValueError, match="mesh_order"):
        RuntimeOptions(tp=2, mesh_order=value)


def test_spaces_allowed_and_runtime_options_normalise():
    assert parse_mesh_order(" tp , pp,dp") == ("tp", "pp", "dp")
    assert RuntimeOptions(mesh_order="pp,dp,tp").mesh_order == ("pp", "dp", "tp")


def test_local_backend_refuses_a_non_default_order_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="--mesh-order 'tp,pp,dp': --backend local runs every rank .* allowed "
                                         "there: dp,pp,tp"):
        run_train(TrainConfig(stages=2, steps=1, backend="local", mesh_order="tp,pp,dp", save=str(tmp_path / "x")))
    assert not (tmp_path / "x").exists()
