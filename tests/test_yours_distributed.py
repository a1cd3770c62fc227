"""`yours` for ddp, sharding and fsdp (helpers.course.yours.distributed): the fixture student (the companion's own
implementations) passes every check with yours, ours and PyTorch's rows; each mutant in tests/student/mutants is
caught with a message naming the broken property; the course-style corpus in tests/student/corpus passes every check
within the handout's contract (the probes beyond it may fail, never in the exit status); a crashed rank, a hung
collective, a wrong return kind and a NotImplementedError are reported per implementation without stopping the rest.
One launch per topic run; implementations of different flavours share one launch (a generated adapters file)."""

from __future__ import annotations

import functools
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import launch as L
from helpers.course.yours import Options
from helpers.course.yours import contract as C
from helpers.course.yours import contract_fsdp as CF
from helpers.course.yours import distributed as D
from helpers.course.yours import fsdp_probe as P
from helpers.course.yours import fsdp_rules as R
from helpers.course.yours import student_calls as S
from helpers.course.yours.report import ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIPPED

STUDENT = Path(__file__).parent / "student"
FIXTURE = STUDENT / "tests" / "adapters.py"
MUTANTS = STUDENT / "mutants"
CORPUS = STUDENT / "corpus"
CHECKS_ONLY = Options(timed=False, warmup=0, timeout_s=120)  # no timing: the checks alone


def by(result, impl=None, status=None, beyond=None):
    return [
        c
        for c in result.checks
        if (impl is None or c.impl == impl)
        and (status is None or c.status == status)
        and (beyond is None or c.beyond == beyond)
    ]


def composed(tmp_path: Path, **adapters_from: str) -> Path:
    """An adapters file taking each named adapter from a mutant (the rest from the fixture): several mutants, one
    launch. A file outside the student's folder finds the fixture's package and the mutants by sys.path."""
    lines = [
        "import sys",
        f"sys.path[:0] = [{str(MUTANTS)!r}, {str(CORPUS)!r}, {str(STUDENT)!r}]",
        "from _fixture import *",
    ]
    lines += [f"from {module} import {name}" for name, module in adapters_from.items()]
    path = tmp_path / "adapters.py"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("topic", ["ddp", "sharding", "fsdp"])
def test_the_fixture_passes_every_check_with_yours_ours_and_pytorchs_rows(topic):
    result = getattr(D, f"run_{topic}")(str(FIXTURE), Options(steps=2, warmup=0, repeat=2, timeout_s=300))
    assert result.checks and all(c.status == PASS for c in result.checks), "\n".join(
        f"{c.impl} | {c.prop} | {c.status} | {c.detail}" for c in result.checks if c.status != PASS
    )
    impls = {c.impl for c in result.checks}
    assert impls == set(D.A.ADAPTERS[topic])  # every flavour the fixture wires, checked
    for impl in impls:  # the course's checks and the probes beyond them, both
        assert by(result, impl, beyond=False) and by(result, impl, beyond=True)
    for impl in impls:
        timed = {r["who"] for r in result.rows if r["impl"] == impl and r["measure"] == "step time"}
        assert {"yours", "ours", "pytorch"} <= timed
        ratios = [r for r in result.rows if r["impl"] == impl and r["measure"].startswith("step time, yours /")]
        assert ratios and all(r["ratio_low"] <= r["ratio"] <= r["ratio_high"] and r["pairs"] == 2 for r in ratios)
    if topic != "ddp":  # memory and bytes beside ours and the formula
        assert {"yours", "ours", "formula"} <= {r["who"] for r in result.rows if r["unit"] == "MiB"}
    if topic == "fsdp":
        assert any("2 repeats bitwise equal" in c.prop for c in result.checks)
        sent = {r["who"]: r["value"] for r in result.rows if r["measure"].startswith("bytes sent")}
        assert sent["yours"] == pytest.approx(sent["formula"], rel=1e-9)  # the companion's FSDP: exactly the formula


