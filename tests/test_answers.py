"""The answers page: every question of the reference writeups and every problem of the 2025 and 2026 editions
(../shared/curricula.md) is covered, the page builds from a synthetic data folder (every answer measured), an empty one
(every answer "not measured") and a stale one, names a faster side only outside the noise, chooses its GPU line from
what was measured, and links nothing on the network."""

import os
import re
from pathlib import Path

import numpy as np
import pytest

from helpers.course import answers as A
from helpers.experiments import benchmarking, ddp
from helpers.experiments import rmsnorm as XR
from helpers.results import save_results
from helpers.timing import Comparison, Ratio, pairwise_ratios, ratio_of

ROOT = Path(__file__).resolve().parent.parent
SEEDS = Path(os.environ.get("SEEDS_DIR", ROOT.parent / "shared" / "seeds"))
CURRICULA = Path(os.environ.get("CURRICULA", ROOT.parent / "shared" / "curricula.md"))
LETTERS = "abcdefgh"


def course_numbers(text: str) -> set[str]:
    """The numbered questions of sections 2 and 3 of a writeup: "2.1.1(b)" per part, "3.1.1" when it has none.
    A heading is "N.N.N. (name)"; a part is a line opening with "(x)" or "- (x)"; earlier unlabelled bullets count as
    the parts before the first label (the writeup's 2.1.2 labels only its (d))."""
    parts, current = {}, None
    for line in text.splitlines():
        heading = re.match(r"\s*([23]\.\d+\.\d+)\.\s*\(", line)
        if heading:
            current = heading.group(1)
            parts[current] = set()
        elif current and (label := re.match(r"\s*(?:-\s*)?\(([a-h])\)", line)):
            parts[current].add(label.group(1))
    return {f"{n}({c})" for n, found in parts.items() if found for c in LETTERS[: LETTERS.index(max(found)) + 1]} | {
        n for n, found in parts.items() if not found
    }


def accounting_parts(text: str) -> set[str]:
    """The parts of the ZeRO-1 accounting commentary: "## Part (a): ..." -> "a"."""
    return set(re.findall(r"^#+\s*Part \(([a-h])\)", text, flags=re.M))


def seed(name: str) -> str:
    path = SEEDS / name
    if not path.is_file():
        pytest.skip(f"the reference writeups are not at {SEEDS} (set SEEDS_DIR)")
    return path.read_text(encoding="utf-8")


def test_the_parser_reads_headings_parts_and_unlabelled_bullets():
    text = "2.1.1. (script)\n- (a) x\n(b) y\n2.1.2. (table)\n- first\n- (c) z\n3.1.1. (`comm`)\ntext (a) inline\n"
    assert course_numbers(text) == {"2.1.1(a)", "2.1.1(b)", "2.1.2(a)", "2.1.2(b)", "2.1.2(c)", "3.1.1"}


def test_every_question_of_the_full_writeup_is_answered():
    numbers = course_numbers(seed(A.WRITEUP))
    assert len(numbers) > 40, sorted(numbers)  # the parser found the writeup's questions
    of_2024 = {q.number for q in A.QUESTIONS if 2024 in q.editions}
    assert numbers == of_2024, f"missing: {sorted(numbers - of_2024)}; not in the writeup: {sorted(of_2024 - numbers)}"


def test_the_three_accounting_questions_are_answered_and_cite_their_source():
    parts = accounting_parts(seed(A.ZERO1))
    assert parts == {"a", "b", "c"}
    for part in parts:
        q = A.BY_NUMBER[f"3.4.5({part})"]
        assert any(r.source == A.ZERO1 for r in q.references), q


def test_the_table_is_complete_and_points_at_real_notebooks():
    assert len(A.QUESTIONS) == len(A.BY_NUMBER)  # no number twice
    stems = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    for q in A.QUESTIONS:
        assert q.number in A.ANSWERS, q.number
        assert A.NOTEBOOKS[q.notebook] in stems, q
        assert q.ask and q.section and q.gpu and q.problem and set(q.editions) <= set(A.EDITIONS), q
        assert q.reads or 2024 not in q.editions, q  # every 2024 answer reads saved results
        sources = (A.WRITEUP, A.ZERO1) if q.editions == (2024,) else ()
        assert all(r.value and (r.source in sources or re.search(r", 20\d\d$", r.source)) for r in q.references), q


