"""Notebook 06's section calls on CPU at a tiny scale: each runs, checks, saves the rows the answers page reads (names,
columns, provenance) and returns a Result whose notes carry the same numbers as its values; a wrong implementation
or a wrong ratio is caught."""

import functools
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

import helpers  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before triton is imported)
from helpers import attention as A
from helpers import env, results
from helpers.experiments import attention as X
from helpers.experiments import attention_bench_sections, attention_sections
from helpers.section import Result
from helpers.timing import Comparison
from helpers.writeup.index import EMBEDDED_PNG, LEFT_OUT_LINES

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_flash_attention.ipynb"

SCALE = dict(  # a PROFILES entry at the smallest sizes that still exercise every branch
    batch=1,
    head_dims=[16],
    seq_lens=[32, 64],
    naive_max_flops=None,
    warmup=1,
    steps=2,
    compile_shape=(1, 1, 32, 16),
    bench_shapes=[(1, 1, 32, 16)],
    bench_dtypes=[torch.float32],
    bench_impls=["naive", "sdpa", "flash_pytorch"],
    flash_pytorch_max_T=32,
    memory_seq_lens=[32, 64, 128],
    memory_shape=(1, 1, 16),
    model_sizes=[X.TINY],
    model_impls=["naive", "sdpa"],
    model_batch=2,
    model_dtype=None,
    model_steps=2,
    kernel_shape=(1, 1, 20, 16),
)
DEVICE = env.device_type()  # the machine's: Triton compiled on a GPU refuses host tensors (interpreted here)
CTX = X.Setup("cpu", DEVICE, "test machine", SCALE)
TRITON_TIMED = {"flash_triton"} if CTX.triton_timed else set()  # on a GPU the cpu profile times Triton too


@pytest.fixture
def saved(tmp_path, monkeypatch):
    """The section calls save under tmp_path (never the repository's data folders); returns that folder."""
    for mod in (attention_sections, attention_bench_sections):
        monkeypatch.setattr(mod, "save_results", functools.partial(results.save_results, directory=tmp_path))
    return tmp_path


def test_setup_resolves_the_profile_and_names_the_device():
    ctx = X.setup("cpu")
    assert ctx.device == DEVICE and ctx.scale is X.PROFILES["cpu"]  # the profile picks the sizes, not the device
    assert ctx.where.startswith(ctx.device_name) and "profile cpu" in ctx.where


def test_naive_sections_save_their_rows_and_state_the_growth_they_measured(saved):
    times = X.naive_times(CTX)
    run = results.load_results(times.saved)
    assert times.saved.name == "06_naive_attention.jsonl" and run.provenance["profile"] == "cpu"
    assert len(run.rows) == 2 * len(X.PASSES) and times.values["oom"].empty
    assert list(times.table.columns) == list(X.PASSES)

    memory = X.naive_memory(CTX, times)
    assert memory.saved.name == "06_naive_memory.jsonl" and memory.values["mismatched"] == 0
    [(t_x, bytes_x)] = memory.values["growth"]
    assert t_x == 2 and 2 < bytes_x < 4  # P + O: T^2 + T d per row grows between 2x and 4x when T doubles
    assert any(f"saved memory grows {bytes_x:.1f}x" in n for n in memory.notes), memory.notes
    assert any(n.startswith("nothing ran out of memory") for n in memory.notes)


