"""python -m helpers reference: one real batch of the tiny cpu plan end to end and resumed; failure, timeout and
budget skipping on a plan of small child processes; the cost model's estimates; the reference-row loader."""

import dataclasses
import json
import math
import subprocess
import sys
import time

import pandas as pd
import pytest

from helpers import results
from helpers.__main__ import main as cli
from helpers.course import reference as R

QUIET = dict(echo=lambda *a, **k: None)
RATES = R.Rates(
    flops_s=1e10,
    bytes_s=1e10,
    gloo_Bps=1e9,
    nccl_Bps=1e9,
    startup_s=1,
    launch_s=1,
    compile_s=1,
    jit_s=0,
    interpreted_call_s=0.1,
    ptxas_s=0.1,
    gpus=0,
)


def child(code: str) -> tuple:
    """A batch command: python running `code` with the run's folder as sys.argv[1]."""
    return (sys.executable, "-c", code)


WRITE = "import sys, pathlib; pathlib.Path(sys.argv[1], '{0}.jsonl').write_text('{{}}\\n'); print('saved: {0}')"


def test_kernels_batch_end_to_end_then_resumed(tmp_path):
    table = R.run_reference(budget_s=300, only=["kernels"], out=tmp_path, profile="cpu", **QUIET)
    folder = table.attrs["folder"]
    assert folder.parent == tmp_path and table["status"].tolist() == ["ok"], table
    manifest = json.loads((folder / "manifest.json").read_text())
    for key in ("commit", "torch", "triton", "driver", "device", "profile", "batches"):
        assert key in manifest, key
    entry = manifest["batches"]["kernels"]
    assert entry["status"] == "ok" and entry["wall_s"] > 0 and entry["commit"] == manifest["commit"]
    assert entry["results"] == ["kernels_rmsnorm", "kernels_attention"]
    files = sorted(p.name for p in folder.glob("*.jsonl"))
    assert files == ["kernels_attention.jsonl", "kernels_rmsnorm.jsonl"]
    assert all((folder / f).stat().st_size < 64 * 1024 for f in files)  # results, not traces
    heads = R.headlines(folder)
    assert heads["figure"].str.contains("RMSNorm Triton fwd,").sum() == 1
    assert heads["figure"].str.contains("RMSNorm Triton fwd\\+bwd").sum() == 1
    assert heads["figure"].str.startswith("attention ").sum() == 3 and heads["ours"].notna().all()
    assert heads["published"].isna().all()  # a tiny cpu shape is not the leaderboard's: nothing to set beside it
    mtime = (folder / "kernels_rmsnorm.jsonl").stat().st_mtime_ns

    again = R.run_reference(budget_s=300, only=["kernels"], out=tmp_path, profile="cpu", **QUIET)
    assert again["status"].tolist() == ["saved earlier"]
    assert (folder / "kernels_rmsnorm.jsonl").stat().st_mtime_ns == mtime  # not rerun
    assert json.loads((folder / "manifest.json").read_text())["batches"]["kernels"] == entry


def test_failure_timeout_and_budget_each_recorded_and_the_rest_still_runs(tmp_path):
    plan = (
        R.Batch("a", "writes a", command=child(WRITE.format("a")), estimate_s=1),
        R.Batch("boom", "fails", command=child("raise SystemExit('boom: this batch failed')"), estimate_s=1),
        R.Batch("slow", "hangs", command=child("import time; time.sleep(60)"), estimate_s=1),
        R.Batch("huge", "does not fit", command=child(WRITE.format("huge")), estimate_s=1e6),
        R.Batch("b", "writes b", command=child(WRITE.format("b")), estimate_s=1),
    )
    start = time.perf_counter()
    table = R.run_reference(
        budget_s=120, out=tmp_path, profile="cpu", plan=plan, rates=RATES, max_batch_s=1.5, **QUIET
    ).set_index("batch")
    assert time.perf_counter() - start < 30  # the hung batch was killed at its limit
    assert table.loc["a", "status"] == "ok" and table.loc["b", "status"] == "ok"
    assert table.loc["boom", "status"] == "failed" and table.loc["slow", "status"] == "timeout"
    assert table.loc["huge", "status"].startswith("skipped: needs ~1000000 s")
    folder = table.attrs["folder"]
    batches = R.read_manifest(folder)["batches"]
    assert "boom: this batch failed" in batches["boom"]["log_tail"] and batches["boom"]["returncode"] == 1
    assert batches["slow"]["status"] == "timeout" and batches["huge"]["status"] == "skipped"
    assert batches["a"]["results"] == ["a"] and not (folder / "huge.jsonl").exists()

    again = R.run_reference(budget_s=120, out=tmp_path, profile="cpu", plan=plan[:2], rates=RATES, **QUIET)
    assert again["status"].tolist() == ["saved earlier", "failed"]  # only the failed one is run again

    tight = R.run_reference(budget_s=0.5, out=tmp_path, profile="cpu", plan=plan[1:2], rates=RATES, **QUIET)
    assert tight["status"].iloc[0].startswith("skipped")  # 1 s estimated, 0.5 s of budget


