"""A synthetic data folder for the answers page's tests (test_answers_page, test_answers_sentences): every result the
answers read, a few rows each, made with the notebooks' own row builders where they exist, and the helpers that plant
one result (samples with a given median, write, all_answers). Imported by name: pytest puts tests/ on sys.path."""

from pathlib import Path

import numpy as np

from helpers.course import answers as A
from helpers.experiments import benchmarking, ddp
from helpers.experiments import rmsnorm as XR
from helpers.results import save_results
from helpers.timing import Comparison, pairwise_ratios

RNG = np.random.default_rng(0)


def samples(median: float, n: int = 10, spread: float = 0.02) -> list[float]:
    return list(median * (1 + spread * RNG.standard_normal(n)))


def comparison(medians: dict) -> Comparison:
    """A Comparison whose samples have these medians (labels "impl|pass")."""
    return Comparison({label: samples(m) for label, m in medians.items()}, next(iter(medians)), "cpu")


def speed_run(step: float, comm: float = 0.0) -> ddp.SpeedRun:
    return ddp.SpeedRun(
        step=samples(step),
        comm=samples(comm) if comm else [0.0] * 10,
        backward=samples(step / 2),
        timeline=[],
        buckets=None,
    )


SIZES = ["small/cpu", "medium/cpu"]


def notebook_01_rows() -> dict:
    timing = [
        {
            "size": s,
            "pass": p,
            "warm-up": w,
            "mean_s": m,
            "std_s": 0.02 * m,
            "median_s": m,
            "first_s": 3 * m,
            "steps": 6,
            "status": "ok",
        }
        for s, base in zip(SIZES, (0.01, 0.03), strict=True)
        for w in (0, 2)
        for p, m in (("forward", base), ("backward", 2 * base), ("both", 3 * base))
    ]
    profile = [
        {
            "op": op,
            "ms/step": 6.0 * share,
            "share": share,
            "calls/step": calls,
            "class": kind,
            "run": run,
            "matmul_share": mm,
        }
        for run, mm in (("forward", 0.8), ("forward+backward", 0.7), ("full step", 0.5))
        for op, share, calls, kind in (("aten::mm", mm, 12, "matmul"), ("aten::add", 1 - mm, 8, "other"))
    ]
    precision = {s: Comparison({"fp32": samples(1.0), "autocast bfloat16": samples(1.3)}, "fp32", "cpu") for s in SIZES}
    peaks = [
        {"size": s, "precision": prec, "pass": p, "peak_MiB": base * f * k, "status": "ok"}
        for s, base in zip(SIZES, (8.0, 14.0), strict=True)
        for prec, f in (("fp32", 1.0), ("autocast bfloat16", 0.9))
        for p, k in (("forward", 1), ("full step", 2))
    ]
    return {
        "01_timing": (timing, dict(batch=4, context=32)),
        "01_profile": (profile, dict(size="medium/cpu", steps=2)),
        "01_flame": (
            [
                {"part": "RMSNorm", "kind": "part", "share": 0.03, "count": 5},
                {"part": "softmax", "kind": "part", "share": 0.02, "count": 2},
            ]
            + [
                {"part": st, "kind": "stage", "share": v, "count": None}
                for st, v in (("forward", 0.3), ("backward", 0.6), ("optimizer step", 0.1))
            ],
            dict(size="medium/cpu"),
        ),
        "01_attention_parts": (attention_parts_rows(), dict(size="medium/cpu", batch=4, context=32)),
        "01_precision_ratios": (benchmarking.precision_ratios(precision), dict(batch=4, context=32)),
        "01_autocast_dtypes": (
            [
                {"tensor": t, "autocast bfloat16 on cpu": d}
                for t, d in (("parameters", "torch.float32"), ("fc1 output", "torch.bfloat16"))
            ],
            {},
        ),
        "01_norm_precision": (
            [{"dtype": d, "max_rel_error": e} for d, e in (("float32", 1e-7), ("bfloat16", 3e-3), ("float16", 4e-4))],
            {},
        ),
        "01_memory_peaks": (peaks, dict(batch=4, context=32)),
        "01_largest_tensors": (
            [{"MiB": 1.5, "op": "aten::mm", "module": "lm_head (Linear)"}],
            dict(size="medium/cpu", peak_MiB=28.0),
        ),
        "08_tp_speed": (
            [
                {
                    "d_ff": f,
                    "comm_ms": cm,
                    "model_comm_ms": 0.6,
                    "comm_share": c,
                    "model_comm_share": m,
                    "d_ff_star": 244.0,
                    "holds": abs(c - m) <= 0.1,
                }
                for f, cm, c, m in ((128, 1.2, 0.94, 0.43), (1024, 0.4, 0.22, 0.2))
            ],
            dict(world=2, alpha_s=1.5e-4, beta_Bps=2.9e8, tokens=256, d_model=64, share_tol=0.1)
            | dict(all_reduce_s=3.2e-4),
        ),
        "01_block_memory": (
            [
                {
                    "context": T,
                    "saved_MiB": mib,
                    "saved_formula_MiB": mib,
                    "top5_share": 0.8,
                    "top5_ops": "mm 1 MiB, mul 1 MiB",
                    "grads_MiB": 25.0,
                    "grads_formula_MiB": 25.0,
                }
                for T, mib in ((32, 9.64), (512, 214.45))  # the staff block's closed form (issue 49)
            ],
            dict(model="xl-2026/cpu", batch_size=4, block=0),
        ),
    }


