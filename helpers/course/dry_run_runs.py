"""The dry run's runs, per notebook (helpers.course.dry_run walks them inside dry_run_meta.on_meta): each calls the
notebook's own experiment functions at the gpu profile's sizes, the largest launch of each kind (the others are the
same code at smaller shapes: gpu_plans ranks them), and gives the tracked peak beside gpu_plans' estimate of the same
run. Notebooks 01, 04, 05 and 07 build their models per edition (gpu_configs: as each notebook's setup builds them)
and 05 per card: those return Runs, whose `key` names what decides their bytes, so a launch two editions or cards
share is walked once. Multi-rank launches run as rank 0 of two on the fake process group; a launch shares one GPU
between its ranks (gpu_plans' default of one GPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from helpers import memory as M
from helpers import model as model_table
from helpers.attention import naive_attention
from helpers.course.dry_run_meta import fake_group
from helpers.experiments import attention as XA
from helpers.experiments import benchmarking as XB
from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import gpu_configs as GC
from helpers.experiments import gpu_plans as G
from helpers.experiments import model_parallel as XM
from helpers.experiments import model_parallel_calc as XT
from helpers.experiments import model_parallel_context as XCP
from helpers.experiments import model_parallel_dp as XV
from helpers.experiments import model_parallel_pipeline as XP
from helpers.experiments import rmsnorm as XR
from helpers.experiments import sharding as XS
from helpers.experiments.common import make_batches, make_optimizer
from helpers.model import build_model, get_config, lm_loss, random_batch, sizes_for
from helpers.rmsnorm import RMSNormPyTorchFunction

WORLD = 2  # the multi-rank notebooks' ranks


def _row(notebook, run, peak_bytes, plan_bytes=None, ranks_per_gpu=1, oom_by_design=False, extra_bytes=0) -> dict:
    """One run: its tracked peak (one rank), extra_bytes the dry run cannot run but the launch holds (planned), the
    bytes per GPU with gpu_plans' margins, the plan's estimate of the same run, and whether its OOM is recorded as a
    row (oom_by_design); dry_run judges it against a card."""
    return {
        "notebook": notebook,
        "run": run,
        "peak_GB": peak_bytes / G.GB,
        "extra_GB": extra_bytes / G.GB,
        "ranks_per_gpu": ranks_per_gpu,
        "per_gpu_GB": G.peak_per_gpu(peak_bytes + extra_bytes, ranks_per_gpu) / G.GB,
        "plan_GB": math.nan if plan_bytes is None else plan_bytes / G.GB,
        "oom_by_design": oom_by_design,
    }


@dataclass(frozen=True)
class Run:
    """One launch of an edition's notebook: `walk` returns its tracked peak bytes on meta; `key` is everything its
    bytes depend on (model shapes, batch, context, variants), so runs with equal keys are walked once."""

    notebook: str
    run: str
    key: tuple
    walk: Callable[[], int]
    plan_bytes: float
    ranks_per_gpu: int = 1
    oom_by_design: bool = False
    extra_bytes: int = 0

    def row(self, peak_bytes: int) -> dict:
        return _row(self.notebook, self.run, peak_bytes, self.plan_bytes, self.ranks_per_gpu, self.oom_by_design,
                    self.extra_bytes)  # fmt: skip


def shape(size) -> tuple:
    """What a model's bytes depend on: its config less its name (2025's 2.7B built at 512 is 2026's xl)."""
    cfg = get_config(size)
    return dataclasses.astuple(dataclasses.replace(cfg, name=""))


@contextlib.contextmanager
def one_layer_models():
    """Every Table 1 size one block deep inside (model.EDITION_SIZES patched in place, restored after): a run walked
    this way meets every shape its full depth does (blocks are alike), in a fraction of the ops; its bytes are left to
    the plan."""
    saved = {edition: dict(sizes) for edition, sizes in model_table.EDITION_SIZES.items()}
    try:
        for sizes in model_table.EDITION_SIZES.values():
            sizes.update({n: dataclasses.replace(c, n_layers=1) for n, c in sizes.items()})
        yield
    finally:
        for edition, sizes in model_table.EDITION_SIZES.items():
            sizes.update(saved[edition])


def _peak(fn, existing=()) -> int:
    """Tracked peak bytes of fn(), counting `existing` from the start."""
    return M.track(fn, existing=existing).peak_bytes


