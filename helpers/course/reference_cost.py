"""The reference run's cost model (helpers.course.reference): each batch's seconds from closed-form FLOPs and bytes
over a device's rates (measured on this CPU, from the datasheet on a GPU), plus process starts, launches and compiles;
an earlier run's wall time on the same device and profile wins over it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from helpers import formulas as F
from helpers.course.reference_batches import SCALES, scale
from helpers.experiments.attention import TILED_STEPS
from helpers.model import get_config


@dataclass(frozen=True)
class Rates:
    """What the cost model assumes of a device: sustained FLOP/s and bytes/s, gloo's all-reduce bytes/s, fixed costs."""

    flops_s: float
    bytes_s: float
    gloo_Bps: float
    nccl_Bps: float
    startup_s: float  # a child process: python, torch, the CUDA context
    launch_s: float  # one 2-rank launch: spawn, imports, rendezvous
    compile_s: float  # one torch.compile'd function
    jit_s: float  # one Triton kernel specialisation (0 in the interpreter)
    interpreted_call_s: float  # one Triton launch in the interpreter, tiny shapes
    ptxas_s: float  # one kernel configuration compiled for one arch by `python -m helpers kernels`
    gpus: int
    low_flops_s: float | None = None  # sustained bf16/fp16 FLOP/s (None: flops_s)
    eager_call_s: float = 10e-6  # one eager PyTorch op: Python, dispatch and the kernel launch

    def flops_for(self, dtype: str) -> float:
        """FLOP/s at `dtype`: fp32 runs disable TF32 (helpers.env), so they get the fp32 rate."""
        return self.flops_s if dtype in ("float32", "fp32") else (self.low_flops_s or self.flops_s)


GPU_EFFICIENCY = 0.3  # sustained share of the datasheet's dense fp32/bf16 peak for these models (notebook 01's MFU)
GPU_FALLBACK_FLOPS = {"fp32": 20e12, "bf16": 300e12}  # an unknown GPU's dense peaks, before GPU_EFFICIENCY


def gpu_rates(device_name: str, gpus: int) -> Rates:
    """Rates of a GPU: its datasheet fp32 (not tf32: fp32 runs disable it) and bf16 peaks (formulas.peak_flops) at
    GPU_EFFICIENCY; HBM-class memory; gloo through host copies (2 x 1 GB moved per rank in 1.4 s: seed 004 §3.1.1,
    2 H100s); NCCL over NVLink."""
    peak = {p: F.peak_flops(device_name, p) or GPU_FALLBACK_FLOPS[p] for p in ("fp32", "bf16")}
    return Rates(
        flops_s=peak["fp32"] * GPU_EFFICIENCY,
        bytes_s=1.5e12,
        gloo_Bps=1.5e9,
        nccl_Bps=100e9,
        startup_s=15,
        launch_s=25,
        compile_s=15,
        jit_s=1.5,
        interpreted_call_s=0,
        ptxas_s=0.3,
        gpus=gpus,
        low_flops_s=peak["bf16"] * GPU_EFFICIENCY,
        eager_call_s=12e-6,
    )


def cpu_rates() -> Rates:
    """Rates of this CPU, measured now in a fraction of a second (a 256³ matmul, a 16 MB copy)."""
    import torch

    a = torch.randn(256, 256)
    b = torch.empty(4 * 2**20)
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    flops_s = 20 * 2 * 256**3 / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(5):
        b.clone()
    bytes_s = 5 * 2 * b.numel() * 4 / (time.perf_counter() - start)
    return Rates(
        flops_s=flops_s,
        bytes_s=bytes_s,
        gloo_Bps=1e9,
        nccl_Bps=1e9,
        startup_s=5,
        launch_s=15,
        compile_s=30,
        jit_s=0,
        interpreted_call_s=0.1,
        ptxas_s=0.15,
        gpus=0,
    )


def _step_s(size, batch: int, context: int, r: Rates) -> float:
    """A forward+backward of `size` on batch x context."""
    return F.train_flops(get_config(size), batch, context) / r.flops_s


