"""Checkpoints of a pipeline: ``torch.distributed.checkpoint`` (DCP) folders keyed by name.

What a checkpoint holds, each entry under a name that does not depend on the schedule or the
rank that wrote it (``unit{u}.{name}`` as ``Pipeline.named_parameters`` names parameters):

- ``model.unit{u}.{key}``: every entry of unit u's ``state_dict()`` (parameters, persistent buffers);
- ``optim.unit{u}.{name}.{state}``: the optimizer state of that parameter (AdamW: ``step``,
  ``exp_avg``, ``exp_avg_sq``), and ``optim.unit{u}.{name}.hyper`` its parameter group's
  hyper-parameters (JSON); ``master.unit{u}.{name}`` the fp32 master copy of a bf16/fp16 parameter;
- ``rng.process{k}``: the CPU (and CUDA) random state of process k = ``r*T + t`` (program rank
  r, tp coordinate t: the same process whatever the mesh order);
- ``meta``: a JSON object the caller gives (``pipert train``: step, data seed, batch, model).

Folders (``DIR/step-N``, completeness, the run that owns DIR) are :mod:`pipert.ckptfolder`'s.

Each process writes the units it holds (data-parallel replicas offer the same entries and DCP
writes one copy of each) and reads the units it holds, so a checkpoint written with one schedule is read by
any other schedule over the same units. A ZeRO-sharded unit (stage >= 1) is written whole: its
holders gather the flat shards of its weights and optimizer state and DCP keeps one copy; on
load each holder takes its shard of the whole entries, so ZeRO and whole-unit runs read each
other's checkpoints. A tensor-parallel shard is written and read as its slice of the whole
entry (:mod:`pipert.ckpttp`), so runs at any T read each other's checkpoints.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from .ckptfolder import CheckpointError, check_files, resolve, step_dir
from .ckpttp import TPLayout, layout_of

__all__ = ["save", "load", "load_units", "resolve", "read_meta", "read_hyper", "check_model", "CheckpointError",
           "step_dir"]


_META = "meta"


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


def read_hyper(path: str | os.PathLike) -> dict:
    """The optimizer hyper-parameters (``lr``, ...) of the checkpoint's first parameter group
    entry, read in this process alone ({} without optimizer state)."""
    p = resolve(path)
    key = next((k for k in sorted(_metadata(p)) if k.startswith("optim.") and k.endswith(".hyper")), None)
    if key is None:
        return {}
    box: dict = {key: ""}
    with _quiet():
        dcp.load(box, checkpoint_id=str(p), no_dist=True)
    return json.loads(box[key])


def check_model(path: str | os.PathLike, units: Iterable[nn.Module]) -> None:
    """The checkpoint at ``path`` has every entry of ``units``' state dicts (meta-device units
    do: only shapes and dtypes are compared), with the same shape and dtype, and no other units."""
    p = resolve(path)
    units = list(units)
    saved = {k.split(".")[1] for k in _metadata(p) if k.startswith("model.")}
    extra = sorted(saved - {f"unit{u}" for u in range(len(units))})
    _check_held(p, dict(enumerate(units)), [f"units the model does not have: {', '.join(extra[:3])}"] if extra else [])


def _check_held(path: Path, modules: dict[int, nn.Module], problems: list[str], tp: TPLayout = TPLayout()) -> None:
    """Every entry of ``modules`` (unit -> module; ``tp``: their TP layout) is in the checkpoint
    with its (whole) shape and dtype."""
    md = _metadata(path)
    missing, wrong = [], []
    for u, module in modules.items():
        for k, t in module.state_dict().items():
            key = f"model.unit{u}.{k}"
            m = md.get(key)
            if m is None or not hasattr(m, "size"):
                missing.append(key)
            elif tuple(m.size) != tp.global_shape(key, t.shape) or m.properties.dtype != t.dtype:
                wrong.append(f"{key}: checkpoint {tuple(m.size)} {m.properties.dtype}, model "
                             f"{tp.global_shape(key, t.shape)} {t.dtype}")
    if missing:
        problems = [f"{len(missing)} entries missing (e.g. {', '.join(missing[:3])})"] + problems
    if wrong:
        problems = [f"{len(wrong)} entries differ ({'; '.join(wrong[:3])})"] + problems
    if problems:
        units = len({k.split(".")[1] for k in md if k.startswith("model.")})
        raise CheckpointError(f"checkpoint {str(path)!r} ({units} units) does not fit the model: "
                              f"{'; '.join(problems)}")


# --- what a process holds --------------------------------------------------------------------
def _holdings(pipe) -> tuple[dict[int, nn.Module], list[tuple[Any, dict]], list[tuple[int, int]], list[tuple]]:
    """What this process holds: one module per whole unit, their optimizers (each with the names
    of its parameters), every (rank, unit) pair of a ZeRO-sharded unit, and (rank, unit, first
    rank, whether the module is copied too) of each further replica of a whole unit (or of the
    stage-0 optimizer of a unit with per-parameter stages) in this process (the local backend)."""
    modules: dict[int, nn.Module] = {}
    first: dict[int, int] = {}
    optimizers: list[tuple[Any, dict]] = []
    sharded: list[tuple[int, int]] = []
    copies: list[tuple] = []
    pl = pipe.program.placement
    for r in pipe.ranks:
        for u in pipe.program.units_owned(r):
            if any(z for _, z in pl.zero_parts(u)):
                sharded.append((r, u))
                if u not in pipe.optimizers[r]:
                    continue
                # the stage-0 class of a unit with per-parameter stages: one optimizer is read and
                # written, further replicas in this process copy it
                if u in first:
                    copies.append((r, u, first[u], False))
                else:
                    first[u] = r
                    optimizers.append((pipe.optimizers[r][u], _param_names({u: pipe.modules[r][u]})))
            elif u in modules:
                copies.append((r, u, first[u], True))
            else:
                modules[u], first[u] = pipe.modules[r][u], r
                if u in pipe.optimizers[r]:
                    optimizers.append((pipe.optimizers[r][u], _param_names({u: modules[u]})))
    return modules, optimizers, sharded, copies


def _copy_replicas(pipe, copies: list[tuple]) -> None:
    """Further replicas in this process take the first one's weights and optimizer state."""
    for r, u, src, whole in copies:
        if whole:
            pipe.modules[r][u].load_state_dict(pipe.modules[src][u].state_dict())
        if u in pipe.optimizers[src]:
            pipe.optimizers[r][u].load_state_dict(copy.deepcopy(pipe.optimizers[src][u].state_dict()))


