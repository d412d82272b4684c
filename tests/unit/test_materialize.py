"""Units built on the meta device and materialised one by one equal the units of a full build."""
import pytest
import torch

from pipert.models import LlamaConfig, LlamaModel, build_units, materialize, model_config, partition
from pipert.models.llama import init_parameters


def _tensors(unit):
    return list(unit.named_parameters()) + list(unit.named_buffers())


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("num_units, fine", [(4, False), (3, False), (12, True)])
def test_each_materialised_unit_equals_the_full_build_bit_for_bit(dtype, num_units, fine):
    full = partition(LlamaModel(model_config("tiny", dtype=dtype), seed=5), num_units, fine=fine)
    for u in range(num_units):
        units = build_units("tiny", num_units, seed=5, keep=[u], fine=fine, dtype=dtype)
        mine, ref = dict(_tensors(units[u])), dict(_tensors(full[u]))
        assert mine.keys() == ref.keys()
        for name, t in ref.items():
            assert mine[name].dtype == t.dtype and torch.equal(mine[name], t), (u, name)
        for v, other in enumerate(units):
            if v != u:
                assert all(t.is_meta for _, t in _tensors(other)), v


def test_same_values_as_a_float32_build_cast_afterwards():
    """What ``pipert train`` did before units were materialised alone: build in float32, cast."""
    for dtype in (torch.bfloat16, torch.float64):
        cast = partition(LlamaModel(model_config("tiny"), seed=1).to(dtype), 4)
        alone = build_units("tiny", 4, seed=1, dtype=str(dtype).removeprefix("torch."))
        for a, b in zip(cast, alone):
            for (n, p), (_, q) in zip(_tensors(a), _tensors(b)):
                assert p.dtype == q.dtype and torch.equal(p, q), n


def test_init_of_a_parameter_depends_on_its_name_not_on_the_others():
    model = LlamaModel(LlamaConfig.preset("tiny"), seed=3)
    named = dict(model.named_parameters())
    alone = torch.empty_like(named["layers.2.mlp.w2.weight"])
    init_parameters([("layers.2.mlp.w2.weight", alone)], seed=3, layers=4)
    assert torch.equal(alone, named["layers.2.mlp.w2.weight"])
    other = torch.empty_like(alone)
    init_parameters([("layers.1.mlp.w2.weight", other)], seed=3, layers=4)
    assert not torch.equal(other, alone)


def test_meta_build_holds_no_storage_and_materialize_allocates_one_unit():
    units = build_units("small", 4, seed=0, keep=[])
    assert all(t.is_meta for u in units for _, t in _tensors(u))
    materialize(units[2], model_config("small"), seed=0)
    assert all(t.device.type == "cpu" for _, t in _tensors(units[2]))
    assert all(t.is_meta for u in (units[0], units[1], units[3]) for _, t in _tensors(u))


def test_build_units_errors():
    with pytest.raises(ValueError, match="unit 4 to materialise is not one of the 4 units"):
        build_units("tiny", 4, keep=[4])
    with pytest.raises(ValueError, match="overrides apply to a preset name"):
        build_units(model_config("tiny"), 4, dtype="float64")
