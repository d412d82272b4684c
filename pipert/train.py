"""``pipert train``: train the built-in LLaMA-style model with any registered schedule.

Default (no flags): the "tiny" model, 4 ranks, 1F1B, 8 micro-batches, byte-level text of
the Python standard library. Backend "auto": several GPUs -> NCCL processes; one GPU ->
the local transport on that GPU; CPU -> gloo processes. pipert starts the processes under
torch's elastic agent (``pipert.launch``); under torchrun this process is the one rank
torchrun's environment names (any number of nodes; NCCL on ``cuda:LOCAL_RANK``).

Each process of a gloo/NCCL run builds the model on the meta device and materialises only
the units its rank computes or holds (``pipert.pipeline.units_needed``), with the
values a full build in one process gives (``pipert.models.build_units``); a model larger than
one process's memory starts as long as each rank's units fit. With ``--json`` the first
step's record also gives ``rank_param_bytes`` (parameter bytes each process materialised, in
global-rank order), ``model_param_bytes`` (the whole model) and, for gloo/NCCL processes,
``mesh_order`` and ``process_coords`` (each global rank's [dp, pp, tp] coordinate).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .comm.mesh import DEFAULT_MESH_ORDER, ProcessLayout, parse_mesh_order

if TYPE_CHECKING:
    import torch

    from .ir.program import Program

__all__ = ["TrainConfig", "run_train", "resolve_backend", "process_group_backend", "DEFAULT_LR"]

_DTYPES = ("float32", "float64", "bfloat16")
DEFAULT_LR = 3e-3
"""AdamW's learning rate when --lr is left out (and no checkpoint gives one)."""
BACKENDS = ("auto", "gloo", "nccl", "nccl-sim", "local")
"""``--backend``: auto (NCCL processes on several GPUs, the local transport on one, gloo processes
on a CPU), gloo, nccl, nccl-sim (gloo processes that follow NCCL's rules: pipert.comm.ncclsim), local."""