def test_the_flop_cap_leaves_shapes_out_says_which_and_saves_the_grid(saved):
    """Issue 41: the cpu profile times the handout's grid only where a forward+backward is at most naive_max_flops
    (1·32²·16·14 = 229,376 FLOPs at T 32; 917,504 at T 64): the notes, the saved provenance and the memory table say
    which shapes did not run."""
    ctx = X.Setup("cpu", DEVICE, "test machine", {**SCALE, "naive_max_flops": 5e5})
    times = X.naive_times(ctx)
    assert times.values["left_out"] == [(1, 1, 64, 16)] and set(times.values["rows"]["T"]) == {32}
    assert "not timed here: 1 of the grid's 2 shapes, over the profile's 0.0005 GFLOP" in times.notes[1]
    run = results.load_results(times.saved)
    assert run.provenance["grid"] == {"head_dims": [16], "seq_lens": [32, 64], "max_flops": 5e5}
    assert run.provenance["steps"] == SCALE["steps"]
    memory = X.naive_memory(ctx, times)
    assert memory.table.loc[64, 16] == "not run" and memory.table.loc[32, 16] > 0


def test_naive_memory_names_the_first_shape_that_ran_out(saved):
    times = X.naive_times(CTX)
    rows = times.values["rows"]
    oom = rows[rows["T"] == 64].assign(oom=True)  # as a device that ran out at T = 64 would record it
    memory = X.naive_memory(CTX, Result(values={"rows": rows, "oom": oom}))
    assert any(n.startswith("first OOM: T=64, d=16") for n in memory.notes), memory.notes


@pytest.mark.parametrize(("compiled_s", "says"), [(0.5, "compiled takes 0.50x naive's time"), (1.0, "no measurable")])
def test_compile_ratios_notes_and_saved_rows_come_from_one_comparison(saved, monkeypatch, compiled_s, says):
    fake = Comparison({"naive": [1.0] * 8, "compiled": [compiled_s] * 8}, "naive", "cpu")
    monkeypatch.setattr(attention_sections, "compare_impls", lambda *a, **k: fake)
    r = X.compile_ratios(CTX)
    assert [n.split(":")[0] for n in r.notes[:2]] == ["fwd, (1, 1, 32, 16) fp32", "fwd+bwd, (1, 1, 32, 16) fp32"]
    assert all(says in n for n in r.notes[:2]), r.notes
    run = results.load_results(r.saved)
    assert run.provenance["shape"] == [1, 1, 32, 16]
    rows = pd.DataFrame(run.rows)
    compiled = rows[rows["label"] == "compiled"]
    assert list(compiled["pass"]) == ["fwd", "fwd+bwd"] and (compiled["ratio"] == compiled_s).all()
    assert (rows["pairs"] == SCALE["steps"]).all()


def test_check_sections_pass_and_a_wrong_attention_fails():
    assert X.online_softmax_check().values["largest_error"] < 1e-10
    assert X.backward_check((1, 2, 21, 8)).values["largest_error"] < 1e-10
    ok = X.function_checks(A.FlashAttentionPyTorch.apply, "ours", (1, 2, 20, 8), (torch.float64,))
    assert list(ok.table.index) == [("float64", False), ("float64", True)] and ok.values["largest_error"] < 1e-10
    with pytest.raises(AssertionError):  # causal where it should not be, and the reverse
        X.function_checks(
            lambda q, k, v, c: A.naive_attention(q, k, v, not c), "wrong", (1, 2, 20, 8), (torch.float64,)
        )


def test_kernel_checks_and_the_summary_the_answers_page_reads(saved):
    pytest.importorskip("triton")
    r = X.kernel_checks(CTX, "dq")
    assert len(r.table) == 4 and r.values["largest_error"] < 2e-2 and "attn_bwd_dq_kernel" in r.notes[0]
    summary = X.checks_summary(CTX)
    run = results.load_results(summary.saved)
    assert summary.saved.name == "06_checks.jsonl" and run.provenance["triton_mode"]
    checks = [row["check"] for row in run.rows]
    for start in ("online softmax", "backward from L", "FlashAttentionPyTorch", "Triton forward", "Triton backward"):
        assert any(c.startswith(start) for c in checks), start  # what helpers.course.answers.nb06 looks for