def test_an_answer_for_an_unknown_number_is_refused():
    with pytest.raises(ValueError, match="9.9.9"):
        A.answers("9.9.9")(lambda q, saved: "")


# ---- comparisons -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.9, 1.1, "no measurable difference"),
        (0.7, 0.9, "a is measurably faster than b"),
        (1.1, 1.3, "b is measurably faster than a"),
    ],
)
def test_a_winner_is_named_only_when_the_interval_excludes_one(low, high, expected):
    text = A.compare_text("a", "b", Ratio((low + high) / 2, low, high, pairs=10))
    assert expected in text
    if expected.startswith("no"):
        assert "faster" not in text


def test_too_few_pairs_name_no_winner():
    text = A.compare_text("a", "b", Ratio(0.5, 0.4, 0.6, pairs=3))
    assert "too few" in text and "faster" not in text


def test_pairwise_ratios_round_trip_through_the_saved_columns():
    rows = pairwise_ratios({"a": [2.0] * 8, "b": [1.0] * 8, "c": [1.0, 1.1] * 4}, size="s")
    assert {(r["a"], r["b"]) for r in rows} == {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")}
    ab = next(r for r in rows if (r["a"], r["b"]) == ("a", "b"))
    assert ab["size"] == "s" and ratio_of(ab) == Ratio(2.0, 2.0, 2.0, 8)


# ---- a synthetic data folder -----------------------------------------------------------------------------------------

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
        for s, base in zip(SIZES, (0.01, 0.03))
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
        for s, base in zip(SIZES, (8.0, 14.0))
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
    compiled = {SIZES[0]: comparison({"False|fwd": 1.0, "True|fwd": 0.7, "False|fwd+bwd": 2.0, "True|fwd+bwd": 1.5})}
    return {
        "rmsnorm_ratios": (XR.ratio_rows(shapes, ("dtype", "H")), {}),
        "rmsnorm_model_ratios": (
            XR.ratio_rows(norms, ("size",), loop="norms") + XR.ratio_rows(compiled, ("size",), loop="compile"),
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
        for m, k in zip(SIZES, (0.1, 0.2))
    }
    speed = [
        {"model": m, "variant": v, "step_s": s * k, "comm_s": c * k}
        for m, k in zip(SIZES, (0.1, 0.2))
        for v, (s, c) in variants.items()
    ]
    sweep = [
        {"model": SIZES[1], "variant": v, "bucket_MB": mb, "step_s": variants[v][0] * 0.2, "buckets": nb}
        for v, mb, nb in (("bucketed 1 MB", 1.0, 3), ("bucketed 25 MB", 25.0, 1))
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


def notebook_06_07_rows() -> dict:
    from helpers.experiments import fsdp as XF

    naive = [
        {
            "impl": "naive",
            "batch": 2,
            "heads": 1,
            "T": T,
            "d": d,
            "dtype": "float32",
            "causal": False,
            "oom": T > 512,
            "median_s": None if T > 512 else 1e-5 * T * k,
            "pass": p,
        }
        for d in (16, 64)
        for T in (128, 256, 512, 1024)
        for p, k in (("fwd", 1), ("bwd", 2), ("fwd+bwd", 3))
    ]
    mem = [
        {
            "batch": 2,
            "T": T,
            "d": d,
            "oom": False,
            "saved_bytes": 2 * T * T * 4 + 2 * T * d * 4,
            "formula_bytes": 2 * T * T * 4 + 2 * T * d * 4,
            "score_matrix_bytes": 2 * T * T * 4,
        }
        for d in (16, 64)
        for T in (128, 256)
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
        "06_naive_attention": (naive, {}),
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


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Every result the answers read, a few rows each, made with the notebooks' own row builders where they exist."""
    everything = {**notebook_01_rows(), **notebook_02_rows(), **notebook_03_05_rows(), **notebook_06_07_rows()}
    return write(tmp_path_factory.mktemp("local"), everything)


def all_answers(folder, profile="cpu") -> dict[str, tuple[str, bool]]:
    saved = A.Saved(folder, profile)
    return {q.number: (got.text, got.measured) for q in A.QUESTIONS for got in [A.answer(q, saved)]}


def test_every_answer_is_measured_from_the_synthetic_folder(synthetic):
    got = all_answers(synthetic)
    unmeasured = {n: text for n, (text, ok) in got.items() if not ok}
    assert not unmeasured, unmeasured
    assert "small/cpu 10 ms / 20 ms / 30 ms" in got["2.1.1(b)"][0]  # the rows' own numbers
    assert "3.0x the warm median" in got["2.1.1(c)"][0]


def test_each_answer_reads_only_the_results_its_question_lists(synthetic):
    for q in A.QUESTIONS:
        saved = A.Saved(synthetic, "cpu")
        assert A.answer(q, saved).measured, q.number
        assert set(saved.used) <= set(q.reads), (q.number, set(saved.used) - set(q.reads))


def test_inside_the_noise_no_winner_outside_it_the_faster(synthetic):
    text = all_answers(synthetic)["2.1.5(a)"][0]
    forward = text.split("Forward+backward")[0]
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops) for H 256" in forward  # outside the noise
    assert "no measurable difference between them for H 1024" in forward  # inside it
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops) for every" not in forward
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops)" in A.compare_text(
        "RMSNorm (PyTorch ops)", "LayerNorm", Ratio(2.5, 2.4, 2.6, 10)
    )
    autocast = all_answers(synthetic)["2.1.4(a)"][0]
    assert autocast.startswith("Forward+backward: fp32 is measurably faster than autocast bfloat16 for every size")


