"""The action interpreter: runs one rank's program of a Schedule on real units.

Per action the interpreter does only a dictionary lookup and a call; all placement logic
lives in the schedule. Receives are posted where they stand and completed by the first
action that consumes their value (or an explicit WAIT); sends are posted where they stand
and completed at the end of the step. Every wait has a timeout and, when it expires,
raises ``PipelineTimeout`` naming this rank, the action and the peer it waited for.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..ir import Action, Op, Payload, Schedule
from .buffers import BoundarySpec, flatten_grads, flatten_params, load_grads, load_params, pack, unpack
from .transport import CommTimeout, Handle, PeerFailure, Transport

__all__ = ["PipelineError", "PipelineTimeout", "RankExecutor", "StepResult", "Fault"]


class PipelineError(RuntimeError):
    """A pipeline step failed on some rank; the message names rank, action and peer."""

    def __init__(self, message: str, rank: int | None = None, peer: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class PipelineTimeout(PipelineError):
    """A communication wait exceeded the pipeline's timeout."""


@dataclass
class Fault:
    """Deliberate failure for tests: rank ``rank`` stops before its action ``at_action``."""

    rank: int
    at_action: int
    mode: str = "hang"  # "hang": sleep forever; "exit": leave the process; "raise": raise here


@dataclass
class StepResult:
    """What one rank's step produced."""

    losses: dict[int, float] = field(default_factory=dict)  # micro-batch -> loss (last-unit ranks only)
    sent_bytes: dict[str, int] = field(default_factory=dict)  # payload -> bytes this rank sent
    trace: list[tuple[str, float, float]] = field(default_factory=list)  # (action, start, end) if traced


