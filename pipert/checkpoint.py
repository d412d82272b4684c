"""Checkpoints of a pipeline: ``torch.distributed.checkpoint`` (DCP) folders keyed by name.

What a checkpoint holds, each entry under a name that does not depend on the schedule or the
rank that wrote it (``unit{u}.{name}`` as ``Pipeline.named_parameters`` names parameters):

- ``model.unit{u}.{key}``: every entry of unit u's ``state_dict()`` (parameters, persistent buffers);
- ``optim.unit{u}.{name}.{state}``: the optimizer state of that parameter (AdamW: ``step``,
  ``exp_avg``, ``exp_avg_sq``), and ``optim.unit{u}.{name}.hyper`` its parameter group's
  hyper-parameters (JSON); ``master.unit{u}.{name}`` the fp32 master copy of a bf16/fp16 parameter;
- ``rng.process{k}``: the CPU (and CUDA) random state of process k;
- ``meta``: a JSON object the caller gives (``pipert train``: step, data seed, batch, model).

Each process writes the units it holds (data-parallel replicas write one copy: DCP keeps the
lowest rank's) and reads the units it holds, so a checkpoint written with one schedule is read by
any other schedule over the same units. Units sharded with ZeRO (stage >= 1) are refused.
"""
from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

__all__ = ["save", "load", "load_units", "resolve", "read_meta", "check_model", "CheckpointError", "step_dir"]


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete or does not fit the model."""


_META = "meta"


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps under ``root``."""
    return Path(root) / f"step-{step:08d}"


def _complete(path: Path) -> bool:
    return (path / ".metadata").is_file()


def resolve(path: str | os.PathLike) -> Path:
    """The checkpoint ``path`` names: the folder itself when it holds one, else its newest
    complete ``step-N`` sub-folder."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path)!r} does not exist or is not a folder")
    if _complete(p):
        return p
    steps = sorted(d for d in p.glob("step-*") if d.is_dir() and _complete(d))
    if not steps:
        raise CheckpointError(f"{str(path)!r} holds no checkpoint: neither a .metadata file (a DCP checkpoint) "
                              f"nor step-N sub-folders with one")
    return steps[-1]


@contextlib.contextmanager
def _quiet():
    """DCP warns that a process without torch.distributed saves or loads alone: that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _metadata(path: Path) -> dict:
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def read_meta(path: str | os.PathLike) -> dict:
    """The ``meta`` object of the checkpoint at ``path`` (read in this process alone)."""
    p = resolve(path)
    if _META not in _metadata(p):
        raise CheckpointError(f"{str(p)!r} is a DCP checkpoint without pipert's 'meta' entry")
    box: dict = {_META: ""}
    with _quiet():
        dcp.load(box, checkpoint_id=str(p), no_dist=True)
    return json.loads(box[_META])


def check_model(path: str | os.PathLike, units: Iterable[nn.Module]) -> None:
    """The checkpoint at ``path`` has every entry of ``units``' state dicts (meta-device units
    do: only shapes and dtypes are compared), with the same shape and dtype, and no other units."""
    p = resolve(path)
    units = list(units)
    saved = {k.split(".")[1] for k in _metadata(p) if k.startswith("model.")}
    extra = sorted(saved - {f"unit{u}" for u in range(len(units))})
    _check_held(p, dict(enumerate(units)), [f"units the model does not have: {', '.join(extra[:3])}"] if extra else [])


def _check_held(path: Path, modules: dict[int, nn.Module], problems: list[str]) -> None:
    """Every entry of ``modules`` (unit -> module) is in the checkpoint with its shape and dtype."""
    md = _metadata(path)
    missing, wrong = [], []
    for u, module in modules.items():
        for k, t in module.state_dict().items():
            key = f"model.unit{u}.{k}"
            m = md.get(key)
            if m is None or not hasattr(m, "size"):
                missing.append(key)
            elif tuple(m.size) != tuple(t.shape) or m.properties.dtype != t.dtype:
                wrong.append(f"{key}: checkpoint {tuple(m.size)} {m.properties.dtype}, model {tuple(t.shape)} "
                             f"{t.dtype}")
    if missing:
        problems = [f"{len(missing)} entries missing (e.g. {', '.join(missing[:3])})"] + problems
    if wrong:
        problems = [f"{len(wrong)} entries differ ({'; '.join(wrong[:3])})"] + problems
    if problems:
        units = len({k.split(".")[1] for k in md if k.startswith("model.")})
        raise CheckpointError(f"checkpoint {str(path)!r} ({units} units) does not fit the model: "
                              f"{'; '.join(problems)}")


