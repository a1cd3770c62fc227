"""`yours` for ddp, sharding and fsdp (helpers.course.yours.distributed): the fixture student (the companion's own
implementations) passes every check with yours, ours and PyTorch's rows; each mutant in tests/student/mutants is
caught with a message naming the broken property; the course-style corpus in tests/student/corpus passes every check
within the handout's contract (the probes beyond it may fail, never in the exit status); a crashed rank, a hung
collective, a wrong return kind and a NotImplementedError are reported per implementation without stopping the rest.
One launch per topic run; implementations of different flavours share one launch (a generated adapters file)."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import launch as L
from helpers.course.yours import Options
from helpers.course.yours import course_models as CM
from helpers.course.yours import dist_common as DC
from helpers.course.yours import distributed as D
from helpers.course.yours import student_calls as S
from helpers.course.yours.ddp import contract as C
from helpers.course.yours.ddp import lm as LM
from helpers.course.yours.ddp import lm_checks as LMC
from helpers.course.yours.fsdp import contract as CF
from helpers.course.yours.fsdp import probe as P
from helpers.course.yours.fsdp import rules as FR
from helpers.course.yours.fsdp import runner as DF
from helpers.course.yours.report import ERROR, FAIL, NEEDS_ENV, NOT_IMPLEMENTED, PASS, SKIPPED, TopicResult
from helpers.course.yours.sharding import rule_checks as RC
from helpers.course.yours.sharding import rules as R
from helpers.course.yours.sharding import runner as DS
from helpers.launch import launch

STUDENT = Path(__file__).parent / "student"
FIXTURE = STUDENT / "tests" / "adapters.py"
MUTANTS = STUDENT / "mutants"
CORPUS = STUDENT / "corpus"
CHECKS_ONLY = Options(timed=False, warmup=0, timeout_s=120)  # no timing: the checks alone
SHARDING_WITHIN = (
    len(C.CM.MODELS) + 1 + 2 + len(R.PROBES) + 3 + 1
)  # course test per model, partition; on R.WIDE ranks weights and state; groups, add, zero_grad
LM_INDIVIDUAL = f"course LM, {LM.LM_WORLD} ranks: {CM.LM_STEPS} SGD steps, gradients vs one process"
ONLY_BUCKETED = "del get_ddp, ddp_on_after_backward, get_ddp_individual_parameters"
ONLY_BUCKETED += ", ddp_individual_parameters_on_after_backward\n"  # the other flavours: another edition's (skipped)


@pytest.fixture(scope="module", autouse=True)
def warm_forkserver():
    """This module's launches (about 40) fork from a forkserver that has imported the checks' modules and
    torch._dynamo once (DC.warm_launches, as the command does): on a 2-core CPU that halves a launch. A forkserver
    an earlier test module left running is replaced first (no launch is in flight between tests), and ours is
    stopped afterwards, so the next module's launches start from the default one."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # private, as multiprocessing's own tests use it: no public way to restart
    DC.warm_launches()
    yield
    forkserver._forkserver._stop()


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
    assert [c.prop for c in summed] == [f"{m}: 5 SGD steps vs one process (allclose)" for m in C.CM.MODELS] + [
        LM_INDIVIDUAL
    ]
    assert all("summed over ranks, not averaged" in c.detail for c in summed)
    assert "every gradient is 3x one process's" in summed[-1].detail  # the course's LM on 3 ranks
    [ours] = [c for c in by(result, "individual", FAIL, beyond=True) if "gradients" in c.prop]  # our toy: the same
    assert "summed over ranks, not averaged" in ours.detail and "emb.weight[" in ours.detail
    unbroadcast = by(result, "ddp", FAIL, beyond=False)
    assert {c.prop for c in unbroadcast} >= {f"{m}: rank 0's parameters after construction" for m in C.CM.MODELS}
    assert all("not broadcast from rank 0" in c.detail for c in unbroadcast if "construction" in c.prop)
    # the wrong bucket all-reduced: caught wherever there are two buckets or more, right in one (0.01 MB: one bucket;
    # the course's LM at 1 to 1000 MB)
    wrong = [c for c in by(result, "bucketed", FAIL, beyond=False) if not c.prop.startswith("course LM")]
    assert {c.prop for c in wrong} == {
        f"{m}, bucket {mb:g} MB: 5 SGD steps vs one process (allclose)" for m in C.CM.MODELS for mb in (0.0016, 0.0001)
    }
    on_lm = [c for c in by(result, "bucketed", FAIL, beyond=False) if c.prop.startswith("course LM")]
    assert len(on_lm) == 2 and not any(" bucket 1" in c.prop for c in on_lm)  # the two sizes with several buckets
    for c in wrong:  # the right diagnosis, no other
        assert "gradient is all zeros after ddp_bucketed_on_after_backward" in c.detail and "fc1.weight" in c.detail
        assert "summed" not in c.detail and "broadcast" not in c.detail and "not finite" not in c.detail