def notebook_02_rows() -> dict:
    shapes = {
        ("float32", 256): comparison(
            {
                "layernorm|fwd": 1.0,
                "torch|fwd": 2.5,
                "torchfn|fwd": 2.4,
                "layernorm|fwd+bwd": 3.0,
                "torch|fwd+bwd": 6.0,
                "torchfn|fwd+bwd": 5.0,
            }
        ),
        ("float32", 1024): comparison(
            {
                "layernorm|fwd": 1.0,
                "torch|fwd": 1.0,
                "compiled|fwd": 0.8,
                "torchfn|fwd": 1.0,
                "layernorm|fwd+bwd": 3.0,
                "torch|fwd+bwd": 3.0,
                "compiled|fwd+bwd": 2.0,
                "torchfn|fwd+bwd": 3.0,
            }
        ),
    }
    medians = {"layernorm": 1.0, "rmsnorm": 1.1, "rmsnorm_torchfn": 1.05}
    norms = {
        s: comparison({f"{n}|{p}": m * k for n, m in medians.items() for p, k in (("fwd", 1), ("fwd+bwd", 2))})
        for s in SIZES
    }
    passes = dict(zip(XR.COMPILE_PASSES, (1.0, 2.0, 2.2), strict=True))  # eager's medians; compiled's 0.7x
    compiled = {
        SIZES[0]: comparison({f"{c}|{p}": t * (0.7 if c else 1.0) for c in (False, True) for p, t in passes.items()})
    }
    return {
        "rmsnorm_ratios": (XR.ratio_rows(shapes, ("dtype", "H")), {}),
        "rmsnorm_model_ratios": (
            XR.ratio_rows(norms, ("size",), loop="norms")
            + XR.ratio_rows(compiled, ("size",), passes=XR.COMPILE_PASSES, loop="compile"),
            {},
        ),
        "rmsnorm_grad_checks": (
            [
                {"check": "derived gradients vs autograd (float64)", "max_abs_error": 4e-16, "passed": True},
                {"check": "gradcheck", "max_abs_error": None, "passed": True},
            ],
            {},
        ),
    }


sharding_speed = [
    {"kind": k, "iteration_s": t, "step_comm_s": c, "update_s": u}
    for k, t, c, u in (("unsharded", 0.9, 0.0, 0.05), ("sharded", 0.95, 0.03, 0.03))
]