def test_ddp_mutants_each_named_by_the_property_they_break(tmp_path):
    path = composed(
        tmp_path,
        get_ddp_individual_parameters="ddp_summed",
        get_ddp="ddp_no_broadcast",
        get_ddp_bucketed="ddp_wrong_bucket",
    )
    result = D.run_ddp(str(path), CHECKS_ONLY)
    assert result.failed
    summed = by(result, "individual", FAIL, beyond=False)
    assert [c.prop for c in summed] == [f"{m}: 5 SGD steps vs one process (allclose)" for m in C.CM.MODELS]
    assert all("summed over ranks, not averaged" in c.detail for c in summed)
    [ours] = [c for c in by(result, "individual", FAIL, beyond=True) if "gradients" in c.prop]  # our toy: the same
    assert "summed over ranks, not averaged" in ours.detail and "emb.weight[" in ours.detail
    unbroadcast = by(result, "ddp", FAIL, beyond=False)
    assert {c.prop for c in unbroadcast} >= {f"{m}: rank 0's parameters after construction" for m in C.CM.MODELS}
    assert all("not broadcast from rank 0" in c.detail for c in unbroadcast if "construction" in c.prop)
    # the wrong bucket all-reduced: caught wherever there are two buckets or more, right in one (0.01 MB: one bucket)
    wrong = {c.prop for c in by(result, "bucketed", FAIL, beyond=False)}
    assert wrong == {
        f"{m}, bucket {mb:g} MB: 5 SGD steps vs one process (allclose)" for m in C.CM.MODELS for mb in (0.0016, 0.0001)
    }
    for c in by(result, "bucketed", FAIL, beyond=False):  # the right diagnosis, no other
        assert "gradient is all zeros after ddp_bucketed_on_after_backward" in c.detail and "fc1.weight" in c.detail
        assert "summed" not in c.detail and "broadcast" not in c.detail and "not finite" not in c.detail


def test_the_course_style_corpus_passes_within_the_contract(tmp_path):
    """A plain-class wrapper (individual), a parameter-only broadcast (2026's get_ddp) and buckets that wait for
    every gradient (bucketed), as students write them: every check within the handout passes; beyond it, our toy's
    per-rank buffer (not broadcast) and unused parameter (its bucket never complete) are reported, not counted."""
    path = composed(
        tmp_path,
        get_ddp_individual_parameters="ddp_plain_class",
        ddp_individual_parameters_on_after_backward="ddp_plain_class",
        get_ddp="ddp_param_broadcast",
        ddp_on_after_backward="ddp_param_broadcast",
        get_ddp_bucketed="ddp_bucket_waits",
        ddp_bucketed_on_after_backward="ddp_bucket_waits",
        ddp_bucketed_on_train_batch_start="ddp_bucket_waits",
    )
    result = D.run_ddp(str(path), CHECKS_ONLY)
    within = by(result, beyond=False)
    assert within and all(c.status == PASS for c in within), [
        (c.impl, c.prop, c.detail) for c in within if c.status != PASS
    ]
    assert {c.impl for c in within} == {"individual", "ddp", "bucketed"} and not result.failed
    assert len(by(result, "bucketed", beyond=False)) == 2 * 2 * len(C.COURSE_BUCKETS_MB)
    buffer = [c for c in by(result, "ddp", FAIL, beyond=True) if "construction" in c.prop]
    assert buffer and "scale" in buffer[0].detail  # parameters broadcast, the buffer not: beyond the handout
    waits = by(result, "bucketed", beyond=True)
    assert waits and all(c.status in (PASS, FAIL) for c in waits)  # the unused parameter: a result, never a crash
    assert any(c.status == FAIL and "buffers only" in c.detail for c in waits)
    assert any(
        c.status == FAIL
        and c.prop.startswith("beyond the handout: same weights")
        and "emb.weight" in c.detail
        and c.prop.endswith("bucket 100 MB")
        for c in waits
    )  # one bucket with the unused parameter: never full


