"""Notebook 08 §1: tensor parallelism against plain data parallelism on the same ranks, at the same tokens per step.

    run = tp_dp_run(CONFIG, profile)     # one launch: TP (every rank the whole batch, 1/N of every block's matmuls)
                                         # and DP (every rank a full replica on B/N sequences, one gradient all-reduce),
                                         # their training steps interleaved in one loop
    tp_dp_section(run)                   # the paired step-time ratio with its 95% interval; each one's bytes per step
                                         # counted against tp_collectives / dp_collectives

Both communicate without overlap (TP's all-reduces sit between its matmuls; helpers.ddp.FlatDDP all-reduces one flat
buffer after backward), so the ratio compares what each must compute and send, not how well either hides it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.comm import count_collectives
from helpers.ddp import FlatDDP
from helpers.experiments.common import make_optimizer, quartiles, rank_rows, slowest_rank, train_step
from helpers.formulas import MiB
from helpers.formulas import model_parallel as FM
from helpers.model import ModelConfig, build_model, random_batch
from helpers.results import save_results
from helpers.section import Result
from helpers.tensor_parallel import TensorParallelLM, check_divisible
from helpers.timing import interleaved, paired_ratio, ratio_columns, time_call, verdict

LABELS = ("TP", "DP")  # the ratio is TP's step time over DP's


@dataclass
class TPDPRun:
    """Each rank's step times and counted collectives, and what ran."""

    ranks: list
    config: dict
    profile: str
    where: str


def tp_dp_worker(cfg: ModelConfig, batch_size: int, steps: int, warmup: int, seed: int = 0) -> dict:
    """On every rank, from the same weights: TP on the whole batch and DP on this rank's B/N sequences, each with
    SGD. One step of each under count_collectives, then `warmup` + `steps` rounds of both interleaved (A B, B A),
    every step started together (a barrier) and timed between device syncs. Returns {label: seconds per step} and
    {label: [(op, bytes)]}."""
    dev, rank, world = L.device(), dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    full = build_model(cfg).to(dev)
    x, y = (t.to(dev) for t in random_batch(cfg, batch_size, generator=torch.Generator().manual_seed(seed + 1)))
    rows = rank_rows(batch_size, rank, world)
    tp, dp = TensorParallelLM(full), FlatDDP(copy.deepcopy(full))
    del full
    setups = {  # label -> (model, gradient sync, optimizer, inputs, targets)
        "TP": (tp, None, make_optimizer(tp.parameters(), "sgd"), x, y),
        "DP": (dp.module, dp, make_optimizer(dp.parameters(), "sgd"), x[rows].clone(), y[rows].clone()),
    }

    def step(label: str, i: int = 0) -> float:
        model, sync, opt, xb, yb = setups[label]
        dist.barrier()
        return time_call(lambda: train_step(model, opt, xb, yb, grad_sync=sync), dev)[1]

    logs = {}
    for label in LABELS:
        with count_collectives() as log:
            step(label)
        logs[label] = list(log)
    samples = interleaved({label: lambda i, label=label: step(label, i) for label in LABELS}, steps, warmup)
    return {"rank": rank, "seconds": samples, "logs": logs}


def check_tp_dp(cfg: ModelConfig, batch_size: int, world: int) -> None:
    """Raise a ValueError naming the constraint when TP or DP cannot split the model or the batch over `world`."""
    check_divisible(cfg, world)
    if batch_size % world:
        raise ValueError(f"data parallelism over {world} ranks needs the batch ({batch_size}) divisible by {world}")


def tp_dp_run(config: dict, profile: str, backend: str = "auto", device: str = "auto") -> TPDPRun:
    """Check the sizes (a clear error before any rank starts), launch the worker on config['world'] ranks."""
    cfg, world, batch = config["model"], config["world"], config["batch"]
    check_tp_dp(cfg, batch, world)
    args = (cfg, batch, config["dp_steps"], config["dp_warmup"])
    ranks = L.launch(tp_dp_worker, world, *args, backend=backend, device=device)
    b, d = L.choose_backend(world, backend, device)
    return TPDPRun(ranks, config, profile, f"{profile} profile · {b} on {d}, {world} ranks")


