"""The rest of issue 49's review, each where a test can see it: the maps link each edition's own torch_compile and
leaderboard, 25 MiB is listed once in 3.4.3(c), GPU lines agree with the published runs beside them and point where
those are printed, 3.4.5(a) states the check it runs, 2.4.1(d) quotes the contexts that ran, anchors say their year
once and 2024's questions come in the handout's order."""

import re

import answers_data as D
import pandas as pd
import pytest

from helpers.course import answers as A
from helpers.course.answers import handouts
from helpers.course.answers.page import render
from helpers.experiments.ddp_overlap import shown_variants
from helpers.timing import Comparison


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return D.synthetic_folder(tmp_path_factory)


def test_each_edition_links_its_own_torch_compile_and_leaderboard():
    for year in (2025, 2026):
        got = handouts.covering(year)
        for letter in "ab":
            assert [q.number for q in got[("torch_compile", letter)]] == [f"torch_compile({letter})"]
        assert [q.number for q in got[("leaderboard", "")]] == [f"{year} leaderboard"]


def test_25_mib_is_shown_once_in_the_overlap_table(tmp_path):
    speed = pd.DataFrame(
        {"model": "m", "variant": ["bucketed 1 MB", "bucketed 25 MB", "bucketed 100 MB"], "buckets": [9, 2, 1]}
    )
    assert shown_variants(speed, "m").count("bucketed 25 MB") == 1
    rows = [{"variant": v, "buckets": 2, "trace overlap": 0.3} for v in ("naive", "bucketed 25 MB", "bucketed 25 MB")]
    D.write(tmp_path, {"04_ddp_overlap": (rows, dict(model="small/cpu"))})  # saved before the fix
    assert A.answer(A.BY_NUMBER["3.4.3(c)"], A.Saved(tmp_path, "cpu")).text.count("bucketed (25 MiB)") == 1


def test_gpu_lines_agree_with_the_published_runs_beside_them(synthetic, tmp_path):
    sizes = {
        s: Comparison({"fp32": D.samples(1.0), "autocast bfloat16": D.samples(0.7)}, "fp32", "cpu") for s in D.SIZES
    }
    D.write(tmp_path, {"01_precision_ratios": (D.benchmarking.precision_ratios(sizes), dict(batch=4, context=32))})
    gpu = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(tmp_path, "cpu")).gpu  # autocast faster at every size here
    assert "carries over in direction" not in gpu.lower() and "small slower" in gpu
    page = render("cpu", synthetic)
    entry = re.search(r'id="a2024-2.1.5-b".*?</div>', page, re.S).group(0)
    assert "reference above" in entry and entry.index("published reference") < entry.index("on a GPU:")


def test_the_sharding_check_is_stated_as_it_runs(synthetic):
    text = D.all_answers(synthetic)["3.4.5(a)"][0]
    assert "within 1% plus, from the second step on, one largest parameter's bytes" in text


def test_the_residual_stream_is_quoted_at_the_contexts_that_ran(tmp_path):
    rows, _ = D.notebook_01_rows()["01_memory_peaks"]
    rows = [r | {"size": "xl-2026/cpu", "context": t} for r in rows if r["size"] == D.SIZES[0] for t in (32, 512)]
    D.write(
        tmp_path, {"01_memory_peaks": (rows, dict(batch=4, context=128, memory_size="xl-2026/cpu", edition="2026"))}
    )
    text = A.answer(A.BY_NUMBER["2.4.1(d)"], A.Saved(tmp_path, "cpu")).text
    assert "at 4 × 32" in text and "at 4 × 512" in text and "× 128 here" not in text


def test_anchors_say_their_year_once_and_2024_follows_the_handouts_order(synthetic):
    page = render("cpu", synthetic)
    assert "2025-2025" not in page and "2026-2026" not in page and 'id="a2025-leaderboard"' in page
    order = re.findall(r'<div class="q [^"]*" id="a2024-([\d.]+)', page)
    assert order == sorted(order, key=lambda n: tuple(int(x) for x in n.split(".")))  # 2.4.1 after 2.3.1


def test_nsys_profile_parts_link_the_answers_that_answer_them():
    for year in (2025, 2026):
        got = {
            letter: [q.number for q in qs] for (p, letter), qs in handouts.covering(year).items() if p == "nsys_profile"
        }
        assert got == {"a": ["2.1.2(a)"], "b": ["nsys_profile"], "c": ["2.1.2(c)"], "d": ["nsys_profile"]} | {
            "e": ["nsys_profile"]
        }


def test_the_largest_allocations_answer_names_the_model_the_handout_asks(synthetic):
    got = A.answer(A.BY_NUMBER["2.4.1(e)"], A.Saved(synthetic, "cpu"))
    assert got.status == "partial" and "the 2024 handout asks 2.7B" in got.missing