def test_benchmark_and_tflops_from_the_same_rows(saved):
    bench = X.benchmark(CTX)
    rows = bench.values["rows"]
    assert bench.saved.name == "attention_bench.jsonl"
    assert set(rows["impl"]) == {"naive", "sdpa", "flash_pytorch", *TRITON_TIMED}
    assert (rows["ms"] == rows["median_s"] * 1e3).all()
    assert ("Triton is not timed here" in bench.notes[0]) != CTX.triton_timed
    left_out = any(line.startswith(LEFT_OUT_LINES) for line in repr(bench).splitlines())  # the front page's note
    assert left_out != CTX.triton_timed
    t = X.tflops(CTX, bench)
    fb = rows[rows["pass"] == "fwd+bwd"].set_index("impl")["median_s"]
    assert f"sdpa {fb['naive'] / fb['sdpa']:.2g}x" in t.notes[1], t.notes
    assert (rows["TFLOPs"] > 0).all() and len(t.table) == 3  # the table rounds: a loaded CPU shows 0.0


def test_benchmark_asserts_the_order_on_device_time_and_notes_it_on_host_time(saved, monkeypatch):
    rows = X.bench_attention("naive", (1, 1, 16, 16), warmup=0, steps=1)
    slow = [dict(r, min_s=5.0 if r["pass"] == "fwd" else 1.0) for r in rows]  # a forward 5x its forward+backward
    monkeypatch.setattr(attention_bench_sections, "sweep", lambda *a, **k: slow)
    notes = X.benchmark(CTX).notes
    assert any(n.startswith("naive float32 T=16: the fastest forward took 5.0x") for n in notes), notes
    with pytest.raises(AssertionError, match="forward slower"):
        X.benchmark(X.Setup("gpu", "cuda", "NVIDIA H100 80GB HBM3", SCALE))
    kept = results.load_results(saved / "attention_bench.jsonl")  # saved before the bound tripped (issue 47)
    assert kept.provenance["profile"] == "gpu" and len(kept.rows) == len(slow)


def test_naive_sections_save_before_a_tripped_bound(saved, monkeypatch):
    """One tripped bound on a GPU must not lose the run: the rows are saved first, then asserted."""
    times = X.naive_times(CTX)
    real = attention_sections.saved_memory
    monkeypatch.setattr(attention_sections, "saved_memory", lambda *a, **k: {**real(*a, **k), "formula_bytes": -1})
    with pytest.raises(AssertionError):  # every row off its closed form
        X.naive_memory(CTX, times)
    assert len(results.load_results(saved / "06_naive_memory.jsonl").rows) == len(X.naive_shapes(SCALE)[0])
    rows = X.bench_attention("naive", (1, 1, 16, 16), warmup=0, steps=1)
    slow = [dict(r, min_s=5.0 if r["pass"] == "fwd" else 1.0) for r in rows]  # a forward 5x its forward+backward
    monkeypatch.setattr(attention_sections, "sweep", lambda *a, **k: slow)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (0, 80 * 2**30))  # the gpu branch's provenance
    with pytest.raises(AssertionError, match="forward slower"):
        X.naive_times(X.Setup("gpu", "cuda", "NVIDIA H100 80GB HBM3", SCALE))
    assert len(results.load_results(saved / "06_naive_attention.jsonl").rows) == len(slow)


def test_yours_against_ours_interleaves_one_loop():
    r = X.yours_against_ours(CTX, {"yours:pytorch": A.FlashAttentionPyTorch.apply})
    assert list(r.table.index) == ["flash_pytorch", "yours:pytorch", "sdpa"] and set(r.values["ratios"]) == {
        "yours:pytorch",
        "sdpa",
    }
    assert len(r.notes) == 3


