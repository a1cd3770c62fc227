"""`yours` for ddp, sharding and fsdp (helpers.course.yours.distributed): the fixture student (the companion's own
implementations) passes every check with yours, ours and PyTorch's rows; each mutant in tests/student/mutants is
caught with a message naming the broken property; a crashed rank, a hung collective, a wrong return kind and a
NotImplementedError are reported per implementation without stopping the rest. One launch per topic run; the DDP
mutants share one launch (one per flavour of the same generated adapters file)."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from helpers.course.yours import Options
from helpers.course.yours import distributed as D
from helpers.course.yours.report import ERROR, FAIL, NOT_IMPLEMENTED, PASS, SKIPPED

STUDENT = Path(__file__).parent / "student"
FIXTURE = STUDENT / "tests" / "adapters.py"
MUTANTS = STUDENT / "mutants"
CHECKS_ONLY = Options(timed=False, warmup=0, timeout_s=120)  # no timing: the checks alone


def by(result, impl=None, status=None):
    return [c for c in result.checks if (impl is None or c.impl == impl) and (status is None or c.status == status)]


def composed(tmp_path: Path, **adapters_from: str) -> Path:
    """An adapters file taking each named adapter from a mutant (the rest from the fixture): several mutants, one
    launch. A file outside the student's folder finds the fixture's package and the mutants by sys.path."""
    lines = ["import sys", f"sys.path[:0] = [{str(MUTANTS)!r}, {str(STUDENT)!r}]", "from _fixture import *"]
    lines += [f"from {module} import {name}" for name, module in adapters_from.items()]
    path = tmp_path / "adapters.py"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("topic", ["ddp", "sharding", "fsdp"])
def test_the_fixture_passes_every_check_with_yours_ours_and_pytorchs_rows(topic):
    result = getattr(D, f"run_{topic}")(str(FIXTURE), Options(steps=2, warmup=0, repeat=2, timeout_s=300))
    assert result.checks and all(c.status == PASS for c in result.checks), \
        "\n".join(f"{c.impl} | {c.prop} | {c.status} | {c.detail}" for c in result.checks if c.status != PASS)
    impls = {c.impl for c in result.checks}
    assert impls == set(D.A.ADAPTERS[topic])  # every flavour the fixture wires, checked
    for impl in impls:
        timed = {r["who"] for r in result.rows if r["impl"] == impl and r["measure"] == "step time"}
        assert {"yours", "ours", "pytorch"} <= timed
        ratios = [r for r in result.rows if r["impl"] == impl and r["measure"].startswith("step time, yours /")]
        assert ratios and all(r["ratio_low"] <= r["ratio"] <= r["ratio_high"] and r["pairs"] == 2 for r in ratios)
    if topic != "ddp":  # memory and bytes beside ours and the formula
        assert {"yours", "ours", "formula"} <= {r["who"] for r in result.rows if "MiB" == r["unit"]}
    if topic == "fsdp":
        assert any("2 repeats bitwise equal" in c.prop for c in result.checks)
        sent = {r["who"]: r["value"] for r in result.rows if r["measure"].startswith("bytes sent")}
        assert sent["yours"] == pytest.approx(sent["formula"], rel=1e-9)  # the companion's FSDP: exactly the formula


def test_ddp_mutants_each_named_by_the_property_they_break(tmp_path):
    path = composed(tmp_path, get_ddp_individual_parameters="ddp_summed", get_ddp="ddp_no_broadcast",
                    get_ddp_bucketed="ddp_bucketed_forgets_bucket")
    result = D.run_ddp(str(path), CHECKS_ONLY)
    summed = by(result, "individual", FAIL)
    assert [c.prop for c in summed] == ["gradients vs one process, toy model"]
    assert "summed over ranks, not averaged" in summed[0].detail and "emb.weight[" in summed[0].detail
    unbroadcast = by(result, "ddp", FAIL)
    assert "not broadcast from rank 0" in unbroadcast[0].detail and unbroadcast[0].prop.startswith("rank 0's weights")
    forgot = by(result, "bucketed", FAIL)
    assert {c.prop for c in forgot} >= {f"gradients vs one process, toy model, bucket {mb:.3g} MB"
                                        for mb in D.ddp_bucket_sizes()}  # caught at every bucket size
    assert all("not synchronized" in c.detail for c in forgot if c.prop.startswith("gradients"))


def test_sharded_optimizer_that_does_not_partition_is_caught():
    result = D.run_sharding(str(MUTANTS / "sharding_not_partitioned.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL)
    assert [c.prop for c in failed] == ["state per rank <= 1/2 + largest tensor (small/cpu)"]  # still bitwise AdamW
    assert "sharded state not partitioned" in failed[0].detail and "100%" in failed[0].detail


@pytest.mark.parametrize("mutant, prop, words", [
    ("fsdp_never_frees", "forward/backward peak vs formula (gathered weights freed)", "gathered weights never freed"),
    ("fsdp_not_sharded", "memory per rank after init vs formula", "not sharded at init"),
])
def test_fsdp_mutants_each_named_by_the_property_they_break(mutant, prop, words):
    result = D.run_fsdp(str(MUTANTS / f"{mutant}.py"), CHECKS_ONLY)
    failed = by(result, status=FAIL)
    assert [c.prop for c in failed] == [prop] and words in failed[0].detail
    assert any(c.prop == "SGD steps vs one process (compute dtype bf16)" and c.status == PASS for c in result.checks)


def test_a_crashed_rank_is_an_error_and_the_other_topics_still_run(tmp_path):
    path = composed(tmp_path, get_sharded_optimizer="sharding_crash", get_ddp_bucketed="ddp_bucketed_nan")
    path.write_text(path.read_text() + textwrap.dedent("""
        def get_ddp(module):
            return None
        def get_ddp_individual_parameters(module):
            raise NotImplementedError
    """))
    crashed = D.run_sharding(str(path), CHECKS_ONLY)
    assert [(c.status, c.prop) for c in crashed.checks] == [(ERROR, "runs on 2 ranks")]
    assert "rank 1 of 2 was killed by SIGSEGV" in crashed.checks[0].detail
    ddp = D.run_ddp(str(path), CHECKS_ONLY)
    statuses = {c.impl: (c.status, c.detail) for c in ddp.checks if c.impl != "bucketed"}
    assert statuses["ddp"] == (ERROR, "get_ddp returned NoneType, expected a torch.nn.Module wrapping the model")
    assert statuses["individual"][0] == NOT_IMPLEMENTED
    nan = [c for c in by(ddp, "bucketed", FAIL) if c.prop.startswith("gradients")]
    assert len(nan) == len(D.ddp_bucket_sizes()) and all("non-finite (NaN/inf) gradient" in c.detail for c in nan)


def test_another_editions_names_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading the file here puts its folders on this process's path
    monkeypatch.setattr(D, "_LOADED", {})
    path = composed(tmp_path)
    path.write_text(path.read_text() + "del get_ddp_bucketed, ddp_bucketed_on_after_backward, "
                    "ddp_bucketed_on_train_batch_start\n")
    got = D._outcome(lambda: D._adapter_fns(str(path), "ddp", "bucketed"))  # in this process: no launch needed
    assert got["status"] == SKIPPED and "another edition" in got["detail"]


def test_a_hung_collective_is_an_error_after_the_timeout():
    result = D.run_sharding(str(MUTANTS / "sharding_hang.py"), Options(timed=False, warmup=0, timeout_s=10))
    (check,) = result.checks
    assert check.status == ERROR and check.detail.startswith("hung:") and "timeout_s=10" in check.detail


def test_an_exception_in_student_code_names_its_file_and_line(tmp_path):
    path = composed(tmp_path)
    path.write_text(path.read_text() + "def get_sharded_optimizer(params, optimizer_cls, **kwargs):\n"
                    "    raise RuntimeError('my bug')\n")
    (check,) = D.run_sharding(str(path), CHECKS_ONLY).checks
    assert check.status == ERROR and "RuntimeError: my bug" in check.detail and f"{path}:" in check.detail