def test_sharding_speed_names_no_winner_without_a_paired_ratio(synthetic, tmp_path):
    got = all_answers(synthetic)
    assert "unsharded is measurably faster than ShardedOptimizer" in got["3.4.5(b)"][0]  # 0.95 s vs 0.9 s
    assert "1.500Ψ" in got["3.4.5(c)"][0]  # the counted table, when saved
    write(tmp_path, {"05_sharding_speed": (sharding_speed, dict(model=SIZES[1]))})
    got = A.answer(A.BY_NUMBER["3.4.5(b)"], A.Saved(tmp_path, "cpu"))
    text, ok = got.text, got.measured
    assert ok and "no faster or slower is claimed" in text and "measurably" not in text


def test_triton_is_said_to_be_gpu_only_when_it_was_not_timed(synthetic):
    got = all_answers(synthetic)
    assert "not timed" in got["2.2.1(a)"][0] and "interpreter" in got["2.2.1(a)"][0]


def test_a_triton_timing_when_there_is_one(tmp_path):
    shapes = {
        ("float32", 4096): comparison(
            {
                "layernorm|fwd": 1.0,
                "torch|fwd": 3.0,
                "triton|fwd": 0.9,
                "layernorm|fwd+bwd": 3.0,
                "torch|fwd+bwd": 9.0,
                "triton|fwd+bwd": 2.0,
            }
        )
    }
    write(tmp_path, {"rmsnorm_ratios": (XR.ratio_rows(shapes, ("dtype", "H")), {})}, profile="gpu")
    saved = A.Saved(tmp_path, "gpu")
    for number in ("2.2.1(a)", "2.2.4(a)"):
        got = A.answer(A.BY_NUMBER[number], saved)
        text, ok = got.text, got.measured
        assert ok and "Triton RMSNorm is measurably faster than RMSNorm (PyTorch ops) for H 4096" in text, text
        assert "not timed" not in text


def test_the_page_is_self_contained(synthetic, tmp_path):
    out = tmp_path / "writeups" / "answers.html"
    A.write_page(out, "cpu", synthetic)
    page = out.read_text(encoding="utf-8")
    assert "://" not in page and "<script" not in page.lower() and "<link" not in page.lower()
    assert "<style>" in page and 'href="01_benchmarking_and_profiling.html#1-%C2%B7-Timing' in page
    ids = re.findall(r'id="([^"]*)"', page)
    assert len(ids) == len(set(ids)) and not any(" " in i for i in ids), ids  # stable ids without spaces
    for q in A.QUESTIONS:
        assert page.count(f"<b>{q.number}</b>") == 1, q.number  # answered once, not repeated
        anchor = A.page.answer_id(q)
        assert anchor in ids
        maps = [re.search(rf'<table class="map" id="map{y}">.*?</table>', page, re.S).group(0) for y in q.editions]
        assert all(f'href="#{anchor}"' in m for m in maps), (q.number, q.editions)  # every edition's map links it
    counts = {k: int(n) for n, k in re.findall(r"<li><b>(\d+)</b> ([^:<]+):", page)}
    assert sum(counts.values()) == len(A.QUESTIONS) and "profile: <b>cpu</b>" in page, counts