def test_the_course_style_corpus_passes_within_the_contract(tmp_path):
    """A plain-class wrapper with NVTX ranges (individual: they must run on a CPU-only torch), a parameter-only
    broadcast (2026's get_ddp) and buckets that wait for every gradient (bucketed), as students write them: every
    check within the handout passes; beyond it, our toy's per-rank buffer (not broadcast) and unused parameter (its
    bucket never complete) are reported, not counted."""
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
    on_lm = [c.prop for c in by(result, "bucketed", beyond=False) if c.prop.startswith("course LM")]
    assert len(by(result, "bucketed", beyond=False)) == 2 * 2 * len(C.COURSE_BUCKETS_MB) + len(on_lm)
    assert len(on_lm) == 1 + 2 * (2 + len(LM.HANDOUT_BUCKETS_MB)) + 1  # construction, each size twice, the sizes
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


def test_on_the_course_lm_a_bucket_fired_from_one_member_and_a_halved_average_are_caught(tmp_path):
    """Both pass the course's test (2 ranks, toy models whose backward runs in reverse registration order); on the
    course's LM (3 ranks, norms registered after the weights they follow) each fails its rule, with a message naming
    it: the bucket only at the sizes that give several buckets (one bucket fires from the embedding's hook, ready
    last), the average everywhere."""
    path = composed(
        tmp_path,
        get_ddp_bucketed="ddp_bucket_fires_early",
        ddp_bucketed_on_after_backward="ddp_bucket_fires_early",
        ddp_bucketed_on_train_batch_start="ddp_bucket_fires_early",
        get_ddp_individual_parameters="ddp_halved",
        get_ddp="ddp_after_backward",
        ddp_on_after_backward="ddp_after_backward",
    )
    result = D.run_ddp(str(path), CHECKS_ONLY)
    [after] = by(result, "ddp", FAIL, beyond=False)  # 2026's get_ddp, all-reducing once backward returned: its rule
    assert "(overlap)" in after.prop and "every one of" in after.detail and "launched after backward" in after.detail
    assert all(c.status == PASS for c in by(result, "ddp", beyond=False) if c != after)
    within = [c for c in by(result, beyond=False) if c.impl != "ddp"]
    assert all(c.status == PASS for c in within if not c.prop.startswith("course LM"))  # the course's test passes
    [halved] = by(result, "individual", FAIL, beyond=False)
    assert (
        halved.prop == LM_INDIVIDUAL and "1.5x one process's: divided by 2, not by the world size (3)" in halved.detail
    )
    early = by(result, "bucketed", FAIL, beyond=False)
    assert len(early) == 2 and all(f"bucket {mb:g} MB" not in c.prop for c in early for mb in LM.HANDOUT_BUCKETS_MB)
    for c in early:
        assert "a bucket was all-reduced before all its gradients were ready" in c.detail and "ln1.weight" in c.detail
        assert "summed" not in c.detail and "broadcast" not in c.detail
    assert [c.status for c in by(result, "bucketed", beyond=False) if "at most bucket_size_mb" in c.prop] == [PASS]


def test_a_crash_at_the_handouts_bucket_size_is_a_contract_error(tmp_path):
    """A bucketed class that refuses 1000 MB passes the course's test and every other size on the course's LM."""
    path = composed(
        tmp_path,
        get_ddp_bucketed="ddp_bucket_refuses_1000mb",
        get_ddp_individual_parameters="ddp_blocking_hook",
        ddp_individual_parameters_on_after_backward="ddp_blocking_hook",
    )
    path.write_text(path.read_text() + "del get_ddp, ddp_on_after_backward\n")
    result = D.run_ddp(str(path), CHECKS_ONLY)
    [blocking] = by(result, "individual", FAIL, beyond=False)  # a blocking all-reduce in each hook: its rule alone
    assert "(overlap)" in blocking.prop and "blocking calls inside backward's hooks (async_op=False)" in blocking.detail
    assert all(c.status == PASS for c in by(result, "individual", beyond=False) if c != blocking)
    [error] = by(result, status=ERROR)
    assert not error.beyond and error.prop.startswith("course LM, bucket 1000 MB")
    assert (
        "ValueError: bucket_size_mb 1000.0 exceeds" in error.detail and "ddp_bucket_refuses_1000mb.py:" in error.detail
    )
    assert "the 2024/2025 handouts run bucketed DDP on this model at 1, 10, 100 and 1000 MB" in error.detail
    assert all(c.status == PASS for c in by(result, "bucketed", beyond=False) if c is not error)