def test_memory_curves_are_t_squared_and_t_and_the_plot_reaches_the_front_page():
    r = X.memory_curves(CTX)
    growth, T_x = r.values["growth"], r.values["T_ratio"]
    assert r.values["mismatched"] == 0 and T_x == 4 and growth["flash_pytorch"] == 4 and growth["naive"] > 4
    assert r.notes[0] == f"T x4: naive keeps {growth['naive']:.1f}x more, FlashAttention 4.0x more"
    embedded = EMBEDDED_PNG.search(r._repr_html_())  # the front page reads the headline cell's embedded figure
    assert embedded and len(embedded.group(1)) > 100


def test_model_and_leaderboard_sections_on_a_cpu(saved):
    assert "sdpa, flash_pytorch" in X.model_outputs(CTX, ("naive", "sdpa", "flash_pytorch")).notes[0]
    card = "xl's 4 models side by side needs about 60 GB; this card has 40: not stepped here"  # as fit_card says it
    steps = X.model_steps(X.Setup("cpu", DEVICE, "test machine", {**SCALE, "left_out": [card]}))
    assert list(steps.values["ratios"]) == [(X.TINY, "sdpa")] and steps.notes[2:] == [card] and len(steps.notes) == 3
    board = X.leaderboard(CTX)
    assert board.values["rows"] == [] and board.saved is None and "not timed" in board.notes[-1]
    assert any(line.startswith(LEFT_OUT_LINES) for line in repr(board).splitlines())
    assert f"{X.PUBLISHED_MS['best class entry']:g} ms" in board.notes[0]
    marks = X.leaderboard_marks(CTX, board, X.benchmark(CTX))
    assert marks.figure is not None and set(marks.table.index) == {"naive", "sdpa", "flash_pytorch", *TRITON_TIMED}


def test_notebook_06_cells_are_short_and_show_the_code_they_measure():
    """Issue 40: one idea per code cell (the parameters and set-up cells aside), and every implementation the
    notebook measures shown by source() from the package, never pasted into markdown or read by inspect."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    lines = [sum(1 for x in src.splitlines() if x.strip() and not x.strip().startswith("#")) for src in code]
    assert max(lines[2:]) <= 12, [src for src, n in zip(code[2:], lines[2:], strict=True) if n > 12]
    shown = "\n".join(line for src in code for line in src.splitlines() if line.startswith("source("))
    for impl in ("naive_attention", "online_softmax", "backward_from_lse", "FlashAttentionPyTorch", "_launch_config"):
        assert impl in shown, impl
    for impl in ("flash_forward_torch", "flash_backward_torch", "_fwd_tile", "attn_fwd_kernel", "FlashAttentionTriton"):
        assert impl in shown, impl
    assert "attn_bwd_dkdv_kernel" in shown and "attn_bwd_dq_kernel" in shown
    text = "".join("".join(c["source"]) for c in cells)
    assert "inspect.getsource" not in text and "```python" not in text


def test_the_leaderboard_on_a_gpu_profile_saves_its_paired_rows(saved, monkeypatch):
    """The gpu branch, at a tiny shape (Triton in its interpreter here): rows saved as 06_leaderboard with the pairs,
    verdicts against flash_triton, and the marks compared on an H100."""
    tiny = functools.partial(X.leaderboard_comparison, warmup=0, shape=(1, 1, 32, 16), dtype=torch.float32)
    monkeypatch.setattr(attention_bench_sections, "leaderboard_comparison", tiny)
    ctx = X.Setup("gpu", DEVICE, "NVIDIA H100 80GB HBM3", {**SCALE, "model_steps": 3})
    board = X.leaderboard(ctx)
    run = results.load_results(board.saved)
    assert board.saved.name == "06_leaderboard.jsonl" and [r["impl"] for r in run.rows] == list(board.table.index)
    assert all(r["pairs"] == 3 and r["TFLOPs"] > 0 for r in run.rows)
    assert sum("flash_triton" in n for n in board.notes) == 2, board.notes
    marks = X.leaderboard_marks(ctx, board, Result())
    assert list(marks.table.index) == sorted(r["impl"] for r in run.rows) and marks.table.shape[1] == 3