def _in_group(fn, world: int = WORLD, rank: int = 0) -> int:
    """Tracked peak of fn() as `rank` of `world` on the fake process group."""
    with fake_group(world, rank):
        return _peak(fn)


def run_00(batch_size: int = 4) -> list[dict]:
    """Notebook 00: the warm-up demo, the gpu profile's first size's forward on a batch of 4 at its own context."""
    size = sizes_for("gpu")[0]
    lm = build_model(size)
    inputs, _ = random_batch(lm.cfg, batch_size=batch_size)
    with torch.no_grad():
        trace = M.track(lambda: lm(inputs), existing=[inputs])
    return [_row("00", f"warm-up demo {size} forward, batch {batch_size}", trace.peak_bytes - trace.baseline_bytes)]


def runs_01(edition: str, gpu_bytes: float) -> list[Run]:
    """Notebook 01 at `edition` (gpu_configs.config_01): §1's warm timing at the largest size the card holds (one
    model, the "backward" pass's graph kept while "forward" and "both" build theirs); §2's profiled step (not
    guarded: the size the card holds, EditionPlan.profiled_on); §5's steady AdamW steps at its largest size (2024) or
    its model at each of the handout's contexts, built that long (benchmarking.profiled_config), fp32 at each and
    under autocast at the longest (§4's precision loop holds one graph at a time, as §5's autocast step does with
    AdamW's state beside it)."""
    c = GC.config_01("gpu", edition, gpu_bytes)
    B, T = c["batch"], c["context"]
    fitting = [s for s in c["sizes"] if G.peak_per_gpu(G.warm_timing_bytes(s, B, T), 1) <= gpu_bytes]
    size = max(fitting or c["sizes"][:1], key=lambda s: G.warm_timing_bytes(s, B, T))  # larger: OOM rows, same code
    over = functools.partial(_over, gpu_bytes)
    warm = G.warm_timing_bytes(size, B, T)
    runs = [
        Run("01", f"warm timing {size} (two graphs)", ("01 warm", shape(size), B, T),
            functools.partial(_peak, functools.partial(_warm_round, size, B, T)), warm, oom_by_design=over(warm)),
        _step_run(f"profiled step {c['profile_size']}", c["profile_size"], B, T, None, guarded=False),
    ]  # fmt: skip
    memory = c["memory"] if len({s for s, _ in c["memory"]}) == 1 else [(size, T)]  # one model by context
    longest = max(t for _, t in memory)
    for s, t in memory:
        for dt in (None, torch.bfloat16) if t == longest else (None,):  # fp16's tensors have bf16's bytes
            run = f"memory peaks {s} at T {t}, {'autocast bf16' if dt else 'fp32'} step"
            runs.append(_step_run(run, s, B, t, dt, over=over))
    return runs


def _over(gpu_bytes: float, nbytes: float) -> bool:
    """A guarded run (its OOM recorded as a row) that this card cannot hold: an OOM by design."""
    return G.peak_per_gpu(nbytes, 1) > gpu_bytes


def _step_run(run: str, size, B: int, T: int, dtype, guarded: bool = True, over=None) -> Run:
    """step_peaks' full step of `size` at B x T (fp32 or under autocast `dtype`), as notebook 01 runs it."""
    cfg = XB.profiled_config(size, T)
    plan = G.step_peak_bytes(cfg, B, T, autocast=dtype is not None)
    walk = functools.partial(lambda: XB.step_peaks(size, B, T, dtype, "meta")["full step"].peak_bytes)
    return Run("01", run, ("01 step", shape(cfg), B, T, str(dtype)), walk, plan,
               oom_by_design=guarded and over is not None and over(plan))  # fmt: skip


def _warm_round(size, batch_size: int, context_length: int) -> None:
    """One round of time_size's warm loop: the three passes of one model (pass_fn: "backward" keeps its graph from
    the start), each once (its later rounds repeat the same allocations)."""
    lm = build_model(size, device="meta")
    x, y = random_batch(lm.cfg, batch_size, context_length, device="meta")
    _each_once([XB.pass_fn(lm, x, y, kind) for kind in ("forward", "backward", "both")])