def test_the_header_counts_four_statuses_honestly(synthetic):
    from helpers.course.answers.page import status_counts

    saved = A.Saved(synthetic, "cpu")
    got = {q.number: A.answer(q, saved) for q in A.QUESTIONS}
    counts = status_counts(got)
    assert set(counts) == set(A.STATUSES) and sum(counts.values()) == len(A.QUESTIONS)
    assert got["2.2.1(a)"].status == "needs a GPU"  # "the Triton kernel was not timed" is not an answer
    assert got["2.2.4(a)"].status == "partial" and got["2.2.4(a)"].missing
    assert got["nsys_profile"].status == "partial" and got["communication_accounting(c)"].status == "closed form"
    assert got["2.1.1(b)"].status == "measured" and counts["not run"] == 0


def test_the_edition_maps_use_each_handouts_ids_and_point_at_sections(synthetic):
    from helpers.course.answers import page as P

    html_ = P.render("cpu", synthetic)
    m2026 = re.search(r'<table class="map" id="map2026">.*?</table>', html_, re.S).group(0)
    # 2026 points back to the 2024-numbered problems it keeps, with the later letters
    assert '<code>benchmarking_mixed_precision (c)</code></td><td><a href="#a2024-2.1.4-a">' in m2026
    assert 'href="#a2024-3.4.3-a"' in m2026 and 'href="#a2024-3.4.4"' not in m2026  # bucketed DDP is gone
    assert "memory_profiling (f)" in m2026 and 'href="#a2025-flash_forward' in m2026
    assert "07_fsdp.html#7-%C2%B7-Calculators" in m2026
    for q in A.QUESTIONS:
        assert P.section_anchor(q), (q.number, q.section)  # a section, not the page top
        heads = {P.heading_id(h) for h in P.notebook_headings(q.notebook)}
        assert P.section_anchor(q) in heads


def test_section_anchors_match_the_exported_notebook():
    import nbformat

    from helpers.course.answers import page as P
    from helpers.writeup import OfflineHTMLExporter

    nb = nbformat.read(ROOT / "notebooks" / "07_fsdp.ipynb", 4)
    body, _ = OfflineHTMLExporter().from_notebook_node(nb)
    exported = set(re.findall(r'<h[1-6] id="([^"]+)"', body))
    for q in (q for q in A.QUESTIONS if q.notebook == "07"):
        assert P.section_anchor(q) in exported, (q.number, P.section_anchor(q))


def test_a_table_and_math_render_under_the_sentence(synthetic):
    from helpers.course.answers import page as P

    html_ = P.render("cpu", synthetic)
    entry = re.search(r'<div class="q [^"]*" id="a2026-tp_calcs-b">.*?</div>', html_, re.S).group(0)
    assert '<table class="ans-table">' in entry and '<span class="math">' in entry
    assert "N<sub>TP</sub> ≤ 1 + 1.5·D<sub>FF</sub>·W/C" in entry
    assert "$" not in entry


def test_an_empty_folder_gives_not_measured_everywhere(tmp_path):
    got = all_answers(tmp_path)
    computed = {q.number for q in A.QUESTIONS if not q.reads}  # closed forms and exact arithmetic: the same anywhere
    for number, (text, ok) in got.items():
        notebook = A.BY_NUMBER[number].notebook
        if number in computed:
            assert ok, (number, text)
        else:
            assert not ok and (
                text.startswith(f"Not measured in this run (run notebook {notebook}") or text.startswith("Needs a GPU")
            ), (number, text)
    A.write_page(tmp_path / "answers.html", "gpu", tmp_path)
    page = (tmp_path / "answers.html").read_text(encoding="utf-8")
    counts = {k: int(n) for n, k in re.findall(r"<li><b>(\d+)</b> ([^:<]+):", page)}
    assert counts["not run yet"] + counts["needs a GPU"] == len(A.QUESTIONS) - len(computed), counts


