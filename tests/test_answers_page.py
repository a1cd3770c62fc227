"""The answers page built from data folders: from the synthetic one every answer is measured and reads only what its
question lists, a faster side is named only outside the noise, the page is self-contained with stable anchors and
honest counts; an empty folder gives "not measured" everywhere, another profile's or an old format's results are not
used; a GPU line follows what was measured. (Coverage of the questions: test_answers.py; the sentences:
test_answers_sentences.py.)"""

import re
from pathlib import Path

import answers_data as D
import pytest

from helpers.course import answers as A
from helpers.experiments import benchmarking
from helpers.experiments import rmsnorm as XR
from helpers.timing import Comparison, Ratio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Every result the answers read (answers_data.synthetic_folder: built once per session)."""
    return D.synthetic_folder(tmp_path_factory)


def test_every_answer_is_measured_from_the_synthetic_folder(synthetic):
    got = D.all_answers(synthetic)
    unmeasured = {n: text for n, (text, ok) in got.items() if not ok}
    assert not unmeasured, unmeasured
    assert "small/cpu 10 ms / 20 ms / 30 ms" in got["2.1.1(b)"][0]  # the rows' own numbers
    assert "3.0x the warm median" in got["2.1.1(c)"][0]


def test_each_answer_reads_only_the_results_its_question_lists(synthetic):
    for q in A.QUESTIONS:
        saved = A.Saved(synthetic, "cpu")
        assert A.answer(q, saved).measured, q.number
        listed = set(q.reads) | set(q.also_reads)
        assert set(saved.used) <= listed, (q.number, set(saved.used) - listed)


def test_inside_the_noise_no_winner_outside_it_the_faster(synthetic):
    text = D.all_answers(synthetic)["2.1.5(a)"][0]
    forward = text.split("Forward+backward")[0]
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops) for H 256" in forward  # outside the noise
    assert "no measurable difference between them for H 1024" in forward  # inside it
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops) for every" not in forward
    assert "LayerNorm is measurably faster than RMSNorm (PyTorch ops)" in A.compare_text(
        "RMSNorm (PyTorch ops)", "LayerNorm", Ratio(2.5, 2.4, 2.6, 10)
    )
    autocast = D.all_answers(synthetic)["2.1.4(a)"][0]
    assert autocast.startswith("Forward+backward: fp32 is measurably faster than autocast bfloat16 for every size")


def test_sharding_speed_names_no_winner_without_a_paired_ratio(synthetic, tmp_path):
    got = D.all_answers(synthetic)
    assert "Unsharded is measurably faster than ShardedOptimizer" in got["3.4.5(b)"][0]  # 0.95 s vs 0.9 s
    assert "1.500Ψ" in got["3.4.5(c)"][0]  # the counted table, when saved
    D.write(tmp_path, {"05_sharding_speed": (D.sharding_speed, dict(model=D.SIZES[1]))})
    got = A.answer(A.BY_NUMBER["3.4.5(b)"], A.Saved(tmp_path, "cpu"))
    text, ok = got.text, got.measured
    assert ok and "no faster or slower is claimed" in text and "measurably" not in text


def test_triton_is_said_to_be_gpu_only_when_it_was_not_timed(synthetic):
    got = D.all_answers(synthetic)
    assert "not timed" in got["2.2.1(a)"][0] and "interpreter" in got["2.2.1(a)"][0]


def test_a_triton_timing_when_there_is_one(tmp_path):
    shapes = {
        ("float32", 4096): D.comparison(
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
    D.write(tmp_path, {"rmsnorm_ratios": (XR.ratio_rows(shapes, ("dtype", "H")), {})}, profile="gpu")
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
    counts = header_counts(page)
    for y, per in counts.items():  # each edition's column counts every answer its map links, once
        assert sum(per.values()) == len(A.page.edition_questions(y)), (y, per)
    assert "profile: <b>cpu</b>" in page


def header_counts(page: str) -> dict[int, dict[str, int]]:
    """The header's table: edition -> status (STATUSES' text before its colon) -> count."""
    table = re.search(r'<table class="statuses">(.*?)</table>', page, re.S).group(1)
    years = [int(y) for y in re.findall(r"<th>(\d{4}) \(", table)]
    rows = re.findall(r"<tr><td>([^:<]+):[^<]*</td>((?:<td>\d+</td>)+)</tr>", table)
    return {y: {k: int(re.findall(r"\d+", cells)[i]) for k, cells in rows} for i, y in enumerate(years)}


def test_the_header_counts_four_statuses_honestly(synthetic):
    from helpers.course.answers.page import status_counts

    saved = A.Saved(synthetic, "cpu")
    got = {q.number: A.answer(q, saved) for q in A.QUESTIONS}
    counts = status_counts(got)
    assert set(counts) == set(A.STATUSES) and sum(counts.values()) == len(A.QUESTIONS)
    assert got["2.2.1(a)"].status == "needs a GPU"  # "the Triton kernel was not timed" is not an answer
    assert got["2.2.4(a)"].status == "partial" and got["2.2.4(a)"].missing
    assert got["nsys_profile"].status == "partial" and got["communication_accounting(c)"].status == "closed form"
    assert got["3.2.1"].status == "partial"  # the rehearsal is not the two-node measurement it asks
    assert got["2.1.1(a)"].status == "measured" and counts["not run"] == 0
    # statuses from what ran: the configuration that ran against the handout's, each shortfall named
    assert got["2.1.1(b)"].status == "partial" and "2/6 of the handout's 5/10" in got["2.1.1(b)"].missing
    assert "ran 2 of the 5" in got["2.1.1(b)"].missing and "6 of the handout's 10" in got["2.1.1(c)"].missing
    assert "widths H ran: 256, 1024 of the handout's 1024, 2048, 4096, 8192" in got["2.3.1(a)"].missing
    assert "1 of the handout's 20" in got["torch_compile(a)"].missing and got["2.1.4(a)"].status == "partial"


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
    got = D.all_answers(tmp_path)
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
    for y, counts in header_counts(page).items():
        asked = {q.number for q in A.page.edition_questions(y)}
        assert counts["not run yet"] + counts["needs a GPU"] == len(asked - computed), (y, counts)


def test_results_of_the_other_profile_are_not_used(tmp_path):
    D.write(tmp_path, {"01_timing": D.notebook_01_rows()["01_timing"]}, profile="gpu")
    got = A.answer(A.BY_NUMBER["2.1.1(b)"], A.Saved(tmp_path, "cpu"))
    text, ok = got.text, got.measured
    assert not ok and "gpu-profile run" in text


def test_a_saved_result_in_an_old_format_does_not_break_the_page(tmp_path):
    D.write(
        tmp_path,
        {
            "01_timing": ([{"size": "small/8", "status": "ok"}], {}),
            "05_sharding_memory": ([{"model": "xl/8", "kind": "unsharded"}], dict(world_size=2)),
        },
    )
    got = D.all_answers(tmp_path)
    assert not got["2.1.1(b)"][1] and "lack what this answer reads" in got["2.1.1(b)"][0]
    assert not got["3.4.5(c)"][1]


def test_write_page_refuses_an_unknown_profile(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        A.write_page(tmp_path / "a.html", "tpu", tmp_path)


@pytest.mark.parametrize(
    "medians, says, never",
    [
        (
            {"fp32": 1.0, "autocast bfloat16": 0.6},
            "measurably faster at each of the 2 sizes timed here",
            "measurably slower",
        ),
        ({"fp32": 1.0, "autocast bfloat16": 1.3}, "Does not carry over", "faster at"),
    ],
)
def test_the_autocast_gpu_line_follows_what_was_measured(tmp_path, medians, says, never):
    precision = {s: Comparison({k: D.samples(m) for k, m in medians.items()}, "fp32", "cpu") for s in D.SIZES}
    D.write(tmp_path, {"01_precision_ratios": (benchmarking.precision_ratios(precision), {})})
    got = A.answer(A.BY_NUMBER["2.1.4(a)"], A.Saved(tmp_path, "cpu"))
    assert got.measured and says in got.gpu and never not in got.gpu, got.gpu


def test_the_leaderboards_give_the_share_of_the_published_mark(synthetic, tmp_path):
    got = D.all_answers(synthetic)
    assert "67% of the best class entry's speed (5.36 ms)" in got["2025 leaderboard"][0]  # 5.36 / 8.0
    assert "sdpa is measurably faster" not in got["2025 leaderboard"][0]
    text, ok = D.all_answers(tmp_path)["2025 leaderboard"]  # nothing saved: the command that can, and the arithmetic
    assert not ok and "python -m helpers bench attention" in text and "TFLOP per forward+backward" in text
    board = got["2026 leaderboard"][0]
    assert "implies MFU 27%-35%" in board and "self-reported" in board and "10% of the card free" in board
    # the tie rule and the chosen plan: tests/test_answers_closed_forms.py


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


def test_each_later_map_lists_exactly_its_handouts_parts_and_every_answer_links_back(synthetic):
    """2025/2026 maps: one row per part the handout asks (handouts.PARTS), none it does not (2024's
    minimal_ddp_benchmarking and overlap part (c) are not in the later handouts); every answer links back to each map
    that links it."""
    from helpers.course.answers import handouts as H
    from helpers.course.answers import page as P

    page = P.render("cpu", synthetic)
    maps = {y: re.search(rf'<table class="map" id="map{y}">.*?</table>', page, re.S).group(0) for y in P.EDITIONS}
    for year in (2025, 2026):
        labels = re.findall(r"<tr><td><code>([^<]+)</code></td>", maps[year])
        assert labels == [P._handout_id(*part) for part in H.parts(year)], year
        assert "minimal_ddp_benchmarking" not in maps[year]
        assert "ddp_overlap_individual_parameters_benchmarking (c)" not in maps[year]
    assert "<code>nsys_profile (e)</code>" in maps[2026] and "<code>mixed_precision_accumulation</code>" in maps[2026]
    tp_d = re.search(r"<code>tp_calcs \(d\)</code></td><td>(.*?)</td>", maps[2026]).group(1)
    assert 'href="#a2026-tp_calcs-b"' in tp_d or "tp_calcs(b)" in tp_d
    assert "ddp_bucketed_benchmarking" in maps[2025] and "ddp_bucketed_benchmarking" not in maps[2026]
    assert page.count("B for the global batch in tokens") == 1  # the calculators' variables, said once
    for q in A.QUESTIONS:
        anchor = P.answer_id(q)
        entry = re.search(rf'<div class="q [^"]*" id="{re.escape(anchor)}">.*?</div>', page, re.S).group(0)
        back = set(re.findall(r'<a href="#map(\d{4})">', entry))
        linked = {str(y) for y, m in maps.items() if f'href="#{anchor}"' in m}
        assert back == linked and back, (q.number, back, linked)


def test_one_edition_per_build_counted_per_edition_and_said_once(tmp_path):
    from helpers.course.answers.page import render, status_counts

    rows = D.notebook_01_rows()
    rows["01_timing"] = (rows["01_timing"][0], {**rows["01_timing"][1], "edition": "2026"})
    folder = D.write(tmp_path, rows)
    saved = A.Saved(folder, "cpu")
    got = {q.number: A.answer(q, saved) for q in A.QUESTIONS}
    assert got["2.1.1(b)"].for_edition(2024) == ("partial", "the 2026 edition's model ran")
    per = {y: status_counts(got, y) for y in (2024, 2026)}
    plain = {y: status_counts({n: a.__class__(**{**a.__dict__, "model": ""}) for n, a in got.items()}, y) for y in per}
    assert per[2024]["partial"] > plain[2024]["partial"] and per[2026]["partial"] == plain[2026]["partial"]
    page = render("cpu", folder)
    assert "run it again" not in page and 'set EDITION = "' not in page  # no repeated clause on every answer
    top_2024 = page[page.index('id="e2024"') : page.index('id="map2024"')]
    assert "Model that ran: the 2026 edition's" in top_2024 and "make writeup EDITION=2024" in top_2024
    assert "this edition's own" in page[page.index('id="e2026"') : page.index('id="map2026"')]
    assert "<th>2024 (" in page and "<th>2026 (" in page  # the header counts each edition's answers