@dataclass
class TrainConfig:
    """Settings of one training run."""

    schedule: str = "1f1b"
    """Registered schedule name (see `pipert simulate --help` for the list), or a schedule file
    (pipert's .json, torch.pipelining's .csv or orders .json) whose shape the other fields match."""
    stages: int = 4
    """Pipeline ranks P."""
    microbatches: int = 8
    """Micro-batches per step M."""
    chunks: int | None = None
    """Units per rank for interleaved schedules."""
    ranks_per_node: int | None = None
    """Ranks per node, for topology-aware schedules (tawpipe)."""
    options: str = ""
    """Generator options as name=value pairs separated by ';' (pipemesh: "enqueue=4,4;dequeue=2,2,2,2")."""
    plan: str = ""
    """A PipeMesh plan file (``pipert plan --pipemesh ... --save FILE``): it fixes the schedule, P, D,
    chunks, micro-batches, options, ZeRO mix, recomputation and TP (``pipert.planner.planfile``);
    each of those fields must equal the plan's."""
    dp: int = 1
    """Data-parallel replicas D of the pipeline (stages x dp processes)."""
    zero: str = "0"
    """ZeRO over the replicas (with --dp > 1): a stage 0-3 for every unit, or per parameter by rules
    ("3:mlp,2:attn,1") or shares ("p=0.4,g=0.7"); see pipert.schedules.zero_rules."""
    tp: int = 1
    """Tensor-parallel processes T per pipeline rank (stages x dp x tp processes)."""
    mesh_order: str = ",".join(DEFAULT_MESH_ORDER)
    """The (dp, pp, tp) mesh's dimensions, outermost first: which process runs which stage,
    replica and tp coordinate (``pipert.comm.mesh.ProcessLayout``; default TP innermost)."""
    sp: bool = False
    """Sequence parallelism inside each TP group (with --tp > 1): norms, residuals and stage
    boundaries split along the sequence."""
    zero3_buffers: int = 1
    """Gathered copies of ZeRO-3 weights: 1, or 2 (forward and backward computes apart)."""
    passes: str = ""
    """Comma-separated lowering passes applied to the schedule (recompute, offload_stashes, expand_folds, ...)."""
    steps: int = 300
    """Training steps."""
    batch_size: int = 16
    """Sequences per step (split into `microbatches`)."""
    seq: int = 64
    """Tokens per sequence."""
    model: str = "tiny"
    """Model preset of pipert.models (tiny, small, ... ; gpt-tiny, gpt-small, ...)."""
    mlp_chunk: int = 0
    """Token rows per chunk of the chunked MLP of pipert.kernels (0: the plain MLP)."""
    mlp_recompute: bool = False
    """Chunked MLP: save only its input, recompute the pre-activations in backward."""
    recompute: str = ""
    """Activation recomputation inside every unit: none, no_attention (keep attention output and
    softmax statistics), full (keep the unit's inputs only); empty: the schedule's (its
    ``meta["recompute"]``: no_attention for helixpipe-2fold, as its paper runs it), else none. The
    CrossPipe families take it as their option: ``full`` builds a RECOMPUTE before each D instead,
    and the units then keep their graphs."""
    sync_folds: bool = False
    """helixpipe-2fold: one compute and one message per fold pair (opts out of the asynchronous two-fold)."""
    loss_in_forward: bool = False
    """helixpipe-2fold: LM head and loss in the last unit's forward (opts out of the loss in backward)."""
    dtype: str = "float32"
    """Parameter and activation dtype: float32, float64, bfloat16."""
    lr: float | None = None
    """AdamW learning rate (None: DEFAULT_LR, or on --resume the checkpoint's; given on --resume,
    it replaces the checkpoint's from the first resumed step on)."""
    backend: str = "auto"
    """auto, gloo, nccl, nccl-sim (gloo processes with NCCL's rules) or local."""
    seed: int = 0
    """Seed of model initialisation and data order."""
    check: bool = False
    """Also run the single-process reference step and report relative errors."""
    json: bool = False
    """Print one JSON object per step instead of a progress bar."""
    timeout: float = 120.0
    """Seconds any communication may wait before the run fails (the command line also takes a unit:
    90s, 2min)."""
    dcs: int = 1
    """Datacenters the ranks split into (equal consecutive blocks); messages between them are delayed."""
    dc_latency: str = ""
    """Latency of a link between datacenters, with a unit: 20ms, 150us (pipert.linkflags)."""
    dc_bandwidth: str = ""
    """Bandwidth of a link between datacenters: 10Gbps, 400MB/s (empty: unlimited)."""
    node_latency: str = ""
    """Latency of a link between nodes of one datacenter (with --ranks-per-node)."""
    node_bandwidth: str = ""
    """Bandwidth of a link between nodes of one datacenter (with --ranks-per-node)."""
    profile: bool = False
    """Measure every unit's compute times on the running job and print the simulator's step time beside the
    measured one."""
    save: str = ""
    """Folder of checkpoints (``DIR/step-N``, pipert.checkpoint); one after the last step. The
    folder belongs to one run (``DIR/run.json``, pipert.ckptfolder): another run's is refused."""
    save_every: int | None = None
    """Also write a checkpoint after every N steps (with --save)."""
    resume: str = ""
    """Checkpoint folder to resume from (a step-N folder, or a --save folder: its newest); --steps
    counts the steps already run."""

    def validate(self) -> None:
        """Every setting, checked before any work (no schedule built, no model materialised):
        ValueError naming the flag, its value and what is allowed."""
        if self.dtype not in _DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} unknown; allowed: {', '.join(_DTYPES)}")
        for name in ("stages", "microbatches", "steps", "batch_size", "seq", "dp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("chunks", "ranks_per_node"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        parse_mesh_order(self.mesh_order)
        self._validate_model()
        if self.plan:
            self._validate_plan()
        self.option_dict()
        self._validate_schedule()
        if self.lr is not None and not 0 < self.lr < math.inf:
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if not 0 < self.timeout < math.inf:
            raise ValueError(f"--timeout must be a finite number of seconds > 0, got {self.timeout}")
        if self.batch_size % self.microbatches:
            raise ValueError(f"--batch-size {self.batch_size} is not divisible into {self.microbatches} "
                             f"micro-batches; use a multiple of {self.microbatches}")
        self.zero = str(self.zero).strip()
        if self.zero not in ("0", "1", "2", "3"):
            from .schedules.zero_rules import check_zero_spec
            try:
                check_zero_spec(self.zero)
            except ValueError as e:
                raise ValueError(f"--zero: {e}") from None
        if self.zero3_buffers not in (1, 2):
            raise ValueError(f"--zero3-buffers must be 1 (one gathered copy of ZeRO-3 weights) or 2 (forward and "
                             f"backward copies), got {self.zero3_buffers}")
        if self.zero != "0" and self.dp == 1:
            raise ValueError(f"--zero {self.zero} shards over data-parallel replicas: give --dp > 1")
        if self.zero3_buffers == 2:
            from .schedules.zero_rules import spec_stages
            if self.dp == 1 or 3 not in spec_stages(self.zero):
                raise ValueError(f"--zero3-buffers 2 keeps two gathered copies of ZeRO-3 weights, but --dp {self.dp} "
                                 f"--zero {self.zero} shards no weight with ZeRO-3; give --dp > 1 and --zero 3 (or a "
                                 f"per-parameter --zero with stage 3), or leave --zero3-buffers out")
        if self.microbatches % self.dp:
            raise ValueError(f"--microbatches {self.microbatches} do not split over --dp {self.dp} replicas; use a "
                             f"multiple of {self.dp}")
        if self.mlp_chunk < 0:
            raise ValueError(f"--mlp-chunk must be >= 0 (0: the plain MLP), got {self.mlp_chunk}")
        if self.mlp_recompute and not self.mlp_chunk:
            raise ValueError("--mlp-recompute applies to the chunked MLP; give --mlp-chunk N > 0 as well")
        from .models.recompute import KEEP_PREFIX, RECOMPUTE_MODES, SAVE_GROUPS, recompute_save_set
        if self.recompute and self.recompute not in RECOMPUTE_MODES and not self.recompute.startswith(KEEP_PREFIX):
            raise ValueError(f"--recompute {self.recompute!r} unknown; allowed: {', '.join(RECOMPUTE_MODES)}, or "
                             f"{KEEP_PREFIX}GROUP,... with groups of {', '.join(SAVE_GROUPS)} (or leave it out: the "
                             f"schedule's)")
        try:
            recompute_save_set(self.recompute or "none")
        except ValueError as e:
            raise ValueError(f"--recompute: {e}") from None
        from .ir.passes import PASSES
        unknown = [p for p in self.pass_names() if p not in PASSES]
        if unknown:
            raise ValueError(f"--passes: unknown pass(es) {', '.join(unknown)}; allowed: {', '.join(PASSES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} unknown; allowed: {', '.join(BACKENDS)}")
        self.link_options().links(self.world)
        if self.save_every is not None and (self.save_every < 1 or not self.save):
            raise ValueError(f"--save-every {self.save_every}: give a step count >= 1 and a --save folder")
        from .trainchecks import check_batch_fits, check_checkpoint_dtype, check_folder_writable, check_tensor_parallel
        check_tensor_parallel(self)
        if self.save:
            check_folder_writable("--save", self.save)
        check_checkpoint_dtype(self)
        check_batch_fits(self)

    def link_options(self):
        """The emulated links (``pipert.linkflags.LinkOptions``) of the link flags."""
        from .linkflags import LinkOptions
        return LinkOptions.parse(self.dcs, self.dc_latency, self.dc_bandwidth, self.ranks_per_node,
                                 self.node_latency, self.node_bandwidth)

    def _validate_plan(self) -> None:
        """The fields a plan fixes equal the plan's, and its units fit the model's layers."""
        from .models import model_config
        from .planner.planfile import load_plan, train_settings
        doc = load_plan(self.plan)
        for name, want in train_settings(doc).items():
            if getattr(self, name) != want:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r} conflicts with --plan {self.plan}, "
                                 f"which sets {want!r}; leave the flag out (or give the plan's value)")
        k, layers = doc["buckets"]["units_per_chunk"], model_config(self.model).layers
        if doc["P"] * doc["M"] * k > layers:
            raise ValueError(f"--plan {self.plan}: P x M x units per chunk (its largest bucket count) = {doc['P']} x "
                             f"{doc['M']} x {k} units, but model {self.model!r} has {layers} layers (one unit needs at "
                             f"least one); allowed: a model of >= {doc['P'] * doc['M'] * k} layers, or a plan with "
                             f"fewer chunks or buckets")

    def _validate_model(self) -> None:
        """The model preset, and the sequence length against its positions."""
        from .models import model_config, model_names
        if self.model not in model_names() and "=" not in self.model:
            raise ValueError(f"--model {self.model!r} unknown; allowed: {', '.join(model_names())}, or LLaMA "
                             f"sizes layers=..,hidden=..,heads=..[,kv_heads=..,ffn=..,vocab=..,max_seq=..]")
        try:
            positions = model_config(self.model).max_seq
        except ValueError as e:
            raise ValueError(f"--model: {e}") from None
        if self.seq > positions:
            raise ValueError(f"--seq {self.seq} exceeds the {positions} positions of model {self.model!r}; "
                             f"allowed: 1..{positions}")

    def _validate_schedule(self) -> None:
        """The schedule name (or file) and its shape against the flags and the model's layers,
        from the family's constraints alone (building a schedule can take long)."""
        from .ir.files import is_schedule_file, load_schedule
        from .models import model_config
        from .scenario import LAYER_PER_CHUNK
        layers = model_config(self.model).layers
        if is_schedule_file(self.schedule):
            from .scenario import file_shape
            sched = load_schedule(self.schedule)
            file_shape(sched, {"--stages": self.stages, "--microbatches": self.microbatches // self.dp,
                               "--chunks": self.chunks}, self.schedule)
            if sched.meta.get("cut", "layers") != "layers":
                return  # pieces of layers: run_train checks the count against the cut
            units = sched.num_units
            what = f"schedule file {self.schedule!r} has {units} units"
        else:
            from .schedules import PipelineConfig, family
            fam = family(self.schedule)
            chunks = self.chunks if self.chunks is not None else fam.default_chunks
            if self.schedule in LAYER_PER_CHUNK:  # units are pieces of layers: 2L+1 of them
                chunks = _layers_per_stage(self)
            try:
                fam.validate(PipelineConfig(self.stages, self.microbatches // self.dp, chunks))
            except ValueError as e:
                raise ValueError(f"--schedule {self.schedule} --stages {self.stages} --microbatches "
                                 f"{self.microbatches // self.dp} (per replica) --chunks {chunks}: {e}") from None
            if self.schedule in LAYER_PER_CHUNK:
                return
            units = self.stages * chunks
            what = f"--stages {self.stages} x {chunks} chunks of {self.schedule} = {units} units"
        if units > layers:
            raise ValueError(f"{what}, but model {self.model!r} has {layers} layers (one unit needs at least one); "
                             f"allowed: --stages x chunks <= {layers}")

    def option_dict(self) -> dict:
        """--options as {name: int or text} (``pipert.scenario_flags.parse_options``)."""
        from .scenario_flags import parse_options
        return parse_options(self.options)

    def pass_names(self) -> list[str]:
        return [p for p in self.passes.split(",") if p]

    @property
    def world(self) -> int:
        """Processes: stages x data-parallel replicas x tensor-parallel processes."""
        return self.stages * self.dp * self.tp

    def layout(self) -> ProcessLayout:
        """Which process runs which stage, replica and tp coordinate (``--mesh-order``)."""
        return ProcessLayout(self.stages, self.dp, self.tp, parse_mesh_order(self.mesh_order))


def build_program(cfg: TrainConfig, rules: str = "gloo") -> Program:
    """The program every rank runs, compiled once (``pipert.compile``): the named schedule (or
    schedule file) for one replica's share of the micro-batches, the passes, then ``dp``
    replicas, validated under ``rules`` (``program_rules(backend)``)."""
    from .compiler import compile
    from .schedules import build_schedule
    from .ir.files import is_schedule_file, load_schedule
    from .scenario import LAYER_PER_CHUNK
    if is_schedule_file(cfg.schedule):
        s = load_schedule(cfg.schedule)
    else:
        from .schedules import family
        accepted = family(cfg.schedule).options()  # None: any option
        takes_nodes = cfg.ranks_per_node and (accepted is None or "ranks_per_node" in accepted)
        opts = {"ranks_per_node": cfg.ranks_per_node} if takes_nodes else {}  # else it shapes the links only
        chunks = _layers_per_stage(cfg) if cfg.schedule in LAYER_PER_CHUNK else cfg.chunks
        if accepted is not None and "links" in accepted:
            opts.update(_link_plan(cfg, cfg.stages * (chunks or family(cfg.schedule).default_chunks)))
        opts.update(_paper_opt_outs(cfg, accepted))
        opts.update(cfg.option_dict())
        s = build_schedule(cfg.schedule, stages=cfg.stages, microbatches=cfg.microbatches // cfg.dp,
                           chunks=chunks, **opts)
    units = None
    if cfg.dp > 1:   # ZeRO rules read the parameters' names and sizes
        import torch
        units = _rank_units(cfg, s, torch.device("cpu"), keep=[], tp=_tp_shapes(cfg))  # names, shard shapes only
    return compile(s, passes=cfg.pass_names(), dp=cfg.dp, zero=cfg.zero, zero3_buffers=cfg.zero3_buffers, units=units,
                   rules=rules)


def _paper_opt_outs(cfg: TrainConfig, accepted: tuple[str, ...] | None) -> dict:
    """Generator options of --recompute (for a family that records it) and of the opt-out flags of
    helixpipe-2fold's paper defaults; an opt-out the family does not take is refused."""
    from .scenario_flags import HELIX_OPT_OUTS
    out = {}
    for name, (opt, value) in HELIX_OPT_OUTS.items():
        if getattr(cfg, name):
            if accepted is not None and opt not in accepted:
                raise ValueError(f"--{name.replace('_', '-')} opts helixpipe-2fold out of a paper default; "
                                 f"--schedule {cfg.schedule} has no option {opt}")
            out[opt] = value
    if cfg.recompute and (accepted is None or "recompute" in accepted):
        out["recompute"] = cfg.recompute
    return out


def _link_plan(cfg: TrainConfig, num_units: int) -> dict:
    """The generator options of the link flags (``pipert.linkplan.link_plan``: the links over the
    P x D ranks and this run's units measured here for one micro-batch of its shape; with --dp, the
    replicas and each unit's reduction, ``pipert.compiler.replica_options``); without emulated
    links: nothing (every transfer free, the generator's default)."""
    link_opts = cfg.link_options()
    if not link_opts.active:
        return {}
    import torch
    from .data import ByteCorpus
    from .linkplan import link_plan
    # a generator told recompute=full (every family that plans the links takes it) emits RECOMPUTE
    # actions: the units it times keep their graph, as the program's units will
    full = cfg.option_dict().get("recompute", cfg.recompute) == "full"
    units = _model_units(cfg, num_units, None, torch.device("cpu"), meta={"recompute_ops": "full"} if full else None)
    x, y = next(iter(ByteCorpus(cfg.seq, seed=cfg.seed).batches(cfg.batch_size // cfg.microbatches, 1)))
    from .compiler import replica_options
    # the links over every replica's ranks (replica d's stage s on rank d*P+s), as the run emulates
    # them; a family that plans the replicas' reductions (CrossPipe's dp) prices them on those
    plan = link_plan(units, x, y, link_opts.links(cfg.stages * cfg.dp))
    return {**plan, **replica_options(cfg.schedule, cfg.dp, cfg.zero, units)}


def program_rules(backend: str) -> str:
    """The communication rules a program of ``pipert train --backend backend`` is validated and run
    under: NCCL's on nccl and nccl-sim (emulated on gloo), gloo's otherwise."""
    return "nccl" if backend in ("nccl", "nccl-sim") else "gloo"


def _layers_per_stage(cfg: TrainConfig) -> int:
    """V for schedules whose chunks are layers per stage (HelixPipe): the model's layers / P."""
    from .models import model_config
    layers = model_config(cfg.model).layers
    if layers % cfg.stages or (cfg.chunks is not None and cfg.chunks * cfg.stages != layers):
        raise ValueError(f"{cfg.schedule} puts layers/P layers on every stage: model {cfg.model!r} has {layers} "
                         f"layers, --stages {cfg.stages}" + (f", --chunks {cfg.chunks}" if cfg.chunks else "")
                         + f"; allowed --stages: divisors of {layers} (>= 2), --chunks: omitted or layers/stages")
    return layers // cfg.stages


def resolve_backend(name: str, launched: bool = False) -> str:
    """The backend ``--backend name`` runs on: gloo, nccl (processes) or local (threads of this
    process). ``launched``: this process is one rank of a job torchrun started (no local there;
    auto: NCCL when this process sees a GPU)."""
    if name == "local" and launched:
        raise ValueError("--backend local runs every rank as a thread of one process; under torchrun use "
                         "--backend gloo, nccl or auto")
    if name != "auto":
        return name
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if launched:
        return "nccl" if n else "gloo"
    return "nccl" if n > 1 else ("local" if n == 1 else "gloo")


_PROCESS_GROUPS = {"gloo": "gloo", "nccl": "nccl", "nccl-sim": "gloo"}
"""The torch.distributed backend of each process backend of ``pipert train``."""


def process_group_backend(backend: str) -> str:
    """The torch.distributed backend (gloo or nccl) that ``backend``'s processes join."""
    return _PROCESS_GROUPS[backend]


def _model_units(cfg: TrainConfig, num_units: int, cut: str | None, device: torch.device, keep=None,
                 meta: Mapping | None = None) -> list:
    """The model of ``cfg`` cut into ``num_units`` units (``pipert.models.build_units``), recomputing
    as --recompute says, else as the schedule records (``meta``), else nothing (``units_recompute``)."""
    from .models import build_units
    from .models.recompute import units_recompute
    recompute = units_recompute(cfg.recompute, meta or {})
    return build_units(cfg.model, num_units, seed=cfg.seed, keep=keep, device=device, max_seq=cfg.seq,
                       dtype=cfg.dtype, cut=cut, recompute=recompute, **_mlp_overrides(cfg))


def _rank_units(cfg: TrainConfig, program: Program, device: torch.device, keep=None, tp=None) -> list:
    """The model's units for one process: those in ``keep`` (default: all) materialised on
    ``device`` in ``cfg.dtype``, the others on the meta device. Values are those of the whole
    model built in one process, whatever ``keep`` is; with ``tp`` (a
    ``pipert.models.tp.TensorParallel``) each unit is cut to this process's TP shard after it is
    materialised (a unit's whole parameters exist for a moment)."""
    units = _model_units(cfg, program.num_units, program.meta.get("cut"), device, keep, program.meta)
    if tp is not None:
        from .models.tpshard import shard_units
        shard_units(units, tp)
    return units


def _tp_shapes(cfg: TrainConfig):
    """The TP layout of ``cfg`` for shard shapes only (no group; None without TP)."""
    from .models.tp import TensorParallel
    return TensorParallel(cfg.tp, 0, None, cfg.sp) if cfg.tp > 1 else None


def _mlp_overrides(cfg: TrainConfig) -> dict:
    return {"mlp_chunk": cfg.mlp_chunk, "mlp_recompute": cfg.mlp_recompute} if cfg.mlp_chunk else {}


def _build(cfg: TrainConfig, device: torch.device, program: Program, rank: int | None, tp=None):
    """Model units (``tp``: this process's TP shards) and data for program rank ``rank`` (None:
    every rank, in this process); the data is identical in every process for the same config."""
    from .data import ByteCorpus
    from .pipeline import units_needed
    keep = None if rank is None else units_needed(program, rank)
    units = _rank_units(cfg, program, device, keep, tp)
    corpus = ByteCorpus(cfg.seq, seed=cfg.seed)
    return program, units, corpus


def _param_bytes(units, materialized_only: bool = True) -> int:
    """Bytes of the parameters of ``units`` (only those not on the meta device, by default)."""
    return sum(p.numel() * p.element_size() for u in units for p in u.parameters()
               if not (materialized_only and p.is_meta))


def _report(cfg: TrainConfig, step: int, loss: float, tokens_per_s: float, extra: dict, bar) -> None:
    if cfg.json:
        print(json.dumps({"step": step, "loss": loss, "tokens_per_s": tokens_per_s, **extra}), flush=True)
    elif bar is not None:
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", **{k: f"{v:.1e}" for k, v in extra.items()})
        bar.update(1)


def _loop(cfg: TrainConfig, rank: int, backend: str, device: torch.device, program: Program,
          tp=None) -> list[float]:
    """Train on this process (global ``rank``; ``tp``: its TP layout, None without TP)."""
    from .binding import RuntimeOptions
    from .pipeline import Pipeline
    from .exec.instrument import Instrumentation
    from .tools.reference import grouped_reference_step
    from .tools.reference import rel_err
    import torch
    layout = cfg.layout()
    program, units, corpus = _build(cfg, device, program, None if backend == "local" else layout.program_rank(rank), tp)
    opt = lambda ps: torch.optim.AdamW(ps, lr=cfg.lr, weight_decay=0.0)  # noqa: E731
    # The reference keeps its own whole model, built in one process, and a persistent optimizer
    # (AdamW state evolves across steps); each step it starts from the pipeline's current weights.
    ref_units = _rank_units(cfg, program, device) if cfg.check and rank == 0 else None
    ref_opt = opt([p for u in ref_units for p in u.parameters()]) if ref_units else None
    sizes = _per_rank(backend, _param_bytes(units))
    whole = units if tp is None else _rank_units(cfg, program, torch.device("meta"), keep=[])  # unsharded shapes
    start = {"rank_param_bytes": sizes, "model_param_bytes": _param_bytes(whole, materialized_only=False),
             "program_digest": program.validated}
    if backend != "local":
        start.update(mesh_order=layout.describe(), process_coords=[layout.coords(g) for g in range(layout.size)])
    link_opts = cfg.link_options()
    links = link_opts.links(cfg.world) if link_opts.active else None
    if links is not None:
        start["links"] = link_opts.as_dict()
    pipe = Pipeline(units, program, optimizer=opt, backend="local" if backend == "local" else "dist",
                    timeout=cfg.timeout, links=links,
                    runtime=RuntimeOptions(tp=cfg.tp, mesh_order=layout.order) if backend != "local" else None,
                    instrument=Instrumentation(trace=True) if cfg.profile else None)
    bar = None
    if rank == 0 and not cfg.json:
        if links is not None:
            print(f"pipert train: emulated links: {link_opts.describe()}", file=sys.stderr)
        dp = f" D={cfg.dp}" + (f" ZeRO {cfg.zero}" if cfg.zero != "0" else "") if cfg.dp > 1 else ""
        bar = progress_bar(cfg.steps, f"pipert train {cfg.schedule} P={cfg.stages}{dp} M={cfg.microbatches}")
    first = _resume(cfg, pipe, ref_units, ref_opt)
    if bar is not None:
        bar.update(first)
    losses, times, timed = [], [], []
    for step, (x, y) in enumerate(corpus.batches(cfg.batch_size, cfg.steps - first, start=first), first):
        x, y = x.to(device), y.to(device)
        before = _gather(pipe, lambda: {k: v.detach().clone() for k, v in pipe.named_parameters().items()}, tp) \
            if cfg.check else None
        held_from = {r: pipe.links.collectives.held(r) for r in pipe.ranks} if links is not None else None
        t0 = time.perf_counter()
        loss = pipe.step(x, y)
        dt = time.perf_counter() - t0
        times.append(dt)
        extra = dict(start) if step == first and cfg.json else {}  # the first step this run runs
        if held_from is not None and cfg.json:
            extra["collective_link_s"] = _collective_link_s(pipe, backend, held_from)
        if cfg.profile:
            prof = _predicted(pipe, backend, rank, links, dt)
            timed.append(prof)
            extra.update(prof if cfg.json else {k: v for k, v in prof.items() if k.endswith("_step_s")})
        if cfg.check:
            grads = _gather(pipe, lambda: {k: v.detach().clone() for k, v in pipe.named_grads().items()}, tp)
            after = _gather(pipe, lambda: {k: v.detach().clone() for k, v in pipe.named_parameters().items()}, tp)
            if rank == 0:
                if step == 0:  # the ranks' own materialised units against the whole model built here
                    extra["max_init_rel_err"] = rel_err(before, _named(ref_units))
                _copy_into(ref_units, before)
                every = program.meta.get("update_every") or cfg.microbatches
                ref, ref_loss = grouped_reference_step(ref_units, x, y, cfg.microbatches, every, ref_opt)
                extra.update({"max_grad_rel_err": rel_err(grads, ref.grads),
                              "max_param_rel_err": rel_err(after, ref.params_after),
                              "ref_loss": ref_loss})
        losses.append(loss)
        if rank == 0:
            _report(cfg, step, loss, cfg.batch_size * cfg.seq / dt, extra, bar)
        if cfg.save and (step + 1 == cfg.steps or cfg.save_every and (step + 1) % cfg.save_every == 0):
            from . import checkpoint, resume
            checkpoint.save(pipe, checkpoint.step_dir(cfg.save, step + 1), resume.train_meta(cfg, step + 1))
    if bar is not None:
        bar.close()
        if cfg.profile and len(timed) > 1:
            _print_fidelity(timed[1:], times[1:])
    return losses


def progress_bar(total: int, desc: str) -> Any:
    """Rank 0's tqdm bar on stderr, under a thread lock: one process draws it, and tqdm's default
    lock adds a multiprocessing one, whose semaphore a rank that leaves by ``os._exit`` on a failure
    leaves to the resource tracker (a "leaked semaphore" warning below the failure summary)."""
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())
    return tqdm(total=total, desc=desc, file=sys.stderr)


def _collective_link_s(pipe, backend: str, held_from: dict[int, int]) -> list[float]:
    """Per program rank, the seconds its collectives of this step were held on the emulated links
    (the simulator's price of each; every rank of a dist job must call this)."""
    mine = {r: sum(h.delay for h in held) for r, held in pipe.held_collectives(held_from).items()}
    every = {r: v for part in _per_rank(backend, mine) for r, v in part.items()}
    return [every.get(r, 0.0) for r in range(pipe.program.num_ranks)]


def _print_fidelity(predicted: list[dict], measured: list[float]) -> None:
    """Medians over the steps after the first (which also builds buffers and warms up)."""
    import statistics
    m = statistics.median(measured)
    p = statistics.median(d["predicted_step_s"] for d in predicted)
    line = f"pipert train --profile: step time measured {m * 1e3:.1f} ms, predicted {p * 1e3:.1f} ms ({(p - m) / m:+.1%})"
    if "predicted_shared_step_s" in predicted[0]:
        s = statistics.median(d["predicted_shared_step_s"] for d in predicted)
        ranks, cores = predicted[0]["ranks_per_host"], predicted[0]["cores_per_host"]
        line += (f", {s * 1e3:.1f} ms with {'/'.join(map(str, ranks))} ranks sharing "
                 f"{'/'.join(map(str, cores))} cores ({(s - m) / m:+.1%})")
    print(f"{line}; medians of steps 1-{len(measured)}", file=sys.stderr)


def _predicted(pipe, backend: str, rank: int, links, measured: float) -> dict:
    """The simulator's step time from this step's measured compute times, beside the measured one
    (every rank of a dist job must call this; rank 0 gets the numbers)."""
    from .tools.fidelity import (local_measurements, message_overhead, predict_step, predict_step_shared,
                                 profile_from_measurements)
    mine = local_measurements(pipe)
    parts = [mine]
    if backend != "local":
        import torch.distributed as dist
        parts = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
    if rank != 0:
        return {}
    prof = profile_from_measurements(parts, pipe.program.num_units)
    predicted = predict_step(pipe.program, prof, links)
    shared = predict_step_shared(pipe.program, prof, links)
    out = {"measured_step_s": measured, "predicted_step_s": predicted,
           "predicted_rel_err": (predicted - measured) / measured, "max_forward_s": prof.max_forward,
           "compute_s_all_ranks": prof.busy, "message_overhead_s": message_overhead(prof.messages, links)}
    if shared is not None:
        out.update(predicted_shared_step_s=shared, predicted_shared_rel_err=(shared - measured) / measured,
                   ranks_per_host=[prof.host_of_rank.count(h) for h in range(len(prof.cores))],
                   cores_per_host=prof.cores, action_overhead_s=prof.action_overhead)
    return out


def _resume(cfg: TrainConfig, pipe, ref_units, ref_opt) -> int:
    """The first step to run: 0, or the checkpoint's step after loading it (and, with --check,
    the reference's weights and optimizer)."""
    if not cfg.resume:
        return 0
    from . import checkpoint
    hyper = {"lr": cfg.lr}  # this run's: the checkpoint's unless --lr was given
    if ref_units is not None:
        checkpoint.load_units(ref_units, ref_opt, cfg.resume, hyper)
    return checkpoint.load(pipe, cfg.resume, hyper)["step"]


def _gather(pipe, fn, tp=None) -> dict:
    """Merge a per-rank dict on rank 0 (every rank of a dist job must call this); with ``tp``,
    TP shards are first gathered to whole tensors over each TP group."""
    from .launch import gather_to_zero
    local = fn()
    if pipe.backend == "local":
        return local
    if tp is not None:  # on the device: the TP group may be NCCL's
        from .models.tpshard import gather_shards
        local = gather_shards(local, tp)
        local = local if tp.rank == 0 else {}  # each TP group's whole tensors come from its coordinate 0
    return gather_to_zero({k: v.cpu() for k, v in local.items()})


def _per_rank(backend: str, value: Any) -> list[Any]:
    """``value`` of every process, in rank order (every rank of a dist job must call this)."""
    if backend == "local":
        return [value]
    import torch.distributed as dist
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _named(units) -> dict:
    return {f"unit{i}.{n}": p.detach() for i, u in enumerate(units) for n, p in u.named_parameters()}


def _copy_into(units, named: dict) -> None:
    import torch
    with torch.no_grad():
        for i, u in enumerate(units):
            for n, p in u.named_parameters():
                if f"unit{i}.{n}" in named:
                    p.copy_(named[f"unit{i}.{n}"].to(p.device, p.dtype))


def _proc(rank: int, world: int, cfg: TrainConfig, backend: str, program: Program) -> None:
    """One rank of a gloo/NCCL job (torch.distributed initialised); NCCL on ``cuda:LOCAL_RANK``."""
    import os
    import torch
    nccl = process_group_backend(backend) == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if nccl else torch.device("cpu")
    torch.set_num_threads(1)
    _loop(cfg, rank, backend, device, program, _tensor_parallel(cfg, device))


def _tensor_parallel(cfg: TrainConfig, device: torch.device):
    """This process's TP layout (None without TP): its "tp" group of the mesh (``pipert.comm.mesh``,
    dimensions in ``--mesh-order``), whose communicator is created here, before the program's, in
    the same order on every process."""
    if cfg.tp == 1:
        return None
    import torch
    import torch.distributed as dist
    from .comm.mesh import pipeline_mesh, tp_group
    from .models.tp import TensorParallel
    layout = cfg.layout()
    group = tp_group(pipeline_mesh(cfg.stages, cfg.dp, device.type, cfg.tp, layout.order))
    dist.all_reduce(torch.zeros(1, device=device), group=group)
    return TensorParallel(cfg.tp, layout.tp_rank(dist.get_rank()), group, cfg.sp)


def _prepare(cfg: TrainConfig, backend: str) -> Program:
    """The program every rank runs; a config that does not fit (unit count, checkpoint, save
    folder) is a ValueError before any rank starts training. Resolves ``cfg.resume`` to a step
    folder and ``cfg.lr`` (``pipert.resume.prepare_resume``), then claims the save folder."""
    from .models import model_config
    from .models.partition import check_unit_count
    layers = model_config(cfg.model).layers
    program = build_program(cfg, program_rules(backend))
    check_unit_count(cfg.schedule, program.num_units, cfg.model, layers, program.meta.get("cut"))
    if cfg.resume:
        import torch
        from .resume import prepare_resume
        prepare_resume(cfg, _rank_units(cfg, program, torch.device("meta"), keep=[]))
    if cfg.lr is None:
        cfg.lr = DEFAULT_LR
    if cfg.save:
        from .resume import claim_save
        claim_save(cfg)
    return program


def _as_launched_rank(cfg: TrainConfig, backend: str) -> None:
    """This process as the rank torchrun gave it: rank 0 prepares the program and every rank gets
    it (or rank 0's ValueError), then trains."""
    import torch.distributed as dist
    from .launch import init_from_env
    rank = init_from_env(process_group_backend(backend), cfg.timeout)
    box: list = [None]
    if rank == 0:
        try:
            box[0] = (_prepare(cfg, backend), cfg.resume, cfg.lr)
        except ValueError as e:
            box[0] = str(e)
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise ValueError(box[0])
    program, cfg.resume, cfg.lr = box[0]
    _proc(rank, dist.get_world_size(), cfg, backend, program)
    dist.destroy_process_group()  # after a failure none: a peer may be gone, torchrun ends the job


def _check_launched(cfg: TrainConfig, backend: str, place) -> None:
    """A torchrun job of the right size, and under NCCL a GPU for this process's local rank."""
    if place.world_size != cfg.world:
        tp = (f" x --tp {cfg.tp}", "/--tp") if cfg.tp > 1 else ("", "")
        raise ValueError(f"torchrun started {place.world_size} processes (WORLD_SIZE), but --stages {cfg.stages} x "
                         f"--dp {cfg.dp}{tp[0]} needs {cfg.world}; start {cfg.world} in all (--nnodes x "
                         f"--nproc-per-node) or change --stages/--dp{tp[1]}")
    if process_group_backend(backend) == "nccl":
        from .launch import check_gpus
        check_gpus(1, place.local_rank)


def run_train(cfg: TrainConfig) -> list[float] | None:
    """Run training; returns the losses when run in this process (local backend).

    Under torchrun (RANK, WORLD_SIZE, ... set) this process is that rank; otherwise a gloo/NCCL
    run starts its ranks with ``pipert.launch.launch`` (``LaunchError`` when one fails).
    """
    from .launch import env_rank
    place = env_rank()
    if place is None and cfg.backend != "local":
        from .launch.starter import warm
        warm()  # the ranks' fork server imports torch while this process validates and compiles
    cfg.validate()
    backend = resolve_backend(cfg.backend, launched=place is not None)
    from .trainchecks import check_mesh_order
    check_mesh_order(cfg, backend)
    if place is not None:
        _check_launched(cfg, backend, place)
        from torch.distributed.elastic.multiprocessing.errors import record
        record(_as_launched_rank)(cfg, backend)  # the error file torchrun reports from
        return None
    if backend != "local" and process_group_backend(backend) == "nccl":
        from .launch import check_gpus
        check_gpus(cfg.world)  # before any work: the GPUs this machine has
    program = _prepare(cfg, backend)  # rejects bad configs before any process starts; shared by every rank
    if backend == "local":
        import torch
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        return _loop(cfg, 0, backend, device, program)
    from .launch import launch
    launch(_proc, cfg.world, args=(cfg, backend, program), backend=process_group_backend(backend),
           timeout=cfg.timeout)
    return None


def config_dict(cfg: TrainConfig) -> dict:
    return asdict(cfg)