def _param_names(modules: dict[int, nn.Module]) -> dict[int, str]:
    """id(parameter) -> ``unit{u}.{name}``."""
    return {id(p): f"unit{u}.{n}" for u, m in modules.items() for n, p in m.named_parameters()}


def _inner(opt) -> tuple[torch.optim.Optimizer, list, list]:
    """(the torch optimizer, the parameters it steps, the model's parameters they stand for)."""
    from .exec.optim import MasterWeightOptimizer
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


def _rng(process: int) -> dict[str, tuple[Callable, Callable]]:
    """Entry name -> (getter, setter) of the random states of process ``process``: the CPU
    generator, and this process's current CUDA device's when CUDA is in use."""
    out: dict[str, tuple[Callable, Callable]] = {f"rng.process{process}": (torch.get_rng_state, torch.set_rng_state)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng.process{process}.cuda"] = (torch.cuda.get_rng_state, torch.cuda.set_rng_state)
    return out


def _process(pipe, no_dist: bool) -> int:
    """This process's number k in ``rng.process{k}``: ``r*T + t`` of its program rank r and tp
    coordinate t, whatever the mesh order (``pipert.comm.mesh.ProcessLayout.canonical``)."""
    return pipe.layout.canonical(dist.get_rank()) if dist.is_initialized() and not no_dist else 0


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
    modules, optimizers, sharded, _ = _holdings(pipe)
    sd = _state(modules, optimizers)
    sd.update(_zero_entries(pipe, sharded))
    no_dist = not (pipe.backend == "dist" and dist.is_initialized())
    sd.update({k: get() for k, (get, _) in _rng(_process(pipe, no_dist)).items()})
    sd[_META] = json.dumps(meta or {})
    sd = layout_of(pipe).wrap(sd)
    with _quiet(), _named_failure("writing", Path(path), sd):
        dcp.save(sd, checkpoint_id=str(path), no_dist=no_dist)
    return Path(path)


@contextlib.contextmanager
def _named_failure(doing: str, path: Path, sd: dict):
    """DCP's failures (a CheckpointException is a BaseException, which error files miss) as a
    CheckpointError naming the folder, the files of the entries in ``sd`` and the cause; a
    truncated or missing file is named by :func:`pipert.ckptfolder.check_files`."""
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        yield
    except CheckpointException as e:
        if doing == "reading":
            check_files(path)
        causes = [f"{type(exc).__name__}: {exc}".rstrip(": ") for exc, _ in e.failures.values()]
        files = ""
        if (path / ".metadata").is_file():
            names = sorted({s.relative_path for i, s in _storage(path).items() if i.fqn in sd})
            files = f" (files {', '.join(names[:4])}{' ...' if len(names) > 4 else ''})"
        raise CheckpointError(f"{doing} checkpoint {str(path)!r}{files} failed: "
                              f"{'; '.join(causes) or type(e).__name__}") from None


def _storage(path: Path) -> dict:
    return dcp.FileSystemReader(str(path)).read_metadata().storage_data


def _placeholders(md: dict, prefix: str, tp: TPLayout) -> dict[str, Any]:
    """Empty tensors (this process's TP slice of each) or None for objects, for every saved entry
    ``prefix + name`` (no dot in name)."""
    out: dict[str, Any] = {}
    for key, m in md.items():
        if key.startswith(prefix) and "." not in key[len(prefix):]:
            out[key] = torch.empty(tp.local_shape(key, m.size), dtype=m.properties.dtype) if hasattr(m, "size") \
                else None
    return out


def _load_state(modules: dict[int, nn.Module], optimizers: list[tuple[Any, dict]], path: Path,
                no_dist: bool, extra: dict[str, Any] | None = None,
                hyper: dict | None = None, tp: TPLayout = TPLayout(), me: int = 0) -> tuple[dict, dict[str, Any]]:
    """Load the entries of ``modules`` (in place), ``optimizers`` (their hyper-parameters the
    checkpoint's, then ``hyper``'s), the random state and ``extra`` (placeholders, filled in
    the returned state dict), each sharded entry as this process's slice (``tp``), the random
    state of process ``me`` (:func:`_process`); returns (meta, state dict)."""
    md = _metadata(path)
    sd: dict[str, Any] = {f"model.unit{u}.{k}": v for u, m in modules.items() for k, v in m.state_dict().items()}
    sd.update(extra or {})
    for opt, names in optimizers:
        _, stepped, params = _inner(opt)
        for p in params:
            prefix = f"optim.{names[id(p)]}."
            if prefix + "hyper" not in md:
                raise CheckpointError(f"checkpoint {str(path)!r} has no optimizer state for {names[id(p)]}")
            sd.update(_placeholders(md, prefix, tp))
        if stepped is not params:
            sd.update({f"master.{names[id(p)]}": m.detach() for m, p in zip(stepped, params)})
    rng = {}  # this process's random states, or process 0's when the writing job had fewer processes
    for key, (get, put) in _rng(me).items():
        src = key if key in md else key.replace(f"rng.process{me}", "rng.process0", 1)
        if src in md:
            rng[src], sd[src] = put, get()
    sd[_META] = ""
    sd = tp.wrap(sd)
    with _quiet(), _named_failure("reading", path, sd):
        dcp.load(sd, checkpoint_id=str(path), no_dist=no_dist)
    sd = tp.unwrap(sd)
    for src, put in rng.items():
        put(sd[src])
    for opt, names in optimizers:
        _apply_optim(opt, names, sd, hyper or {})
    return json.loads(sd[_META]), sd


def _apply_optim(opt, names: dict[int, str], sd: dict[str, Any], override: dict) -> None:
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
        groups.append({**{k: v for k, v in g.items() if k != "params"}, **hyper, **override, "params": ids})
    inner.load_state_dict({"state": state, "param_groups": groups})
    if stepped is not params:
        with torch.no_grad():
            for m, p in zip(stepped, params):
                p.data = m.detach().to(p.dtype)


def load(pipe, path: str | os.PathLike, hyper: dict | None = None) -> dict:
    """Read the units this process of ``pipe`` holds, their optimizer state and this process's
    random state from the checkpoint at ``path`` (a DCP folder, or a folder of ``step-N`` ones:
    the newest); every process of a torch.distributed job calls this. The optimizers take the
    checkpoint's hyper-parameters, then ``hyper``'s (e.g. ``{"lr": 1e-4}``). Returns its ``meta``."""
    p = resolve(path)
    check_files(p)
    modules, optimizers, sharded, copies = _holdings(pipe)
    tp = layout_of(pipe)
    _check_held(p, {**modules, **{u: pipe.modules[r][u] for r, u in sharded}}, [], tp)
    no_dist = not (pipe.backend == "dist" and dist.is_initialized())
    meta, sd = _load_state(modules, optimizers, p, no_dist, _zero_placeholders(pipe, sharded, _metadata(p), tp), hyper,
                           tp, _process(pipe, no_dist))
    _apply_zero(pipe, sharded, sd, hyper or {})
    _copy_replicas(pipe, copies)
    return meta


def load_units(units: list[nn.Module], optimizer: torch.optim.Optimizer | None, path: str | os.PathLike,
               hyper: dict | None = None) -> dict:
    """Read a pipeline checkpoint into the whole model in this process alone: ``units`` (the
    model partitioned as when it was saved) and ``optimizer`` over their parameters (or None;
    hyper-parameters as :func:`load`). Returns its ``meta``."""
    p = resolve(path)
    check_files(p)
    modules = dict(enumerate(units))
    optimizers = [(optimizer, _param_names(modules))] if optimizer is not None else []
    _check_held(p, modules, [])
    return _load_state(modules, optimizers, p, no_dist=True, hyper=hyper)[0]


# --- ZeRO-sharded units ----------------------------------------------------------------------
def _gather(pipe, rank: int, u: int, shard_of: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """Unit u's flat (padded) tensor from the shards ``shard_of(state)`` of its holders (in a
    torch.distributed job every holder calls this: an ALLGATHER over the unit's group)."""
    st = pipe._executors[rank].state
    group = st.group(u)
    if pipe.backend == "local":
        return torch.cat([shard_of(pipe._executors[h].state) for h in group])
    mine = shard_of(st).contiguous()
    whole = mine.new_empty(mine.numel() * len(group))
    pipe._executors[rank].transport.collective("ALLGATHER", mine, group, None, out=whole).wait(pipe.timeout)
    return whole


def _names(st, module: nn.Module, u: int, zc: int | None) -> list[str]:
    """Names of the parameters of unit u's ZeRO class ``zc`` (None: all), in module order."""
    ids = {id(p) for p in st.params(u, zc)}
    return [n for n, p in module.named_parameters() if id(p) in ids]


def _pieces(module: nn.Module, u: int, flat: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """``unit{u}.{name}`` -> that parameter's piece of the flat tensor of the parameters ``names``."""
    params, out, off = dict(module.named_parameters()), {}, 0
    for n in names:
        p = params[n]
        out[f"unit{u}.{n}"] = flat[off:off + p.numel()].view(p.shape).clone()
        off += p.numel()
    return out


def _shard_state(st, part: tuple) -> dict[str, Any]:
    opt = st.shard_opt.get(part)
    if opt is None:
        return {}
    if not isinstance(opt, torch.optim.Optimizer):
        raise CheckpointError(f"unit {part[0]} is sharded with ZeRO and steps fp32 master copies (bf16/fp16 "
                              f"weights); checkpoints of such units are not supported: use zero=0 or float32/float64")
    return opt.state.get(st.shards[part], {})


def _zero_entries(pipe, sharded: list[tuple[int, int]]) -> dict[str, Any]:
    """Whole-unit entries (as a zero=0 unit writes them) of the ZeRO units this process holds;
    a unit with per-parameter stages writes each ZeRO class's parameters from its shards."""
    out: dict[str, Any] = {}
    for u, r in sorted(dict((u, r) for r, u in reversed(sharded)).items()):  # one holder per unit
        st, module = pipe._executors[r].state, pipe.modules[r][u]
        out.update({f"model.unit{u}.{k}": v for k, v in module.state_dict().items()
                    if k not in dict(module.named_parameters())})  # buffers are whole on every holder
        for zc, z in st.parts[u]:
            names, part = _names(st, module, u, zc), (u, zc)
            if z == 0:  # whole on every holder; its optimizer is the owner's (see _holdings)
                out.update({f"model.unit{u}.{n}": p.detach() for n, p in module.named_parameters() if n in names})
                continue
            weights = _gather(pipe, r, u, lambda s: s.shards[part].detach())
            out.update({f"model.{k}": v for k, v in _pieces(module, u, weights, names).items()})
            state, n = _shard_state(st, part), st.shards[part].numel()
            for key in sorted(state):
                v = state[key]
                if isinstance(v, torch.Tensor) and v.numel() == n and v.dim() == 1:
                    whole = _gather(pipe, r, u, lambda s: _shard_state(s, part)[key])
                    out.update({f"optim.{k}.{key}": t for k, t in _pieces(module, u, whole, names).items()})
                else:  # per-shard scalars (AdamW's step) are the same on every holder
                    out.update({f"optim.unit{u}.{name}.{key}": v for name in names})
            if part in st.shard_opt:
                hyper = json.dumps({k: v for k, v in st.shard_opt[part].param_groups[0].items() if k != "params"})
                out.update({f"optim.unit{u}.{name}.hyper": hyper for name in names})
    return out


def _zero_placeholders(pipe, sharded: list[tuple[int, int]], md: dict, tp: TPLayout) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r, u in sharded:
        module, st = pipe.modules[r][u], pipe._executors[r].state
        params = dict(module.named_parameters())
        for k, v in module.state_dict().items():
            out[f"model.unit{u}.{k}"] = torch.empty(v.shape, dtype=v.dtype, device=v.device) if k in params else v
        for zc, z in st.parts[u]:
            for name in (_names(st, module, u, zc) if z else ()):  # stage 0: the owner's optimizer loads it
                out.update(_placeholders(md, f"optim.unit{u}.{name}.", tp))
    return out


def _apply_zero(pipe, sharded: list[tuple[int, int]], sd: dict[str, Any], override: dict) -> None:
    """Each holder's shard of the whole entries: weights, optimizer state (hyper-parameters the
    checkpoint's, then ``override``'s); ZeRO-1/2 holders also keep the whole weights in the module."""
    for r, u in sharded:
        st, module = pipe._executors[r].state, pipe.modules[r][u]
        for zc, z in st.parts[u]:
            _apply_part(st, module, u, zc, z, sd, override)


def _apply_part(st, module: nn.Module, u: int, zc: int | None, z: int, sd: dict[str, Any], override: dict) -> None:
    names = _names(st, module, u, zc)
    if not names:
        return
    part = (u, zc)
    with torch.no_grad():
        if z < 3:
            for n, p in module.named_parameters():
                if n in names:
                    p.copy_(sd[f"model.unit{u}.{n}"])
    if z == 0:
        return
    k, _ = st.position(u)
    size = st.shards[part].numel()

    def shard(key: str) -> torch.Tensor:
        flat = torch.cat([sd[key.format(name=n)].reshape(-1) for n in names])
        return st._padded(u, flat)[k * size:(k + 1) * size]

    with torch.no_grad():
        st.shards[part].copy_(shard(f"model.unit{u}.{{name}}"))
    opt = st.shard_opt.get(part)
    if opt is None:
        return
    _shard_state(st, part)  # refuses master-weight optimizers
    prefix = f"optim.unit{u}.{names[0]}."
    keys = [key[len(prefix):] for key in sd if key.startswith(prefix) and "." not in key[len(prefix):]]
    state = {}
    for key in keys:
        if key == "hyper":
            continue
        first = sd[prefix + key]
        whole = isinstance(first, torch.Tensor) and first.shape == dict(module.named_parameters())[names[0]].shape
        # every holder gets its own tensors: optimizers update their state in place
        state[key] = shard(f"optim.unit{u}.{{name}}.{key}").clone() if whole else copy.deepcopy(first)
    hyper = json.loads(sd[prefix + "hyper"])
    group = {**{a: b for a, b in opt.param_groups[0].items() if a != "params"}, **hyper, **override, "params": [0]}
    opt.load_state_dict({"state": {0: state} if state else {}, "param_groups": [group]})