# --- what a process holds --------------------------------------------------------------------
def _holdings(pipe) -> tuple[dict[int, nn.Module], list[tuple[Any, dict]]]:
    """The units this process holds (one module per unit) and its optimizers, each with the
    names of its parameters."""
    modules: dict[int, nn.Module] = {}
    optimizers: list[tuple[Any, dict]] = []
    for r in pipe.ranks:
        for u in pipe.schedule.units_owned(r):
            if pipe.schedule.placement.zero_stage(u):
                raise CheckpointError(f"unit {u} is sharded with ZeRO stage {pipe.schedule.placement.zero_stage(u)}; "
                                      f"checkpoints support zero=0 (whole units, replicated or not)")
            if u in modules:  # another replica in this process: the same values
                continue
            modules[u] = pipe.modules[r][u]
            if u in pipe.optimizers[r]:
                optimizers.append((pipe.optimizers[r][u], _param_names({u: modules[u]})))
    return modules, optimizers


def _param_names(modules: dict[int, nn.Module]) -> dict[int, str]:
    """id(parameter) -> ``unit{u}.{name}``."""
    return {id(p): f"unit{u}.{n}" for u, m in modules.items() for n, p in m.named_parameters()}


def _inner(opt) -> tuple[torch.optim.Optimizer, list, list]:
    """(the torch optimizer, the parameters it steps, the model's parameters they stand for)."""
    from .runtime.optim import MasterWeightOptimizer
    if isinstance(opt, MasterWeightOptimizer):
        return opt.inner, opt.masters, opt.params
    params = [p for g in opt.param_groups for p in g["params"]]
    return opt, params, params


def _optim_entries(opt, names: dict[int, str]) -> dict[str, Any]:
    inner, stepped, params = _inner(opt)
    sd = inner.state_dict()
    out: dict[str, Any] = {}
    for idx, state in sd["state"].items():
        for k, v in state.items():
            out[f"optim.{names[id(params[idx])]}.{k}"] = v
    for g in sd["param_groups"]:
        hyper = json.dumps({k: v for k, v in g.items() if k != "params"})
        for idx in g["params"]:
            out[f"optim.{names[id(params[idx])]}.hyper"] = hyper
    if stepped is not params:
        for m, p in zip(stepped, params):
            out[f"master.{names[id(p)]}"] = m.detach()
    return out