class RankExecutor:
    """Executes ``schedule.actions[rank]`` against ``runners`` (unit -> UnitRunner)."""

    def __init__(self, rank: int, schedule: Schedule, runners: dict, transport: Transport,
                 optimizers: dict[int, torch.optim.Optimizer], boundary: Callable[[int, int], BoundarySpec],
                 timeout: float = 60.0, loss_scale: float | None = None, fault: Fault | None = None,
                 trace: bool = False) -> None:
        self.rank = rank
        self.schedule = schedule
        self.actions: list[Action] = schedule.actions[rank]
        self.runners = runners
        self.transport = transport
        self.optimizers = optimizers
        self.boundary = boundary
        self.timeout = timeout
        # Each optimizer update averages the loss over the micro-batches it covers.
        per_update = schedule.meta.get("update_every") or schedule.num_microbatches
        self.loss_scale = loss_scale if loss_scale is not None else 1.0 / per_update
        self.fault = fault if fault is not None and fault.rank == rank else None
        self.trace = trace
        self.last_unit = schedule.num_units - 1
        # Activation/gradient receives that stand between two computes are posted before the
        # first of them, so the sender never waits for this rank to finish that compute
        # (gloo and NCCL sends rendezvous with the posted receive). Queue order is unchanged.
        self.early_recvs: dict[int, list[int]] = {}
        computes = [i for i, a in enumerate(self.actions) if a.is_compute]
        for k, c in enumerate(computes):
            stop = computes[k + 1] if k + 1 < len(computes) else len(self.actions)
            ahead = [j for j in range(c + 1, stop) if self.actions[j].op is Op.RECV
                     and self.actions[j].payload in (Payload.ACT, Payload.GRAD)]
            if ahead:
                self.early_recvs[c] = ahead
        self.early_set = {j for js in self.early_recvs.values() for j in js}
        self._dispatch = {
            Op.F: self._forward, Op.B: self._backward, Op.D: self._backward, Op.W: self._weight_grad,
            Op.OPT: self._optimize, Op.RECOMPUTE: self._recompute, Op.SEND: self._send, Op.RECV: self._recv,
            Op.WAIT: self._wait_action, Op.FREE: self._noop, Op.OFFLOAD: self._noop, Op.PREFETCH: self._noop,
            Op.BROADCAST: self._collective, Op.REDUCE: self._collective, Op.ALLREDUCE: self._collective,
            Op.ALLGATHER: self._collective, Op.REDUCESCATTER: self._collective,
        }

    # ------------------------------------------------------------------ step
    def run(self, inputs: Sequence[torch.Tensor] | None, targets: Sequence[torch.Tensor] | None) -> StepResult:
        """Run the whole program once. ``inputs[m]``/``targets[m]`` are needed on the ranks
        that compute the first/last unit of micro-batch m."""
        self.inputs, self.targets = inputs, targets
        for runner in self.runners.values():
            runner.clear()  # nothing carries over from a step that failed midway
        self.values: dict[tuple, torch.Tensor] = {}     # (payload, unit, mb) -> tensor present here
        self.pending: dict[tuple, tuple] = {}            # value key -> (handle, buffer, index, action)
        self.unit_pending: dict[int, list] = {}          # unit -> pending weight/wgrad receives
        self.sends: list[tuple[Handle, int, Action]] = []
        self.stepped: set[int] = set()                   # units whose OPT ran this step
        self.result = StepResult()
        now = time.perf_counter
        early, early_set = self.early_recvs, self.early_set
        for i, a in enumerate(self.actions):
            if self.fault is not None and i == self.fault.at_action:
                self._trip()
            if i in early_set:
                continue  # posted before the previous compute
            if a.sub is not None and a.sub[0] != a.sub[1] - 1 and a.is_compute:
                continue  # a split compute runs whole at its last sub-block
            for j in early.get(i, ()):
                self._recv(j, self.actions[j])
            t0 = now() if self.trace else 0.0
            self._dispatch[a.op](i, a)
            if self.trace:
                self.result.trace.append((str(a), t0, now()))
        for handle, i, a in self.sends:
            self._complete(handle, i, a)
        for key, (handle, _, i, a) in list(self.pending.items()):
            raise PipelineError(f"rank {self.rank}: action {i} ({a}) received a value nobody consumed")
        return self.result

    def _trip(self) -> None:
        mode = self.fault.mode
        if mode == "exit":
            import os
            os._exit(3)
        if mode == "raise":
            raise PipelineError(f"rank {self.rank}: injected fault at action {self.fault.at_action}")
        while True:
            time.sleep(3600)

    # ------------------------------------------------------------------ waits
    def _complete(self, handle: Handle, i: int, a: Action) -> None:
        try:
            handle.wait(self.timeout)
        except CommTimeout:
            verb = "to" if a.op is Op.SEND or a.waits is Op.SEND else "from"
            raise PipelineTimeout(
                f"rank {self.rank} stalled at action {i} ({a}): waited {self.timeout:g} s for "
                f"{a.payload} {verb} rank {self.peer_text(a)}, which did not respond", self.rank, a.peer) from None
        except PeerFailure as e:
            raise PipelineError(f"rank {self.rank} failed at action {i} ({a}): peer rank {self.peer_text(a)} "
                                f"went away ({e})", self.rank, a.peer) from None

    def _post(self, post, i: int, a: Action) -> Handle:
        try:
            return post()
        except PeerFailure as e:
            raise PipelineError(f"rank {self.rank} failed at action {i} ({a}): peer rank {self.peer_text(a)} "
                                f"went away ({e})", self.rank, a.peer) from None

    @staticmethod
    def peer_text(a: Action) -> str:
        if a.peer is not None:
            return str(a.peer)
        return "in group " + ",".join(map(str, a.group))

    def _take(self, key: tuple, i: int, a: Action) -> torch.Tensor:
        """The value ``key`` on this rank, completing its receive if one is pending."""
        if key in self.pending:
            handle, buf, j, recv = self.pending.pop(key)
            self._complete(handle, j, recv)
            self.values[key] = buf
        try:
            return self.values.pop(key)
        except KeyError:
            raise PipelineError(f"rank {self.rank}: action {i} ({a}) needs {key[0]} u{key[1]} m{key[2]} "
                                f"which is not on this rank (was the schedule validated?)") from None

    def _settle_unit(self, unit: int, grads: bool = True) -> None:
        """Complete pending weight (and, with ``grads``, weight-gradient) receives of
        ``unit``. Computes need only the weights: their gradient contributions add up in
        any order, so received gradients are merged where they are sent or stepped."""
        pending = self.unit_pending.get(unit)
        if not pending:
            return
        keep = []
        for handle, buf, j, recv in pending:
            if recv.payload is Payload.WGRAD and not grads:
                keep.append((handle, buf, j, recv))
                continue
            self._complete(handle, j, recv)
            module = self.runners[unit].module
            if recv.payload is Payload.WEIGHT:
                load_params(module, buf)
            else:
                self._fresh_grads(unit)
                load_grads(module, buf, accumulate=True)
        if keep:
            self.unit_pending[unit] = keep
        else:
            del self.unit_pending[unit]

    # ------------------------------------------------------------------ compute
    def _forward(self, i: int, a: Action) -> None:
        u = a.unit
        self._settle_unit(u, grads=False)
        runner = self.runners[u]
        for m in a.mb:
            x = self.inputs[m] if u == 0 else self._act_input(u, m, i, a)
            if u == self.last_unit:
                self.result.losses[m] = float(runner.forward(m, x, self.targets[m]))
            else:
                self.values[(Payload.ACT, u, m)] = runner.forward(m, x)

    def _act_input(self, u: int, m: int, i: int, a: Action):
        return self._unpacked(self._take((Payload.ACT, u - 1, m), i, a), u - 1, m)

    def _unpacked(self, value, u: int, m: int):
        """A received boundary value arrives packed flat; a local one is passed as produced."""
        if isinstance(value, torch.Tensor) and self.boundary(u, m).packed:
            return unpack(value, self.boundary(u, m))
        return value

    def _fresh_grads(self, u: int) -> None:
        """Gradients stay readable after OPT until the next step; a unit that accumulates
        again in the same step (several updates per step) starts from zero."""
        if u in self.stepped:
            self.stepped.discard(u)
            for p in self.runners[u].module.parameters():
                p.grad = None

    def _backward(self, i: int, a: Action) -> None:
        u = a.unit
        self._settle_unit(u, grads=False)
        if a.op is Op.B:
            self._fresh_grads(u)
        runner = self.runners[u]
        for m in a.mb:
            if u == self.last_unit:
                grad_out = None
            else:
                grad_out = self._unpacked(self._take((Payload.GRAD, u, m), i, a), u, m)
            if a.op is Op.B:
                grad_in = runner.backward(m, grad_out, loss_scale=self.loss_scale)
            else:
                grad_in = runner.backward_input(m, grad_out, loss_scale=self.loss_scale)
            if u > 0:
                self.values[(Payload.GRAD, u - 1, m)] = grad_in

    def _weight_grad(self, i: int, a: Action) -> None:
        self._fresh_grads(a.unit)
        for m in a.mb:
            self.runners[a.unit].backward_weight(m)

    def _recompute(self, i: int, a: Action) -> None:
        raise PipelineError(f"rank {self.rank}: action {i} ({a}): RECOMPUTE is not supported by this executor")

    def _optimize(self, i: int, a: Action) -> None:
        units = [a.unit] if a.unit is not None else self.schedule.units_owned(self.rank)
        for u in units:
            self._settle_unit(u)
            if u in self.optimizers:  # units without parameters have no optimizer
                self.optimizers[u].step()
            self.stepped.add(u)

    # ------------------------------------------------------------------ communication
    def _payload_tensor(self, i: int, a: Action) -> torch.Tensor:
        p = a.payload
        if p is Payload.WEIGHT:
            self._settle_unit(a.unit)
            return flatten_params(self.runners[a.unit].module)
        if p is Payload.WGRAD:
            self._settle_unit(a.unit)
            return flatten_grads(self.runners[a.unit].module)
        t = self._take((p, a.unit, a.mb[0]), i, a)
        return pack(t) if isinstance(t, (tuple, list)) else t.contiguous()

    def _send(self, i: int, a: Action) -> None:
        t = self._payload_tensor(i, a)
        if a.payload is Payload.WGRAD:
            load_grads(self.runners[a.unit].module, None)  # the contributions move with the message
        handle = self._post(lambda: self.transport.isend(t, a.peer), i, a)
        key = a.payload.value
        self.result.sent_bytes[key] = self.result.sent_bytes.get(key, 0) + t.numel() * t.element_size()
        self.sends.append((handle, i, a))

    def _recv(self, i: int, a: Action) -> None:
        p = a.payload
        if p in (Payload.WEIGHT, Payload.WGRAD):
            module = self.runners[a.unit].module
            buf = flatten_params(module).new_empty(sum(q.numel() for q in module.parameters()))
            handle = self._post(lambda: self.transport.irecv(buf, a.peer), i, a)
            self.unit_pending.setdefault(a.unit, []).append((handle, buf, i, a))
            return
        spec = self.boundary(a.unit, a.mb[0])
        buf = spec.empty()
        handle = self._post(lambda: self.transport.irecv(buf, a.peer), i, a)
        self.pending[(p, a.unit, a.mb[0])] = (handle, buf, i, a)

    def _wait_action(self, i: int, a: Action) -> None:
        if a.waits is Op.RECV:
            if a.payload in (Payload.WEIGHT, Payload.WGRAD):
                self._settle_unit(a.unit)
            elif (a.payload, a.unit, a.mb[0]) in self.pending:
                handle, buf, j, recv = self.pending.pop((a.payload, a.unit, a.mb[0]))
                self._complete(handle, j, recv)
                self.values[(a.payload, a.unit, a.mb[0])] = buf

    def _collective(self, i: int, a: Action) -> None:
        module = self.runners[a.unit].module
        self._settle_unit(a.unit)
        if a.payload is Payload.WEIGHT:
            t = flatten_params(module)
        else:
            t = flatten_grads(module)
        op = a.op.value
        if op not in ("BROADCAST", "REDUCE", "ALLREDUCE"):
            raise PipelineError(f"rank {self.rank}: action {i} ({a}): {op} is not supported yet; "
                                f"allowed: BROADCAST, REDUCE, ALLREDUCE")
        handle = self._post(lambda: self.transport.collective(op, t, a.group, a.root), i, a)
        self._complete(handle, i, a)
        key = f"{op.lower()}:{a.payload.value}"
        self.result.sent_bytes[key] = self.result.sent_bytes.get(key, 0) + t.numel() * t.element_size()
        if a.payload is Payload.WEIGHT:
            if self.rank != a.root:
                load_params(module, t)
        elif op == "REDUCE" and self.rank != a.root:
            load_grads(module, None)
        else:
            load_grads(module, t, accumulate=False)

    def _noop(self, i: int, a: Action) -> None:
        return None