def test_results_of_the_other_profile_are_not_used(tmp_path):
    write(tmp_path, {"01_timing": notebook_01_rows()["01_timing"]}, profile="gpu")
    got = A.answer(A.BY_NUMBER["2.1.1(b)"], A.Saved(tmp_path, "cpu"))
    text, ok = got.text, got.measured
    assert not ok and "gpu-profile run" in text


def test_a_saved_result_in_an_old_format_does_not_break_the_page(tmp_path):
    write(
        tmp_path,
        {
            "01_timing": ([{"size": "small/8", "status": "ok"}], {}),
            "05_sharding_memory": ([{"model": "xl/8", "kind": "unsharded"}], dict(world_size=2)),
        },
    )
    got = all_answers(tmp_path)
    assert not got["2.1.1(b)"][1] and "lack what this answer reads" in got["2.1.1(b)"][0]
    assert not got["3.4.5(c)"][1]


def test_write_page_refuses_an_unknown_profile(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        A.write_page(tmp_path / "a.html", "tpu", tmp_path)


# ---- every edition -----------------------------------------------------------------------------------------------------


def edition_problems(text: str) -> dict[int, set[str]]:
    """The problems each later edition names in curricula.md: the bold names of its bullets ("**a / b**": two)."""
    found, year = {}, None
    for line in text.splitlines():
        heading = re.match(r"##\s*(20\d\d) edition", line)
        if heading:
            year = int(heading.group(1))
            found[year] = set()
        elif line.startswith("## "):  # another section (the details, the contract): no edition's list
            year = None
        elif year and (bold := re.match(r"\s*-\s*\*\*([^*]+)\*\*", line)):
            found[year] |= {name.strip() for name in bold.group(1).split("/")}
    return found


def test_the_curricula_parser_reads_editions_and_split_names():
    text = (
        "## 2025 edition (adds)\n- **a_b**: x\n- plain\n## 2026 edition\n- **c / d_e**: y\n- **a_b**: z\n"
        "## Details\n- **2026 Table 1**: not a problem\n"
    )
    assert edition_problems(text) == {2025: {"a_b"}, 2026: {"c", "d_e", "a_b"}}


def test_every_problem_of_the_2025_and_2026_editions_is_answered():
    if not CURRICULA.is_file():
        pytest.skip(f"the curricula are not at {CURRICULA} (set CURRICULA)")
    wanted = edition_problems(CURRICULA.read_text(encoding="utf-8"))
    assert set(wanted) == {2025, 2026} and all(len(v) > 5 for v in wanted.values()), wanted
    for year, names in wanted.items():
        have = {q.problem for q in A.QUESTIONS if year in q.editions}
        assert names <= have, f"{year}: missing {sorted(names - have)}"
    shared = {q.problem for q in A.QUESTIONS if set(q.editions) == {2025, 2026}}
    assert {"pytorch_attention", "flash_forward", "flash_backward", "flash_benchmarking"} <= shared


def test_a_problem_both_editions_share_is_one_question():
    seen = {}
    for q in A.QUESTIONS:
        for year in q.editions:
            assert (year, q.number) not in seen, q.number
            seen[year, q.number] = q
    assert len({q.number for q in A.QUESTIONS}) == len(A.QUESTIONS)


@pytest.mark.parametrize(
    "medians, says, never",
    [
        ({"fp32": 1.0, "autocast bfloat16": 0.6}, "measurably faster at each of the 2 sizes timed here", "slower"),
        ({"fp32": 1.0, "autocast bfloat16": 1.3}, "Does not carry over", "faster at"),
    ],
)
def test_the_autocast_gpu_line_follows_what_was_measured(tmp_path, medians, says, never):
    precision = {s: Comparison({k: samples(m) for k, m in medians.items()}, "fp32", "cpu") for s in SIZES}
    write(tmp_path, {"01_precision_ratios": (benchmarking.precision_ratios(precision), {})})
    got = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(tmp_path, "cpu"))
    assert got.measured and says in got.gpu and never not in got.gpu, got.gpu