def _rng_state() -> dict[str, torch.Tensor]:
    k = dist.get_rank() if dist.is_initialized() else 0
    out = {f"rng.process{k}": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng.process{k}.cuda"] = torch.cuda.get_rng_state()
    return out


def _state(modules: dict[int, nn.Module], optimizers: list[tuple[Any, dict]]) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for u, m in modules.items():
        sd.update({f"model.unit{u}.{k}": v for k, v in m.state_dict().items()})
    for opt, names in optimizers:
        sd.update(_optim_entries(opt, names))
    return sd


# --- save and load ---------------------------------------------------------------------------
def save(pipe, path: str | os.PathLike, meta: dict | None = None) -> Path:
    """Write what this process of ``pipe`` holds to the DCP folder ``path`` (every process of a
    torch.distributed job calls this with the same ``path``); ``meta`` (JSON-able) is stored as
    ``meta``. Returns the folder."""
    modules, optimizers = _holdings(pipe)
    sd = _state(modules, optimizers)
    sd.update(_rng_state())
    sd[_META] = json.dumps(meta or {})
    with _quiet():
        dcp.save(sd, checkpoint_id=str(path), no_dist=not (pipe.backend == "dist" and dist.is_initialized()))
    return Path(path)


def _placeholders(md: dict, prefix: str) -> dict[str, Any]:
    """Empty tensors (or None for objects) for every saved entry ``prefix + name`` (no dot in name)."""
    out: dict[str, Any] = {}
    for key, m in md.items():
        if key.startswith(prefix) and "." not in key[len(prefix):]:
            out[key] = torch.empty(tuple(m.size), dtype=m.properties.dtype) if hasattr(m, "size") else None
    return out


def _load_state(modules: dict[int, nn.Module], optimizers: list[tuple[Any, dict]], path: Path,
                no_dist: bool) -> dict:
    _check_held(path, modules, [])
    md = _metadata(path)
    sd: dict[str, Any] = {f"model.unit{u}.{k}": v for u, m in modules.items() for k, v in m.state_dict().items()}
    for opt, names in optimizers:
        _, stepped, params = _inner(opt)
        for p in params:
            prefix = f"optim.{names[id(p)]}."
            if prefix + "hyper" not in md:
                raise CheckpointError(f"checkpoint {str(path)!r} has no optimizer state for {names[id(p)]}")
            sd.update(_placeholders(md, prefix))
        if stepped is not params:
            sd.update({f"master.{names[id(p)]}": m.detach() for m, p in zip(stepped, params)})
    rng = f"rng.process{dist.get_rank() if dist.is_initialized() and not no_dist else 0}"
    rng = rng if rng in md else "rng.process0"
    sd[rng] = torch.get_rng_state()
    sd[_META] = ""
    with _quiet():
        dcp.load(sd, checkpoint_id=str(path), no_dist=no_dist)
    torch.set_rng_state(sd[rng])
    for opt, names in optimizers:
        _apply_optim(opt, names, sd)
    return json.loads(sd[_META])


def _apply_optim(opt, names: dict[int, str], sd: dict[str, Any]) -> None:
    inner, stepped, params = _inner(opt)
    state: dict[int, dict] = {}
    for idx, p in enumerate(params):
        prefix = f"optim.{names[id(p)]}."
        entries = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
        entries.pop("hyper")
        if entries:
            state[idx] = entries
    groups, idx = [], 0
    for g in inner.param_groups:
        ids = list(range(idx, idx + len(g["params"])))
        idx += len(g["params"])
        hyper = json.loads(sd[f"optim.{names[id(params[ids[0]])]}.hyper"]) if ids else {}
        groups.append({**{k: v for k, v in g.items() if k != "params"}, **hyper, "params": ids})
    inner.load_state_dict({"state": state, "param_groups": groups})
    if stepped is not params:
        with torch.no_grad():
            for m, p in zip(stepped, params):
                p.data = m.detach().to(p.dtype)


def load(pipe, path: str | os.PathLike) -> dict:
    """Read the units this process of ``pipe`` holds, their optimizer state and this process's
    random state from the checkpoint at ``path`` (a DCP folder, or a folder of ``step-N`` ones:
    the newest); every process of a torch.distributed job calls this. Returns its ``meta``."""
    p = resolve(path)
    modules, optimizers = _holdings(pipe)
    return _load_state(modules, optimizers, p, no_dist=not (pipe.backend == "dist" and dist.is_initialized()))


def load_units(units: list[nn.Module], optimizer: torch.optim.Optimizer | None, path: str | os.PathLike) -> dict:
    """Read a pipeline checkpoint into the whole model in this process alone: ``units`` (the
    model partitioned as when it was saved) and ``optimizer`` over their parameters (or None).
    Returns its ``meta``."""
    p = resolve(path)
    modules = dict(enumerate(units))
    optimizers = [(optimizer, _param_names(modules))] if optimizer is not None else []
    return _load_state(modules, optimizers, p, no_dist=True)


# --- pipert train ----------------------------------------------------------------------------
_SAME = ("model", "dtype", "seq", "batch_size", "seed")
"""Settings a resumed ``pipert train`` run must share with the checkpoint: the model and the
data stream (batch ``k`` is a pure function of seed, k, batch size and sequence length)."""


def train_meta(cfg, step: int) -> dict:
    """The ``meta`` of a ``pipert train`` checkpoint taken after ``step`` steps."""
    return {"step": step, **{k: getattr(cfg, k) for k in _SAME},
            "schedule": cfg.schedule, "stages": cfg.stages, "microbatches": cfg.microbatches}


def check_resume(cfg, units: Iterable[nn.Module]) -> Path:
    """The checkpoint ``cfg.resume`` names, after checking it fits the run: the same model
    (``units``, on the meta device, give its shapes), data settings, and a step below ``cfg.steps``."""
    p = resolve(cfg.resume)
    meta = read_meta(p)
    for k in _SAME:
        if meta.get(k) != getattr(cfg, k):
            raise CheckpointError(f"--{k.replace('_', '-')} {getattr(cfg, k)} differs from the checkpoint's "
                                  f"{meta.get(k)!r} ({str(p)!r}); a resumed run keeps the model and the data stream")
    if meta["step"] >= cfg.steps:
        raise CheckpointError(f"--steps {cfg.steps}: the checkpoint {str(p)!r} is already at step {meta['step']}; "
                              f"give --steps > {meta['step']} (the total, counting the steps already run)")
    check_model(p, units)
    return p