def runs_02(gpu_bytes: float, c=None) -> list[Run]:
    """Notebook 02 on a card of gpu_bytes: the PyTorch RMSNorm fwd+bwd on (rows, H) per width; §2's largest model's
    fwd+bwd at its batch; §5's compile loop at the largest size the card holds (rmsnorm.fit_card)."""
    c = XR.fit_card(c or XR.PROFILES["gpu"], gpu_bytes)
    runs = [
        Run("02", f"norm {c['rows']} x {H} fwd+bwd", ("02 norm", c["rows"], H), functools.partial(_norm, c["rows"], H),
            G.norm_peak_bytes(c["rows"], H))
        for H in c["hidden"]
    ]  # fmt: skip
    B = c["batch"]
    size = max(sizes_for("gpu"), key=lambda s: G.retained_graph_bytes(s, B, get_config(s).context_length))
    T = get_config(size).context_length
    runs.append(Run("02", f"model {size} fwd+bwd, batch {B}", ("02 model", shape(size), B),
                    functools.partial(_model_pass, size, B), G.retained_graph_bytes(size, B, T)))  # fmt: skip
    size = c["compile_model_sizes"][-1]
    T = get_config(size).context_length
    runs.append(Run("02", f"compile {size}: fwd+bwd+opt, batch {B}", ("02 compile", shape(size), B),
                    functools.partial(_compile_loop, size, B), G.compile_loop_bytes(size, B, T)))  # fmt: skip
    return runs


def _norm(rows: int, H: int) -> int:
    """Peak of RMSNormPyTorchFunction's fwd+bwd on (rows, H) above its inputs."""
    x = torch.empty(rows, H, requires_grad=True)  # (rows, H)
    g = torch.empty(H, requires_grad=True)
    trace = M.track(lambda: RMSNormPyTorchFunction.apply(x, g).sum().backward(), existing=(x, g))
    return trace.peak_bytes - trace.baseline_bytes


def _model_batch(size, batch_size: int):
    """A model of `size` and one batch at its context, on meta."""
    lm = build_model(size)
    x, y = (t.to("meta") for t in make_batches(size, 1, batch_size, lm.cfg.context_length, 0)[0])
    return lm, x, y


def _model_pass(size, batch_size: int) -> int:
    """§2's model_section: one fwd+bwd of `size`, its parameters counted."""
    lm, x, y = _model_batch(size, batch_size)
    return _peak(lambda: lm_loss(lm(x), y).backward(), existing=list(lm.parameters()))


def _compile_loop(size, batch_size: int) -> int:
    """§5's loop (compare_compiled, eager here): the passes in both orders, AdamW's state alive."""
    lm, x, y = _model_batch(size, batch_size)
    opt = make_optimizer(lm.parameters(), "adamw")

    def both():
        lm.zero_grad(set_to_none=True)
        lm_loss(lm(x), y).backward()

    passes = [lambda: lm(x), both, lambda: (both(), opt.step())]
    return _peak(lambda: _each_once(passes + passes[::-1]), existing=list(lm.parameters()))


