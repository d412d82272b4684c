"""Equality checks of pipelined training against the single-process reference step.

Used by the test-suite and by ``pipert train --check``: the same tiny model, the same batch,
one step with a schedule, and the relative errors of loss, gradients and updated parameters.
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .exec.instrument import Instrumentation
from .tools.reference import rel_err

__all__ = ["Case", "CaseResult", "tiny_units", "make_batch", "run_case", "run_cases_dist", "rel_err", "sgd",
           "build_case_program", "assert_exact", "family_cases"]


@dataclass(frozen=True)
class Case:
    """One schedule configuration to check."""

    schedule: str
    """A registered name, or ``torch:<class>`` for the order torch's schedule class builds
    (``torch_orders``; option ``("comms", True)`` keeps torch's send/receive positions)."""
    stages: int
    microbatches: int
    dtype: str = "float64"
    chunks: int | None = None
    options: tuple = ()
    """Extra generator options as (name, value) pairs."""
    steps: int = 1
    """Training steps; every step is checked against a reference started from the same weights."""
    fine: bool = False
    """Partition into three units per layer instead of chunks of layers."""
    passes: tuple = ()
    """Lowering passes applied to the built schedule (names of ``pipert.ir.passes.PASSES``)."""
    fold: int = 1
    """Micro-batches per op (``pipert.ir.passes.fold_microbatches``)."""
    dp: int = 1
    """Data-parallel replicas (``pipert.schedules.data_parallel.replicate``); ranks = stages * dp."""
    zero: int | str | tuple = 0
    """ZeRO over the replicas (with dp > 1): a stage for every unit, one per unit, or a per-parameter
    spec (``pipert.schedules.zero_rules``: "3:mlp,2:attn,1", "p=0.4,g=0.7")."""
    zero3_buffers: int = 1
    """Gathered copies of ZeRO-3 weights: 1, or 2 (forward and backward apart)."""
    links: tuple = ()
    """Emulated links as (name, value) pairs of ``pipert.linkflags.LinkOptions.parse``
    (e.g. ``(("dcs", 2), ("dc_latency", "2ms"))``); empty: messages are not delayed."""
    link_path: str = "auto"
    """How delayed messages are applied (``pipert.comm.delayed.DelayedTransport``): auto,
    timer or stream; the stream path estimates the ranks' clock offsets (link_clock "estimate")."""
    model: str = "llama"
    """Model family of the tiny test model: llama or gpt (``tiny_units``)."""
    cut: str | None = None
    """Partition cut (``pipert.models.partition``): None follows ``fine``; "helix" gives 2L+1 units."""
    recompute: str = "none"
    """Recompute mode inside every unit (``pipert.models.recompute.RECOMPUTE_MODES``)."""
    mlp_chunk: int = 0
    """Rows per chunk of the chunked MLP (0: the plain MLP); ``mlp_recompute`` selects its mode."""
    mlp_recompute: bool = False
    rules: str = "native"
    """Communication rules the program is compiled under (``pipert.compile(rules=...)``): the
    backend's own ("native": gloo's on the CPU), or "nccl" (run under ``pipert.comm.ncclsim``)."""
    save_ops: tuple = ()
    """Selective recomputation in every unit of the pipeline (not the reference): the op groups
    whose outputs are kept, every other op recomputed (``pipert.models.recompute.SAVE_GROUPS``)."""


@dataclass
class CaseResult:
    case: Case
    loss_err: float
    grad_err: float
    param_err: float
    sent_bytes: dict
    delayed: dict = field(default_factory=dict)
    """With ``case.links``: the link emulator's backend and the messages it delayed (all ranks)."""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["case"] = asdict(self.case)
        return d


# Cases that exercise every op of the IR (tests/multiproc/test_gloo_ir_ops.py on gloo, and
# tests/unit/test_runtime_local.py on the local transport): 2 ranks, 4 ranks (dp pairs), 3 ranks.
IR_OP_CASES = [
    Case("1f1b", 2, 8, fold=2, steps=2),                              # two micro-batches per op
    Case("1f1b", 2, 8, fold=2, passes=("expand_folds",)),             # ... expanded, one message each
    Case("1f1b", 2, 4, passes=("recompute",), steps=2),               # RECOMPUTE on every unit
    Case("zb-h1", 2, 4, passes=("recompute",)),
    Case("1f1b", 2, 4, passes=("offload_stashes",), steps=2),         # OFFLOAD/PREFETCH of every stash
    Case("zb-v", 2, 4, passes=("offload_stashes",)),
    Case("zb-v", 2, 4, passes=("offload_weights",), steps=2),        # OFFLOAD/PREFETCH of units' weights
    Case("crosspipe-greedy", 2, 4),                                   # W pieces
]
IR_OP_DP_CASES = [
    Case("1f1b", 2, 8, dp=2, steps=2),                                # ALLREDUCE of weight gradients
    Case("1f1b", 2, 8, dp=2, zero=1, steps=2),                        # REDUCESCATTER + ALLGATHER
    Case("zb-h1", 2, 8, dp=2, zero=3, steps=2),                       # ZeRO-3: gather before use, free after
]
# HelixPipe (2L+1 units, attention placed by micro-batch, QKV weights travel): p in {2, 4}, one and
# two folds, with and without recomputation without attention, with and without the chunked MLP.
HELIX_CASES = [
    Case("helixpipe", 2, 4, chunks=2, steps=2),
    Case("helixpipe-2fold", 2, 8, model="gpt", recompute="no_attention", steps=2),
    Case("helixpipe-2fold", 2, 4, chunks=2, mlp_chunk=4, recompute="no_attention"),
    Case("helixpipe", 2, 4, model="gpt", mlp_chunk=4),
    Case("helixpipe-2fold", 2, 4, passes=("expand_folds", "send_early")),
    Case("helixpipe-2fold", 2, 4, model="gpt", options=(("loss_in_backward", False),)),  # the opt-out
]
HELIX_P4_CASES = [
    Case("helixpipe", 4, 4, model="gpt", recompute="no_attention", mlp_chunk=4, steps=2),
    Case("helixpipe-2fold", 4, 8),
]
IR_OP_TORCH_CASES = [
    Case("torch:ScheduleInterleavedZeroBubble", 3, 4, chunks=2, steps=2),
    Case("torch:ScheduleInterleavedZeroBubble", 3, 4, chunks=2, options=(("comms", True),), steps=2),
]


def family_cases(stages: int, **fields: Any) -> list[Case]:
    """One case per registered schedule family at ``stages`` ranks per pipeline, with the settings
    each needs (tawpipe: two ranks per node; helixpipe: the GPT model cut into 2L+1 units;
    pipemesh: two replicas), 2 x stages micro-batches per replica; ``fields`` set on every case."""
    from .schedules import available
    out = []
    for name in available():
        kw: dict = {"options": (("ranks_per_node", 2),)} if name == "tawpipe" else {}
        if name.startswith("helixpipe"):
            kw.update(model="gpt", cut="helix")
        dp = 2 if name == "pipemesh" else 1
        out.append(Case(name, stages, 2 * stages * dp, dp=dp, **kw, **fields))
    return out


def assert_exact(results: Sequence[dict], loss_tol: float = 1e-12, tol: float = 1e-10) -> None:
    """Every result of ``run_cases_dist`` ran and matched the reference: loss within ``loss_tol``,
    gradients and updated parameters within ``tol`` (relative)."""
    for r in results:
        assert "error" not in r, r
        label = str(r["case"])
        assert r["loss_err"] <= loss_tol, label
        assert r["grad_err"] <= tol, label
        assert r["param_err"] <= tol, label


def sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The tests' optimizer: plain SGD with momentum (updates depend on gradients linearly)."""
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def tiny_units(num_units: int, dtype: str, seed: int = 0, fine: bool = False, *, model: str = "llama",
               cut: str | None = None, recompute: str = "none", mlp_chunk: int = 0,
               mlp_recompute: bool = False) -> list[nn.Module]:
    """``num_units`` units of a tiny LLaMA (or GPT, ``model="gpt"``) model with as many layers
    as the cut needs: one per unit, three units per layer (``fine``) or 2L+1 units (``cut="helix"``)."""
    from .models import GPTConfig, LlamaConfig, model_from_config, partition
    cut = "fine" if fine else (cut or "layers")
    per, extra = {"layers": (1, 0), "fine": (3, 0), "helix": (2, 1)}.get(cut, (1, 0))
    if (num_units - extra) % per or num_units <= extra:
        raise ValueError(f"a {cut} partition has {per} units per layer (+{extra}); {num_units} units do not fit")
    layers = (num_units - extra) // per
    mlp = {"mlp_chunk": mlp_chunk, "mlp_recompute": mlp_recompute}
    if model == "llama":
        cfg = LlamaConfig(vocab=64, hidden=32, layers=layers, heads=4, kv_heads=2, ffn=48, max_seq=16, dtype=dtype,
                          **mlp)
    elif model == "gpt":
        cfg = GPTConfig(vocab=64, hidden=32, layers=layers, heads=4, ffn=64, max_seq=16, dtype=dtype, **mlp)
    else:
        raise ValueError(f"tiny_units: model={model!r}; allowed: llama, gpt")
    return partition(model_from_config(cfg, seed=seed), num_units, cut=cut, recompute=recompute)


def make_batch(microbatches: int, seed: int = 0, mb_size: int = 2, seq: int = 8, vocab: int = 64):
    g = torch.Generator().manual_seed(1000 + seed)
    tokens = torch.randint(0, vocab, (microbatches * mb_size, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build_case_program(case: Case, check: bool = True):
    """The program of ``case``: its schedule built for ``microbatches / (fold * dp)`` micro-batches
    and folded, then compiled (``pipert.compile``) with its passes and ``dp`` replicas.
    ``check=False``: not validated (for tests that change it and compile it again)."""
    from .compiler import compile
    from .ir.passes import fold_microbatches
    from .schedules import build_schedule
    per = case.fold * case.dp
    if case.microbatches % per:
        raise ValueError(f"{case.microbatches} micro-batches do not split into fold {case.fold} x dp {case.dp}")
    if case.schedule.startswith("torch:"):
        from .ir.torch_format import from_torch
        orders = torch_orders(case.schedule[len("torch:"):], case.stages, case.microbatches // per, case.chunks or 1,
                              **dict(case.options))
        s = from_torch(orders, case.schedule, fsdp="drop")
    else:
        s = build_schedule(case.schedule, stages=case.stages, microbatches=case.microbatches // per,
                           chunks=case.chunks, **dict(case.options))
    s = fold_microbatches(s, case.fold)
    units = _case_units(case, s) if case.dp > 1 else None   # ZeRO rules read parameter names and sizes
    return compile(s, passes=case.passes, dp=case.dp, zero=case.zero, zero3_buffers=case.zero3_buffers, units=units,
                   rules="nccl" if case.rules == "nccl" else "gloo", check=check)


def _case_units(case: Case, schedule: Any) -> list[nn.Module]:
    return tiny_units(schedule.num_units, case.dtype, fine=case.fine, model=case.model,
                      cut=case.cut or schedule.meta.get("cut"), recompute=case.recompute, mlp_chunk=case.mlp_chunk,
                      mlp_recompute=case.mlp_recompute)




def _snapshot(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().cpu() for k, v in named.items()}


def run_case(case: Case, backend: str = "local", optimizer: Callable = sgd, timeout: float = 60.0,
             gather: Callable[[dict], dict] | None = None) -> CaseResult | None:
    """Train ``case.steps`` steps with the schedule and with the reference; worst errors.

    For backend "dist" every rank calls this; rank 0 returns the result, the others None.
    """
    from .pipeline import Pipeline
    from .tools.reference import grouped_reference_step
    program = build_case_program(case)
    units = _case_units(case, program)
    ref_units = copy.deepcopy(units)
    if case.save_ops:
        from .models.recompute import selective_recompute
        units = [selective_recompute(u, case.save_ops) for u in units]
    ref_opt = optimizer([p for u in ref_units for p in u.parameters()])
    links = None
    if case.links:
        from .linkflags import LinkOptions
        links = LinkOptions.parse(**dict(case.links))
    if links is not None:
        from .binding import LinkEmulation
        links = LinkEmulation(links, path=case.link_path, clock="estimate" if case.link_path == "stream" else "auto")
    pipe = Pipeline(units, program, optimizer=optimizer, backend=backend, timeout=timeout, links=links)
    gather = gather or (lambda d: d)
    worst = [0.0, 0.0, 0.0]
    sent: dict = {}
    for step in range(case.steps):
        x, y = make_batch(case.microbatches, seed=step)
        loss = pipe.step(x, y)
        grads = gather(_snapshot(pipe.named_grads()))
        params = gather(_snapshot(pipe.named_parameters()))
        for r in pipe.last_results.values():
            for k, v in r.sent_bytes.items():
                sent[k] = sent.get(k, 0) + v
        if backend == "dist" and dist.get_rank() != 0:
            continue
        ref, ref_loss = grouped_reference_step(ref_units, x, y, case.microbatches,
                                               program.meta.get("update_every") or case.microbatches, ref_opt)
        worst[0] = max(worst[0], abs(loss - ref_loss) / max(abs(ref_loss), 1e-300))
        worst[1] = max(worst[1], rel_err(grads, ref.grads))
        worst[2] = max(worst[2], rel_err(params, ref.params_after))
    delayed = _delayed(pipe, backend)
    if backend == "dist":
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(sent, parts, dst=0)
        if dist.get_rank() != 0:
            return None
        sent = {}
        for part in parts:
            for k, v in part.items():
                sent[k] = sent.get(k, 0) + v
    return CaseResult(case, worst[0], worst[1], worst[2], sent, delayed)


def _delayed(pipe: Any, backend: str) -> dict:
    """The link emulator's backend and the messages it delayed, summed over every rank."""
    if pipe.links is None:
        return {}
    n = pipe.links_delayed()
    if backend == "dist":
        t = torch.tensor([n])
        dist.all_reduce(t)
        n = int(t)
    return {"backend": pipe.links.backend, "messages": n}


def run_cases_dist(rank: int, world: int, cases: Sequence[Case], out_path: str, timeout: float = 60.0) -> None:
    """Process entry (see ``pipert.launch.launch``): run every case, rank 0 writes JSON."""
    from .launch import gather_to_zero
    torch.set_num_threads(1)
    results = []
    for case in cases:
        try:
            res = run_case(case, backend="dist", gather=gather_to_zero, timeout=timeout)
            if res is not None:
                results.append(res.as_dict())
        except Exception as e:  # noqa: BLE001 - recorded per case; the test reports it
            if rank == 0:
                results.append({"case": asdict(case), "error": f"{type(e).__name__}: {e}"})
            raise
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def fault_worker(rank: int, world: int, schedule: str | Sequence[str], microbatches: int,
                 instrument: Instrumentation | None, timeout: float, rules: str = "native") -> None:
    """Process entry: one step of a tiny model under ``instrument`` (a
    ``pipert.exec.instrument.Instrumentation``, e.g. a ``Fault`` that stops one rank mid-step;
    None: no hook); ``schedule`` may name one schedule per rank (ranks that disagree on the
    program)."""
    from .pipeline import Pipeline
    name = schedule if isinstance(schedule, str) else schedule[rank]
    program = build_case_program(Case(name, world, microbatches, rules=rules))
    units = tiny_units(program.num_units, "float32")
    pipe = Pipeline(units, program, optimizer=sgd, backend="dist", timeout=timeout, instrument=instrument)
    x, y = make_batch(microbatches)
    pipe.step(x, y)


def unit_weight_bytes(units: Sequence[nn.Module]) -> list[int]:
    return [sum(p.numel() * p.element_size() for p in u.parameters()) for u in units]


class SizedCost:
    """Uniform unit times with each unit's real weight size: lets the simulator's byte
    counters be compared with the runtime's for weight-passing schedules."""

    def __init__(self, weight_bytes: Sequence[int]) -> None:
        from .cost.uniform import UniformCost
        self.base = UniformCost()
        self.weight_bytes = list(weight_bytes)

    def compute_time(self, action, rank: int) -> float:
        return self.base.compute_time(action, rank)

    def memory(self, kind: str, unit: int) -> float:
        return self.weight_bytes[unit] if kind in ("weight", "wgrad") else self.base.memory(kind, unit)

    def message_bytes(self, payload, unit: int, num_mbs: int = 1) -> float:
        from .ir import Payload
        if payload in (Payload.WEIGHT, Payload.WGRAD):
            return float(self.weight_bytes[unit])
        return self.base.message_bytes(payload, unit, num_mbs)


def simulated_collective_prices(program: Any, links: Any, weight_bytes: Sequence[int]) -> dict[int, list[tuple]]:
    """Per rank, ``(op, seconds)`` of each collective it takes part in, in its program order, as
    the simulator prices it: the duration of its node in the simulator's graph of ``program`` on
    ``links`` with each unit's real weight size (:class:`SizedCost`)."""
    from .ir.semantics import COLLECTIVE_OPS
    from .sim import simulate
    g = simulate(program, SizedCost(weight_bytes), links).graph
    price: dict[tuple, list[float]] = {}  # group -> its collectives' prices, in the group's order
    for n, a, _ in g.collectives:  # one node per collective
        price.setdefault(tuple(sorted(a.group)), []).append(g.dur[n])
    out: dict[int, list[tuple]] = {}
    for r, actions in enumerate(program.actions):
        seen: dict[tuple, int] = {}
        out[r] = []
        for a in actions:
            if a.op in COLLECTIVE_OPS:
                gk = tuple(sorted(a.group))
                seen[gk] = seen.get(gk, -1) + 1
                out[r].append((a.op.value, price[gk][seen[gk]]))
    return out


def train_collective_seconds(**flags: Any) -> list[float]:
    """Per program rank, the seconds the simulator prices the collectives of one step of
    ``pipert train`` with ``flags`` (``TrainConfig`` fields) on its link flags: what the run's
    ``collective_link_s`` must be."""
    from .train import TrainConfig, _rank_units, build_program
    cfg = TrainConfig(**flags)
    program = build_program(cfg)
    units = _rank_units(cfg, program, torch.device("meta"))
    prices = simulated_collective_prices(program, cfg.link_options().links(program.num_ranks),
                                         unit_weight_bytes(units))
    return [sum(p for _, p in prices[r]) for r in range(program.num_ranks)]


def torch_orders(cls_name: str, stages: int, microbatches: int, chunks: int = 1,
                 comms: bool = False) -> dict[int, list]:
    """The per-rank action orders that ``torch.distributed.pipelining.<cls_name>`` builds for
    ``stages`` ranks with ``chunks`` stages each (``pipeline_order``, or
    ``pipeline_order_with_comms`` when ``comms``), computed without processes: the schedule
    classes derive their orders from the stages' indices and group size alone, which stand-in
    stages provide."""
    from torch.distributed.pipelining import schedules as torch_schedules

    class _Stage:
        def __init__(self, index: int) -> None:
            self.stage_index, self.group_size, self.group_rank = index, stages, 0
            self.num_stages = stages * chunks
            self.submod = nn.Identity()
            self.is_first, self.is_last = index == 0, index == self.num_stages - 1

    if cls_name == "ScheduleZBVZeroBubble":
        local = [0, 2 * stages - 1]
    else:
        local = [c * stages for c in range(chunks)]
    cls = getattr(torch_schedules, cls_name)
    sched = cls([_Stage(i) for i in local] if chunks > 1 or cls_name == "ScheduleZBVZeroBubble"
                else _Stage(0), microbatches)
    if comms:
        if getattr(sched, "pipeline_order_with_comms", None) is None:
            raise ValueError(f"{cls_name} has no communication order")
        return dict(sched.pipeline_order_with_comms)
    return dict(sched.pipeline_order)
