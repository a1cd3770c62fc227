"""Stress the exit of a plain `mp.spawn` training script: does any rank die at interpreter exit?

Each run spawns 2 ranks (gloo) that wrap a toy model, train 5 steps, call barrier and destroy_process_group, and
return with the wrapper and its hooks still alive, as students' scripts and course test suites do. A rank that dies
by SIGABRT ("terminate called without an active exception") is counted. The causes and their fixes are in
helpers.comm (no_python_refs: no Python object in a work's thread-local state; InFlight: no tensor given to a
collective released by the backend's thread after its Python object died); `launch` runs notebook 05's memory
worker through helpers.launch.launch instead.

    python tests/exit_stress.py --runs 200                      # every variant, one after another (make stress)
    python tests/exit_stress.py --runs 30 --variants torch_ddp  # torch's DDP, for comparison
    python tests/exit_stress.py --runs 30 --variants torch_ddp --finish   # ... ending with helpers.launch.finish()

Variants: per_parameter, bucketed (helpers.ddp), sharded (DDPBucketed + ShardedOptimizer), zero1 (Zero1Optimizer),
fsdp (helpers.fsdp.FSDP), all (the five in one script), torch_ddp (torch.nn.parallel), launch. Rates move with
load: count hundreds of runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from helpers.launch import free_port

OURS = ("per_parameter", "bucketed", "sharded", "zero1", "fsdp")
VARIANTS = OURS + ("all", "torch_ddp", "launch")


class Toy(nn.Module):
    """Three Linears and a frozen Parameter, as in the reproduction in ../shared/repro."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(10, 10, bias=False), nn.Linear(10, 50), nn.Linear(50, 5)
        self.frozen = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def wrap(variant: str, model: nn.Module):
    """(module to call, gradient sync or None, optimizer) for one variant."""
    from helpers import ddp, fsdp, sharding

    if variant in ("per_parameter", "bucketed", "torch_ddp"):
        net = ddp.wrap(variant, model, 1.0 if variant == "bucketed" else None)
        return net, net, torch.optim.SGD(net.parameters(), lr=0.1)
    if variant == "sharded":
        net = ddp.DDPBucketed(model, 0.001)
        return net, net, sharding.ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3)
    if variant == "zero1":
        return model, None, sharding.Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    net = fsdp.FSDP(model)
    return net, net, torch.optim.SGD(net.parameters(), lr=0.1)


def worker(rank: int, world: int, port: int, variant: str, finish: bool) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)
    alive = []  # every wrapper stays alive until the interpreter exits
    for v in OURS if variant == "all" else (variant,):
        torch.manual_seed(rank)
        model = Toy()
        if v in ("per_parameter", "bucketed"):
            wrap(v, model)  # wrapped twice, as a re-run notebook cell does: the first wrapper's hooks must go quietly
        net, sync, opt = wrap(v, model)
        alive.append((net, opt))
        for _ in range(5):
            opt.zero_grad()
            if hasattr(sync, "on_train_batch_start"):
                sync.on_train_batch_start()
            nn.functional.mse_loss(net(x[rank * 10 : rank * 10 + 10]), y[rank * 10 : rank * 10 + 10]).backward()
            if sync is not None:
                sync.finish_gradient_synchronization()
            opt.step()
    dist.barrier()
    dist.destroy_process_group()
    if finish:
        from helpers.launch import finish as end

        end()


def one_run(variant: str, finish: bool) -> str | None:
    """None if every rank exited cleanly, else what went wrong."""
    try:
        if variant == "launch":
            from helpers.experiments import sharding as S
            from helpers.launch import launch

            launch(
                partial(
                    S.run_all,
                    [
                        partial(
                            S.memory_worker,
                            model="small/cpu",
                            kinds=["unsharded", "sharded"],
                            batch_size=8,
                            context_length=32,
                            steps=2,
                        )
                    ],
                ),
                2,
                backend="gloo",
                device="cpu",
            )
        else:
            mp.spawn(worker, args=(2, free_port(), variant, finish), nprocs=2, join=True)
    except Exception as exc:  # ProcessExitedException or RankError: names the rank and the signal
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument(
        "--variants", default=",".join(OURS + ("launch",)), help=f"comma-separated: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--finish", action="store_true", help="end each rank with helpers.launch.finish()")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    lost_any = 0
    for variant in variants:
        start, lost = time.perf_counter(), 0
        for i in range(args.runs):
            problem = one_run(variant, args.finish)
            lost += problem is not None
            print(f"{variant} run {i}: {problem or 'ok'}", flush=True)
        print(
            f"{variant}{' +finish' if args.finish else ''}: {lost} of {args.runs} runs lost a rank at exit "
            f"({time.perf_counter() - start:.0f} s, torch {torch.__version__})",
            flush=True,
        )
        lost_any += lost
    return 1 if lost_any else 0


if __name__ == "__main__":
    sys.exit(main())
