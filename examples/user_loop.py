"""Train your own nn.Module with pipert and your own loop: gradient clipping, a cosine learning
rate, evaluation. Every rank runs this file:

    torchrun --nproc-per-node 2 examples/user_loop.py            # 2 pipeline stages
    torchrun --nproc-per-node 4 examples/user_loop.py --dp 2     # 2 stages x 2 replicas

Rank 0 prints the loss and gradient norm per step and, with ``--check``, trains the same model
in one process with the same loop and prints the largest difference (float64: about 1e-15).
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
from torch import nn

import pipert
from pipert.launch import init_from_env


def model() -> tuple[nn.Sequential, nn.Module]:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(4)]
    return nn.Sequential(nn.Linear(8, 16), *blocks, nn.Linear(16, 4)).double(), nn.MSELoss()


def batch(step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 8, generator=g, dtype=torch.float64), 3 * torch.randn(n, 4, generator=g, dtype=torch.float64)


def adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=4, help="per replica")
    ap.add_argument("--check", action="store_true", help="compare with the single-process loop on rank 0")
    args = ap.parse_args()
    rank = init_from_env()  # torchrun's environment: this process is one rank (gloo on CPUs, NCCL on GPUs)
    world = torch.distributed.get_world_size()
    stages = world // args.dp
    net, loss_fn = model()
    ref = copy.deepcopy(net)
    # every rank compiles the same program (the Pipeline compares their digests)
    program = pipert.compile(args.schedule, stages=stages, microbatches=args.microbatches * args.dp, dp=args.dp)
    units = pipert.partition(list(net), program.num_units, loss_fn=loss_fn)
    pipe = pipert.Pipeline(units, program, optimizer=adamw, backend="dist")
    sched = pipe.lr_scheduler(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps))
    n = 2 * args.microbatches * args.dp
    for step in range(args.steps):
        x, y = batch(step, n)
        loss = pipe.forward_backward(x, y)
        norm = pipe.clip_grad_norm_(1.0)
        pipe.optimizer_step()
        sched.step()
        if rank == 0:
            lr = sched.get_last_lr()[0]
            say(f"step {step}: loss {loss.item():.6f}  grad norm {norm.item():.6f}  lr {lr:.5f}")
    out = pipe.eval(batch(99, n)[0])  # the last stage's ranks get the outputs
    params = pipe.named_parameters()  # every rank takes part (ZeRO shards are gathered)
    if args.check:
        check(ref, loss_fn, args, n, out, params, units, net, rank)
    pipe.close()
    torch.distributed.destroy_process_group()


def say(line: str) -> None:
    """One whole line per write: the ranks share torchrun's stdout, and print() under
    PYTHONUNBUFFERED writes the text and its newline separately (lines of two ranks interleave)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(ref: nn.Module, loss_fn: nn.Module, args: argparse.Namespace, n: int, out: torch.Tensor | None,
          params: dict, units: list, net: nn.Module, rank: int) -> None:
    """The same loop on the single-process model; prints the largest differences."""
    opt = adamw(ref.parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    for step in range(args.steps):
        x, y = batch(step, n)
        opt.zero_grad()
        loss_fn(ref(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        sched.step()
    model_name = {id(p): k for k, p in net.named_parameters()}  # the units share the model's parameters
    in_model = {f"unit{u}.{k}": model_name[id(p)] for u, m in enumerate(units) for k, p in m.named_parameters()}
    want = dict(ref.named_parameters())
    with torch.no_grad():
        diff = max(float((v - want[in_model[k]]).abs().max()) for k, v in params.items())
    say(f"rank {rank}: {len(params)} parameters after {args.steps} steps, largest difference {diff:.3g}")
    if out is not None:
        with torch.no_grad():
            err = float((out - ref(batch(99, n)[0])).abs().max())
        say(f"rank {rank}: eval outputs, largest difference {err:.3g}")


if __name__ == "__main__":
    main()
