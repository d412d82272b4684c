"""What every op means: the one semantics that the validator/simulator, the emulator, the executor
and the lowering passes read (docs/semantics.md explains it in prose).

A rank holds *values*. A value is named by its kind, a unit and, for per-micro-batch kinds, a
micro-batch (for per-unit kinds, a slot: the whole unit or one ZeRO class, and which gathered copy):

====================  ===========================================================================
``ACT u m``           output activation of unit u (what unit u+1 reads)
``GRAD u m``          gradient w.r.t. ``ACT u m`` (what backward of unit u reads)
``STASH u m``         what the backward of (u, m) needs, left by F (or rebuilt by RECOMPUTE)
``STASH_W u m``       what W of (u, m) needs, left by D
``KEPT u m``          the input F keeps when a RECOMPUTE of (u, m) follows on the same rank
``WEIGHT u``          the parameters of unit u
``WGRAD u``           the accumulated weight gradient of unit u: a set of micro-batch contributions
====================  ===========================================================================

The parts:

- :mod:`.table` — per op (:data:`TABLE`): the fields its actions set, its queue, whether it takes
  time, the values it reads, writes and frees relative to the action (a read marked ``release``
  ends the value's life on the rank);
- :mod:`.opsets` — every set of ops the consumers use, derived from the table;
- :mod:`.fields` — the check of an action's fields (run when an Action is made);
- :mod:`.rules` — :class:`Semantics`, the rules that make the table concrete for one program:

  - *Units and edges.* A ref with ``edge="prev"`` exists only for units with a predecessor
    (unit 0 reads the batch, its backward produces no input gradient); ``edge="next"`` only for
    units with a successor (the last unit's F produces the loss, its backward is seeded by it).
  - *Folds.* An action naming several micro-batches (``F u m0,1``) reads and writes each per-
    micro-batch value once per micro-batch; per-unit values once. It takes the sum of its
    micro-batches' times (:func:`action_time`: a cost model prices one (op, unit, micro-batch)).
  - *Sub-blocks.* A compute split into pieces ``sI/N`` reads at its first piece and writes at its
    last piece; every piece takes ``1/N`` of the time.
  - *Recomputation.* An F of (u, m) that is followed on its rank by ``RECOMPUTE u m`` writes
    ``KEPT u m`` instead of ``STASH u m``; the RECOMPUTE turns it into the stash.
  - *Payload.* SEND, RECV, collectives and memory ops act on the value their payload names
    (:data:`PAYLOAD_VALUE`); a SEND hands it over except a unit's weights (:func:`releases_on_send`).
  - *OPT* steps the named unit, or without a unit every unit whose weights the rank holds; of a
    ZeRO class of stage >= 1 it reads the gradient shard and writes the weight shard, and the whole
    weights of a ZeRO-1/2 class are stale (freed) until an ALLGATHER.
  - *ZeRO classes.* A unit whose parameters have several ZeRO stages (``Placement.mixed``) has one
    ``WEIGHT`` and one ``WGRAD`` value per stage present, its *classes*, each with its share of the
    unit's bytes and the rules of its stage. An action whose payload is the weights or gradient of
    such a unit names one class (``zclass``, text ``z3``) and acts on that class alone; a compute or
    OPT of the unit reads and writes every class.
  - *Gathered weights.* A holder of a ZeRO-3 class keeps only its shard; F, B, D and RECOMPUTE read
    the gathered class, and so does W: its stash refers to the class's parameters, whose storage is
    the gathered copy. With ``Placement.zero3_buffers == 2`` the gathered copies are two values, the
    ``fwd`` copy (F) and the ``bwd`` copy (B, D, RECOMPUTE, W); an ALLGATHER or FREE names one (``side``).
  - *Initial holdings.* A holder starts a step with the whole weights of its ZeRO-0/1/2 classes and
    the shards of its ZeRO-1/2/3 classes (:meth:`Semantics.initial`).
  - *Counted memory.* Every value is counted while present, except host copies and the model state
    a holder keeps across steps (:meth:`Semantics.counted`). OFFLOAD moves a value off the device
    (reading it is an error until PREFETCH brings it back).
  - *Queues.* Each op runs on one of the rank's queues (:class:`Queue`); collectives on the group
    queue, or on the compute queue where the placement's ``collective_queue`` says so.
"""
from ..ops import Op, Payload
from .fields import PER_MB_PAYLOADS, fields_error
from .opsets import (BACKWARD_OPS, BOUNDARY_OPS, BWD_COPY_READERS, COLLECTIVE_OPS, COMM_OPS, COMPUTE_OPS,
                     DROPPING_OPS, GRAD_WRITERS, HOST_OPS, LOCAL_WGRAD_OPS, MEMORY_OPS, P2P_OPS, PIECEWISE_OPS, ROOTED_OPS,
                     SIDED_OPS, STASH_READERS, TIMED_OPS, UNIT_COMPUTE_OPS, WEIGHT_READERS)
from .rules import (BWD, Effect, Plan, Semantics, ValueKey, action_time, applies, describe, recomputed,
                    releases_on_send, sends_payload, slot, slot_class)
from .table import (F_RECOMPUTED, MEMORY_KIND, PAYLOAD, PAYLOAD_VALUE, PER_UNIT, TABLE, Fields, OpSpec, Queue, Ref,
                    Role, Value)

__all__ = ["Op", "Payload", "Value", "Queue", "Role", "Ref", "Fields", "OpSpec", "TABLE", "PAYLOAD", "PAYLOAD_VALUE",
           "MEMORY_KIND", "PER_UNIT", "F_RECOMPUTED", "PER_MB_PAYLOADS", "fields_error",
           "Semantics", "Effect", "Plan", "ValueKey", "BWD", "slot", "slot_class", "describe", "releases_on_send",
           "applies", "sends_payload",
           "recomputed", "action_time",
           "UNIT_COMPUTE_OPS", "COMPUTE_OPS", "P2P_OPS", "COLLECTIVE_OPS", "COMM_OPS", "MEMORY_OPS", "ROOTED_OPS",
           "BACKWARD_OPS", "STASH_READERS", "WEIGHT_READERS", "BWD_COPY_READERS", "LOCAL_WGRAD_OPS", "BOUNDARY_OPS",
           "GRAD_WRITERS", "SIDED_OPS", "DROPPING_OPS", "HOST_OPS", "PIECEWISE_OPS", "TIMED_OPS"]