def notebook_03_05_rows() -> dict:
    coll = [
        {
            "backend": "gloo",
            "device": "cpu",
            "world_size": n,
            "nodes": 1,
            "op": "all_reduce",
            "size_bytes": b,
            "size": f"{b // 1024} KB",
            "time_s": t,
            "p25_s": 0.9 * t,
            "p75_s": 1.1 * t,
            "busbw_GBps": b / t / 1e9,
            "wrong": 0,
        }
        for n in (2, 4)
        for b, t in ((8192, 4e-4 * n), (65536, 6e-4 * n), (1 << 20, 3e-3 * n))
    ]
    variants = {
        "local": (1.0, 0),
        "naive": (2.0, 0.8),
        "flat": (1.6, 0.4),
        "per_parameter": (1.5, 0.2),
        "bucketed 1 MB": (1.4, 0.1),
        "bucketed 25 MB": (1.41, 0.1),
        "torch_ddp 25 MB": (1.3, 0),
    }
    raw = {
        m: [{v: speed_run(s * k, c * k) for v, (s, c) in variants.items()} for _ in range(2)]
        for m, k in zip(SIZES, (0.1, 0.2), strict=True)
    }
    speed = [
        {"model": m, "variant": v, "step_s": s * k, "comm_s": c * k}
        for m, k in zip(SIZES, (0.1, 0.2), strict=True)
        for v, (s, c) in variants.items()
    ]
    sweep = [
        {
            "model": SIZES[1],
            "variant": v,
            "bucket_MB": mb,
            "step_s": variants[v][0] * 0.2,
            "buckets": nb,
            "predicted_s": p,
        }
        for v, mb, nb, p in (
            ("bucketed 1 MB", 1.0, 3, variants["bucketed 1 MB"][0] * 0.16),
            ("bucketed 25 MB", 25.0, 1, variants["bucketed 25 MB"][0] * 0.25),
        )
    ]
    mem = [
        {
            "model": m,
            "kind": k,
            "rank": r,
            "point": p,
            "step": st,
            "label": label,
            "live_bytes": live,
            "peak_bytes": 2 * live,
            "phase_peak_bytes": 2 * live,
        }
        for m in SIZES
        for k, f in (("unsharded", 1.0), ("sharded", 0.8))
        for r in (0, 1)
        for p, st, label, live in (
            ("after init", 0, "after init", 4e6),
            ("before step", 1, "before step 1", 4e6),
            ("after step", 1, "after step 1", 8e6 * f),
        )
    ]
    return {
        "03_collectives": (coll, dict(cpu_count=2)),
        "03_two_node_rehearsal": ([{**r, "nodes": 2} for r in coll[:2]], {}),
        "04_ddp_checks": (
            [
                {"model": m, "variant": v, "start_equal": True, "ranks_equal": True, "grad_ratio": 0.1}
                for m in ("toy", "small/cpu")
                for v in ("naive", "flat")
            ],
            {},
        ),
        "04_ddp_speed": (speed, {}),
        "04_ddp_ratios": (ddp.ratio_rows(raw), {}),
        "04_ddp_overlap": (
            [{"variant": v, "buckets": None, "trace overlap": o} for v, o in (("naive", 0.0), ("per_parameter", 0.4))],
            dict(model=SIZES[1]),
        ),
        "04_ddp_bucket_sweep": (
            sweep,
            dict(model=SIZES[1], alpha_s=3e-4, beta_Bps=1.5e9, backward_s=0.1, grad_bytes=4_000_000, n_star=12.0),
        ),
        "05_sharding_memory": (mem, dict(world_size=2)),
        "05_sharding_speed": (sharding_speed, dict(model=SIZES[1])),
        "05_sharding_ratios": (pairwise_ratios({"unsharded": samples(0.9), "sharded": samples(0.95)}, launch=0), {}),
        "05_sharding_comm": (
            [
                {"kind": k, "per-rank traffic / Ψ": t}
                for k, t in (("unsharded", 1.0), ("sharded", 1.5), ("zero1", 1.0001))
            ],
            dict(model=SIZES[0]),
        ),
    }