def test_the_leaderboards_give_the_share_of_the_published_mark(synthetic, tmp_path):
    got = all_answers(synthetic)
    assert "67% of the best class entry's speed (5.36 ms)" in got["2025 leaderboard"][0]  # 5.36 / 8.0
    assert "sdpa is measurably faster" not in got["2025 leaderboard"][0]
    text, ok = all_answers(tmp_path)["2025 leaderboard"]  # nothing saved: the command that can, and the arithmetic
    assert not ok and "python -m helpers bench attention" in text and "TFLOP per forward+backward" in text
    board = got["2026 leaderboard"][0]
    assert "implies MFU 27%-35%" in board and "self-reported" in board and "10% of the card free" in board
    assert "B200 ~180 GB: FSDP, every block checkpointing, chunked LM head" in board  # the tie goes to less memory


def test_a_saved_reference_run_is_named_beside_the_answer(tmp_path, monkeypatch):
    from helpers import results
    from helpers.course.answers import page
    from helpers.course.answers.core import QUESTIONS

    q = next(q for q in QUESTIONS if q.reads)
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    assert page._reference_runs(q) == ""
    results.save_results(
        [{"x": 1}], q.reads[0], profile="gpu", kind="reference", directory=tmp_path / "reference" / "h100"
    )
    assert "reference runs beside this one" in page._reference_runs(q) and "profile gpu" in page._reference_runs(q)


# ---- issue 32: the closed-form answers carry the derived figures, and directions follow the values -------------------


def test_the_2025_and_2026_closed_forms_on_the_page(synthetic):
    got = all_answers(synthetic)
    c = got["communication_accounting(c)"][0]
    assert "1,278 tokens per FSDP shard" in c and "319 tokens per device" in c and "20,444" in c and "10,222" in c
    assert "17.5 MB per token" in got["communication_accounting(a)"][0]
    assert "10,828 tokens per device" in got["communication_accounting(b)"][0]
    assert "communication_accounting(d)" in A.BY_NUMBER  # tricks are their own part
    assert "k* = √(L·I/A) = 0.86" in got["gradient_checkpointing(b)"][0]
    a = got["gradient_checkpointing(a)"][0]
    assert "O(1)" in a and "O(N²)" in a and "recursive prefix" in a
    f = got["fsdp_accounting(a)"][0]
    assert "27.3 GB against DDP" in f and "13.6 GB against ZeRO-1" in f
    assert "N_TP ≤ 1 + 1.5·D_FF·W/C" in got["tp_calcs(b)"][0] and "12.2 against 23.4" in got["tp_calcs(b)"][0]
    assert "N_DP ≤ 1 + B·W/C" in got["data_parallel_calcs"][0]
    assert "1.5·B·D_FF·W²/C²" in got["fsdp_tp_calcs(c)"][0] and "3·B·D_FF·W²/(8·C²)" in got["fsdp_tp_calcs(d)"][0]


@pytest.mark.parametrize(
    "peak_fall, states_fall, says",
    [(8.7, 8.16, "by more than"), (7.0, 8.16, "by less than"), (8.16, 8.16, "by the states saved")],
)
def test_the_peak_fall_direction_follows_the_values(peak_fall, states_fall, says):
    from helpers.course.answers.nb07 import fall_text

    assert says in fall_text(peak_fall, states_fall)


def test_fsdp_accounting_direction_on_planted_rows(tmp_path):
    zero = [
        {"kind": k, "stage": s, "rank": 0, "measured_MiB": v, "zero_MiB": v, "measured/zero": 1.0}
        for k, s, v in (("ddp", 0, 16.0), ("fsdp", 3, 7.84))
    ]
    for fsdp_peak, says in ((23.3, "by more than the states saved"), (25.0, "by less than the states saved")):
        mem = [
            {"kind": k, "rank": 0, "point": "after step 1", "live_MiB": v, "peak_MiB": p}
            for k, v, p in (("ddp", 16.0, 32.0), ("fsdp", 7.84, fsdp_peak))
        ]
        write(tmp_path, {"07_zero_check": (zero, {}), "07_memory": (mem, {})})
        got = A.answer(A.BY_NUMBER["fsdp_accounting(a)"], A.Saved(tmp_path, "cpu"))
        assert got.measured and says in got.text, got.text