def _attn_s(shape, impl: str, r: Rates, dtype: str = "float32") -> float:
    """A causal fwd+bwd of `impl` on (B, H, T, d) at `dtype`; naive costs more than its FLOPs, and the PyTorch tiles
    cost their eager launches on top (attention.tiled_launches: about 1.5 M at T = 16,384)."""
    import torch

    from helpers.attention import attention_flops, tiled_launches

    B, H, T, d = shape
    flops = attention_flops(B * H, T, T, d, True) + attention_flops(B * H, T, T, d, True, backward=True)
    compute = flops / r.flops_for(dtype) * {"naive": 4, "compiled": 3, "flash_pytorch": 2}.get(impl, 1.5)
    if impl != "flash_pytorch":
        return compute
    return compute + tiled_launches(T, d, getattr(torch, dtype), True) * r.eager_call_s


def _norm_calls_s(calls: int, rows: int, H: int, r: Rates) -> float:
    """`calls` fwd+bwd norm calls and as many copies (the yardstick), each at the device's bytes/s."""
    import torch

    return calls * 2 * F.norm_bytes(rows, H, torch.float32, True) / r.bytes_s


def _est_kernels(s, r: Rates) -> float:
    calls = 2 * (s["norm_warmup"] + s["norm_steps"])  # per impl: fwd, then fwd+bwd
    triton = calls * r.interpreted_call_s + 3 * r.jit_s
    attn = (s["attn_warmup"] + s["attn_steps"]) * sum(
        _attn_s(s["attn_shape"], i, r, s["attn_dtype"]) for i in s["attn_impls"]
    )
    return 2 * _norm_calls_s(calls, *s["norm_shape"], r) + triton + attn + 3 * r.jit_s


def _est_registers(s, r: Rates) -> float:
    from helpers.kernel_check import all_configs

    n = sum(len(c.archs) for c in all_configs(s["quick"]))  # compiles: a tuned row is for its own architecture
    return n * r.ptxas_s + (len(all_configs(True)) * r.jit_s if r.gpus else 0)


def _est_01(s, r: Rates) -> float:
    per_size = []
    for size in s["sizes"]:
        step = _step_s(size, s["batch"], s["context"], r)
        build = 6 * F.param_bytes(size) / r.bytes_s * 50  # random init: a few passes over the weights
        timing = (s["cold_steps"] + s["warmup"] + s["steps"]) * step * (1 / 3 + 1 + 1) + 6 * build
        peaks = (1 + len(s["autocast"])) * (3 * step + build)
        per_size.append(timing + peaks)
    return sum(per_size)


def _est_02(s, r: Rates) -> float:
    steps = s["warmup"] + s["steps"]
    total = 0.0
    for H in s["hidden"]:
        names = 1 + (H in s["compile_hidden"]) + (s["triton_shape"] is None)
        total += (
            len(s["dtypes"])
            * 2
            * (names * _norm_calls_s(steps, s["rows"], H, r) + (H in s["compile_hidden"]) * r.compile_s + 2 * r.jit_s)
        )
    if s["triton_shape"] is not None:
        total += len(s["dtypes"]) * 2 * 4 * r.interpreted_call_s
    return total


def _est_06(s, r: Rates) -> float:
    steps = s["warmup"] + s["steps"]
    total = 0.0
    for shape in s["bench_shapes"]:
        for impl in s["bench_impls"]:
            if impl == "flash_pytorch" and shape[2] > s["flash_pytorch_max_T"]:
                continue
            n = s["warmup"] + min(s["steps"], TILED_STEPS) if impl.endswith("pytorch") else steps  # sweep's cap
            total += sum(
                2 * n * _attn_s(shape, impl, r, dtype)  # fwd, bwd, fwd+bwd
                + (r.compile_s if impl == "compiled" else 0)
                + 3 * r.jit_s
                for dtype in s["dtypes"]
            )
    return total


