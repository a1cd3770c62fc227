"""Notebook 08's context parallelism section: ring attention on N ranks against full attention on one.

run = context_parallel_run(CONFIG, profile)   # one launch: full, causal contiguous, causal balanced
exactness_section(run)                        # o and logsumexp within 2·n·u·max|ref| of naive attention
cost_section(run)                             # bytes sent and chunk pairs computed per rank against the formulas
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.attention import attention_lse, naive_attention
from helpers.context_parallel import check_sequence, local_chunks, ring_attention
from helpers.formulas import model_parallel as FM
from helpers.results import save_results
from helpers.section import Result

VARIANTS = {"full": (False, True), "causal, contiguous": (True, False), "causal, balanced": (True, True)}


@dataclass
class CPRun:
    """Each rank's measurements, the sizes and where they ran."""

    ranks: list
    sizes: dict
    profile: str
    where: str


def context_parallel_worker(batch_heads: int, context_length: int, head_dim: int, seed: int = 0) -> dict:
    """On every rank: q, k, v for the whole sequence (the same on every rank), naive attention's output and
    logsumexp on one process, then ring attention on this rank's chunks for each variant: differences, stats."""
    dev, rank, world = L.device(), dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch_heads, context_length, head_dim, generator=g).to(dev) for _ in range(3))
    out = {"rank": rank, "world": world}
    for name, (causal, balanced) in VARIANTS.items():
        o_ref, lse_ref = naive_attention(q, k, v, causal), attention_lse(q, k, causal)  # (BH, T, d), (BH, T)
        mine = [local_chunks(t, rank, world, causal, balanced) for t in (q, k, v)]
        o, lse, stats = ring_attention(*mine, causal=causal, balanced=balanced)
        o_ref, lse_ref = (local_chunks(t, rank, world, causal, balanced) for t in (o_ref, lse_ref[..., None]))
        out[name] = dict(
            stats,
            o=(float((o - o_ref).abs().max()), float(o_ref.abs().max())),
            lse=(float((lse - lse_ref[..., 0]).abs().max()), float(lse_ref.abs().max())),
        )
    return out


def context_parallel_run(config: dict, profile: str, backend: str = "auto", device: str = "auto") -> CPRun:
    """Check the sequence cuts (a clear error before any rank starts), launch on config['world'] ranks."""
    sizes = dict(
        batch_heads=config["cp_batch_heads"], context_length=config["cp_context"], head_dim=config["cp_head_dim"]
    )
    for causal, balanced in VARIANTS.values():
        check_sequence(sizes["context_length"], config["world"], causal, balanced)
    ranks = L.launch(context_parallel_worker, config["world"], *sizes.values(), backend=backend, device=device)
    b, d = L.choose_backend(config["world"], backend, device)
    return CPRun(ranks, sizes, profile, f"{profile} profile · {b} on {d}, {config['world']} ranks")


def reduction_terms(sizes: dict, world: int) -> int:
    """Terms along the longest chain of sums: the scores (d), the softmax's sum and p@v over T keys, 2N merges."""
    return sizes["head_dim"] + 2 * sizes["context_length"] + 2 * world


def exactness_section(run: CPRun) -> Result:
    """Each rank's rows of o and of the logsumexp against naive attention on one process."""
    n = reduction_terms(run.sizes, len(run.ranks))
    rows = []
    for r in run.ranks:
        for name in VARIANTS:
            for what in ("o", "lse"):
                diff, scale = r[name][what]
                bound = 2 * n * FM.UNIT_ROUNDOFF[torch.float32] * scale
                rows.append(
                    dict(
                        variant=name,
                        rank=r["rank"],
                        tensor=what,
                        max_abs_diff=diff,
                        bound=bound,
                        **{"diff/bound": diff / bound},
                    )
                )
    table = pd.DataFrame(rows)
    path = save_results(table, "08_cp_exactness", profile=run.profile, **run.sizes)
    worst = float(table["diff/bound"].max())
    notes = [
        f"Ring attention's rows are within {worst:.2%} of their bound 2·n·u·max|ref| (n = {n}) of naive "
        f"attention on one process, causal and not · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"worst_ratio": worst})


def cost_section(run: CPRun) -> Result:
    """Bytes sent and (query, key) chunk pairs computed per rank, against cp_bytes_sent and cp_work."""
    N, s = len(run.ranks), run.sizes
    rows = []
    for r in run.ranks:
        for name, (causal, balanced) in VARIANTS.items():
            sent, work = r[name]["bytes_sent"], r[name]["work"]
            f_sent, f_work = (
                FM.cp_bytes_sent(s["batch_heads"], s["context_length"], s["head_dim"], N),
                FM.cp_work(N, r["rank"], causal, balanced),
            )
            rows.append(
                dict(
                    variant=name,
                    rank=r["rank"],
                    bytes_sent=sent,
                    formula_bytes=f_sent,
                    work=work,
                    formula_work=f_work,
                    equal=(sent, work) == (f_sent, f_work),
                )
            )
    table = pd.DataFrame(rows)
    path = save_results(table, "08_cp_cost", profile=run.profile, **run.sizes)
    work = table.pivot(index="rank", columns="variant", values="work")
    contiguous, balanced = work["causal, contiguous"], work["causal, balanced"]
    notes = [
        f"Counted bytes and chunk pairs equal the formulas in {int(table['equal'].sum())} of {len(table)} rows. "
        f"Causal with contiguous chunks, the busiest rank computes {contiguous.max() / contiguous.min():.1f}x the "
        f"least busy's pairs; in the balanced order every rank computes {balanced.max():g} · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"all_equal": bool(table["equal"].all())})
