"""Notebook 05's sections, one call each: plan within the budget, run, save with provenance, and return a Result
(helpers.section) whose notes are made from the same numbers as its table; here also the profiles and the speed plan.
The workers and tables they call live in sharding_build, sharding_equivalence, sharding_memory and sharding_speed.

    s = setting("cpu", "auto")                   # profile, 2 ranks' backend and device, config, budget, caption
    check = correctness_section(s)               # §1: every variant's weights against the unsharded run's, bitwise
    mem = memory_section(s)                      # §2: live and peak bytes at init, before and after each step
    speed = speed_section(s)                     # §3: time per iteration, interleaved, and where it goes
    comm = collectives_section(s, check)         # §4: bytes handed to collectives against the formulas
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import ClassVar

import pandas as pd
import torch

from helpers import env
from helpers import formulas as F
from helpers import launch as L
from helpers.budget import Budget
from helpers.experiments.common import RankSetting, name_models
from helpers.experiments.sharding_build import run_all
from helpers.experiments.sharding_equivalence import collectives_table, equivalence_table, equivalence_worker
from helpers.experiments.sharding_memory import memory_breakdown, memory_frame, memory_table, memory_worker
from helpers.experiments.sharding_speed import ratio_rows, speed_runs, speed_summary, speed_table
from helpers.formulas import MiB
from helpers.model import count_parameters, sizes_for
from helpers.section import Result

PROFILES = {  # notebook 05 per profile: the models for memory and speed, the global batch and context, timed steps
    "cpu": dict(
        memory_models=["small/cpu", "xl/cpu"],
        speed_model="large/cpu",  # §3: the 2026 xl preset's all-reduce and AdamW per step would double the notebook
        check_model="small/cpu",
        batch=4,  # global, 2 sequences per rank: §3's forward+backward was 92% of an iteration at 8, hiding the update
        # the optimizers shard; §2 holds 16 B of states per parameter against 2 x 64 tokens' activations per rank
        context=64,  # §2's (§3's: SPEED_CONTEXT); at batch 8 x 128, §2 and §3 took 40 s of make test's 51 s
        warmup=2,  # one untimed round past the first call is enough on a CPU (no JIT, no autotuning)
        steps=10,
        speed_launches=[["unsharded", "naive_sharded", "sharded", "zero1", "torch_zero"]],
    ),
    # XL on one GPU shared by 2 ranks: one launch per variant, so only one copy of the model states per rank at a time
    "gpu": dict(
        memory_models=["xl"],
        speed_model="xl",
        check_model="small",
        batch=4,
        context=128,
        warmup=2,
        steps=5,
        speed_launches=[["unsharded"], ["sharded"], ["zero1"], ["torch_zero"]],
    ),
}
CHECK_KINDS = ["unsharded", "naive_sharded", "sharded", "zero1"]  # §1's variants (and §4's byte counts)
MEMORY_KINDS = ["unsharded", "sharded", "zero1"]  # §2's
CHECK_CONTEXT = SPEED_CONTEXT = 64  # tokens per sequence in §1 and §3 (§2 uses the profile's context)


def plan_speed_steps(
    budget, model: str, kinds, warmup: int, steps: int, batch_size: int, context_length: int, world: int = 2
) -> int:
    """Section 4's timed steps within the budget, never fewer than timing.MIN_PAIRS (a verdict needs them): each
    round trains every kind once on each rank (one thread per rank: its share of the batch, the gradients'
    all-reduce, AdamW over the parameters). Returns the steps to run; the plan (budget.plans[-1]) names the rest."""
    from helpers.timing import MIN_PAIRS

    cal = budget.calibration.per_rank(world) if budget.calibration else None
    psi = count_parameters(model) * 4

    def round_s():
        step = cal.step_s(F.train_flops(model, batch_size // world, context_length))
        # AdamW reads p, g, m, v and writes p, m, v: 7 tensors of psi bytes, at 10 GB/s (a planning figure)
        return len(kinds) * (step + cal.allreduce_time(psi) + 7 * psi / 10e9)

    first = f"warm-up and steps 1-{MIN_PAIRS}"
    items = [first] + [f"step {i}" for i in range(MIN_PAIRS + 1, steps + 1)]
    plan = budget.fit(
        items,
        lambda item: (warmup + MIN_PAIRS if item == first else 1) * round_s(),
        what=f"{model}'s timed",
        keep_first=True,
    )
    return MIN_PAIRS + len(plan.kept) - 1 if steps >= MIN_PAIRS else steps


@dataclass
class Setting(RankSetting):
    """Where notebook 05 runs (RankSetting: profile, ranks' backend and device, config, budget, caption) on how many
    ranks."""

    MODEL_KEYS: ClassVar[tuple[str, ...]] = ("memory_models", "speed_model", "check_model")

    world: int = 2


SHARED_GPU_SHARE = 0.75  # of a shared GPU's memory the ranks' model states may take (the rest: activations, margin)


def config_for(profile: str, edition: str = "2026", shared: int = 1, gpu_bytes: float | None = None) -> dict:
    """PROFILES[profile] with its models named as `edition`'s Table 1 names them (model.for_edition). Where `shared`
    ranks share one GPU of `gpu_bytes`, a model whose unsharded states (parameters, gradients, AdamW: twice
    state_bytes) do not fit SHARED_GPU_SHARE of it is replaced by the edition's largest that does, and "cut" says
    which (the 2026 xl needs about 55 GB of states per rank: one GPU per rank, as its handout runs it)."""
    cut = []

    def fits(m: str) -> bool:
        return gpu_bytes is None or shared * 2 * F.state_bytes("unsharded", m, 2, 0) <= SHARED_GPU_SHARE * gpu_bytes

    def fitting(m: str) -> str:
        if fits(m):
            return m
        smaller = [s for s in sizes_for(profile, edition) if fits(s) and count_parameters(s) < count_parameters(m)]
        if not smaller:
            raise ValueError(f"no {edition} model fits {shared} ranks on one GPU of {gpu_bytes / 1e9:.0f} GB")
        cut.append(f"{m} -> {smaller[-1]} ({shared} ranks share one GPU of {gpu_bytes / 1e9:.0f} GB)")
        return smaller[-1]

    config = name_models(PROFILES[profile], Setting.MODEL_KEYS, edition)
    for k in Setting.MODEL_KEYS:
        config[k] = [fitting(m) for m in config[k]] if isinstance(config[k], list) else fitting(config[k])
    return {**config, "cut": cut}


def setting(profile: str, budget: str | float = "auto", edition: str = "2026") -> Setting:
    """Notebook 05's setting from its parameters cell (PROFILE, BUDGET, EDITION): 2 ranks, gloo on CPU (on one GPU
    both ranks share it through gloo); on cpu the budget calibrates this machine (about a second); the models as
    `edition`'s Table 1 names them, the largest that fits where ranks share a GPU (config_for)."""
    profile, facts = env.resolve_profile(profile), env.machine_facts()
    backend, device = L.choose_backend(2)
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    gpu_bytes = torch.cuda.mem_get_info()[1] if gpus else None
    config = config_for(profile, edition, shared=-(-2 // max(gpus, 1)), gpu_bytes=gpu_bytes)
    where = f"{facts['device']} · {profile} profile · {edition} model · {backend} on {device}, 2 ranks"
    if config["cut"]:
        where += f" · smaller model: {'; '.join(dict.fromkeys(config['cut']))}"
    return Setting(profile, backend, device, config, Budget.resolve(budget, "05", profile), where)


@dataclass(repr=False)  # shown as a Result: notes, table, where it was saved
class CheckResult(Result):
    """§1's Result, with each rank's {kind: KindRun} (per_rank; §4 counts their collectives) and the full table."""

    per_rank: list = field(default_factory=list)
    equal: pd.DataFrame | None = None


def correctness_section(s: Setting) -> CheckResult:
    """§1: every kind trains the check model 3 AdamW steps with two param groups from the same weights on the same
    batches; per kind and rank: bitwise the same averaged gradients and weights as the unsharded run."""
    start, model = time.perf_counter(), s.config["check_model"]
    worker = functools.partial(
        equivalence_worker,
        model=model,
        kinds=CHECK_KINDS,
        steps=3,
        batch_size=s.config["batch"],
        context_length=CHECK_CONTEXT,
        optimizer="adamw",
        groups=True,
    )
    per_rank = L.launch(worker, s.world, backend=s.backend, device=s.device)  # per rank: {kind: KindRun}
    return correctness_result(per_rank, model=model, seconds=time.perf_counter() - start, where=s.where)


def correctness_result(per_rank: list[dict], *, model: str, seconds: float, where: str) -> CheckResult:
    """§1's Result from the ranks' KindRuns: the note claims bitwise equality only where every row has it."""
    equal = equivalence_table(per_rank)
    kinds = list(per_rank[0])
    same = bool(equal["same_grads"].all() and equal["same_weights"].all())
    what = (
        "the same averaged gradients every step and the same weights bit for bit as the unsharded run, every "
        "variant on every rank"
        if same
        else "NOT bitwise equal to the unsharded run in every row (same_grads, same_weights below)"
    )
    note = f"{model}, 3 AdamW steps: {what} ({seconds:.0f} s) · {where}"
    table = equal.pivot(index="kind", columns="rank", values=["max_abs_diff", "state_MiB", "calls_per_step"]).loc[kinds]
    return CheckResult(table, None, [note], None, {"same": same}, per_rank, equal)


@dataclass(repr=False)  # shown as a Result: notes, table, where it was saved
class MemoryResult(Result):
    """§2's Result, with each rank's MemoryRuns (per_rank; the breakdown and the calculator read them) and one row
    per model, kind, rank and point (mem)."""

    per_rank: list = field(default_factory=list)
    mem: pd.DataFrame | None = None


def memory_section(s: Setting) -> MemoryResult:
    """§2: per memory model, unsharded, ShardedOptimizer and Zero1Optimizer tracked around init and two steps, saved
    as 05_sharding_memory; the table is MiB live and peak per point by kind and rank."""
    c, start = s.config, time.perf_counter()
    workers = [
        functools.partial(
            memory_worker, model=name, kinds=MEMORY_KINDS, batch_size=c["batch"], context_length=c["context"], steps=2
        )
        for name in c["memory_models"]
    ]
    per_rank = L.launch(functools.partial(run_all, workers), s.world, backend=s.backend, device=s.device)
    mem = memory_frame(per_rank)  # one row per model, kind, rank and point
    saved = s.save(
        mem,
        "05_sharding_memory",
        device_used=s.device,
        batch=c["batch"],
        context=c["context"],
        world_size=s.world,
    )
    notes = [
        f"{len(mem)} rows in {time.perf_counter() - start:.0f} s",
        f"MiB per rank, global batch {c['batch']} × {c['context']} tokens, AdamW fp32 · {s.where}",
    ]
    return MemoryResult(memory_table(mem), None, notes, saved, {}, per_rank, mem)


def breakdown_section(s: Setting, mem: MemoryResult) -> Result:
    """§2's analytic breakdown (formulas.live_bytes' parts, + activations at the peak) against the measured bytes;
    the table is rank 0's rows in MiB; values["breakdown"]: every row, with its tolerance and whether it is within."""
    breakdown = memory_breakdown(mem.per_rank)
    worst = ((breakdown["measured"] - breakdown["analytic"]).abs() / breakdown["measured"]).max()
    note = f"largest |measured − analytic| / measured over {len(breakdown)} rows: {worst:.2e} · {s.where}"
    shown = breakdown[breakdown["rank"] == 0].drop(columns=["rank", "tolerance", "within"])
    table = (shown.set_index(["model", "kind", "point"]) / MiB).round(2)
    return Result(table, None, [note], None, {"breakdown": breakdown, "worst": float(worst)})


@dataclass(repr=False)  # shown as a Result: notes, table, where it was saved
class SpeedResult(Result):
    """§3's Result, with each launch's per-rank SpeedRuns (raw) and one row per kind (speed, seconds)."""

    raw: list = field(default_factory=list)
    speed: pd.DataFrame | None = None


def speed_section(s: Setting) -> SpeedResult:
    """§3: the timed steps planned within the budget (at least timing.MIN_PAIRS), every kind of each launch
    interleaved step by step, saved as 05_sharding_speed; the table is ms per iteration and its parts.
    values["same_weights"]: the timed runs also ended bit-identical."""
    c, planned = s.config, len(s.budget.plans)
    kinds = [k for launch in c["speed_launches"] for k in launch]
    steps = plan_speed_steps(s.budget, c["speed_model"], kinds, c["warmup"], c["steps"], c["batch"], SPEED_CONTEXT)
    start = time.perf_counter()
    raw = speed_runs(
        c["speed_launches"],
        model=c["speed_model"],
        steps=steps,
        warmup=c["warmup"],
        batch_size=c["batch"],
        context_length=SPEED_CONTEXT,
        world=s.world,
        backend=s.backend,
        device=s.device,
    )
    speed = speed_table(raw)
    saved = s.save(
        speed.reset_index(),
        "05_sharding_speed",
        device_used=s.device,
        model=c["speed_model"],
        batch=c["batch"],
        context=SPEED_CONTEXT,
    )
    notes = [
        f"{c['speed_model']}, global batch {c['batch']} × {SPEED_CONTEXT}, ms per iteration (median of the slowest "
        f"rank, {steps} steps) in {time.perf_counter() - start:.0f} s · {s.where}"
    ] + [p.note for p in s.budget.plans[planned:] if p.note]
    columns = ["iteration_s", "fwd_bwd_s", "grad_comm_s", "step_s", "update_s", "step_comm_s"]
    same = all(all(r.same_weights.values()) for runs in raw for r in runs)
    return SpeedResult((speed[columns] * 1e3).round(2), None, notes, saved, {"same_weights": same}, raw, speed)


def ratios_section(s: Setting, sp: SpeedResult) -> Result:
    """§3's comparisons: every pair of kinds timed in one launch, time per iteration paired step by step with its 95%
    interval (saved as 05_sharding_ratios, which the answers and front pages read); the notes (speed_summary) say
    where ShardedOptimizer's time goes and name a difference only outside the noise."""
    rows = ratio_rows(sp.raw)
    saved = s.save(rows, "05_sharding_ratios", model=s.config["speed_model"])
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table[table["b"].isin(["unsharded", "sharded"])].set_index(["b", "a"]).sort_index()
    return Result(table, None, speed_summary(sp.speed, sp.raw).splitlines(), saved, {"rows": rows})


def collectives_section(s: Setting, check: CheckResult) -> Result:
    """§4: bytes handed to each collective per step during §1's run (rank 0), per-rank traffic / Ψ and state vs an
    exact 1/N, against formulas.expected_collectives (column "matches formula"); saved as 05_sharding_comm."""
    model = s.config["check_model"]
    comm = collectives_table(check.per_rank[0], model, s.world, n_groups=2)  # rank 0's KindRuns
    saved = s.save(comm.reset_index(), "05_sharding_comm", model=model, world_size=s.world)
    return collectives_result(comm, saved, model=model, world=s.world, where=s.where)


def collectives_result(comm: pd.DataFrame, saved=None, *, model: str, world: int, where: str) -> Result:
    """§4's Result: the counted bytes against the formulas (the note says 'equal' only when every row matches),
    each variant's per-rank traffic relative to unsharded DDP's, and each sharded state relative to an exact 1/N."""
    psi, t = count_parameters(model) * 4, comm["per-rank traffic / Ψ"]
    equal = "equal" if comm["matches formula"].all() else "NOT equal in every row (matches formula below)"
    state = comm["state / (Ψ_state/N)"]
    notes = [
        f"{model} (Ψ = {psi / MiB:.2f} MiB), bytes passed to collectives per step, counted vs formula: {equal} · "
        f"rank 0 · {where}",
        f"per-rank traffic per step for N = {world}: unsharded DDP {t['unsharded']:.3f} Ψ, ShardedOptimizer "
        f"{t['sharded']:.3f} Ψ ({t['sharded'] / t['unsharded']:.2f}x), ZeRO-1 {t['zero1']:.3f} Ψ "
        f"({t['zero1'] / t['unsharded']:.4f}x: the padding only)",
        f"optimizer state per rank relative to an exact 1/N: ShardedOptimizer (whole tensors) {state['sharded']:.4f}, "
        f"ZeRO-1 (flat slices) {state['zero1']:.4f}",
    ]
    return Result(comm.round(4), None, notes, saved, {"comm": comm})
