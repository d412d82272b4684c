"""The action interpreter: runs one rank's program of a Schedule on real units.

The program is run in list order and decides nothing of its own (docs/semantics.md): what an
action reads and writes comes from ``pipert.ir.semantics`` (looked up once per action when the
executor is built), where receives are posted is where they stand. Six verbs realise the ops:

- ``compute``: F, B, D, W, RECOMPUTE, OPT on the unit runners (values in, values out);
- ``send`` / ``recv``: posted where they stand; a receive completes when its value is first
  read (or at a WAIT), a send when the transport is done with it (checked after every action);
- ``collective``: posted where it stands over its group, completed by its first reader (at once
  when the placement's ``collective_queue`` is the compute queue);
- ``wait``: completes an earlier SEND or RECV;
- ``memory``: FREE, OFFLOAD, PREFETCH of a value, a unit's weights or a stash.

The executor runs a ``pipert.ir.program.Program`` only if it is what the validator accepted
(``Program.verify``): ``pipert.compile`` makes one. Test and measurement hooks come in one
``pipert.exec.instrument.Instrumentation`` (``instrument``; None in production).

Every host wait has a timeout and, when it expires, raises ``PipelineTimeout`` naming this
rank, the action and the peer it waited for. A handle with stream semantics
(``pipert.comm.base.stream_waits``: NCCL on a GPU) completes on the stream instead: the
stream that reads its value waits, the host does not, and a hang is the process group's
timeout to catch. A loss stays on its device; ``Pipeline.step`` reads the step's losses once.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..comm.base import Handle, Transport, stream_waits
from ..comm.nccl import first_uses
from ..device.queues import HostQueues
from ..device.tensors import tensor_key
from ..errors import CommTimeout, PeerFailure, PipelineError, PipelineTimeout
from ..ir import Action, Op, Payload
from ..ir.phases import forward_only_program
from ..ir.program import Program
from ..ir.semantics import MEMORY_OPS, P2P_OPS, STASH_READERS, TABLE, Queue, Semantics, Value, recomputed
from .buffers import BoundarySpec
from .collectives import run_collective, run_memory_op
from .instrument import NONE, Instrumentation, digest
from .stash import hooked_units
from .state import UnitState

__all__ = ["RankExecutor", "StepResult", "SUPPORTED_OPS"]

SUPPORTED_OPS = frozenset(Op)
"""Every op of the IR runs on every transport (gloo's missing collectives are emulated)."""


@dataclass
class StepResult:
    """What one rank's step produced."""

    losses: dict[int, float] = field(default_factory=dict)
    """Micro-batch -> loss (last-unit ranks only), filled from ``loss_values`` by ``Pipeline.step``
    with one read of the device per step."""
    loss_values: dict[int, torch.Tensor] = field(default_factory=dict)
    """Micro-batch -> loss as a 0-d tensor on its device, detached (last-unit ranks only)."""
    outputs: dict[int, Any] = field(default_factory=dict)
    """Micro-batch -> the last unit's output, of an evaluation program run without targets."""
    sent_bytes: dict[str, int] = field(default_factory=dict)  # payload (or op:payload) -> bytes this rank sent
    trace: list[tuple[str, float, float]] = field(default_factory=list)  # (action, start, end) if traced
    op_times: list[tuple[str, int | None, float, float, tuple[int, int] | None]] = field(default_factory=list)
    """If traced: (op, unit, seconds, CPU seconds of the computing thread, piece) of every compute
    per micro-batch and of OPT, the unit's work alone (waits for received values excluded); piece
    ``(j, n)`` for the j-th of n sub-blocks of a split compute (its own seconds), else None."""
    messages: list[tuple] = field(default_factory=list)
    """If traced: every point-to-point message of the step, ("send", peer, k, bytes, ready at) on
    its sender (ready: the end of the compute-queue action the send waits for, where the link model
    starts it; its post where it waits for none) and ("recv", peer, k, wait began, completed) on
    its receiver, k its index on its directed link in the step (FIFO: the k-th send meets the k-th
    receive), times
    ``time.perf_counter()`` (one clock for the processes of one host)."""
    queue_overhead: float = 0.0
    """If traced: seconds the compute queue spent on its computes and WAITs beyond the computes' own
    work and the waits for communication, and between them (issuing, hand-offs between queue
    threads, Python, the interpreter lock, waits for a core); the first action's start excluded."""
    queue_computes: int = 0
    """If traced: the compute actions that ``queue_overhead`` is spread over."""
    issue_s: float = 0.0
    """Host seconds from the start of the step until every action was issued, before the step's one
    wait for the queues: against the step's time, how far ahead of its queues the host ran."""
    memory: list[int] = field(default_factory=list)  # bytes held after each action, if measured
    stashes: list[list[tuple[int, int]]] = field(default_factory=list)
    """If measured: after each action, the (unit, micro-batch) stashes holding saved tensors
    (seen by the saved-tensor hooks of ``pipert.exec.stash``)."""
    order: list[tuple] = field(default_factory=list)
    """If recorded: (action index, op, unit, micro-batch, digest of the value read, digest of the value
    written) per micro-batch of every compute, in the order they ran."""


_ACT_GRAD = (Value.ACT, Value.GRAD)
_PAYLOAD_KIND = {Payload.ACT: Value.ACT, Payload.GRAD: Value.GRAD}


class RankExecutor:
    """Executes ``program.actions[rank]`` against ``runners`` (unit -> UnitRunner).

    ``instrument``: a ``pipert.exec.instrument.Instrumentation`` (None: no hook); an unvalidated
    program runs only when its ``check`` is False."""

    def __init__(self, rank: int, program: Program, runners: dict, transport: Transport,
                 optimizers: dict[int, torch.optim.Optimizer], boundary: Callable[[int, int], BoundarySpec],
                 timeout: float = 60.0, loss_scale: float | None = None, state: UnitState | None = None,
                 queues: Any = None, comms: Any = None, instrument: Instrumentation | None = None) -> None:
        if not isinstance(program, Program):
            raise TypeError(f"RankExecutor runs a Program (pipert.compile), got {type(program).__name__}")
        instrument = instrument or NONE
        program.verify(unchecked=not instrument.check)
        self.rank = rank
        self.compiled = program
        """The whole Program (every rank's actions); ``program`` is this rank's."""
        self.program: tuple[Action, ...] = program.actions[rank]
        self.runners = runners
        self.transport = transport
        self.boundary = boundary
        self.timeout = timeout
        per_update = program.meta.get("update_every") or program.num_microbatches
        self.loss_scale = loss_scale if loss_scale is not None else 1.0 / per_update
        self.fault = instrument.fault_of(rank)
        self._aborted = threading.Event()
        self.trace = instrument.trace
        self.measure = instrument.measure_memory
        self.record = instrument.record
        self.last_unit = program.num_units - 1
        self.state = state if state is not None else UnitState(rank, program, runners, optimizers)
        if not self.measure and not forward_only_program(program):
            self.state.stash.hooked = hooked_units(self.program)
        self.queues = queues if queues is not None else HostQueues()
        self.comms = comms
        """Where communicators are created (``connect``) when they are made at first use (NCCL,
        ``pipert.comm.nccl``): each first use connects on the issuing thread, in program order."""
        self._first_uses: list | None = None  # (action index, communicator) of each first use, once needed
        self._sends_lock = threading.Lock()
        self._in_flight: list[tuple[Handle, int, Action]] = []
        """Handles completed on the stream since the queues last finished, in that order (what a
        step that does not finish may still wait for on the device)."""
        sem = Semantics.of(program)
        self.blocking_collectives = sem.collective_queue is Queue.COMPUTE
        keep = recomputed(self.program)
        self.evaluation = forward_only_program(program)
        """An evaluation program (``pipert.ir.phases``): forwards without graphs or stashes."""
        verbs = {Queue.COMPUTE: self._compute, Queue.SEND: self._send, Queue.RECV: self._recv,
                 Queue.GROUP: self._collective}
        # per action: (verb, activation/gradient values it reads, those it writes, flag, queue, every
        # value it reads, every value it writes, the SEND/RECV a WAIT completes); the flag of an F
        # says whether it keeps its graph, of another compute which gathered copy of its unit's
        # weights it reads (None: it reads none)
        self.plan: list[tuple] = []
        for a in self.program:
            if a.op not in SUPPORTED_OPS:
                raise PipelineError(f"rank {rank}: op {a.op} is not supported; allowed: "
                                    f"{', '.join(sorted(o.value for o in SUPPORTED_OPS))}", rank)
            verb = verbs[TABLE[a.op].queue]
            if a.op is Op.WAIT:
                verb = self._wait
            elif a.op in MEMORY_OPS:
                verb = self._memory
            bad = sem.field_error(a) if a.unit is not None and a.unit < sem.num_units else None
            if bad is not None:
                raise PipelineError(f"rank {rank}: action {a}: {bad}", rank)
            keeps = a.op is Op.F and any((a.unit, m) in keep for m in a.mb)
            p = sem.plan(a, rank, keeps)
            rk = [k for e in p.reads for k in e.keys(a.mb)]
            wk = [k for e in p.writes for k in e.keys(a.mb)]
            rd = [k for k in rk if k[0] in _ACT_GRAD]
            wr = [k for k in wk if k[0] in _ACT_GRAD]
            # F keeps its graph unless a RECOMPUTE follows; another compute that reads weights binds
            # its side's gathered copy first
            flag = not keeps if a.op is Op.F else \
                (TABLE[a.op].side if any(e.kind is Value.WEIGHT for e in p.reads) else None)
            self.plan.append((verb, rd, wr, flag, sem.queue(a.op), rk, wk, _wait_target(self.program, len(self.plan))))
        held = sorted(u for u in runners if rank in program.placement.holders(u))
        # units whose weights or gradients each compute-queue action may change
        self.touches = [([a.unit] if a.unit is not None else held) if sem.queue(a.op) is Queue.COMPUTE else []
                        for a in self.program]

    # ------------------------------------------------------------------ step
    def run(self, inputs: Sequence[torch.Tensor] | None, targets: Sequence[torch.Tensor] | None,
            part: tuple[int, int] | None = None) -> StepResult:
        """Run the program once, or its actions ``part = (start, stop)``: a part that starts at 0
        begins a step, a later one goes on with the step's state (``pipert.ir.phases``: the
        update after forward and backward). ``inputs[m]``/``targets[m]`` are needed on the ranks
        that compute the first/last unit of micro-batch m; ``targets=None`` on an evaluation
        program keeps the last unit's outputs (``StepResult.outputs``)."""
        t_start = time.perf_counter()
        start, stop = part if part is not None else (0, len(self.program))
        if start == 0:
            self.inputs, self.targets = inputs, targets
            self.state.begin_step()
            self.values: dict[tuple, Any] = {}     # (kind, unit, mb) -> tensor or tuple present here
            self.pending: dict[tuple, tuple] = {}  # value key -> (handle, buffer, slot, index, action)
            self.sends: list[tuple[Handle, Any, int, Action]] = []
            self.result = StepResult()
            self._link_index: dict[tuple[str, int], int] = {}  # (SEND|RECV, peer) -> messages posted
            self._recv_index: dict[int, int] = {}  # action index of a posted RECV -> its k on the link
            self._ends: dict[int, float] = {}  # traced: compute-queue action index -> its end
            self._ready_of: dict[int, int] = {}  # traced: SEND index -> the compute-queue action it waits for
            self._queue_end: float | None = None  # traced: end of the compute queue's last action
            self._accounted = 0.0  # traced: seconds computing or waiting for communication so far
        self._error: BaseException | None = None
        q = self.queues
        posted: dict[tuple, Any] = {}    # value key -> event of the post that brings it
        at: dict[int, Any] = {}          # action index -> event of its post (SEND, RECV, collective)
        taken: dict[int, Any] = {}       # unit -> event of the last post that read its weights or gradient
        lazy = [(i, c) for i, c in self._unconnected() if start <= i < stop]
        nxt, used = (lazy[0][0] if lazy else -1), 0
        last_compute = -1
        for i in range(start, stop):
            a = self.program[i]
            if i == nxt:  # a communicator's first use: its creation blocks this (issuing) thread
                self._connect(i, a, lazy[used][1])
                used += 1
                nxt = lazy[used][0] if used < len(lazy) else -1
            if self.fault is not None and i == self.fault.at_action:
                q.compute(self._item(i, a, lambda *_: self._trip()))
            verb, rd, wr, flag, qn, rk, wk, dep = self.plan[i]
            waits = [posted[k] for k in rk if k in posted]
            item = self._item(i, a, verb, rd, wr, flag)
            if qn is Queue.COMPUTE:
                if dep is not None and dep in at:             # a WAIT: its SEND or RECV was posted
                    waits.append(at[dep])
                for u in self.touches[i]:                     # computes change weights and gradients
                    if u in taken:
                        waits.append(taken[u])
                q.compute(item, waits)
                last_compute = i
                continue
            if self.trace and last_compute >= 0:
                self._ready_of[i] = last_compute
            ev = q.recv(item, waits) if qn is Queue.RECV else q.send(item, waits)
            at[i] = ev
            for k in wk:
                posted[k] = ev
            for k in rk:
                if k[0] is Value.WEIGHT or k[0] is Value.WGRAD:
                    taken[k[1]] = ev
        self.result.issue_s = time.perf_counter() - t_start
        if not q.finish(self.timeout):
            raise self._stalled()
        self._in_flight.clear()  # everything the queues waited for on the device is done
        if self._error is not None:
            raise self._error
        # what is still in flight (sends; weights or gradients a held unit keeps for the next step):
        # the host waits for it, or (stream semantics) the compute queue does, so the next step's
        # computes are ordered after it
        q.after(self._end_step)
        self.sends = []
        for key, (_, _, _, i, a) in self.pending.items():
            raise PipelineError(f"rank {self.rank}: action {i} ({a}) received {key[0].name.lower()} u{key[1]} "
                                f"m{key[2]}, which nothing read")
        return self.result

    def _unconnected(self) -> list:
        """(action index, communicator) of the first uses whose communicator does not exist yet."""
        comms = self.comms
        if comms is None or not comms.lazy:
            return []
        if self._first_uses is None:
            self._first_uses = first_uses(self.program, self.rank)
        return [(i, c) for i, c in self._first_uses if not comms.is_connected(c)]

    def _connect(self, i: int, a: Action, comm: Any) -> None:
        """Create ``comm`` at action i; a timeout stops the step (queued items are skipped)."""
        try:
            self.comms.connect(comm, f"action {i} ({a})", self.timeout)
        except (CommTimeout, PeerFailure) as e:
            err = PipelineTimeout if isinstance(e, CommTimeout) else PipelineError
            self._error = err(f"rank {self.rank} stalled at action {i} ({a}): {e}", self.rank, a.peer)
            self.queues.finish()
            raise self._error from None

    def _item(self, i: int, a: Action, verb: Callable, *args: Any) -> Callable[[], None]:
        """Action i as a queue item: skipped after a failure; the first exception is kept."""
        def run() -> None:
            if self._error is not None:
                raise RuntimeError("skipped after an earlier failure")
            self.state.at(i)
            t0, accounted = (time.perf_counter(), self._accounted) if self.trace else (0.0, 0.0)
            try:
                verb(i, a, *args)
                if self.sends:
                    self._reap_sends()
            except BaseException as e:  # noqa: BLE001 - raised again by run() after the queues stop
                if self._error is None:
                    self._error = e
                raise
            if self.trace:
                t1 = time.perf_counter()
                self.result.trace.append((str(a), t0, t1))
                if self.plan[i][4] is Queue.COMPUTE:
                    self._queue_time(i, a, t0, t1, self._accounted - accounted)
            if self.measure:
                self.result.memory.append(self.held_bytes())
                self.result.stashes.append(self.state.stash.live())
        return run

    def _queue_time(self, i: int, a: Action, t0: float, t1: float, accounted: float) -> None:
        """Adds compute-queue action i (from t0 to t1, ``accounted`` of it computing or waiting for
        communication) to ``queue_overhead``: what it took beyond that, and the gap since the
        queue's previous action, for computes and WAITs (other actions are timed as they are)."""
        if a.is_compute or a.op is Op.WAIT:
            gap = t0 - self._queue_end if self._queue_end is not None else 0.0
            self.result.queue_overhead += gap + max(0.0, t1 - t0 - accounted)
            self.result.queue_computes += a.is_compute
        self._queue_end = self._ends[i] = t1

    def _trip(self) -> None:
        self.fault.trip(self._aborted, PipelineError)  # a hang lasts until the Pipeline gives up (abort)

    def abort(self) -> None:
        """End an injected hang (the Pipeline calls this on ranks still running after it gave
        up on a failed step, so no thread outlives the step)."""
        self._aborted.set()

    # ------------------------------------------------------------------ waits
    def _end_step(self) -> None:
        for handle, _, i, a in self.sends:
            self._complete(handle, i, a)
        self.state.pending_check(self.rank)

    def _complete(self, handle: Handle, i: int, a: Action) -> None:
        k = self._recv_index.pop(i, None) if self.trace and a.op is Op.RECV else None
        t0 = time.perf_counter() if self.trace else 0.0
        try:
            if stream_waits(handle):
                handle.wait_stream()  # the current stream waits; no host wait, no timeout here
                self._in_flight.append((handle, i, a))
            else:
                handle.wait(self.timeout)
            if self.trace:
                t1 = time.perf_counter()
                self._accounted += t1 - t0
                if k is not None:
                    self.result.messages.append(("recv", a.peer, k, t0, t1))
        except CommTimeout as e:
            verb = "to" if a.op is Op.SEND or a.waits is Op.SEND else "from"
            detail = getattr(e, "detail", "")
            raise PipelineTimeout(
                f"rank {self.rank} stalled at action {i} ({a}): waited {self.timeout:g} s for "
                f"{a.payload} {verb} rank {peer_text(a)}, which did not respond" + (f" ({detail})" if detail else ""),
                self.rank, a.peer) from None
        except PeerFailure as e:
            raise PipelineError(f"rank {self.rank} failed at action {i} ({a}): peer rank {peer_text(a)} "
                                f"went away ({e})", self.rank, a.peer) from None

    def _stalled(self) -> PipelineTimeout:
        """The error of a step whose queues did not finish in time: the first communication the
        device still waits for (in the order they were completed on the stream), named."""
        for handle, i, a in self._in_flight:
            if not handle.done():
                verb = "to" if a.op is Op.SEND or a.waits is Op.SEND else "from"
                return PipelineTimeout(
                    f"rank {self.rank} stalled at action {i} ({a}): the step did not finish in {self.timeout:g} s; "
                    f"its first communication still in flight is {a.payload} {verb} rank {peer_text(a)}",
                    self.rank, a.peer)
        return PipelineTimeout(f"rank {self.rank}: the step did not finish in {self.timeout:g} s, though every "
                               f"communication it waited for is done", self.rank)

    def _post(self, post: Callable[[], Handle], i: int, a: Action, nbytes: int = 0) -> Handle:
        if self.trace and a.op in P2P_OPS:
            k = self._link_index.get((a.op.value, a.peer), 0)
            self._link_index[(a.op.value, a.peer)] = k + 1
            if a.op is Op.SEND:
                now = time.perf_counter()
                self.result.messages.append(("send", a.peer, k, nbytes, self._ends.get(self._ready_of.get(i), now)))
            else:
                self._recv_index[i] = k
        try:
            return post()
        except PeerFailure as e:
            raise PipelineError(f"rank {self.rank} failed at action {i} ({a}): peer rank {peer_text(a)} "
                                f"went away ({e})", self.rank, a.peer) from None

    def _reap_sends(self) -> None:
        """Release the buffers of sends the transport has finished."""
        with self._sends_lock:
            self.sends[:] = [item for item in self.sends if not item[0].done()]

    def _take(self, key: tuple, i: int, a: Action) -> Any:
        """Value ``key`` on this rank (completing its receive if pending); it leaves the table."""
        if key in self.pending:
            self._settle(key)
        try:
            return self.values.pop(key)
        except KeyError:
            raise PipelineError(f"rank {self.rank}: action {i} ({a}) needs {key[0].name.lower()} u{key[1]} "
                                f"m{key[2]}, which is not on this rank (was the schedule validated?)") from None

    def _settle(self, key: tuple) -> None:
        """Complete the receive or collective that brings ``key`` (and its fold partners)."""
        handle, buf, slots, j, recv = self.pending[key]
        self._complete(handle, j, recv)
        for k, part in zip(slots, self._split(buf, slots)):
            self.pending.pop(k, None)
            self.values[k] = part

    def _split(self, buf: torch.Tensor, keys: list[tuple]) -> list[Any]:
        """A received buffer cut into the values of ``keys`` (a fold carries several)."""
        out, off = [], 0
        for kind, u, m in keys:
            spec = self.boundary(u, m)
            n = spec.numel()
            flat = buf[off:off + n]
            off += n
            out.append(spec.unpack(flat))
        return out

    # ------------------------------------------------------------------ compute
    def _clocks(self) -> tuple[float, float] | None:
        """(wall, this thread's CPU) seconds now when tracing, else None (no clock is read)."""
        return (time.perf_counter(), time.thread_time()) if self.trace else None

    def _timed(self, op: Op, u: int | None, t: tuple[float, float], piece: tuple[int, int] | None = None) -> None:
        """One ``op_times`` entry since clocks ``t`` (``piece``: the sub-block of a split compute)."""
        wall, cpu = time.perf_counter() - t[0], time.thread_time() - t[1]
        self._accounted += wall
        self.result.op_times.append((op.value, u, wall, cpu, piece))

    def _compute(self, i: int, a: Action, rd: list, wr: list, flag: bool | str | None) -> None:
        op, u = a.op, a.unit
        if op is Op.OPT:
            t = self._clocks()
            self.state.optimize(a)
            if t is not None:
                self._timed(op, a.unit, t)
            return
        if op is Op.F:
            self.state.ready(u, TABLE[op].side)
        elif flag is not None:   # the gathered copy of weights this compute reads (pipert.ir.semantics)
            self.state.ready(u, flag)
        runner = self.runners[u]
        first = a.sub is None or a.sub[0] == 0
        if first and op in STASH_READERS:
            for m in a.mb:
                if self.state.stash.is_offloaded(u, m):
                    raise PipelineError(f"rank {self.rank}: action {i} ({a}) reads the stash of micro-batch {m}, "
                                        f"which is offloaded (was the schedule validated?)", self.rank)
        reads_by_mb = {k[2]: k for k in rd} if first else {}
        writes_by_mb = {k[2]: k for k in wr}
        for m in a.mb:
            key = reads_by_mb.get(m)
            x = self._take(key, i, a) if key is not None else None
            t = self._clocks()
            out = self._run(runner, a, m, x, flag)
            if t is not None:
                self._timed(op, u, t, a.sub)
            if self.record:
                self.result.order.append((i, op.value, u, m, digest(x), digest(out)))
            key = writes_by_mb.get(m)
            if key is not None:
                self.values[key] = out

    def _run(self, runner: Any, a: Action, m: int, x: Any, graph: bool) -> Any:
        op, u = a.op, a.unit
        if op is Op.F:
            if u == 0:
                x = self.inputs[m]
            if self.evaluation:
                out = runner.evaluate(x, None if self.targets is None else self.targets[m])
                if u != self.last_unit:
                    return out
                (self.result.outputs if self.targets is None else self.result.loss_values)[m] = out
                return None
            with self.state.stash.capture(u, m):
                if u == self.last_unit:  # no host read here: the step reads its losses once
                    loss = runner.forward(m, x, self.targets[m], keep_graph=graph)
                    if loss is not None:  # None: the loss comes with the backward (loss in backward)
                        self.result.loss_values[m] = loss.detach()
                    return None
                return runner.forward(m, x, keep_graph=graph)
        if op is Op.RECOMPUTE:
            with self.state.stash.capture(u, m):
                runner.recompute(m)
            return None
        if op is Op.W:
            self.state.fresh_grads(u)
            runner.backward_weight(m, a.sub)
            if a.sub is None or a.sub[0] == a.sub[1] - 1:
                self.state.stash.drop(u, m)
            return None
        if op is Op.B:
            self.state.fresh_grads(u)
            out = runner.backward(m, x, loss_scale=self.loss_scale)
            self.state.stash.drop(u, m)
        else:
            out = runner.backward_input(m, x, loss_scale=self.loss_scale)  # D
        if u == self.last_unit:
            loss = runner.pop_loss(m)  # the loss of a unit whose head runs in its backward
            if loss is not None:
                self.result.loss_values[m] = loss
        return out

    # ------------------------------------------------------------------ communication
    def _payload_out(self, i: int, a: Action, release: bool) -> torch.Tensor:
        """The flat tensor a SEND or collective carries (values leave the table if ``release``)."""
        if a.payload is Payload.WEIGHT or a.payload is Payload.WGRAD:
            return self.state.flat(a.unit, a.payload, a.zclass)
        kind = _PAYLOAD_KIND[a.payload]
        parts = []
        for m in a.mb:
            key = (kind, a.unit, m)
            v = self._take(key, i, a)
            if not release:
                self.values[key] = v
            parts.append(self.boundary(a.unit, m).pack(v))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _count(self, key: str, t: torch.Tensor) -> None:
        self.result.sent_bytes[key] = self.result.sent_bytes.get(key, 0) + t.numel() * t.element_size()

    def _send(self, i: int, a: Action, rd: list, wr: list, graph: bool) -> None:
        if a.payload is Payload.WGRAD:
            t = self.state.take_wgrad(a.unit, a.zclass)
        else:
            t = self._payload_out(i, a, release=True)
        handle = self._post(lambda: self.transport.isend(t, a.peer), i, a, t.numel() * t.element_size())
        self._count(a.payload.value, t)
        with self._sends_lock:
            self.sends.append((handle, t, i, a))

    def _recv(self, i: int, a: Action, rd: list, wr: list, graph: bool) -> None:
        if a.payload is Payload.WEIGHT or a.payload is Payload.WGRAD:
            st, u, zc = self.state, a.unit, a.zclass
            buf = st.new_flat(u, zc)
            handle = self._post(lambda: self.transport.irecv(buf, a.peer), i, a)
            done = (lambda: st.bind(u, buf, zc)) if a.payload is Payload.WEIGHT else \
                (lambda: st.add_grads(u, buf, zc=zc))
            st.expect(u, handle, done, i, a, self._complete, buf)
            return
        kind = _PAYLOAD_KIND[a.payload]
        keys = [(kind, a.unit, m) for m in a.mb]
        buf = self._empty(keys)
        handle = self._post(lambda: self.transport.irecv(buf, a.peer), i, a)
        for k in keys:
            self.pending[k] = (handle, buf, keys, i, a)

    def _empty(self, keys: list[tuple]) -> torch.Tensor:
        specs = [self.boundary(u, m) for _, u, m in keys]
        return torch.empty(sum(s.numel() for s in specs), dtype=specs[0].dtype, device=specs[0].device)

    def _wait(self, i: int, a: Action, rd: list, wr: list, graph: bool) -> None:
        if a.waits is Op.RECV:
            if a.payload is Payload.WEIGHT or a.payload is Payload.WGRAD:
                self.state.settle(a.unit)
                return
            for m in a.mb:
                key = (_PAYLOAD_KIND[a.payload], a.unit, m)
                if key in self.pending:
                    self._settle(key)
            return
        target = Action(Op.SEND, unit=a.unit, mb=a.mb, payload=a.payload, peer=a.peer, tag=a.tag, zclass=a.zclass)
        for handle, _, j, s in reversed(self.sends):
            if s == target and j < i:
                self._complete(handle, j, s)
                return

    def _collective(self, i: int, a: Action, rd: list, wr: list, graph: bool) -> None:
        run_collective(self, i, a)

    # ------------------------------------------------------------------ memory ops
    def _memory(self, i: int, a: Action, rd: list, wr: list, graph: bool) -> None:
        run_memory_op(self, i, a)

    # ------------------------------------------------------------------ measurement
    def held_bytes(self) -> int:
        """Bytes the program holds now (docs/semantics.md, "Memory": unit of account)."""
        keys: set[tuple] = set()
        for v in self.values.values():
            for t in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(t, torch.Tensor):
                    keys.add(tensor_key(t))
        for _, buf, slots, _, _ in self.pending.values():
            keys.add(tensor_key(buf))
        return sum(k[3] for k in keys) + self.state.stash_bytes() + self.state.held_bytes()


def _wait_target(program: list[Action], i: int) -> int | None:
    """Index of the SEND or RECV that the WAIT at ``i`` completes (None for other actions)."""
    a = program[i]
    if a.op is not Op.WAIT:
        return None
    target = Action(a.waits, unit=a.unit, mb=a.mb, payload=a.payload, peer=a.peer, tag=a.tag)
    return next((j for j in range(i - 1, -1, -1) if program[j] == target), None)


def peer_text(a: Action) -> str:
    if a.peer is not None:
        return str(a.peer)
    return "in group " + ",".join(map(str, a.group))