def test_sharded_optimizer_that_does_not_partition_is_caught():
    result = D.run_sharding(str(MUTANTS / "sharding_not_partitioned.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL, beyond=False)
    assert [c.prop for c in failed] == ["ToyModel: optimizer state partitioned over ranks"]  # still AdamW's numbers
    assert "not partitioned" in failed[0].detail
    [deeper] = by(result, status=FAIL, beyond=True)
    assert deeper.prop.endswith("state per rank <= 1/2 + largest tensor (small/cpu)")
    assert "sharded state not partitioned" in deeper.detail and "100%" in deeper.detail


def test_fsdp_that_keeps_the_full_weights_fails_the_contract():
    result = D.run_fsdp(str(MUTANTS / "fsdp_not_sharded.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL, beyond=False)
    assert [c.prop for c in failed] == ["a shard per rank after get_fsdp"] and "not sharded at init" in failed[0].detail
    assert any(c.prop == "3 SGD steps vs one process (fp16, allclose)" and c.status == PASS for c in result.checks)
    assert any(c.prop.endswith("(compute dtype bf16)") and c.status == PASS for c in result.checks)


def test_fsdp_that_never_frees_fails_the_handouts_freeing_rules():
    """The 2026 handout: free the gathered weights after use. Kept alive, they fail within the contract (and the peak
    beyond it); the course's test itself passes."""
    result = D.run_fsdp(str(MUTANTS / "fsdp_never_frees.py"), CHECKS_ONLY)
    assert result.failed
    failed = by(result, status=FAIL, beyond=False)
    assert [c.prop for c in failed] == list(R.FREEING)
    assert "embedding.weight is still gathered" in failed[0].detail and "2 layers after its own use" in failed[0].detail
    assert "linear1.weight is gathered (float32 held by autograd" in failed[1].detail
    assert all(f"{n}.weight is still gathered" in failed[2].detail for n in ("embedding", "linear1", "lm_head"))
    assert all(c.status == PASS for c in by(result, beyond=False) if "SGD steps" in c.prop or "compute" in c.prop)
    [peak] = by(result, status=FAIL, beyond=True)
    assert peak.prop.endswith("forward/backward peak vs formula (gathered weights freed)")


FSDP_STYLES = {  # name -> (module the three adapters come from, the checks within the contract it must fail)
    "hooks": ("fsdp_hooks", set()),  # gathers in module hooks, frees by resizing, prefetches one layer
    "function": ("fsdp_function", set()),  # a custom autograd Function, prefetches two layers and for backward
    "kept_for_backward": ("fsdp_kept_for_backward", set(R.FREEING[:2])),
    "held_after_backward": ("fsdp_held_after_backward", {R.FREEING[2]}),
    "prefetch_all": ("fsdp_prefetch_all", {R.FREEING[0]}),
    "grads_all_reduced": ("fsdp_grads_all_reduced", {R.REDUCE}),
    "compute_dtype_ignored": (
        "fsdp_compute_dtype_ignored",
        {"compute dtype float16: forward matmuls and weight all-gathers in float16"},
    ),
}


def fsdp_course_part(paths: dict) -> dict:
    """In each rank: the FSDP worker's checks within the handout for several adapters files, one launch."""
    return {name: D.fsdp_worker(path, ["fsdp"], CHECKS_ONLY, parts=("course",))["fsdp"] for name, path in paths.items()}


def test_fsdp_styles_pass_and_each_mutant_fails_exactly_its_rule(tmp_path):
    """Student-style FSDPs (tests/student/corpus: hooks, autograd Function) pass every check within the handout; each
    mutant (tests/student/mutants) passes the course's test and fails its rule alone: the gathered weight kept for
    backward through autograd, held after backward, an unbounded prefetch, gradients all-reduced, compute_dtype never
    used."""
    paths = {}
    for name, (module, _) in FSDP_STYLES.items():
        (tmp_path / name).mkdir()
        names = ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params")
        paths[name] = str(composed(tmp_path / name, **dict.fromkeys(names, module)))
    per_rank = L.launch(functools.partial(fsdp_course_part, paths), 2, backend="gloo", device="cpu", timeout_s=300)
    checks = {}
    for name, (_, expected) in FSDP_STYLES.items():
        runs = [r[name] for r in per_rank]
        assert all(r["status"] == "ok" for r in runs), runs[0]
        checks[name] = CF.course_fsdp_checks("fsdp", {k: [r["course"][k] for r in runs] for k in runs[0]["course"]})
        assert len(checks[name]) == 2 * len(CF.COURSE_FSDP_DTYPES) + 1 + len(R.FREEING) + 3  # every check ran
        failed = [c for c in checks[name] if c.status != PASS]
        assert {c.prop for c in failed} == expected, (name, [(c.prop, c.status, c.detail) for c in failed])
    kept = next(c for c in checks["kept_for_backward"] if c.prop == R.FREEING[1])
    assert "linear1.weight is gathered (float32 held by autograd" in kept.detail  # the diagnosis, not only a fail
    ignored = [c for c in checks["compute_dtype_ignored"] if c.status == FAIL]
    assert "accepted and never used?" in ignored[0].detail
    within = next(c for c in checks["function"] if c.prop == R.FREEING[1])  # gathered ahead for backward: allowed
    assert "only linear2.weight, lm_head.weight gathered" in within.detail


def test_a_full_weight_is_found_by_its_values_and_a_shard_or_an_activation_is_not():
    """fsdp_probe.FullWeights (no launch): a weight whole in a padded flat buffer, transposed, or cast to fp16 is
    found; half of it (a shard) or an activation made from it is not; a shard is told by its first values."""
    torch.manual_seed(0)
    w, v = torch.randn(6, 4), torch.randn(3, 5)
    found = P.FullWeights({"a.weight": w, "b.weight": v})
    flat = torch.cat([torch.zeros(3), v.reshape(-1), w.t().contiguous().reshape(-1), torch.zeros(1)])  # (42,)
    assert found.in_storage(flat.untyped_storage()) == {("a.weight", "float32"), ("b.weight", "float32")}
    assert found.in_storage(w.half().untyped_storage()) == {("a.weight", "float16")}
    assert not found.in_storage(w.reshape(-1)[:12].clone().untyped_storage())  # a shard
    assert not found.in_storage((torch.ones(2, 6) @ w).untyped_storage())  # an activation
    assert found.weight_of(w.t()) == "a.weight" and found.weight_of(w.half()[None]) == "a.weight"
    assert found.weight_of(w[:3]) is None and found.weight_of(torch.zeros(6, 4)) is None
    assert found.shard_of(w.reshape(-1)[12:]) == "a.weight" and found.shard_of(v.half().reshape(-1)[8:]) == "b.weight"
    assert found.shard_of(torch.randn(12)) is None  # an all-gather of anything else


def test_a_crashed_rank_is_an_error_and_the_other_topics_still_run(tmp_path):
    path = composed(tmp_path, get_sharded_optimizer="sharding_crash", get_ddp_bucketed="ddp_bucketed_nan")
    path.write_text(
        path.read_text()
        + textwrap.dedent("""
        def get_ddp(module):
            return None
        def get_ddp_individual_parameters(module):
            raise NotImplementedError
    """)
    )
    crashed = D.run_sharding(str(path), CHECKS_ONLY)
    assert [(c.status, c.prop) for c in crashed.checks] == [(ERROR, "runs on 2 ranks")]
    assert "rank 1 of 2 was killed by SIGSEGV" in crashed.checks[0].detail
    ddp = D.run_ddp(str(path), CHECKS_ONLY)
    statuses = {c.impl: (c.status, c.detail) for c in ddp.checks if c.impl != "bucketed"}
    assert statuses["ddp"][0] == ERROR and statuses["ddp"][1].startswith(
        "get_ddp returned NoneType, expected a wrapper"
    )
    assert statuses["individual"][0] == NOT_IMPLEMENTED
    nan = [c for c in by(ddp, "bucketed", FAIL, beyond=False) if "SGD steps" in c.prop]
    assert len(nan) == 2 * len(C.COURSE_BUCKETS_MB) and all("not finite (NaN/inf)" in c.detail for c in nan)
    nan = [c for c in by(ddp, "bucketed", FAIL, beyond=True) if c.prop.startswith("beyond the handout: gradients")]
    assert len(nan) == len(D.ddp_bucket_sizes()) and all("non-finite (NaN/inf) gradient" in c.detail for c in nan)


def test_another_editions_names_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the file here puts its folders on this process's path
    monkeypatch.setattr(S, "_LOADED", {})
    path = composed(tmp_path)
    path.write_text(
        path.read_text() + "del get_ddp_bucketed, ddp_bucketed_on_after_backward, ddp_bucketed_on_train_batch_start\n"
    )
    got = S.outcome(lambda: S.adapter_fns(str(path), "ddp", "bucketed"))  # in this process: no launch needed
    assert got["status"] == SKIPPED and "another edition" in got["detail"]


def test_a_hung_collective_is_an_error_after_the_timeout():
    result = D.run_sharding(str(MUTANTS / "sharding_hang.py"), Options(timed=False, warmup=0, timeout_s=5))
    (check,) = result.checks
    assert check.status == ERROR and check.detail.startswith("hung:") and "timeout_s=5" in check.detail


def test_an_exception_in_student_code_names_its_file_and_line(tmp_path):
    path = composed(tmp_path)
    path.write_text(
        path.read_text() + "def get_sharded_optimizer(params, optimizer_cls, **kwargs):\n"
        "    raise RuntimeError('my bug')\n"
    )
    result = D.run_sharding(str(path), CHECKS_ONLY)  # each phase reports it: the course's checks among them
    assert result.failed and by(result, beyond=False) and all(c.status == ERROR for c in result.checks)
    assert all("RuntimeError: my bug" in c.detail and f"{path}:" in c.detail for c in result.checks)


def test_an_exception_beyond_the_contract_keeps_the_contract_checks(tmp_path):
    """An optimizer that raises only on a large model: the course's checks (small toy models) all pass; the memory and
    timing phases on small/cpu are each an error row beyond the handout, at the student's line; the exit status
    holds."""
    path = composed(tmp_path)
    path.write_text(
        path.read_text()
        + textwrap.dedent("""
        def get_sharded_optimizer(params, optimizer_cls, **kwargs):
            params = list(params)
            if len(params) > 6:
                raise RuntimeError('my bug on big models')
            return ShardedOptimizer(params, optimizer_cls, **kwargs)
    """)
    )
    result = D.run_sharding(str(path), Options(steps=2, warmup=0, timeout_s=120))
    within = by(result, beyond=False)
    assert len(within) == 3 and all(c.status == PASS for c in within) and not result.failed
    errors = by(result, status=ERROR)
    assert len(errors) == 2 and all(c.beyond and "small/cpu" in c.prop for c in errors)
    assert all("RuntimeError: my bug on big models" in c.detail and f"{path}:" in c.detail for c in errors)


def test_an_exceptions_location_is_the_students_deepest_frame():
    """Installed packages (a .venv inside the repository too), torch and the companion are skipped (no launch)."""
    root = STUDENT
    frames = [
        (str(root / "tests" / "adapters.py"), "10"),
        (str(root / "cs336_systems" / "ddp.py"), "42"),
        (str(root / ".venv" / "lib" / "python3.11" / "site-packages" / "einops" / "einops.py"), "7"),
        (S.torch.__file__, "99"),
        (S.__file__, "5"),
    ]
    assert S.student_frame(frames, str(FIXTURE)) == f"{root / 'cs336_systems' / 'ddp.py'}:42"
    assert S.student_frame(frames[2:], str(FIXTURE)) == f"{frames[-1][0]}:5"  # none of theirs: the deepest


def test_a_crash_beyond_the_contract_keeps_the_contract_checks(tmp_path):
    """A rank killed only on a large model (the probes beyond the handout): the course's checks, relaunched alone,
    stand; the probes are one error row naming the signal, never in the exit status."""
    path = composed(tmp_path)
    path.write_text(
        path.read_text()
        + textwrap.dedent("""
        import os, signal
        import torch.distributed as dist
        def get_sharded_optimizer(params, optimizer_cls, **kwargs):
            params = list(params)
            if len(params) > 6 and dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGSEGV)
            return ShardedOptimizer(params, optimizer_cls, **kwargs)
    """)
    )
    result = D.run_sharding(str(path), CHECKS_ONLY)
    within = by(result, beyond=False)
    assert len(within) == 3 and all(c.status == PASS for c in within) and not result.failed
    [error] = by(result, beyond=True)
    assert error.status == ERROR and "rank 1 of 2 was killed by SIGSEGV" in error.detail
