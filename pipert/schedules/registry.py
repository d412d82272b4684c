"""The schedule registry: names -> generator families, plus the common config.

A *family* is a pure function ``build(config, **options) -> Schedule`` together with what
it accepts (chunk range, constraints on P/M/V, extra keyword options) and what it emits
(whether backward is split into D and W). Families register themselves by name; callers
go through :func:`build_schedule`, which validates the inputs before building.

Every schedule a registered family builds has ``meta["family"]``, ``meta["stages"]``,
``meta["chunks"]`` and ``meta["split_backward"]``; its ``num_units`` is ``stages * chunks``
for the activation-passing families in this package.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..ir import Action, Op, Placement, Schedule, add_optimizer_steps, lower
from ..ir.lowering import order_recvs_by_send

__all__ = ["PipelineConfig", "Family", "register", "available", "family", "build_schedule", "assemble",
           "require_chunks", "require_microbatches_at_least_stages", "order_recvs_by_send", "check_dp_option"]


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (got {value!r})")


@dataclass(frozen=True)
class PipelineConfig:
    """The shape of one pipeline-parallel training step; validated on construction."""

    stages: int
    """P: number of pipeline ranks (devices); >= 1."""
    microbatches: int
    """M: micro-batches per optimizer step; >= 1."""
    chunks: int = 1
    """V: model chunks held by each rank; the model is cut into P*V units; >= 1."""

    def __post_init__(self) -> None:
        _positive_int("stages", self.stages)
        _positive_int("microbatches", self.microbatches)
        _positive_int("chunks", self.chunks)

    @property
    def units(self) -> int:
        """Number of units (chunks of layers) in the model: P*V."""
        return self.stages * self.chunks


@dataclass(frozen=True)
class Family:
    """A registered schedule family."""

    name: str
    """Registry key, e.g. ``"1f1b"``."""
    build: Callable[..., Schedule]
    """Pure generator ``build(config: PipelineConfig, **options) -> Schedule``."""
    description: str
    """One line for listings (CLI help)."""
    split_backward: bool = False
    """True if the schedules use D (input-grad) and W (weight-grad) instead of B."""
    default_chunks: int = 1
    """V used when the caller passes ``chunks=None``."""
    min_chunks: int = 1
    """Smallest V accepted."""
    max_chunks: int | None = 1
    """Largest V accepted; None = unbounded."""
    check: Callable[[PipelineConfig], None] | None = None
    """Raises ValueError (naming the value and what is allowed) for configs it cannot build."""
    constraints: str = ""
    """Human-readable summary of the constraints ``check`` enforces."""

    def options(self) -> tuple[str, ...] | None:
        """Extra keyword options ``build`` accepts; None if it takes any (``**kwargs``)."""
        params = list(inspect.signature(self.build).parameters.values())[1:]
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return tuple(p.name for p in params
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))

    def validate(self, config: PipelineConfig) -> None:
        """Chunk range, then the family's own constraints."""
        require_chunks(self.name, config, self.min_chunks, self.max_chunks)
        if self.check is not None:
            self.check(config)

    def accepts(self, config: PipelineConfig) -> bool:
        """Whether :meth:`validate` passes ``config``."""
        try:
            self.validate(config)
        except ValueError:
            return False
        return True


_FAMILIES: dict[str, Family] = {}


def register(name: str, build: Callable[..., Schedule], description: str, *, split_backward: bool = False,
             default_chunks: int = 1, min_chunks: int = 1, max_chunks: int | None = 1,
             check: Callable[[PipelineConfig], None] | None = None, constraints: str = "",
             replace: bool = False) -> Family:
    """Add a family under ``name``; registering a taken name needs ``replace=True``."""
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"schedule name must be non-empty without spaces (got {name!r})")
    if name in _FAMILIES and not replace:
        raise ValueError(f"schedule {name!r} is already registered (pass replace=True to override)")
    if not (1 <= min_chunks <= default_chunks and (max_chunks is None or default_chunks <= max_chunks)):
        raise ValueError(f"schedule {name!r}: need 1 <= min_chunks <= default_chunks <= max_chunks "
                         f"(got {min_chunks}, {default_chunks}, {max_chunks})")
    fam = Family(name, build, description, split_backward, default_chunks, min_chunks, max_chunks, check,
                 constraints)
    _FAMILIES[name] = fam
    return fam


def available() -> list[str]:
    """Registered names, in registration order."""
    return list(_FAMILIES)


def family(name: str) -> Family:
    """The family registered as ``name``; ValueError listing the allowed names otherwise."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; available: {', '.join(available())}") from None


def build_schedule(name: str, *, stages: int, microbatches: int, chunks: int | None = None,
                   **options: Any) -> Schedule:
    """Validate the inputs against family ``name`` and build its schedule."""
    fam = family(name)
    config = PipelineConfig(stages, microbatches, fam.default_chunks if chunks is None else chunks)
    fam.validate(config)
    allowed = fam.options()
    if allowed is not None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"{name} does not take option(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(allowed) or 'none'}")
    return fam.build(config, **options)


# --- helpers for generators ---------------------------------------------------------

def require_chunks(name: str, config: PipelineConfig, lo: int, hi: int | None) -> None:
    """ValueError unless lo <= V <= hi (hi None = unbounded)."""
    v = config.chunks
    if lo == hi and v != lo:
        raise ValueError(f"{name} needs chunks == {lo} (got V={v})")
    if v < lo:
        raise ValueError(f"{name} needs chunks >= {lo} (got V={v})")
    if hi is not None and v > hi:
        raise ValueError(f"{name} needs chunks <= {hi} (got V={v})")


def require_microbatches_at_least_stages(name: str, config: PipelineConfig) -> None:
    """ValueError unless M >= P."""
    if config.microbatches < config.stages:
        raise ValueError(f"{name} needs microbatches >= stages "
                         f"(got M={config.microbatches} < P={config.stages})")


def assemble(family_name: str, config: PipelineConfig, unit_ranks: Sequence[int], orders: list[list[Action]],
             *, split_backward: bool, post_ahead: int = 1, **meta: Any) -> Schedule:
    """Per-rank compute orders + unit placement -> full schedule.

    Appends ``OPT u`` on each unit's owner after its last compute, lowers the
    activation/gradient transfers that the placement implies (``lower`` also puts every
    link's RECVs in its SEND order and posts activation/gradient receives ``post_ahead``
    computes early).
    """
    placement = Placement.by_unit(list(unit_ranks))
    compute = add_optimizer_steps(orders, placement)
    info = {"family": family_name, "stages": config.stages, "chunks": config.chunks,
            "split_backward": split_backward, **meta}
    return lower(family_name, config.stages, len(unit_ranks), config.microbatches, placement, compute, info,
                 post_ahead=post_ahead)


def check_dp_option(family: str, dp: Any) -> None:
    """The ``dp`` option of a family that plans for its data-parallel replicas
    (``pipert.compiler.replica_options``): an integer >= 1."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"{family} option dp must be an integer >= 1, got {dp!r}")