def test_a_bucket_over_bucket_size_mb_fails_that_rule_alone(tmp_path):
    """Closing a bucket once it has passed the limit gives right gradients, and all-reduces bigger than the limit."""
    path = composed(
        tmp_path,
        get_ddp_bucketed="ddp_bucket_overflows",
        ddp_bucketed_on_after_backward="ddp_bucket_overflows",
        ddp_bucketed_on_train_batch_start="ddp_bucket_overflows",
    )
    path.write_text(path.read_text() + ONLY_BUCKETED)
    result = D.run_ddp(str(path), CHECKS_ONLY)
    [over] = by(result, status=FAIL, beyond=False)
    assert over.prop == "course LM: each bucket's all-reduce at most bucket_size_mb"
    assert "a bucket holds more than bucket_size_mb of parameters" in over.detail
    assert "over by at most one tensor: a bucket closed only once past the limit?" in over.detail


def test_a_plain_bucketed_class_in_registration_order_passes_on_the_course_lm(tmp_path):
    """Not an nn.Module, buckets filled greedily in registration order (not the handout's reverse), MB as 10**6 bytes,
    a set of arrived gradients per bucket, the broadcast imported by name; beside it a per-parameter DDP on
    Tensor.register_hook (not a post-accumulate hook): every check within the handout passes, the course's LM and how
    the calls are made included."""
    path = composed(
        tmp_path,
        get_ddp_bucketed="ddp_bucket_plain_class",
        ddp_bucketed_on_after_backward="ddp_bucket_plain_class",
        ddp_bucketed_on_train_batch_start="ddp_bucket_plain_class",
        get_ddp_individual_parameters="ddp_tensor_hook",
        ddp_individual_parameters_on_after_backward="ddp_tensor_hook",
    )
    path.write_text(path.read_text() + "del get_ddp, ddp_on_after_backward\n")
    result = D.run_ddp(str(path), CHECKS_ONLY)
    within = [c for c in by(result, beyond=False) if c.impl != "ddp"]
    assert any(c.impl == "individual" and "(overlap)" in c.prop for c in within)
    assert any(c.prop.endswith("one all-reduce a step") for c in within)
    assert within and all(c.status == PASS for c in within), [(c.prop, c.detail) for c in within if c.status != PASS]
    assert any("BasicsTransformerLM from your cs336_basics.model" in c.detail for c in within)


def test_the_course_lm_parts_registration_order_from_readiness():
    """No launch: the fixture's BasicsTransformerLM (the course's layout) has tensors whose gradient comes after an
    earlier-registered one's (ln1 after the attention projections), the sizes chosen give buckets that hold such
    a tensor behind their last-added member, and without a cs336_basics our copy of the layout is used."""
    before = set(sys.modules)
    sys.path.insert(0, str(STUDENT))
    try:
        cls, source = CM.course_lm_class()
        assert cls.__name__ == "BasicsTransformerLM" and "your cs336_basics" in source
        x, y = CM.lm_batches(LM.LM_WORLD)[0]
        order = LM.readiness(CM.course_lm(cls, 0), x, y)
    finally:
        sys.path.remove(str(STUDENT))
        for name in set(sys.modules) - before:  # the fixture's cs336_basics, out of this process's way
            del sys.modules[name]
    late = order.late()
    assert {"layers.0.ln1.weight", "layers.1.ln1.weight"} <= set(late) and "token_embeddings.weight" not in late
    sizes = LM.lm_bucket_sizes(order)
    assert sizes[2:] == list(LM.HANDOUT_BUCKETS_MB) and all(order.parts(mb * LM.MiB) for mb in sizes[:2])
    assert not order.parts(1.0 * LM.MiB)  # one bucket: its last-added member (the embedding) is ready last
    limit, total = 0.25 * sum(order.nbytes), sum(order.nbytes)  # an all-reduce over the limit: how far over
    assert "buckets never split" in LMC._oversize_why(total, limit, order.nbytes)
    assert "over by at most one tensor" in LMC._oversize_why(int(limit) + 128, limit, order.nbytes)


