"""Planners that choose how a schedule runs from an analytic cost and memory model.

``pipemesh``: PipeMesh's Eqs. 1-5 and memory model; ``recompute``: its recomputation DP;
``search``: the q/recomputation search of Eq. 6; ``workload``: component times and per-operation
sizes from a model, a device and a topology; ``paper``: the paper's Table IV configurations.
Pure Python: nothing here imports torch.
"""
from .pipemesh import Components, QueuePlan, Sharding, queue_plan, megatron_plan, breadth_first_plan
from .recompute import OpCost, Recompute, recompute_brute, recompute_dp
from .search import GiB, Plan, plan, plan_fixed

__all__ = ["Components", "QueuePlan", "Sharding", "queue_plan", "megatron_plan", "breadth_first_plan",
           "OpCost", "Recompute", "recompute_brute", "recompute_dp", "GiB", "Plan", "plan", "plan_fixed"]