def naive_rows(configs, batch: int = 8, oom=()) -> list[dict]:
    """06_naive_attention rows for (d, T) configurations (fwd+bwd = 1e-8·T² s: 16x for 4x the length), out of memory
    at the (d, T) in `oom`."""
    return [
        {
            "impl": "naive",
            "batch": batch,
            "heads": 1,
            "T": T,
            "d": d,
            "dtype": "float32",
            "causal": False,
            "oom": (d, T) in oom,
            "median_s": None if (d, T) in oom else 1e-8 * T * T * k / 3,
            "pass": p,
        }
        for d, T in configs
        for p, k in (("fwd", 1), ("bwd", 2), ("fwd+bwd", 3))
    ]


NAIVE_CPU = dict(grid=dict(head_dims=[16, 32, 64, 128], seq_lens=[256, 1024, 4096, 8192, 16384], max_flops=2e9))


def notebook_06_07_rows() -> dict:
    from helpers.experiments import fsdp as XF

    naive = naive_rows([(d, 256) for d in (16, 32, 64, 128)] + [(16, 1024)])  # as the cpu profile's grid
    mem = [
        {
            "batch": 8,
            "T": T,
            "d": d,
            "oom": False,
            "saved_bytes": 8 * T * T * 4 + 8 * T * d * 4,
            "formula_bytes": 8 * T * T * 4 + 8 * T * d * 4,
            "score_matrix_bytes": 8 * T * T * 4,
        }
        for d, T in [(d, 256) for d in (16, 32, 64, 128)] + [(16, 1024)]
    ]
    compiled = comparison({"naive": 1.0, "compiled": 0.7})
    compile_rows = [
        {**row, "pass": p, "pairs": 10}
        for p in ("fwd", "fwd+bwd")
        for row in compiled.table().reset_index().to_dict("records")
    ]
    checks = [
        {"check": c, "detail": "shape, dtypes, tolerance"}
        for c in (
            "online softmax = logsumexp",
            "backward from L = autograd",
            "FlashAttentionPyTorch = naive",
            "Triton forward kernel = spec",
            "Triton backward kernels = autograd",
            "FlashAttentionTriton = naive",
        )
    ]
    bench = [
        {"impl": i, "T": 512, "d": 64, "dtype": "float32", "pass": p, "median_s": m * k, "oom": False}
        for i, m in (("naive", 2e-3), ("sdpa", 1e-3))
        for p, k in (("fwd", 1), ("bwd", 2), ("fwd+bwd", 3))
    ]
    board = [
        {
            "impl": i,
            "median_ms": ms,
            "TFLOPs": 1.0,
            "ratio": r,
            "ratio_low": r * 0.98,
            "ratio_high": r * 1.02,
            "pairs": 20,
        }
        for i, ms, r in (("flash_triton", 8.0, 1.0), ("sdpa", 9.6, 1.2), ("naive", 80.0, 10.0))
    ]
    sweep = [
        {"segment": k, "peak_MiB": pk, "median_ms": ms, "time / none": r, "low": r - 0.05, "high": r + 0.05}
        for k, pk, ms, r in (
            (0, 40.0, 100.0, 1.0),
            (2, 14.0, 130.0, 1.3),
            (3, 12.0, 131.0, 1.31),
            (4, 13.0, 132.0, 1.32),
        )
    ]
    ffn = dict(tokens=4096, d=4096, f=16384, n=8, C=989e12, W=450e9)
    return {
        "06_naive_attention": (naive, dict(NAIVE_CPU, steps=6, warmup=2)),
        "06_naive_memory": (mem, {}),
        "06_compile_ratios": (compile_rows, dict(shape=[2, 1, 512, 64])),
        "06_checks": (checks, dict(triton_mode="interpreter")),
        "attention_bench": (bench, {}),
        "06_leaderboard": (board, {}),
        "07_checkpoint": (
            sweep,
            dict(model="small/cpu", n_blocks=12, batch=4, context=64, k_continuous=3.1, k_best=3, steps=6),
        ),
        "07_equivalence": (
            [
                {"ranks": n, "dtype": dt, "max_diff/bound": 0.1, "replicated_equal": True, "bitwise": n == 1}
                for n in (2, 1)
                for dt in ("fp32", "fp16")
            ],
            {},
        ),
        "07_memory": (
            [
                {"kind": k, "rank": 0, "point": "after step 1", "live_MiB": v, "peak_MiB": 2 * v}
                for k, v in (("ddp", 16.0), ("zero1", 12.0), ("fsdp", 8.0))
            ],
            {},
        ),
        "07_zero_check": (
            [
                {"kind": k, "stage": s, "rank": 0, "measured_MiB": v, "zero_MiB": v, "measured/zero": 1.0}
                for k, s, v in (("ddp", 0, 16.0), ("zero1", 1, 12.0), ("fsdp", 3, 8.0))
            ],
            {},
        ),
        "07_gather_timeliness": (
            [
                {
                    "rank": 0,
                    "call": i,
                    "module": f"m{i}",
                    "prefetched": i > 0,
                    "in_time": i > 1,
                    "stall_us": 0.0 if i > 1 else 50.0,
                }
                for i in range(4)
            ],
            {},
        ),
        "07_ring": (
            [
                {"N": n, "S_bytes": s, "method": m, "exact": True, "median_us": 100.0 * n, "model_us": 90.0 * n}
                for n in (2, 4)
                for s in (1024, 65536)
                for m in ("ring", "alternate ring")
            ],
            dict(alpha_s=5e-5, W_Bps=2e9),
        ),
        "07_ffn_calcs": (XF.ffn_table(n_tp=4, **ffn).reset_index(), dict(n_tp=4, **ffn)),
    }