def test_without_a_usable_cs336_basics_the_course_layout_is_ours(monkeypatch):
    """No launch: no cs336_basics, or a BasicsTransformerLM that cannot be built with the course's arguments."""
    monkeypatch.setitem(sys.modules, "cs336_basics.model", None)  # import fails
    cls, source = CM.course_lm_class()
    assert cls is CM.CourseLM and "our copy" in source
    x, y = CM.lm_batches(2)[0]
    late = LM.readiness(CM.course_lm(cls, 0), x, y).late()
    assert "layers.1.ln1.weight" in late  # the same registration order as the course's

    class Theirs(CM.CourseLM):
        def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, attn_pdrop):
            super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff)

    monkeypatch.setattr(CM, "course_lm_class", lambda: (Theirs, "yours"))
    cls, source, order = LM.usable_lm(2)
    assert cls is CM.CourseLM and "your BasicsTransformerLM raised TypeError" in source and order.late()


def test_sharded_optimizer_that_does_not_partition_is_caught():
    result = D.run_sharding(str(MUTANTS / "sharding_not_partitioned.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL, beyond=False)  # still AdamW's numbers: the two state checks, nothing else
    assert [c.prop for c in failed] == [
        "ToyModel: optimizer state partitioned over ranks",
        R.WIDE_STATE_PROP,
        R.ADD_PROP.format("added parameters' state partitioned over ranks"),
    ]
    assert all("not partitioned" in c.detail for c in failed[:2]) and "did not assign them" in failed[2].detail
    [deeper] = by(result, status=FAIL, beyond=True)
    assert deeper.prop.endswith("state per rank <= 1/2 + largest tensor (small/cpu)")
    assert "sharded state not partitioned" in deeper.detail and "100%" in deeper.detail


def test_fsdp_that_keeps_the_full_weights_fails_the_contract():
    result = D.run_fsdp(str(MUTANTS / "fsdp_not_sharded.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL, beyond=False)
    assert [c.prop for c in failed] == [
        "a shard per rank after get_fsdp",
        f"{CF.WIDE} ranks: a shard per rank after get_fsdp",
    ]
    assert all("not sharded at init" in c.detail for c in failed)
    assert any(c.prop == "3 SGD steps vs one process (fp16, allclose)" and c.status == PASS for c in result.checks)
    assert any(c.prop.endswith("(compute dtype bf16)") and c.status == PASS for c in result.checks)


def test_fsdp_that_never_frees_fails_the_handouts_freeing_rules():
    """The 2026 handout: free the gathered weights after use. Kept alive, they fail within the contract (and the peak
    beyond it); the course's test itself passes."""
    result = D.run_fsdp(str(MUTANTS / "fsdp_never_frees.py"), CHECKS_ONLY)
    assert result.failed
    failed = by(result, status=FAIL, beyond=False)
    assert [c.prop for c in failed] == list(FR.FREEING)
    assert "embedding.weight is still gathered" in failed[0].detail and "2 layers after its own use" in failed[0].detail
    assert "linear1.weight is gathered (float32 held by autograd" in failed[1].detail
    assert all(f"{n}.weight is still gathered" in failed[2].detail for n in ("embedding", "linear1", "lm_head"))
    assert all(c.status == PASS for c in by(result, beyond=False) if "SGD steps" in c.prop or "compute" in c.prop)
    [peak] = by(result, status=FAIL, beyond=True)
    assert peak.prop.endswith("forward/backward peak vs formula (gathered weights freed)")


def test_a_hook_fsdp_that_frees_is_not_blamed_for_gloos_copies_of_its_reduce_scatters(tmp_path):
    """The corpus' hook FSDP frees every gathered weight (the freeing checks pass) and reduce-scatters async; on gloo
    each reduce-scatter in flight keeps a copy of its input, which the peak beyond the handout allows for then, and
    says so, instead of calling the excess unfreed weights."""
    names = ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params")
    result = D.run_fsdp(str(composed(tmp_path, **dict.fromkeys(names, "fsdp_hooks"))), CHECKS_ONLY)
    assert all(c.status == PASS for c in by(result, beyond=False)), [c.detail for c in by(result, status=FAIL)]
    [peak] = [c for c in by(result, beyond=True) if "forward/backward peak" in c.prop]
    assert peak.status == PASS and "gloo's copy of each" in peak.detail, peak.detail


FSDP_STYLES = {  # name -> (module the three adapters come from, the checks within the contract it must fail)
    "hooks": ("fsdp_hooks", set()),  # gathers in module hooks, frees by resizing, prefetches one layer
    "function": ("fsdp_function", set()),  # a custom autograd Function, prefetches two layers and for backward
    "kept_for_backward": ("fsdp_kept_for_backward", set(FR.FREEING[:2])),
    "held_after_backward": ("fsdp_held_after_backward", {FR.FREEING[2]}),
    "prefetch_all": ("fsdp_prefetch_all", {FR.FREEING[0]}),
    "grads_all_reduced": ("fsdp_grads_all_reduced", {FR.REDUCE}),
    "compute_dtype_ignored": (
        "fsdp_compute_dtype_ignored",
        {"compute dtype float16: forward matmuls and weight all-gathers in float16"},
    ),
    "halved_by_two": ("fsdp_halved_by_two", {f"{CF.WIDE} ranks: 3 SGD steps vs one process (fp32, allclose)"}),
}


def fsdp_course_part(paths: dict, worker=D.fsdp_worker) -> dict:
    """In each rank: the FSDP worker's checks within the handout for several adapters files, one launch."""
    return {name: worker(path, ["fsdp"], CHECKS_ONLY, parts=("course",))["fsdp"] for name, path in paths.items()}


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
    per_rank, wide = (
        L.launch(functools.partial(fsdp_course_part, paths, w), n, backend="gloo", device="cpu", timeout_s=300)
        for w, n in ((D.fsdp_worker, 2), (DF.wide_worker, CF.WIDE))
    )
    checks = {}
    for name, (_, expected) in FSDP_STYLES.items():
        runs = [r[name] for r in per_rank]
        assert all(r["status"] == "ok" for r in runs), runs[0]
        checks[name] = CF.course_fsdp_checks("fsdp", {k: [r["course"][k] for r in runs] for k in runs[0]["course"]})
        checks[name] += DF.wide_checks("fsdp", [r[name] for r in wide], paths[name], checks[name])
        assert len(checks[name]) == 2 * len(CF.COURSE_FSDP_DTYPES) + 1 + len(FR.FREEING) + 3 + 2  # every check ran
        failed = [c for c in checks[name] if c.status != PASS]
        assert {c.prop for c in failed} == expected, (name, [(c.prop, c.status, c.detail) for c in failed])
    kept = next(c for c in checks["kept_for_backward"] if c.prop == FR.FREEING[1])
    assert "linear1.weight is gathered (float32 held by autograd" in kept.detail  # the diagnosis, not only a fail
    ignored = [c for c in checks["compute_dtype_ignored"] if c.status == FAIL]
    assert "accepted and never used?" in ignored[0].detail
    within = next(c for c in checks["function"] if c.prop == FR.FREEING[1])  # gathered ahead for backward: allowed
    assert "only linear2.weight, lm_head.weight gathered" in within.detail
    [halved] = [c for c in checks["halved_by_two"] if c.status == FAIL]
    assert "the same check passes on the test's 2 ranks" in halved.detail and "rank" in halved.detail


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
    assert len(nan) == 2 * len(C.COURSE_BUCKETS_MB) + 2 + len(LM.HANDOUT_BUCKETS_MB)
    assert all("not finite (NaN/inf)" in c.detail for c in nan)
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


def test_a_module_this_python_lacks_is_the_environments_with_the_fix(tmp_path):
    """The student's code imports their assignment-1 package from a git submodule this checkout never filled (an
    empty cs336-basics/): every phase needs their environment, none fails, and the fix names the submodule."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "cs336-systems"\n')
    (tmp_path / ".gitmodules").write_text('[submodule "cs336-basics"]\n\tpath = cs336-basics\n')
    (tmp_path / "cs336-basics").mkdir()
    (tmp_path / "tests").mkdir()
    adapters = tmp_path / "tests" / "adapters.py"
    adapters.write_text(
        "def get_sharded_optimizer(params, optimizer_cls, **kwargs):\n"
        "    from cs336_basics.optimizer import AdamW  # noqa: F401\n"
        "    return optimizer_cls(params, **kwargs)\n"
    )
    result = D.run_sharding(str(adapters), CHECKS_ONLY)
    within = by(result, beyond=False)
    assert within and not result.failed and {c.status for c in within} == {NEEDS_ENV}, [c.status for c in within]
    assert all("git submodule update --init" in c.detail for c in within), within[0].detail
    assert not any(str(R.WIDE) + " ranks" in c.prop for c in result.checks)  # nothing ran: no wider launch


def test_a_hung_collective_is_an_error_after_the_timeout():
    """The mutant's rank 0 waits in a collective rank 1 never enters: however far a slow machine got in 1 s (the
    timeout counts from both ranks' start), the launch is stopped as hung, twice (all parts, then the course's)."""
    result = D.run_sharding(str(MUTANTS / "sharding_hang.py"), Options(timed=False, warmup=0, timeout_s=1))
    (check,) = result.checks
    assert check.status == ERROR and check.detail.startswith("hung:") and "timeout_s=1" in check.detail


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
    assert len(within) == SHARDING_WITHIN and all(c.status == PASS for c in within) and not result.failed
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
    assert len(within) == SHARDING_WITHIN and all(c.status == PASS for c in within) and not result.failed
    [error] = by(result, beyond=True)
    assert error.status == ERROR and "rank 1 of 2 was killed by SIGSEGV" in error.detail


# ---- the sharded optimizer's rules from the handout's words: mutants and correct variants, one launch for all ----

GROUPS = {R.groups_prop(p) for p in R.PROBES}
SHARDING_MUTANTS = {  # mutant -> (the within-contract checks it fails, its status, a phrase of the diagnosis)
    "sharding_group_hparams": (
        GROUPS | {R.ADD_PROP.format("added group's own lr")},
        FAIL,
        "own hyperparameters",
    ),
    "sharding_dict_crash": (GROUPS, ERROR, "parameter groups (dicts), which the handout allows"),
    "sharding_add_never_stepped": ({R.ADD_PROP.format("added parameters stepped")}, FAIL, "never stepped"),
    "sharding_add_unsharded": (
        {R.ADD_PROP.format("added parameters' state partitioned over ranks")},
        FAIL,
        "did not assign them among the ranks",
    ),
    "sharding_zero_grad_own": ({R.ZERO_GRAD_PROP}, FAIL, "clears only the gradients of the parameters it owns"),
    "sharding_two_ranks": ({R.WIDE_PROP, R.WIDE_STATE_PROP}, FAIL, "world size"),
    "sharding_two_owners": ({R.WIDE_STATE_PROP}, FAIL, "does not follow the world size"),
}
SHARDING_CORPUS = {  # correct, each in its own style: every check within the handout passes
    "_sharded": MUTANTS / "_sharded.py",  # round-robin by count, the mutants' base
    "sharding_by_size": CORPUS / "sharding_by_size.py",  # greedy by size, flat broadcasts
    "sharding_base_format": CORPUS / "sharding_base_format.py",  # param_groups in optimizer_cls's format
    "sharding_plain_class": CORPUS / "sharding_plain_class.py",  # no torch.optim.Optimizer, an inner one per group
}


def contract_part(paths: list[str], worker=D.sharding_worker) -> dict:
    """In a rank: the sharding worker's part within the handout for each adapters file (one launch for all)."""
    return {p: worker(p, ["sharded"], CHECKS_ONLY, ("course",))["sharded"] for p in paths}


@pytest.fixture(scope="module")
def sharding_students() -> dict:
    """name -> TopicResult: every sharding mutant and correct variant, run in one launch, judged as `yours` judges."""
    paths = {name: str(MUTANTS / f"{name}.py") for name in SHARDING_MUTANTS}
    paths |= {name: str(path) for name, path in SHARDING_CORPUS.items()}
    per_rank, wide = (
        launch(
            functools.partial(contract_part, list(paths.values()), w), n, backend="gloo", device="cpu", timeout_s=300
        )
        for w, n in ((D.sharding_worker, 2), (DS.wide_worker, R.WIDE))
    )
    results = {}
    for name, path in paths.items():
        results[name] = TopicResult("sharding")
        DS.judge_sharding(results[name], "sharded", [r[path] for r in per_rank], path, [r[path] for r in wide])
    return results


@pytest.mark.parametrize("name", sorted(SHARDING_MUTANTS))
def test_each_sharding_mutant_fails_exactly_its_rule(sharding_students, name):
    """Each passes the course's test (and the partition check); it fails only the checks of the rule it breaks,
    with a message that names the mistake."""
    props, status, phrase = SHARDING_MUTANTS[name]
    result = sharding_students[name]
    within = by(result, beyond=False)
    assert result.failed and any(c.prop.endswith("(allclose, rtol 1e-7)") and c.status == PASS for c in within)
    failed = {c.prop: c for c in within if c.status != PASS}
    assert set(failed) == props, [(c.prop, c.status, c.detail) for c in failed.values()]
    assert all(c.status == status and phrase in c.detail for c in failed.values()), [c.detail for c in failed.values()]


def test_sharding_mutant_messages_say_what_differed(sharding_students):
    """The numbers behind a red line: where, by how much, against which bound; what the weights match instead."""
    groups = [c for c in by(sharding_students["sharding_group_hparams"], status=FAIL) if c.prop in GROUPS]
    assert all("|diff|" in c.detail and "bound 32 x 2^-24" in c.detail for c in groups)
    assert all("group 0's own lr" in c.detail and "group 1's own weight_decay" in c.detail for c in groups)
    [crash] = [c for c in by(sharding_students["sharding_dict_crash"], status=ERROR)][:1]
    assert "AttributeError" in crash.detail and "sharding_dict_crash.py:" in crash.detail
    [zero] = by(sharding_students["sharding_zero_grad_own"], status=FAIL)
    assert "rank 0 kept layers.1.weight, layers.3.weight, layers.5.weight" in zero.detail


@pytest.mark.parametrize("name", sorted(SHARDING_CORPUS))
def test_each_sharding_variant_passes_within_the_contract(sharding_students, name):
    result = sharding_students[name]
    within = by(result, beyond=False)
    assert len(within) == SHARDING_WITHIN and not result.failed
    assert all(c.status == PASS for c in within), [(c.prop, c.detail) for c in within if c.status != PASS]


def test_the_sharding_bound_admits_another_kernel_and_not_another_lr():
    """The bound (32 roundings of float32 per element per step, on one process's path) holds fused AdamW, which
    rounds differently, against the default AdamW on the probes' model; a group's lr 0.02 -> 0.1 is far outside it."""
    probe = R.PROBES[0]
    torch.manual_seed(0)
    base = R.Chain()

    def trained(drop=(), **extra):
        net = copy.deepcopy(base)
        return R.train(net, probe.cls(probe.groups(net, drop), **probe.defaults, **extra))

    ref = trained()
    limits = R.bound(ref.path)
    fused = trained(fused=True)
    assert any(not torch.equal(fused.weights[n], ref.weights[n]) for n in ref.weights)  # it does round differently
    assert 0 < RC.worst([fused.weights], ref.weights, limits).ratio < 1
    assert RC.worst([trained(drop=[(0, "lr")]).weights], ref.weights, limits).ratio > 1e4


def test_the_added_state_is_read_from_the_optimizers_the_wrapper_holds(one_rank):
    """state_growth reads the state of the torch optimizers a wrapper is or holds (a buffer its step leaves for the
    backend to free later is not state); with none to be found, the bytes the step leaves alive. Both agree here."""
    net = R.Chain()
    params = dict(net.named_parameters())
    one = 2 * R.WIDTH * R.WIDTH * 4 + 4  # AdamW: two moments and a step counter per tensor

    class Holder:  # a plain class with its inner optimizers in a list
        def __init__(self):
            self.inners = [torch.optim.AdamW(list(params.values())[:2])]

        def step(self):
            self.inners[0].step()

    def hidden():  # an optimizer no attribute reaches
        inner = torch.optim.AdamW(list(params.values())[2:5])
        return type("Hidden", (), {"step": staticmethod(lambda: inner.step())})()

    net(torch.randn(4, R.WIDTH)).sum().backward()
    holder, closure = Holder(), hidden()
    assert R.state_bytes(holder) == 0 and R.state_bytes(closure) is None
    assert R.state_growth(holder, params) == 2 * one
    assert R.state_growth(closure, params) == 3 * one


@pytest.mark.parametrize(
    "mutant, diagnosis",
    [
        ("ddp_bucket_gate", "all-reduces launched at one moment: a ready bucket sent one member per call"),
        ("ddp_bucket_bytes_as_mb", "each launched at a gradient of its own: buckets sent as they filled"),
    ],
)
def test_one_call_per_tensor_fails_the_call_count_alone_and_says_why(tmp_path, mutant, diagnosis):
    """Right gradients and no call over the limit on the course's LM, but one call per tensor at every size (the
    course's LM alone: its toy test passes as the gradients do). Buckets that, once complete, all-reduce each member
    on its own launch their calls at one moment; a bucket of bytes compared with MB holds one tensor, and its call
    comes at that tensor's gradient: the message tells the two apart by when the calls were launched."""
    names = ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start")
    path = composed(tmp_path, **dict.fromkeys(names, mutant))
    got = DC.launch_each(LM.lm_worker, str(path), ["bucketed"], CHECKS_ONLY, world=LM.LM_WORLD, parts=("course",))
    checks = LMC.lm_checks("bucketed", got["bucketed"], str(path))
    failed = [c for c in checks if c.status == FAIL]
    assert {c.prop for c in failed} == {c.prop for c in checks if "all-reduce" in c.prop and "bucket " in c.prop}
    assert all(diagnosis in c.detail for c in failed), [c.detail for c in failed]
    assert any(c.prop.endswith("one all-reduce a step") for c in failed)
    assert any("fewer all-reduces than tensors" in c.prop for c in failed)
    assert all(c.status == PASS for c in checks if c not in failed)


def test_without_cs336_basics_model_fsdp_is_judged_on_our_copy_of_the_staff_layers(monkeypatch):
    """A student's tree whose cs336_basics has no model module: the 2026 test's model is built from our copy of the
    staff layers (said in one line), so the handout's FSDP rules still run on the course's model."""
    monkeypatch.setitem(sys.modules, "cs336_basics.model", None)  # an import of it raises ImportError
    layers, shard_types = CM.course_layers()
    assert layers is CM.StaffLayers and shard_types == (CM.StaffLayers.Linear, CM.StaffLayers.Embedding)
    assert CM.course_layers_source() == CM.STAFF_SOURCE
    model = CM.FSDPToyModel(layers)
    ids, _ = CM.fsdp_data()
    assert model(ids).shape == (*ids.shape, CM.FSDP_VOCAB)
    assert {type(m) for m in model.modules()} >= {CM.StaffLayers.Linear, CM.StaffLayers.Embedding}


def _dies_once(marker, path, names, opts, parts):
    """A worker whose rank 1 is killed by SIGSEGV the first time only (the marker file remembers)."""
    import os
    import signal

    if torch.distributed.get_rank() == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    return {n: {"status": PASS} for n in names}


def test_a_signal_that_a_fresh_launch_does_not_repeat_is_the_environments(tmp_path):
    """A rank killed by a signal once (gloo's teardown, say) is rerun in a fresh launch; the results are the rerun's
    and the report says the environment, the signal and the phase, never a failed rule."""
    worker = functools.partial(_dies_once, str(tmp_path / "died"))
    got = DC.launch_each(worker, "adapters.py", ["individual"], CHECKS_ONLY, world=2, parts=("course",))
    assert [r["status"] for r in got["individual"]] == [PASS, PASS]
    [env] = DC.environment_checks("ddp", "individual", got["individual"])
    assert env.beyond and env.status == SKIPPED and "killed by SIGSEGV" in env.detail and "course part" in env.detail


def test_a_rank_that_loads_a_students_file_guards_the_interpreter(tmp_path):
    """The distributed checks' ranks import the checks, load the student's file and run their model, which may call
    their own Triton kernel (sara-kothari's 2026 LM calls its FlashAttention): the interpreter there has the kernel
    checks' fixes (bf16 into tl.dot as on a GPU, an access outside the kernel's tensors refused). Without them every
    DDP run of that repository on the course LM died by SIGABRT, reported as a crash of a DDP that is right."""
    adapters = tmp_path / "adapters.py"
    adapters.write_text("X = 1\n")
    code = (
        "import helpers.course.yours.distributed\n"
        "from helpers.course.yours import adapters as A\n"
        f"A.load({str(adapters)!r})\n"
        "from triton.runtime import interpreter\n"
        "b = type(interpreter.interpreter_builder)\n"
        "print(getattr(b.create_masked_load, 'guarded', False), getattr(b.create_dot, 'widens_bf16', False))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "True True"
