"""Notebook 08's context parallelism section: ring attention on N ranks against full attention on one.

run = context_parallel_run(CONFIG, profile)   # one launch: full, causal contiguous, causal balanced
exactness_section(run)                        # o and logsumexp within 2·n·u·max|ref| of naive attention, and the
                                              # gradients within 2·n'·u·(their terms' magnitude) of its autograd's
cost_section(run)                             # bytes sent and chunk pairs computed per rank against the formulas
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.attention import attention_lse, attention_probs, naive_attention
from helpers.context_parallel import check_sequence, local_chunks, ring_attention, ring_attention_backward
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
    """On every rank: q, k, v and an output gradient dO for the whole sequence (the same on every rank), naive
    attention's output, logsumexp and gradients (autograd) on one process, then ring attention's forward and
    backward on this rank's chunks for each variant: differences against their scales, stats."""
    dev, rank, world = L.device(), dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(batch_heads, context_length, head_dim, generator=g).to(dev) for _ in range(4))
    out = {"rank": rank, "world": world}
    for name, (causal, balanced) in VARIANTS.items():
        out[name] = _variant(q, k, v, do, causal, balanced)
    return out


def _variant(q, k, v, do, causal: bool, balanced: bool) -> dict:
    """One variant on this rank: ring attention's forward and backward on its chunks against the reference on the
    whole sequence (held only here): per tensor (max |difference|, scale), and the stats."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = reference(q, k, v, do, causal)  # whole-sequence tensors

    def local(t):
        return local_chunks(t, rank, world, causal, balanced)

    mine = [local(t) for t in (q, k, v)]
    o, lse, stats = ring_attention(*mine, causal=causal, balanced=balanced)
    dq, dk, dv, back = ring_attention_backward(*mine, o, lse, local(do), causal=causal, balanced=balanced)
    out = dict(stats, backward_bytes_sent=back["bytes_sent"], backward_work=back["work"])
    for what, t in {"o": o, "lse": lse[..., None], "dq": dq, "dk": dk, "dv": dv}.items():
        scale = ref.get(f"|{what}|", ref[what])  # the gradients: their terms' magnitude
        out[what] = (float((t - local(ref[what])).abs().max()), float(local(scale).abs().max()))
    return out


def reference(q, k, v, do, causal: bool) -> dict:
    """Naive attention on the whole sequence: o, lse (..., T, 1) and autograd's dq, dk, dv for the output gradient
    do; and each gradient's terms' magnitude, the same sums over absolute values (|dP| <= |dO| |V|^T, |D| <=
    rowsum(|dO| |O|), |dS| <= P (|dP| + |D|)), the scale a componentwise rounding bound takes (Higham §3.1)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = naive_attention(q, k, v, causal)  # (BH, T, d)
    o.backward(do)
    out = {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    del o  # and with it the graph's T x T tensors
    with torch.no_grad():
        out["lse"] = attention_lse(q, k, causal)[..., None]  # (BH, T, 1)
        p = attention_probs(q, k, causal)  # (BH, T, T)
        ds = do.abs() @ v.abs().transpose(-2, -1)  # (BH, T, T): |dP|'s bound
        ds.add_((do.abs() * out["o"].abs()).sum(-1, keepdim=True)).mul_(p)  # |dS|'s bound
        scale = q.shape[-1] ** -0.5
        out.update({"|dq|": ds @ k.abs() * scale, "|dk|": ds.transpose(-2, -1) @ q.abs() * scale})
        out["|dv|"] = p.transpose(-2, -1) @ do.abs()
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


def reduction_terms(sizes: dict, world: int, backward: bool = False) -> int:
    """Terms along the longest chain of sums: the scores (d), the softmax's sum and p@v over T keys, 2N merges;
    backward, on top of the o and lse it starts from: dP and D (d each), dQ or dK over T, the ring's 2N partials."""
    forward = sizes["head_dim"] + 2 * sizes["context_length"] + 2 * world
    return forward + (2 * sizes["head_dim"] + sizes["context_length"] + 2 * world if backward else 0)


def exactness_section(run: CPRun) -> Result:
    """Each rank's rows of o and of the logsumexp against naive attention on one process, and its chunks' gradients
    against autograd's through naive attention (scale: their terms' magnitude)."""
    n = {b: reduction_terms(run.sizes, len(run.ranks), b) for b in (False, True)}
    rows = []
    for r in run.ranks:
        for name in VARIANTS:
            for what in ("o", "lse", "dq", "dk", "dv"):
                diff, scale = r[name][what]
                bound = 2 * n[what.startswith("d")] * FM.UNIT_ROUNDOFF[torch.float32] * scale
                rows.append(dict(variant=name, rank=r["rank"], tensor=what, **FM.bound_columns(diff, bound)))
    table = pd.DataFrame(rows)
    path = save_results(table, "08_cp_exactness", profile=run.profile, **run.sizes)
    worst = float(table["diff/bound"].max())
    grads = table[table["tensor"].str.startswith("d")]["diff/bound"].max()
    notes = [
        f"Ring attention's rows are within {worst:.2%} of their bound 2·n·u·max|ref| (n = {n[False]}) of naive "
        f"attention on one process, causal and not; its gradients within {grads:.2%} of 2·n'·u·max(their terms' "
        f"magnitude) (n' = {n[True]}) of autograd's through naive attention · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"worst_ratio": worst})


def cost_section(run: CPRun) -> Result:
    """Bytes sent and (query, key) chunk pairs computed per rank, against cp_bytes_sent and cp_work."""
    N, s = len(run.ranks), run.sizes
    rows = []
    for r in run.ranks:
        for name, (causal, balanced) in VARIANTS.items():
            m = r[name]
            f_sent, f_back = (
                FM.cp_bytes_sent(s["batch_heads"], s["context_length"], s["head_dim"], N, backward=b)
                for b in (False, True)
            )
            f_work = FM.cp_work(N, r["rank"], causal, balanced)
            rows.append(
                dict(
                    variant=name,
                    rank=r["rank"],
                    bytes_sent=m["bytes_sent"],
                    formula_bytes=f_sent,
                    backward_bytes_sent=m["backward_bytes_sent"],
                    formula_backward_bytes=f_back,
                    work=m["work"],
                    formula_work=f_work,
                    equal=(m["bytes_sent"], m["backward_bytes_sent"], m["work"], m["backward_work"])
                    == (f_sent, f_back, f_work, f_work),
                )
            )
    table = pd.DataFrame(rows)
    path = save_results(table, "08_cp_cost", profile=run.profile, **run.sizes)
    work = table.pivot(index="rank", columns="variant", values="work")
    contiguous, balanced = work["causal, contiguous"], work["causal, balanced"]
    back = table["backward_bytes_sent"].iloc[0] / table["bytes_sent"].iloc[0]
    notes = [
        f"Counted bytes and chunk pairs equal the formulas in {int(table['equal'].sum())} of {len(table)} rows; "
        f"the backward sends {back:.1f}x the forward's bytes (K and V N − 1 steps again, dK and dV N). "
        f"Causal with contiguous chunks, the busiest rank computes {contiguous.max() / contiguous.min():.1f}x the "
        f"least busy's pairs; in the balanced order every rank computes {balanced.max():g} · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"all_equal": bool(table["equal"].all())})
