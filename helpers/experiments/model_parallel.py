"""Notebook 08's tensor and sequence parallelism sections: one launch, then one Result per section.

    run = tensor_parallel_run(CONFIG)          # 2 ranks (gloo on the CPU): TP and TP+SP against one process
    exactness_section(run)                     # every output and gradient within 2·n·u of one process
                                               # (each section: directory=... saves there, as the reference runner)
    bytes_section(run)                         # collectives counted against formulas.model_parallel.tp_collectives
    memory_section(run)                        # one block's saved activations against block_activation_bytes

The pipeline sections are in model_parallel_pipeline.py. Every size comes from PROFILES[profile].
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.comm import count_collectives
from helpers.formulas import MiB
from helpers.formulas import model_parallel as FM
from helpers.memory import track
from helpers.model import ModelConfig, build_model, lm_loss, random_batch
from helpers.results import save_results
from helpers.section import Result
from helpers.tensor_parallel import TensorParallelLM, check_divisible, shard_parameter, sync_sequence_parallel_grads

PROFILES = {  # what notebook 08 runs per profile
    "cpu": dict(
        model=ModelConfig("tp/cpu", d_model=64, d_ff=256, n_layers=2, n_heads=4, vocab_size=256, context_length=32),
        batch=4,
        world=2,
        pipe_world=2,  # 4 processes on a 2-core machine would time-share: the bubble would not be measurable
        pipe_micro=4,  # the memory tracker costs ~0.1 s per micro-batch pass here: m = 4, one block per chunk
        pipe_layers=4,
        pipe_chunks=2,  # interleaved 1F1B: v chunks per stage (n_layers divisible by p·v, m a multiple of p)
        pipe_batch=8,
        pipe_overrides=dict(vocab_size=64),  # a small LM head: the last stage about as long as the others
        pipe_steps=2,
        pipe_fixed_ms=(10, 20),  # the fixed-cost stages' forward and backward
        cp_batch_heads=4,
        cp_context=128,
        cp_head_dim=32,
        speed_tokens=256,
        speed_d_model=64,
        speed_widths=[64, 256, 1024, 4096],
        dp_steps=12,  # TP against DP: rounds of both interleaved, after dp_warmup untimed ones
        dp_warmup=2,
    ),
    "gpu": dict(
        model=ModelConfig("tp/gpu", d_model=768, d_ff=3072, n_layers=4, n_heads=12, context_length=512),
        batch=8,
        world=2,
        pipe_world=4,
        pipe_micro=8,
        pipe_layers=8,
        pipe_chunks=2,
        pipe_batch=16,  # every rank's one-process reference on the whole batch: 64 sequences held 25 GB per rank,
        # 4 ranks over 80 GB on one GPU (the dry run); 16 hold about 6.5 GB each
        cp_batch_heads=32,
        cp_context=4096,
        cp_head_dim=64,
        speed_tokens=4096,
        speed_d_model=1024,
        speed_widths=[512, 2048, 8192, 32768],
        dp_steps=20,
        dp_warmup=5,
    ),
}
MODES = {"TP": False, "TP+SP": True}
SPEED_KEYS = ("speed_tokens", "speed_d_model", "speed_widths")  # what model_parallel_calc's speed launch reads


@dataclass
class TPRun:
    """What tensor_parallel_run measured: each rank's dict, and the configuration it ran."""

    ranks: list
    config: dict
    profile: str
    where: str