def formulas(run: TPDPRun) -> dict[str, dict]:
    """Each label's {op: (calls, bytes)} per step from the closed forms."""
    cfg, c = run.config["model"], run.config
    return {
        "TP": FM.tp_collectives(cfg, c["batch"], cfg.context_length, c["world"]),
        "DP": FM.dp_collectives(cfg, c["world"]),
    }


def tp_dp_table(run: TPDPRun) -> pd.DataFrame:
    """One row per label: tokens per step and per rank, the slowest rank's step time (median, quartiles), the ratio
    to DP with its interval (rounds paired), calls and bytes counted on rank 0 against the formula, bytes sent."""
    cfg, c, N = run.config["model"], run.config, run.config["world"]
    tokens = c["batch"] * cfg.context_length
    steps = {label: slowest_rank([r["seconds"][label] for r in run.ranks]) for label in LABELS}
    rows = []
    for label, formula in formulas(run).items():
        log = run.ranks[0]["logs"][label]
        ((op, (calls, nbytes)),) = formula.items()  # one kind of collective each: all-reduces
        counted = [b for o, b in log if o == op]
        p25, median, p75 = quartiles(steps[label])
        rows.append(
            dict(
                parallelism=label,
                tokens_per_step=tokens,
                tokens_per_rank=tokens if label == "TP" else tokens // N,
                step_ms=median * 1e3,
                step_p25_ms=p25 * 1e3,
                step_p75_ms=p75 * 1e3,
                **ratio_columns(paired_ratio(steps[label], steps["DP"])),
                calls=len(counted),
                formula_calls=calls,
                bytes=sum(counted),
                formula_bytes=nbytes,
                equal=(len(counted), sum(counted)) == (calls, nbytes) and {o for o, _ in log} == {op},
                sent_MiB=FM.sent_bytes(formula, N) / MiB,
            )
        )
    return pd.DataFrame(rows).set_index("parallelism")


def tp_dp_section(run: TPDPRun, directory=None) -> Result:
    """TP's step time over DP's at equal tokens, paired round by round, and each one's bytes against its formula."""
    table = tp_dp_table(run)
    cfg, c = run.config["model"], run.config
    path = save_results(
        table.reset_index(), "08_tp_vs_dp", profile=run.profile, world=c["world"], batch=c["batch"],
        context=cfg.context_length, model=cfg.name, steps=c["dp_steps"], warmup=c["dp_warmup"], directory=directory,
    )  # fmt: skip
    tp, dp = table.loc["TP"], table.loc["DP"]
    ratio = paired_ratio(*(slowest_rank([r["seconds"][k] for r in run.ranks]) for k in LABELS))
    star = FM.tp_dp_equal_bytes_tokens(cfg)
    notes = [
        f"At {tp['tokens_per_step']} tokens per step on {c['world']} ranks: {verdict('TP', 'DP', ratio, 'step time')}.",
        f"A TP rank sends {tp['sent_MiB']:.3f} MiB per step in {tp['calls']} all-reduces of the activations (growing "
        f"with the tokens, each call paying the latency α), a DP rank {dp['sent_MiB']:.3f} MiB in {dp['calls']} of "
        f"the gradients (growing with the parameters); the bytes are equal at Ψ/(4 L C) ≈ {star:.0f} tokens per step "
        f"for this model. Counted calls and bytes equal the formulas in {int(table['equal'].sum())} of {len(table)} "
        f"rows · {run.where}.",
    ]
    values = {"ratio": ratio, "all_equal": bool(table["equal"].all()), "equal_bytes_tokens": star}
    return Result(table=table, notes=notes, saved=path, values=values)