def run_03(c=None, gpus: int = 1) -> list[dict]:
    """Notebook 03: one rank's message buffers (source, output, expected, the work copy timed) for every op at the
    largest message, per CUDA backend and world size; gloo puts every rank on the `gpus` GPUs, NCCL one per rank."""
    c = c or XC.PROFILE_GRID["gpu"]
    size, rows = max(c["sizes"]), []
    for backend, device in c["combos"]:
        for n in c["world_sizes"] if device == "cuda" else ():
            numel = max(n, size // 4 // n * n)  # as bench_worker: float32, n equal chunks
            peak = max(_peak(functools.partial(_buffers, op, numel, n)) for op in XC.OPS)
            run = f"{backend}+cuda, {n} ranks, {XC.format_size(size)} messages"
            rows.append(
                _row("03", run, peak, G.collective_bytes(size), 1 if backend == "nccl" else G.ranks_per_gpu(n, gpus))
            )
    return rows


def _buffers(op: str, numel: int, n: int) -> list:
    """One rank's buffers for `op` (collectives._buffers) and the work copy of the source that is timed."""
    return [t.clone() if i == 0 else t for i, t in enumerate(XC._buffers(op, numel, 0, n, "meta")) if t is not None]


def torch_ddp_stand_in(variants) -> list[tuple]:
    """Notebook 04's variants with torch DDP as DDPBucketed at its bucket size (its C++ reducer reads values, which
    meta tensors have none of; with gradient_as_bucket_view=True both hold parameters and buckets, 2Ψ)."""
    return [(label, "bucketed", mb) if kind == "torch_ddp" else (label, kind, mb) for label, kind, mb in variants]


def runs_04(edition: str, gpu_bytes: float) -> list[Run]:
    """Notebook 04 §2 at `edition`: the speed launch with the largest plan (the sweep model's, with every bucket
    size): every wrapper built on a copy of the model and stepped twice (each then holds its gradients or buckets
    while the others step), as rank 0 of two on the fake process group."""
    c = GC.config_04("gpu", edition, 1, gpu_bytes)  # the sizes the card holds, both ranks on it
    b = c["batch"] // WORLD
    size = max(c["sizes"], key=lambda s: G.ddp_rank_bytes(s, G.ddp_variants(s, "gpu", edition), b, c["context"]))
    variants = XD.SPEED_VARIANTS + (
        [v for v in XD.sweep_variants(G.sweep_buckets_mb()) if v not in XD.SPEED_VARIANTS]
        if size == c["sweep_model"]
        else []
    )
    work = functools.partial(
        XD.speed_worker, model=size, variants=torch_ddp_stand_in(variants), steps=1, warmup=1, batch_size=c["batch"],
        context_length=c["context"], traced=0,
    )  # fmt: skip
    plan = G.ddp_rank_bytes(size, len(variants), b, c["context"])
    key = ("04 speed", shape(size), tuple(variants), c["batch"], c["context"])
    run = f"speed {size}, {len(variants)} variants"
    return [Run("04", run, key, functools.partial(_in_group, work), plan, G.ranks_per_gpu(WORLD, 1))]


def runs_05(edition: str, gpu_bytes: float) -> list[Run]:
    """Notebook 05 §2 at `edition` on a card of gpu_bytes (its models: gpu_configs.config_05): the memory launch,
    each kind (DDP's buckets with AdamW, ShardedOptimizer, ZeRO-1) built, stepped twice and freed in turn. The speed
    launches hold one kind each at a context of 64 (less); torch's ZeroRedundancyOptimizer, theirs alone, is planned
    as ShardedOptimizer's states."""
    c = GC.config_05("gpu", edition, gpus=1, gpu_bytes=gpu_bytes)
    kinds = ["unsharded", "sharded", "zero1"]
    runs = []
    for size in c["memory_models"]:
        work = functools.partial(
            XS.memory_worker, model=size, kinds=kinds, batch_size=c["batch"], context_length=c["context"], steps=2
        )
        plan = max(G.kind_peak_bytes(k, size, c["batch"] // WORLD, c["context"], WORLD) for k in kinds)
        key = ("05 memory", shape(size), tuple(kinds), c["batch"], c["context"])
        run = f"memory {size}: {', '.join(kinds)}"
        runs.append(Run("05", run, key, functools.partial(_in_group, work), plan, G.ranks_per_gpu(WORLD, 1)))
    return runs


def _naive_passes(shape, dtype, is_causal) -> int:
    """Peak of bench_attention's three passes of naive attention on one input, from drawing it (as XA.inputs: its
    generator cannot draw on meta) through pass_steps' kept "bwd" graph to the last pass."""

    def passes():
        q, k, v = (torch.empty(shape, dtype=dtype, requires_grad=True) for _ in range(3))  # (B, H, T, d)
        do = torch.empty(shape, dtype=dtype)
        steps = XA.pass_steps(lambda q, k, v: naive_attention(q, k, v, is_causal), q, k, v, do)
        _each_once([steps[p] for p in XA.PASSES])

    return _peak(passes)


def _each_once(calls) -> None:
    """Call each in turn, dropping each result (and the graph it holds) as a timing loop does."""
    for call in calls:
        call()


def runs_06(gpu_bytes: float, c=None) -> list[Run]:
    """Notebook 06 on a card of gpu_bytes: naive attention's passes at every shape of §1's grid and §4's benchmark
    (where an OOM is a row, by design) and at the leaderboard's; §6's models side by side under autocast, each
    stepping naive attention, at the largest size the card holds (attention.fit_card)."""
    c = XA.fit_card(c or XA.PROFILES["gpu"], gpu_bytes)

    def naive(run, s, dt, causal, plan, extra=0, by_design=True) -> Run:
        return Run("06", run, ("06 naive", s, str(dt), causal), functools.partial(_naive_passes, s, dt, causal),
                   plan, oom_by_design=by_design, extra_bytes=extra)  # fmt: skip

    fp32 = torch.float32
    runs = [naive(f"naive grid {s} fp32", s, fp32, False, G.naive_pass_bytes(s)) for s in XA.naive_shapes(c)[0]]
    for dt in c["bench_dtypes"]:
        for s in c["bench_shapes"] if "naive" in c["bench_impls"] else ():
            runs.append(naive(f"bench naive {s} {str(dt)[6:]}", s, dt, True, G.naive_pass_bytes(s, dt, True)))
    lb = XA.LEADERBOARD
    s, dt = tuple(lb[k] for k in ("batch", "heads", "T", "d")), lb["dtype"]
    fused = 2 * G.fused_graph_bytes(s, dt)  # flash_triton's and sdpa's kept graphs (not runnable on meta)
    plan = G.naive_pass_bytes(s, dt, True) + fused
    runs.append(naive(f"leaderboard {s} {str(dt)[6:]}", s, dt, True, plan, extra=fused, by_design=False))
    n, B, dt = len(c["model_impls"]), c["model_batch"], c["model_dtype"]
    plans = {
        m: G.models_side_by_side_bytes(m, n, B, get_config(m).context_length, dt is not None) for m in c["model_sizes"]
    }
    size = max(plans, key=plans.get)
    walk = functools.partial(_peak, functools.partial(_models_side_by_side, size, n, B, dt))
    key = ("06 models", shape(size), n, B, str(dt))
    return runs + [Run("06", f"models {size}: {n} side by side", key, walk, plans[size])]


def _models_side_by_side(size, models: int, batch_size: int, dtype) -> None:
    """compare_models' round with naive attention in every model (meta cannot run the fused ones, whose tensors
    naive's bound): the models built at once, each stepped under torch.autocast as its step does."""
    x, y = random_batch(size, batch_size, device="meta", generator=torch.Generator().manual_seed(0))
    nets = [build_model(size, attention="naive", device="meta") for _ in range(models)]
    for net in nets:
        net.zero_grad(set_to_none=True)
        with torch.autocast("meta", dtype, enabled=dtype is not None):
            loss = lm_loss(net(x), y)
        loss.backward()


def runs_07(edition: str, gpu_bytes: float) -> list[Run]:
    """Notebook 07 with the models it builds (gpu_configs.config_07: 2026's): §5's checkpoint sweep's model without
    checkpointing (its largest step); §2-§4's measure launch as rank 0 of two: FSDP, DDP and ZeRO-1 built side by
    side, each stepped at least twice (its first phase, each kind alone, holds less); torch's fully_shard refuses
    meta parameters, so its planned share is added."""
    c = GC.config_07("gpu", GC.built_edition("07", edition), gpu_bytes)
    m, B, T = c["ckpt_model"], c["ckpt_batch"], c["ckpt_context"]
    sweep = functools.partial(
        XF.checkpoint_sweep, m, n_layers=c["ckpt_layers"], batch_size=B, context_length=T, segments=[0], steps=1,
        warmup=0,
    )  # fmt: skip
    key = ("07 sweep", shape(m), c["ckpt_layers"], B, T)
    runs = [Run("07", f"checkpoint sweep {m}, {B} x {T}, no checkpointing", key, functools.partial(_peak, sweep),
                G.retained_graph_bytes(m, B, T))]  # fmt: skip
    kinds = ("fsdp", "ddp", "zero1")
    work = functools.partial(
        XF.measure_worker, model=c["model"], batch_size=c["batch"], context_length=c["context"], steps=1, warmup=1,
        kinds=kinds, memory=False, trace=False,
    )  # fmt: skip
    plan = G.fsdp_launch_bytes(c["model"], c["batch"] // WORLD, c["context"], WORLD)
    run = f"measure {c['model']}: {', '.join(kinds)} (+ fully_shard planned)"
    key = ("07 measure", shape(c["model"]), kinds, c["batch"], c["context"])
    extra = G.fsdp_state_bytes(c["model"], WORLD)
    runs.append(Run("07", run, key, functools.partial(_in_group, work), plan, G.ranks_per_gpu(WORLD, 1),
                    extra_bytes=extra))  # fmt: skip
    return runs


def run_08(c=None) -> list[dict]:
    """Notebook 08's launches as rank 0 of theirs on the fake group: the TP worker (one process's reference step and
    TP, TP+SP beside it); the pipeline worker as its first and its last stage (embeddings / LM head), one timed step,
    the fixed-cost stages at no cost; TP against DP, one round of each; the speed worker once per width. Ring
    attention's launch runs its reference, naive attention's forward and backward and its gradients' scales on the
    whole sequence, causal and not: its T x T scores are the launch's peak, while the ring's tiles (hundreds of
    thousands of tiny meta ops, ~50 s here) hold (BH, T/N, d) blocks."""
    c = c or XM.PROFILES["gpu"]
    cfg, world, p = c["model"], c["world"], c["pipe_world"]
    tp = functools.partial(XM.tensor_parallel_worker, cfg, c["batch"])
    with fake_group(world):
        peak = _peak(tp)
    run = f"tensor parallel {cfg.name}, batch {c['batch']}"
    rows = [_row("08", run, peak, G.tp_launch_bytes(cfg, c["batch"]), G.ranks_per_gpu(world, 1))]
    pipe_cfg, batch = XP.pipe_model(c), c.get("pipe_batch", c["batch"] * c["pipe_micro"])
    pipe = functools.partial(XP.pipeline_worker, pipe_cfg, batch, c["pipe_micro"], 1, (0, 0), c["pipe_chunks"])
    peaks = []
    for rank in (0, p - 1):
        with fake_group(p, rank):
            peaks.append(_peak(pipe))
    run = f"pipeline {p} stages, batch {batch} (stages 0 and {p - 1})"
    rows.append(_row("08", run, max(peaks), G.pipeline_launch_bytes(pipe_cfg, batch), G.ranks_per_gpu(p, 1)))
    versus = functools.partial(XV.tp_dp_worker, cfg, c["batch"], 1, 1)
    with fake_group(world):
        peak = _peak(versus)
    run = f"tp against dp {cfg.name}, batch {c['batch']}"
    rows.append(_row("08", run, peak, G.tp_dp_launch_bytes(cfg, c["batch"]), G.ranks_per_gpu(world, 1)))
    cp = (1, c["cp_batch_heads"], c["cp_context"], c["cp_head_dim"])
    peak = _peak(functools.partial(_cp_reference, cp[1:]))
    plan = G.cp_reference_bytes(cp)
    rows.append(_row("08", f"ring attention {cp[1:]}: its reference", peak, plan, G.ranks_per_gpu(world, 1)))
    speed = functools.partial(XT.tp_speed_worker, c["speed_tokens"], c["speed_d_model"], c["speed_widths"], 1)
    with fake_group(world):
        peak = _peak(speed)
    plan = G.tp_speed_bytes(c["speed_tokens"], c["speed_d_model"], c["speed_widths"], world)
    rows.append(_row("08", f"tp speed, d_ff up to {max(c['speed_widths'])}", peak, plan, G.ranks_per_gpu(world, 1)))
    return rows


def _cp_reference(shape) -> None:
    """context_parallel_worker's reference: q, k, v and dO of the whole sequence, naive attention's output,
    logsumexp and gradients and the gradients' scales, without and with the causal mask (one at a time)."""
    q, k, v, do = (torch.empty(shape) for _ in range(4))  # (BH, T, d)
    for causal in (False, True):
        XCP.reference(q, k, v, do, causal)


FIXED = {  # notebooks without an edition or a card-dependent model: walked once, rows of tracked peaks
    "00": run_00,
    "03": run_03,
    "08": run_08,
}
BY_CARD = {  # notebooks without an edition whose sizes follow the card (fit_card): Runs per card, walked once per key
    "02": runs_02,
    "06": runs_06,
}
BY_EDITION = {  # notebooks that build their EDITION's models (05: per card too): Runs, walked once per key
    "01": runs_01,
    "04": runs_04,
    "05": runs_05,
    "07": runs_07,
}
NOTEBOOKS = sorted(FIXED | BY_CARD | BY_EDITION)