def write(folder: Path, results: dict, profile: str = "cpu") -> Path:
    for name, (rows, extra) in results.items():
        save_results(rows, name, profile=profile, directory=folder, **extra)
    return folder


def all_answers(folder, profile="cpu") -> dict[str, tuple[str, bool]]:
    saved = A.Saved(folder, profile)
    return {q.number: (got.text, got.measured) for q in A.QUESTIONS for got in [A.answer(q, saved)]}


_BUILT: dict[str, Path] = {}


def synthetic_folder(tmp_path_factory) -> Path:
    """The synthetic folder, built once per session (each test module's `synthetic` fixture returns it) from a fresh
    RNG, so its samples do not depend on which tests ran before."""
    global RNG
    if "folder" not in _BUILT:
        RNG = np.random.default_rng(0)
        everything = {**notebook_01_rows(), **notebook_02_rows(), **notebook_03_05_rows(), **notebook_06_07_rows()}
        _BUILT["folder"] = write(tmp_path_factory.mktemp("local"), everything)
    return _BUILT["folder"]


def attention_parts_rows(softmax_s: float = 1e-4, matmul_s: float = 1e-4, flop_ratio: float = 0.02) -> list[dict]:
    """01_attention_parts as notebook 01 saves it: the three ops, then softmax / (QKᵀ + PV) paired over 20 rounds."""
    ratio = softmax_s / (2 * matmul_s)
    ops = [{"op": op, "median_s": t} for op, t in (("QKᵀ", matmul_s), ("softmax", softmax_s), ("PV", matmul_s))]
    return ops + [
        {"op": "softmax / (QKᵀ + PV)", "ratio": ratio, "ratio_low": 0.9 * ratio, "ratio_high": 1.1 * ratio}
        | {"pairs": 20, "flop_ratio": flop_ratio}
    ]