def test_every_is_said_only_when_every_size_ran(tmp_path):
    from helpers.model import CPU_SIZES

    for sizes, says, never in (
        (SIZES, "at each of the 2 sizes timed here", "at every size here"),
        (CPU_SIZES, "at every size here", "sizes timed here"),
    ):
        precision = {
            s: Comparison({"fp32": samples(1.0), "autocast bfloat16": samples(0.6)}, "fp32", "cpu") for s in sizes
        }
        write(tmp_path, {"01_precision_ratios": (benchmarking.precision_ratios(precision), {})})
        got = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(tmp_path, "cpu"))
        assert says in got.gpu and never not in got.gpu + got.text, got.gpu
        assert ("the time budget ran 2 of the 5 sizes" in got.text) == (len(sizes) == 2)


@pytest.mark.parametrize(
    "first, says, never",
    [
        ((1.0, 1.0, 1.0, 1.0, 1.0, 6.3), "1 of 6 first calls are not", "no measurable first-call cost"),
        ((1.0, 1.0, 1.0, 1.0, 1.0, 1.01), "no measurable first-call cost", "are not ("),
    ],
)
def test_the_first_call_sentence_follows_the_largest_value(tmp_path, first, says, never):
    timing = [
        {
            "size": s,
            "pass": p,
            "warm-up": w,
            "mean_s": 0.01,
            "std_s": 0.0002,
            "median_s": 0.01,
            "first_s": 0.01 * (f if w == 0 else 1),
            "steps": 6,
            "status": "ok",
        }
        for (s, p), f in zip([(s, p) for s in SIZES for p in ("forward", "backward", "both")], first)
        for w in (0, 2)
    ]
    write(tmp_path, {"01_timing": (timing, dict(batch=4, context=32))})
    got = A.answer(A.BY_NUMBER["2.1.1(c)"], A.Saved(tmp_path, "cpu"))
    assert got.measured and says in got.text and never not in got.text, got.text


@pytest.mark.parametrize(
    "medium, says",
    [
        (0.6, "Partly: overlapping was measurably faster here for medium/cpu"),
        (1.0, "Does not carry over"),
    ],
)
def test_the_overlap_gpu_line_follows_each_models_ratio(tmp_path, medium, says):
    raw = {
        m: [
            {"naive": speed_run(1.0, 0.1), "flat": speed_run(1.0, 0.1), "per_parameter": speed_run(k, 0.1)}
            for _ in range(2)
        ]
        for m, k in zip(SIZES, (1.0, medium))
    }
    write(tmp_path, {"04_ddp_ratios": (ddp.ratio_rows(raw), {})})
    got = A.answer(A.BY_NUMBER["3.4.3(a)"], A.Saved(tmp_path, "cpu"))
    assert got.measured and says in got.gpu, got.gpu


def test_nsys_compares_softmax_with_the_attention_matmuls_within_the_forward(tmp_path):
    rows = notebook_01_rows()
    profile = [
        {
            "op": op,
            "ms/step": 6.0 * share,
            "share": share,
            "calls/step": 2,
            "class": kind,
            "run": run,
            "matmul_share": 0.7,
        }
        for run in ("forward", "forward+backward", "full step")
        for op, share, kind in (
            ("aten::mm", 0.6, "matmul"),
            ("aten::bmm", 0.1, "matmul"),
            ("aten::_softmax", 0.05, "other"),
            ("aten::add", 0.25, "other"),
        )
    ]
    write(tmp_path, {**rows, "01_profile": (profile, dict(size="medium/cpu", steps=2))})
    text = A.answer(A.BY_NUMBER["nsys_profile"], A.Saved(tmp_path, "cpu")).text
    head_dim = A.BY_NUMBER and __import__("helpers.model", fromlist=["get_config"]).get_config("medium/cpu").head_dim
    assert f"{5 / (4 * head_dim):.1%} of the FLOPs of the QKᵀ and PV matmuls" in text and "0.50x their time" in text