def test_estimates_from_the_cost_model_and_from_an_earlier_run():
    h100 = R.gpu_rates("NVIDIA H100 80GB HBM3", gpus=1)
    for batch in R.PLAN:
        gpu, cpu = R.model_estimate_s(batch.name, "gpu", h100), R.model_estimate_s(batch.name, "cpu", RATES)
        assert math.isfinite(gpu) and 0 < gpu <= R.MAX_BATCH_S, (batch.name, gpu)  # every batch fits its limit
        assert cpu > 0
    slower = dataclasses.replace(h100, flops_s=h100.flops_s / 2)
    assert R.model_estimate_s("01", "gpu", slower) > R.model_estimate_s("01", "gpu", h100)  # FLOPs-bound work
    earlier = {"profile": "cpu", "batches": {"01": {"status": "ok", "wall_s": 20.0, "commit": "abc"}}}
    assert R.estimate_s("01", "cpu", RATES, earlier) == (pytest.approx(22.0), "earlier run (abc)")
    failed = {"profile": "cpu", "batches": {"01": {"status": "failed", "wall_s": 3.0}}}
    assert R.estimate_s("01", "cpu", RATES, failed)[1] == "cost model"


def test_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown batch"):
        R.run_reference(only=["kernels,nope"], out=tmp_path, profile="cpu", rates=RATES, **QUIET)
    with pytest.raises(ValueError, match="budget"):
        R.run_reference(budget_s=0, out=tmp_path, profile="cpu", **QUIET)
    if R.machine_facts()["device_type"] != "cuda":
        with pytest.raises(ValueError, match="needs CUDA"):
            R.run_reference(out=tmp_path, profile="gpu", **QUIET)
    assert cli(["reference", "--only", "nope", "--profile", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown batch(es) nope" in err[0]


def test_reference_rows_beside_local(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "DATA_DIR", tmp_path)
    local = pd.DataFrame({"impl": ["a", "b"], "ms": [1.0, 2.0], "device": ["cpu", "cpu"]})
    shown = results.beside_reference(local, "bench", ["impl", "ms"])
    assert "no reference run of 'bench' saved yet" in capsys.readouterr().out
    assert shown.columns.tolist() == ["run", "device", "date", "profile", "impl", "ms"] and len(shown) == 2
    assert results.reference_rows("bench").empty

    for gpu, ms in (("NVIDIA H100 80GB HBM3", 0.5), ("NVIDIA H200", 0.4)):
        results.save_results(
            [{"impl": "a", "ms": ms, "device": "cuda"}],
            "bench",
            profile="gpu",
            directory=tmp_path / "reference" / results.device_slug(gpu),
            device=gpu,
        )
    ref = results.reference_rows("bench")
    assert sorted(ref["device"]) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert (ref["torch_device"] == "cuda").all() and (ref["date"].str.len() == 10).all()
    shown = results.beside_reference(local, "bench", ["impl", "ms"])
    assert shown["run"].tolist() == ["this machine"] * 2 + ["reference"] * 2
    assert shown.loc[shown.run == "reference", "ms"].tolist() == [0.5, 0.4]
    assert capsys.readouterr().out == ""


def test_code_commit_ignores_data(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "code")
    first = R.code_commit(tmp_path)
    assert first and not first.endswith("-dirty")
    (tmp_path / "data" / "reference").mkdir(parents=True)
    (tmp_path / "data" / "reference" / "r.jsonl").write_text("{}\n")
    git("add", ".")
    git("commit", "-qm", "results")
    assert R.code_commit(tmp_path) == first  # committing results does not make saved batches stale
    (tmp_path / "data" / "reference" / "r.jsonl").write_text("{}\n{}\n")
    assert R.code_commit(tmp_path) == first
    (tmp_path / "code.py").write_text("x = 2\n")
    assert R.code_commit(tmp_path) == first + "-dirty"


def test_headlines_set_a_published_figure_only_beside_its_own_setting(tmp_path):
    lb = dict(batch=1, heads=16, T=16384, d=64, dtype="bfloat16", causal=True, device="cuda", **{"pass": "fwd+bwd"})
    results.save_results(
        [
            dict(lb, impl="flash_triton", median_ms=6.0),
            dict(lb, impl="naive", median_ms=70.0),
            dict(lb, impl="sdpa", median_ms=7.0, T=4096),
        ],
        "kernels_attention",
        directory=tmp_path,
    )
    results.save_results(
        [{"kind": "unsharded", "iteration_s": 1.0}, {"kind": "sharded", "iteration_s": 1.1}],
        "05_sharding_speed",
        directory=tmp_path,
        model="xl",
    )
    heads = R.headlines(tmp_path).set_index("figure")
    pub = heads["published"]
    assert pub["attention flash_triton fwd+bwd, 1x16x16384x64 bfloat16"] == 5.36  # the 2025 leaderboard
    assert pub["attention naive fwd+bwd, 1x16x16384x64 bfloat16"] == 80.0
    assert pd.isna(pub["attention sdpa fwd+bwd, 1x16x4096x64 bfloat16"])  # another shape: nothing beside it
    xl = heads.loc["xl sharded / unsharded iteration time"]
    assert xl["ours"].tolist() == pytest.approx([1.1, 1.1])
    assert xl["published"].tolist() == pytest.approx([836.05 / 783.53, 198 / 202])  # 000 and 004 disagree
    assert xl["published source"].str.contains("000_6835ed27c4bcad4a.txt").any()
    assert xl["published source"].str.contains("not interleaved").all()  # two launches: said beside the ratio


@pytest.mark.parametrize("precision, says", [(None, "fp32 (TF32 off)"), ("tf32", "fp32 with TF32 matmuls")])
def test_headlines_name_the_precision_of_each_side(tmp_path, precision, says):
    """Issue 39 item 13: the seed's H100 times ran TF32 matmuls (its kernel names), ours fp32 unless TF32 was on;
    both are said, so a 2-3x gap is not read as a slow machine."""
    extra = {} if precision is None else {"precision": precision}
    row = {"size": "small", "pass": "both", "warm-up": 3, "median_s": 0.03}
    results.save_results([row], "01_timing", directory=tmp_path, batch=16, context=128, **extra)
    [head] = R.headlines(tmp_path).to_dict(orient="records")
    assert head["figure"] == f"small forward+backward, warm, {says}" and head["published"] == 0.0241
    assert "TF32" in head["published source"]


@pytest.mark.parametrize("batch", ["02", "06"])
def test_batches_02_and_06_save_before_their_physical_checks(tmp_path, monkeypatch, batch):
    """Issue 39 item 8: a noisy yardstick (or one implausible row) fails the batch but keeps its rows."""
    from helpers.course import reference_batches as RB

    def implausible(*a, **k):
        raise AssertionError("outside its physical bound")

    monkeypatch.setattr(RB, "_device", lambda: "cuda")
    monkeypatch.setattr(RB.env, "machine_facts", lambda: {"device": "NVIDIA H100"})
    monkeypatch.setattr(RB.XR, "bench_kernels", lambda **k: [{"rows": 8, "median_s": 1e-3}])
    monkeypatch.setattr(RB.XA, "sweep", lambda *a, **k: [{"impl": "naive", "median_s": 1e-3}])
    monkeypatch.setattr(RB.XR, "check_fraction_of_copy", implausible)
    monkeypatch.setattr(RB.XA, "check_physical_bounds", implausible)
    s = {**RB.scale(batch if batch == "02" else "06-float32", "cpu"), "rows": 8}
    with pytest.raises(AssertionError, match="physical bound"):
        {"02": RB.run_02, "06": RB.run_06}[batch](s, "cpu", tmp_path)
    assert {p.stem.split("@")[0] for p in tmp_path.glob("*.jsonl")} == {
        {"02": "rmsnorm_bench", "06": "attention_bench"}[batch]
    }


def test_without_git_the_stamp_is_a_hash_of_the_sources(tmp_path):
    """Issue 31 item 12: a copied tree (no .git) must not read as 'same commit' (None == None) after a code change."""
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "x.py").write_text("x = 1\n")
    first = R.code_commit(tmp_path)
    assert first and first.startswith("src-") and R.code_commit(tmp_path) == first
    (tmp_path / "helpers" / "x.py").write_text("x = 2\n")
    assert R.code_commit(tmp_path) not in (first, None)


def test_kernels_batch_saves_both_results_before_its_bandwidth_check(tmp_path, monkeypatch):
    """Issue 31 item 12: a noisy copy yardstick fails the batch but keeps its RMSNorm and attention rows."""
    from helpers.course import reference_batches as RB

    def too_fast(rows):
        raise AssertionError("fraction of copy bandwidth 1.2 > 1.05")

    monkeypatch.setattr(RB, "_device", lambda: "cuda")
    monkeypatch.setattr(RB.XR, "bench_norm", lambda name, *a: {"impl": name, "median_s": 1.0})
    monkeypatch.setattr(RB.XA, "leaderboard_comparison", lambda *a: (None, [{"impl": "sdpa", "median_ms": 1.0}]))
    monkeypatch.setattr(RB.XR, "check_fraction_of_copy", too_fast)
    with pytest.raises(AssertionError, match="fraction of copy"):
        RB.run_kernels(RB.scale("kernels", "cpu"), "cpu", tmp_path)
    assert {p.name for p in tmp_path.glob("*.jsonl")} == {"kernels_rmsnorm.jsonl", "kernels_attention.jsonl"}


def test_each_chunk_leaves_one_archive_and_a_split_result_keeps_every_part(tmp_path):
    import tarfile

    from helpers.course import reference_batches as RB

    plan = (
        R.Batch("a", "writes a", command=child(WRITE.format("a")), estimate_s=1),
        R.Batch("b", "writes b", command=child(WRITE.format("b")), estimate_s=1),
    )
    for chunk, batches in enumerate((plan[:1], plan), 1):
        table = R.run_reference(
            budget_s=60,
            out=tmp_path / "ref",
            profile="cpu",
            plan=batches,
            rates=RATES,
            archive_dir=tmp_path / "archives",
            **QUIET,
        )
        assert table.attrs["archive"].name.endswith(f"-{chunk:02d}.tar.gz")
    with tarfile.open(table.attrs["archive"]) as tar:
        assert {"a.jsonl", "b.jsonl", "manifest.json"} <= {n.split("/")[-1] for n in tar.getnames()}
    for kind in ("unsharded", "sharded"):
        RB.save_part([{"kind": kind, "iteration_s": 1.0}], "05_sharding_speed", kind, "cpu", tmp_path, model="xl")
    merged = results.load_results(tmp_path / "05_sharding_speed.jsonl")
    assert sorted(merged.frame()["kind"]) == ["sharded", "unsharded"] and merged.provenance["model"] == "xl"


def test_cost_model_prices_fp32_without_tf32_and_tiled_attention_by_launches():
    """Issue 31 item 12: fp32 runs disable TF32 (batch 01 took ~3x a TF32 estimate); the PyTorch tiles cost their
    eager launches per fwd+bwd at T = 16,384 (most of a million), whatever their FLOPs; no batch sits near its cap."""
    import torch

    from helpers.attention import tiled_launches

    h100 = R.gpu_rates("NVIDIA H100 80GB HBM3", gpus=1)
    assert h100.flops_for("float32") == pytest.approx(R.GPU_EFFICIENCY * 67e12)
    assert h100.flops_for("bfloat16") == pytest.approx(R.GPU_EFFICIENCY * 989e12)
    tiled = R._attn_s((1, 16, 16384, 64), "flash_pytorch", h100, "bfloat16")
    launches = tiled_launches(16384, 64, torch.bfloat16, True)  # 0.76 M with the tuned bf16 tiles (1.3 M before)
    assert launches > 5e5 and tiled > launches * h100.eager_call_s
    assert launches * h100.eager_call_s > 100 * R._attn_s((1, 16, 16384, 64), "flash_triton", h100, "bfloat16")
    for batch in R.PLAN:
        assert R.model_estimate_s(batch.name, "gpu", h100) <= 0.8 * R.MAX_BATCH_S, batch.name
    assert [b.name for b in R._only(["05"], R.PLAN)] == [
        f"05-{k}" for k in ("unsharded", "sharded", "zero1", "torch_zero")
    ]  # a split batch by name


def test_batch_08_saves_what_the_tp_answers_read_and_they_quote_it(tmp_path):
    """Notebook 08's batch at the cpu plan (two 2-rank launches): its four results, each with provenance, and the
    2026 tp_calcs / fsdp_tp_calcs answers read the real 08_tp_speed beside their closed forms."""
    from helpers.course import answers as A
    from helpers.course.reference_batches import run_batch

    names = run_batch("08", "cpu", tmp_path)
    assert names == ["08_tp_exactness", "08_tp_bytes", "08_tp_memory", "08_tp_speed"]
    runs = {n: results.load_results(tmp_path / f"{n}.jsonl") for n in names}
    assert all(r.rows and r.provenance["profile"] == "cpu" for r in runs.values())
    assert runs["08_tp_speed"].provenance["tokens"] == 64 and len(runs["08_tp_speed"].rows) == 2
    assert all(r["equal"] for r in runs["08_tp_bytes"].rows)  # counted collectives == the closed form
    saved = A.Saved(tmp_path, "cpu")
    d = A.answer(A.BY_NUMBER["fsdp_tp_calcs(d)"], saved)
    assert "N_TP = 2, 64 tokens of width 32" in d.text and sum(r["pass / part"] == "(d) measured" for r in d.table) == 3
    assert "Measured here" in A.answer(A.BY_NUMBER["tp_calcs(b)"], saved).text and set(saved.used) == {"08_tp_speed"}