def tensor_parallel_worker(cfg: ModelConfig, batch_size: int, seed: int = 0) -> dict:
    """On every rank: one process's step on the whole batch, then TP and TP+SP from the same weights; per mode the
    largest difference of the logits and of every gradient shard, the collectives, one block's saved bytes."""
    dev = L.device()
    torch.manual_seed(seed)
    full = build_model(cfg).to(dev)
    x, y = (t.to(dev) for t in random_batch(cfg, batch_size, generator=torch.Generator().manual_seed(seed + 1)))
    logits = full(x)
    lm_loss(logits, y).backward()
    ref = {"logits": logits.detach(), **{n: p.grad for n, p in full.named_parameters()}}
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "modes": {}, "reference_block_bytes": _block_bytes(full.blocks[0], x.shape)}
    for mode, sp in MODES.items():
        tp = TensorParallelLM(full, sequence_parallel=sp)
        with count_collectives() as log:
            logits = tp(x)
            lm_loss(logits, y).backward()
            sync_sequence_parallel_grads(tp)
        mine = {"logits": logits.detach(), **{n: p.grad for n, p in tp.named_parameters()}}
        diffs = {}
        for name, t in mine.items():
            r = shard_parameter(name, ref[name], rank, world)
            diffs[name] = (float((t - r).abs().max()), float(r.abs().max()))
        shape = (x.shape[0], x.shape[1] // world if sp else x.shape[1])
        out["modes"][mode] = {"diffs": diffs, "log": list(log), "block_bytes": _block_bytes(tp.blocks[0], shape)}
    return out


def _block_bytes(block: torch.nn.Module, bt: tuple, tries: int = 3) -> int:
    """Bytes one block's forward leaves alive (its saved tensors and its output), measured by helpers.memory.track:
    the least of `tries` forwards, since now and then a collective's (B, T, C) buffer outlives the forward by a
    moment (about 1 run in 6 under SP on a busy 2-core machine: gloo's release, not the block's)."""
    x = torch.randn(*bt, block.norm1.weight.shape[0], device=block.norm1.weight.device, requires_grad=True)
    counts = []
    for _ in range(tries):
        trace = track(lambda: block(x), existing=[*block.parameters(), *block.buffers(), x])
        counts.append(trace.current_bytes - trace.baseline_bytes)
        del trace
    return min(counts)


def tensor_parallel_run(config: dict, profile: str, backend: str = "auto", device: str = "auto") -> TPRun:
    """Check the sizes (a clear error before any rank starts), launch the worker on config['world'] ranks."""
    cfg, world = config["model"], config["world"]
    check_divisible(cfg, world, cfg.context_length, sequence_parallel=True)
    ranks = L.launch(tensor_parallel_worker, world, cfg, config["batch"], backend=backend, device=device)
    b, d = L.choose_backend(world, backend, device)
    return TPRun(ranks, config, profile, f"{profile} profile · {b} on {d}, {world} ranks")


def exactness_table(run: TPRun) -> pd.DataFrame:
    """Per mode and rank: the logits and the gradients (worst tensor), |TP − one process| against 2·n·u·max|ref|."""
    cfg = run.config["model"]
    rows = []
    for r in run.ranks:
        for mode, m in r["modes"].items():
            for what, names in [("logits", ["logits"]), ("gradients", [n for n in m["diffs"] if n != "logits"])]:
                worst, check = FM.worst_against(
                    {n: m["diffs"][n] for n in names}, lambda scale: FM.tp_bound(cfg, cfg.context_length, scale)
                )
                rows.append(dict(mode=mode, rank=r["rank"], tensor=what, worst=worst, **check))
    return pd.DataFrame(rows)


def exactness_section(run: TPRun, directory=None) -> Result:
    """§1-2's check: every rank's logits and gradient shards within the fp32 reduction-order bound of one process."""
    table = exactness_table(run)
    path = save_results(table, "08_tp_exactness", profile=run.profile, world=run.config["world"], directory=directory)
    cfg = run.config["model"]
    worst = float(table["diff/bound"].max())
    n = FM.reduction_length(cfg, cfg.context_length)
    notes = [
        f"The largest difference from one process is {worst:.2%} of its bound 2·n·u·max|ref| (n = {n} terms along "
        f"the step's longest chain of sums, u = 2^-24) over {len(table)} checks · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"worst_ratio": worst, "n": n})


def bytes_table(run: TPRun) -> pd.DataFrame:
    """Per mode and collective: calls and bytes counted on rank 0 against tp_collectives; bytes sent per rank."""
    cfg, c = run.config["model"], run.config
    rows = []
    for mode, sp in MODES.items():
        formula = FM.tp_collectives(cfg, c["batch"], cfg.context_length, c["world"], sequence_parallel=sp)
        log = run.ranks[0]["modes"][mode]["log"]
        for op, (calls, nbytes) in formula.items():
            counted = [b for o, b in log if o == op]
            rows.append(
                dict(
                    mode=mode,
                    op=op,
                    calls=len(counted),
                    formula_calls=calls,
                    bytes=sum(counted),
                    formula_bytes=nbytes,
                    equal=(len(counted), sum(counted)) == (calls, nbytes),
                )
            )
        rows[-1]["unexpected_ops"] = sorted({o for o, _ in log} - set(formula))
    return pd.DataFrame(rows)


def bytes_section(run: TPRun, directory=None) -> Result:
    """Bytes per step, counted against the closed forms; TP+SP's sent bytes against TP's."""
    table = bytes_table(run)
    c, cfg = run.config, run.config["model"]
    sent = {m: FM.tp_bytes_sent(cfg, c["batch"], cfg.context_length, c["world"], sp) for m, sp in MODES.items()}
    path = save_results(table, "08_tp_bytes", profile=run.profile, world=c["world"], directory=directory)
    notes = [
        f"Counted calls and bytes equal the formula in {int(table['equal'].sum())} of {len(table)} rows. With ring "
        f"collectives a rank sends {sent['TP'] / MiB:.3f} MiB per step under TP and {sent['TP+SP'] / MiB:.3f} MiB "
        f"under TP+SP ({sent['TP+SP'] / sent['TP']:.3f}x: the backward's re-gather of the saved T/N input) · "
        f"{run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"sent": sent, "all_equal": bool(table["equal"].all())})


def memory_table(run: TPRun) -> pd.DataFrame:
    """One block's saved bytes on rank 0: one process, TP, TP+SP; measured against block_activation_bytes."""
    c, cfg = run.config, run.config["model"]
    s, b, h, a = cfg.context_length, c["batch"], cfg.d_model, cfg.n_heads
    r0 = run.ranks[0]
    rows = []
    for mode, t, sp, measured in [("one process", 1, False, r0["reference_block_bytes"])] + [
        (m, c["world"], sp, r0["modes"][m]["block_bytes"]) for m, sp in MODES.items()
    ]:
        formula = FM.block_activation_bytes(cfg, b, s, t, sp)
        rows.append(
            dict(
                mode=mode,
                ranks=t,
                measured_bytes=measured,
                formula_bytes=formula,
                **{"measured/formula": measured / formula},
                korthikanti_16bit_bytes=FM.korthikanti_bytes(s, b, h, a, t, sp),
            )
        )
    return pd.DataFrame(rows).set_index("mode")


def memory_section(run: TPRun, directory=None) -> Result:
    """§2's memory: one block's activations with TP and with TP+SP against the formula (exact in bytes here)."""
    table = memory_table(run)
    path = save_results(
        table.reset_index(), "08_tp_memory", profile=run.profile, world=run.config["world"], directory=directory
    )
    one, tp, sp = (table.loc[m, "measured_bytes"] for m in ("one process", "TP", "TP+SP"))
    notes = [
        f"One block keeps {one / MiB:.3f} MiB for backward in one process, {tp / one:.0%} of it under TP and "
        f"{sp / one:.0%} under TP+SP on {run.config['world']} ranks; the formula gives every row to within "
        f"{(table['measured/formula'] - 1).abs().max():.2%} · {run.where}."
    ]
    return Result(table=table, notes=notes, saved=path, values={"ratio": table["measured/formula"].to_dict()})