def test_the_attention_growth_is_the_ratio_of_the_times_shown(synthetic):
    got = A.answer(A.BY_NUMBER["pytorch_attention(a)"], A.Saved(synthetic, "cpu"))
    # synthetic: fwd+bwd = 3e-5·T s for T <= 512: T 128 -> 512 is 4x
    assert "4x for 4x the length" in got.text and len(got.table) == 6, got.text


def test_the_alternate_ring_shows_both_rings_and_the_fits_error(tmp_path):
    ring = [
        {"N": n, "S_bytes": s, "method": m, "exact": True, "median_us": t, "model_us": 1600.0}
        for n in (2, 4)
        for s in (1024, 65536)
        for m, t in (("ring", 600.0 * n), ("alternate ring", 660.0 * n))
    ]
    write(tmp_path, {"07_ring": (ring, dict(alpha_s=1495e-6, W_Bps=2e9))})
    got = A.answer(A.BY_NUMBER["alternate_ring_all_reduce"], A.Saved(tmp_path, "cpu"))
    assert "α alone exceeds every measured N = 2 time" in got.text and "1.10x to 1.10x" in got.text
    assert len(got.table) == 4 and "ring: measured / model" in got.table[0]


def test_intervals_sit_in_a_table_under_the_sentence(synthetic):
    got = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(synthetic, "cpu"))
    assert "(ratios in the table below)" in got.text and "[95% interval]" not in got.text
    assert [r["size"] for r in got.intervals] == SIZES and all(
        "x [" in r["median of paired ratios [95% interval]"] for r in got.intervals
    )
    rows = A.Saved(synthetic, "cpu").frame("01_precision_ratios")
    assert "[95% interval]" in A.series_text(rows[rows["b"] == "fp32"], "autocast bfloat16", "fp32", "size")  # inline


def test_the_autocast_answer_quotes_the_calibration_and_a_capped_isa(tmp_path, monkeypatch):
    precision = {
        s: Comparison({"fp32": samples(1.0), "autocast bfloat16": samples(20.0)}, "fp32", "cpu") for s in SIZES
    }
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    write(tmp_path, {"01_precision_ratios": (benchmarking.precision_ratios(precision), dict(bf16_slowdown=43.0))})
    got = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(tmp_path, "cpu"))
    assert "a bf16 matmul takes 43.0x an fp32 one" in got.text and "ONEDNN_MAX_CPU_ISA=AVX2" in got.text, got.text


@pytest.mark.parametrize(
    "ratio, says", [(1.31, "consistent with the 1.33x"), (3.1, "above the 1.33x"), (1.1, "below the 1.33x")]
)
def test_the_checkpointing_price_is_compared_with_the_flops_from_the_same_interval(tmp_path, ratio, says):
    sweep = [
        {"segment": k, "peak_MiB": pk, "median_ms": 100.0 * r, "time / none": r, "low": r - 0.05, "high": r + 0.05}
        for k, pk, r in ((0, 40.0, 1.0), (1, 12.0, ratio), (2, 14.0, ratio))
    ]
    write(
        tmp_path,
        {
            "07_checkpoint": (
                sweep,
                dict(model="small/cpu", n_blocks=12, batch=4, context=64, k_continuous=0.8, k_best=1, steps=6),
            )
        },
    )
    got = A.answer(A.BY_NUMBER["gradient_checkpointing(b)"], A.Saved(tmp_path, "cpu"))
    assert says in got.text and ("measurably slower" in got.text) == (ratio - 0.05 > 1), got.text


def test_the_nsys_answer_says_no_gpu_only_where_there_was_none(synthetic, tmp_path):
    """Issue 31: on the gpu profile the page said "no GPU here"; the profile's provenance says where it ran."""
    nsys = next(q for q in A.QUESTIONS if q.name == "nsys_profile")
    assert "no GPU here" in A.answer(nsys, A.Saved(synthetic, "cpu")).text
    rows = {name: notebook_01_rows()[name] for name in nsys.reads}
    for name in ("01_flame", "01_profile"):
        rows[name] = (rows[name][0], {**rows[name][1], "device_type": "cuda"})
    text = A.answer(nsys, A.Saved(write(tmp_path, rows, profile="gpu"), "gpu")).text
    assert "no GPU here" not in text and "CUDA kernels" in text, text
