"""The ZeRO stage of every parameter, from what a user or the planner gives.

Forms of ``zero`` (``Pipeline(..., zero=...)``, ``pipert train --zero``):

- a stage 0..3 for every unit, or a list with one entry per unit (a stage, or a tuple with one
  stage per parameter of the unit in ``named_parameters()`` order);
- rules ``"3:mlp,2:attn*.wq*,1"``: ``STAGE:PATTERN`` entries tried in order, the first whose
  pattern the parameter's name contains wins (``*`` and ``?`` are wildcards), the last entry a
  bare ``STAGE`` for every other parameter;
- shares ``"p=0.4,g=0.7"``: in each unit, the largest parameters first (ties: module order), a
  parameter is ZeRO-3 while the elements before it are under ``p`` of the unit's, else ZeRO-2
  while under ``g`` (so ``g >= p`` is the ZeRO-2/3 share, the paper's psi_g / psi), else ZeRO-1.

Everything is decided from names and shapes, so every rank decides the same.
"""
from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Sequence

__all__ = ["resolve_zero", "check_zero_spec", "spec_stages", "SPEC_HELP"]

SPEC_HELP = ("a stage 0-3; rules 'STAGE:PATTERN,...,STAGE' (first pattern contained in the parameter name "
             "wins, the last entry the default stage; e.g. '3:mlp,2:attn,1'); or shares 'p=X,g=Y' "
             "(0 <= p <= g <= 1: ZeRO-3 and ZeRO-2/3 shares of each unit's elements, largest parameters first)")

Params = Sequence[tuple[str, int]]   # (name, element count) of one unit's parameters, module order


def _error(spec: str, what: str) -> ValueError:
    return ValueError(f"zero spec {spec!r}: {what}; allowed: {SPEC_HELP}")


def _stage(spec: str, text: str) -> int:
    if text.strip() not in ("0", "1", "2", "3"):
        raise _error(spec, f"stage {text.strip()!r} is not 0, 1, 2 or 3")
    return int(text)


def _parse(spec: str) -> tuple[str, object]:
    """("rules", [(pattern, stage)..., (None, default)]) or ("shares", (p, g))."""
    entries = [e.strip() for e in spec.split(",")]
    if any(not e for e in entries):
        raise _error(spec, "an entry is empty")
    if all(re.fullmatch(r"[pg]\s*=.*", e) for e in entries):
        shares = {}
        for e in entries:
            key, val = (x.strip() for x in e.split("=", 1))
            if key in shares:
                raise _error(spec, f"share {key!r} given twice")
            try:
                shares[key] = float(val)
            except ValueError:
                raise _error(spec, f"share {key}={val!r} is not a number") from None
        p, g = shares.get("p", 0.0), shares.get("g", shares.get("p", 0.0))
        if not 0.0 <= p <= g <= 1.0:
            raise _error(spec, f"shares p={p}, g={g} must satisfy 0 <= p <= g <= 1")
        return "shares", (p, g)
    rules: list[tuple[str | None, int]] = []
    for k, e in enumerate(entries):
        last = k == len(entries) - 1
        if ":" in e:
            if last:
                raise _error(spec, f"the last entry {e!r} must be a bare default stage")
            stage, pattern = e.split(":", 1)
            if not pattern.strip():
                raise _error(spec, f"entry {e!r} has an empty pattern")
            rules.append((pattern.strip(), _stage(spec, stage)))
        elif not last:
            raise _error(spec, f"entry {e!r} is a bare stage before the last entry")
        else:
            rules.append((None, _stage(spec, e)))
    return "rules", rules


def check_zero_spec(spec: str) -> None:
    """Raise ValueError naming ``spec``, what is wrong and what is allowed, if it does not parse."""
    _parse(spec)


def spec_stages(spec: str) -> set[int]:
    """The ZeRO stages a spec (a stage, rules or shares) can give a parameter, whatever its name
    or size: rules their stages; shares 3 where p > 0, 2 where g > p, 1 where g < 1."""
    if spec.strip() in ("0", "1", "2", "3"):
        return {int(spec)}
    kind, val = _parse(spec)
    if kind == "rules":
        return {stage for _, stage in val}
    p, g = val
    return {s for s, on in ((3, p > 0), (2, g > p), (1, g < 1)) if on}


def _by_rules(rules: list, params: Params) -> tuple[int, ...]:
    out = []
    for name, _ in params:
        out.append(next(s for pat, s in rules if pat is None or fnmatchcase(name, f"*{pat}*")))
    return tuple(out)


def _by_shares(p: float, g: float, params: Params) -> tuple[int, ...]:
    total = sum(n for _, n in params)
    order = sorted(range(len(params)), key=lambda i: (-params[i][1], i))
    out = [1] * len(params)
    before = 0
    for i in order:
        out[i] = 3 if before < p * total else 2 if before < g * total else 1
        before += params[i][1]
    return tuple(out)


def resolve_zero(zero: int | str | Sequence, units: Sequence[Params]) -> tuple[list, list | None]:
    """Per unit, a ZeRO stage or a tuple of stages per parameter, and per unit the parameters'
    element counts (None where the unit has one stage); see the module doc for ``zero``."""
    U = len(units)
    if isinstance(zero, str):
        s = zero.strip()
        if s in ("0", "1", "2", "3"):
            return [int(s)] * U, None
        kind, parsed = _parse(zero)
        default = parsed[-1][1] if kind == "rules" else 1   # the stage of a unit without parameters
        per = [(_by_rules(parsed, ps) if kind == "rules" else _by_shares(*parsed, ps)) if ps else default
               for ps in units]
    elif isinstance(zero, int) and not isinstance(zero, bool):
        if zero not in (0, 1, 2, 3):
            raise ValueError(f"zero={zero!r}: allowed: {SPEC_HELP}")
        return [zero] * U, None
    else:
        per = list(zero)
        if len(per) != U:
            raise ValueError(f"zero: {len(per)} entries for {U} units; give one per unit (a stage or a tuple of "
                             f"stages per parameter), or {SPEC_HELP}")
        for u, z in enumerate(per):
            if isinstance(z, (list, tuple)):
                if len(z) != len(units[u]) or any(x not in (0, 1, 2, 3) for x in z):
                    raise ValueError(f"zero of unit {u}: {list(z)} must give a stage 0..3 for each of its "
                                     f"{len(units[u])} parameters")
            elif z not in (0, 1, 2, 3):
                raise ValueError(f"zero of unit {u}: stage {z!r} is not 0, 1, 2 or 3")
    zeros, numel = [], []
    for u, z in enumerate(per):
        z = tuple(z) if isinstance(z, (list, tuple)) else z
        if isinstance(z, tuple) and not z:
            z = 0
        if isinstance(z, tuple) and len(set(z)) == 1:
            z = z[0]
        zeros.append(z)
        numel.append(tuple(n for _, n in units[u]) if isinstance(z, tuple) else None)
    return zeros, (numel if any(n is not None for n in numel) else None)