def _est_03(s, r: Rates) -> float:
    from helpers.experiments.collectives import OPS

    total = 0.0
    for backend, device in s["combos"]:
        for n in s["world_sizes"]:
            if (device == "cuda" and not r.gpus) or (backend == "nccl" and r.gpus < n):
                continue  # run_grid skips it
            bw = r.nccl_Bps if backend == "nccl" else r.gloo_Bps
            call = {size: 2 * size / bw for size in s["sizes"]}  # _agreed_iters: 3 <= timed calls <= iters
            calls = sum(min(s["iters"], max(3, s["budget_s"] // c)) * c + s["warmup"] * c for c in call.values())
            total += r.launch_s + len(OPS) * calls
    return total


def _train_launch_s(size, variants: int, steps: int, batch: int, context: int, r: Rates, comm_bytes: float) -> float:
    """One 2-rank launch training `variants` copies of `size` for `steps`, each step sending comm_bytes over gloo."""
    per_step = _step_s(size, batch // 2, context, r) + comm_bytes / r.gloo_Bps + 16 * F.param_bytes(size) / r.bytes_s
    return r.launch_s + variants * steps * per_step


def _est_04(s, r: Rates) -> float:
    from helpers.experiments.ddp import SPEED_VARIANTS, sweep_variants

    total = 0.0
    for size in s["sizes"]:
        n = len(SPEED_VARIANTS) + (
            len([v for v in sweep_variants(s["buckets_mb"]) if v not in SPEED_VARIANTS])
            if size == s["sweep_model"]
            else 0
        )
        total += _train_launch_s(
            size, n, s["warmup"] + s["steps"], s["batch"], s["context"], r, 2 * F.param_bytes(size)
        )
    return total


def _est_05(s, r: Rates) -> float:
    m = s["speed_model"]
    return sum(
        _train_launch_s(m, len(kinds), s["warmup"] + s["steps"], s["batch"], s["context"], r, 3 * F.param_bytes(m))
        for kinds in s["speed_launches"]
    )


def _est_07(s, r: Rates) -> float:
    m = s["model"]
    memory = _train_launch_s(m, 3, 3, s["batch"], s["context"], r, 3 * F.param_bytes(m)) - r.launch_s
    return memory + _train_launch_s(m, 4, s["warmup"] + s["steps"], s["batch"], s["context"], r, 3 * F.param_bytes(m))


def _est_08(s, r: Rates) -> float:
    """Two 2-rank launches: one process's step and TP, TP+SP on the whole batch (with three tracked block forwards
    each); the speed launch's all-reduces at three sizes and a TP and a local step per width, reps + 1 each."""
    cfg, tokens, d = s["model"], s["batch"] * s["model"].context_length, s["model"].d_model
    acts = 4 * tokens * d  # one (B, T, C) fp32 tensor: TP all-reduces 4 per block per step
    tp = 3 * F.train_flops(cfg, s["batch"], cfg.context_length) / r.flops_s + 4 * cfg.n_layers * 2 * acts / r.gloo_Bps
    n, t, dm = s["world"], s["speed_tokens"], s["speed_d_model"]
    ar = 2 * 4 * t * dm / r.gloo_Bps  # one all-reduce of the (tokens, d) activations
    steps = sum(2 * 12 * t * dm * f / n / r.flops_s + 2 * ar for f in s["speed_widths"])
    return 2 * r.launch_s + tp + (s["speed_reps"] + 1) * (steps + 5.25 * ar)


ESTIMATORS = {
    "kernels": _est_kernels,
    "registers": _est_registers,
    "01": _est_01,
    "02": _est_02,
    "03": _est_03,
    "04": _est_04,
    "04-sweep": _est_04,
    "07": _est_07,
    "08": _est_08,
    **{name: {"05": _est_05, "06": _est_06}[name[:2]] for name in SCALES if name[:3] in ("05-", "06-")},
}
assert set(ESTIMATORS) == set(SCALES)


def model_estimate_s(name: str, profile: str, r: Rates) -> float:
    """The cost model's seconds for batch `name` at `profile`: its child's start plus its work."""
    return r.startup_s + ESTIMATORS[name](scale(name, profile), r)


def estimate_s(name: str, profile: str, r: Rates, manifest: dict) -> tuple[float, str]:
    """(seconds, where from): an earlier run's wall time on this device and profile (x1.1), else the cost model."""
    earlier = manifest.get("batches", {}).get(name, {})
    if manifest.get("profile") == profile and earlier.get("status") == "ok" and earlier.get("wall_s"):
        return 1.1 * earlier["wall_s"], f"earlier run ({earlier.get('commit')})"  # 10 % for the machine's spread
    return model_estimate_s(name, profile, r), "cost model"
