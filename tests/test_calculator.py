"""helpers.calculator: the whole grid computed, each choice mapped to its own table, each piece of a table stored once
over the inputs it depends on, evenly spaced slider stops, ids unique per block, clear refusals, nothing from the
network; in Chromium when there is one (the page's script against the Python functions)."""

import itertools
import json
import re

import pandas as pd
import pytest

from helpers.calculator import MAX_COMBINATIONS, Calculator, evaluate, grid_table, page_grid
from helpers.experiments import fsdp as X
from helpers.experiments import sharding as S
from helpers.formulas import zero_memory
from helpers.model import count_parameters

INPUTS = {"model": ["small", "xl"], "world_size": [1, 2, 4, 8], "precision": ["mixed", "fp32"]}


def table_of(model, world_size, precision="mixed"):
    """A small table that differs for every combination."""
    return pd.DataFrame({"ranks": [world_size, 2 * world_size], "label": [model, precision]})


def compact(frame) -> str:
    """A table's HTML as the calculator stores it (no whitespace between tags)."""
    return re.sub(r">\s+<", "><", frame.to_html())


def page(calc) -> dict:
    """The parts of a rendered block: its HTML, the script's data, the table shown at first."""
    block = calc._repr_html_()
    return {
        "html": block,
        "data": json.loads(re.search(r"var data = (.*?);\n", block).group(1)),
        "shown": re.search(r'<div class="calc-output">(.*?)</div>', block, re.S).group(1),
    }


def test_every_combination_is_computed_once():
    calls = []
    calc = Calculator(lambda **kw: calls.append(kw) or table_of(**kw), INPUTS)
    grid = [dict(zip(INPUTS, combo, strict=True)) for combo in itertools.product(*INPUTS.values())]
    assert calls == grid  # row-major, the last input fastest
    assert len(calc.html) == len(grid) == 16 and page(calc)["data"]["sizes"] == [2, 4, 2]


def test_each_choice_maps_to_its_own_table():
    p = page(Calculator(table_of, INPUTS))
    for combo, positions in zip(
        itertools.product(*INPUTS.values()), itertools.product(*(range(len(v)) for v in INPUTS.values())), strict=True
    ):
        assert grid_table(p["data"], positions) == compact(table_of(*combo)), combo
    assert p["data"]["labels"][1] == ["1", "2", "4", "8"]
    assert "<template" not in p["html"]  # no table is stored whole: the script assembles them


def test_table_returns_the_choice_frame_with_defaults_for_the_rest():
    calc = Calculator(table_of, INPUTS, default={"model": "xl", "world_size": 4})
    pd.testing.assert_frame_equal(calc.table(), table_of("xl", 4, "mixed"))
    pd.testing.assert_frame_equal(calc.table(world_size=8, precision="fp32"), table_of("xl", 8, "fp32"))
    assert page(calc)["shown"] == compact(table_of("xl", 4, "mixed"))  # the default, before any script ran


def test_a_piece_is_stored_over_only_the_inputs_it_depends_on():
    calc = Calculator(lambda model, world_size, precision: table_of(model, world_size), INPUTS)  # precision ignored
    varying = [part for part in page(calc)["data"]["parts"] if not isinstance(part, str)]
    axes = sorted(tuple(a) for a, _ in varying)
    assert axes == [(0,), (1,), (1,)], axes  # the model's label; world_size and 2 × world_size; never precision
    assert all(len(indices) == len(INPUTS[list(INPUTS)[a[0]]]) for a, indices in varying)
    pool = page(calc)["data"]["pool"]
    assert len(pool) == len(set(pool)) and {"small", "xl", "1", "16"} <= set(pool)


def test_tables_of_different_layouts_are_stored_whole_each_once():
    def rows(n, flag):
        return pd.DataFrame({"x": range(n)})  # flag ignored: 3 distinct tables over 6 combinations

    calc = Calculator(rows, {"n": [1, 2, 3], "flag": ["a", "b"]})
    data = page(calc)["data"]
    assert len(data["pool"]) == 3 and data["parts"] == [[[0], [0, 1, 2]]]
    for i, positions in enumerate(itertools.product(range(3), range(2))):
        assert grid_table(data, positions) == calc.html[i]


def test_the_grid_puts_back_any_table_and_refuses_a_wrong_count():
    tables = ["<b>1</b><i>x</i>", "<b>2</b><i>x</i>", "<b>1</b><i>y</i>", "<b>2</b><i>y</i>"]
    grid = page_grid(tables, [2, 2])
    assert [grid_table(grid, p) for p in itertools.product(range(2), range(2))] == tables
    assert grid["parts"][0] == "<b>" and grid["parts"][2] == "</b><i>"  # constant runs: one string
    with pytest.raises(ValueError, match=r"4 tables for 3 × 2 = 6 combinations"):
        page_grid(tables, [3, 2])


def test_powers_of_two_get_evenly_spaced_stops():
    sizes = [2**i for i in range(11)]
    p = page(Calculator(table_of, {"model": ["xl"], "world_size": sizes}, default={"world_size": 8}))
    slider = re.search(r'<input type="range"[^>]*>', p["html"]).group(0)
    assert 'data-input="world_size"' in slider
    assert re.search(r'min="0"', slider) and re.search(r'max="10"', slider) and re.search(r'step="1"', slider)
    assert 'value="3"' in slider  # 8 is the 4th stop of 11, not at 7/1023 of the way
    assert re.search(r"<output[^>]*>8</output>", p["html"])
    assert '<select id="' in p["html"] and 'data-input="model"' in p["html"]  # strings: a drop-down


def test_labelled_choices_and_named_inputs_show_labels_and_pass_values():
    calc = Calculator(
        X.strategies_table,
        {"model": ["xl"], "world_size": [8], "gpu_bytes": {"40 GB": 40e9, "80 GB": 80e9}},
        names={"gpu_bytes": "GPU memory"},
    )
    block = calc._repr_html_()
    assert re.search(r"<output[^>]*>40 GB</output>", block) and re.search(r"<label[^>]*>GPU memory</label>", block)
    assert re.search(r"<label[^>]*>world size</label>", block)  # unnamed: the keyword, spaced
    pd.testing.assert_frame_equal(calc.table(gpu_bytes=80e9), X.strategies_table("xl", 8, 80e9))


def test_two_blocks_have_distinct_ids():
    first, second = Calculator(table_of, INPUTS)._repr_html_(), Calculator(table_of, INPUTS)._repr_html_()
    ids = re.findall(r'\bid="([^"]+)"', first + second)
    assert len(ids) == 2 * (1 + len(INPUTS)) and len(set(ids)) == len(ids)
    root = re.match(r'<div class="calc" id="([^"]+)">', first).group(1)
    assert json.dumps(root) in first  # its script finds its own root


def test_too_many_combinations_are_refused_before_computing():
    calls = []
    with pytest.raises(ValueError, match=r"100 × 100 = 10000 combinations .* more than the 5000 .* fewer choices"):
        Calculator(lambda a, b: calls.append(1), {"a": list(range(100)), "b": list(range(100))})
    assert not calls and MAX_COMBINATIONS == 5000


@pytest.mark.parametrize(
    "inputs, default, message",
    [
        (
            {"model": ["xl"], "world_size": [1], "ranks": [1]},
            None,
            r"do not fit table_of.*unexpected keyword argument 'ranks'",
        ),
        ({"precision": ["fp32"]}, None, r"do not fit table_of.*missing a required argument"),
        ({"model": [], "world_size": [1]}, None, r"'model' has no choices"),
        ({"model": ["xl", "xl"], "world_size": [1]}, None, r"same label twice"),
        ({"model": ["xl"], "world_size": [1]}, {"world_size": 3}, r"3 is not a choice of 'world_size'.*\[1\]"),
        ({"model": ["xl"], "world_size": [1]}, {"ranks": 3}, r"no input named \['ranks'\]"),
        ({}, None, r"at least one input"),
    ],
)
def test_bad_inputs_get_clear_errors(inputs, default, message):
    with pytest.raises(ValueError, match=message):
        Calculator(table_of, inputs, default=default)
    with pytest.raises(ValueError, match=r"names given for \['ranks'\], which are not inputs"):
        Calculator(table_of, INPUTS, names={"ranks": "ranks"})


def test_bad_results_name_the_combination():
    with pytest.raises(TypeError, match=r"returned a dict; a calculator shows pandas DataFrames"):
        Calculator(lambda n: {"n": n}, {"n": [1, 2]})  # a dict, but not of rows
    with pytest.raises(ValueError, match=r"\(\*\*\{'n': 0\}\) failed: division by zero"):
        Calculator(lambda n: pd.DataFrame({"x": [1 / n]}), {"n": [1, 0]})


def test_rows_as_plain_data_become_a_table():
    calc = Calculator(lambda n: {"a": {"x": n / 3}, "b": {"x": 2.0}}, {"n": [1, 2]})
    pd.testing.assert_frame_equal(calc.table(n=1), pd.DataFrame({"x": [0.333, 2.0]}, index=["a", "b"]))


def test_the_memory_calculator_with_presets_recomputation_and_pipeline():
    """formulas.memory_calculator: sharding and pipeline stages divide the states, recomputation cuts activations in
    the published ratios (Korthikanti et al., 2022), 1F1B keeps min(pp, m) micro-batches, the bubble (pp-1)/(m+pp-1)."""
    from helpers import formulas as F

    assert {"small", "xl", "2.7B", "2026 leaderboard"} <= set(F.CALCULATOR_PRESETS)
    assert F.preset_params("2026 leaderboard") + F.LEADERBOARD_MODEL["d_model"] * (2 * 34 + 1) == sum(
        F.llama_params(**F.LEADERBOARD_MODEL).values()
    )  # the same model less its norm gains
    base = dict(preset="Llama-3-8B-like (MHA)", dp=8, pp=1, micro_batch=1, n_micro=8)
    none, sel, full = (F.memory_calculator(**base, recompute=r) for r in F.RECOMPUTATION)
    psi = F.preset_params("Llama-3-8B-like (MHA)")
    assert none["DDP (ZeRO-0)"]["model states (GB)"] == pytest.approx(16 * psi / 1e9)
    assert none["ZeRO-3"]["model states (GB)"] == pytest.approx(16 * psi / 8 / 1e9)
    assert sel["ZeRO-1"]["activations (GB)"] / full["ZeRO-1"]["activations (GB)"] == pytest.approx(17)  # 34 / 2
    assert none["ZeRO-1"]["activations (GB)"] > sel["ZeRO-1"]["activations (GB)"]
    piped = F.memory_calculator(**{**base, "pp": 4}, recompute="full")
    assert piped["DDP (ZeRO-0)"]["model states (GB)"] == pytest.approx(16 * psi / 4 / 1e9)
    assert piped["DDP (ZeRO-0)"]["pipeline bubble"] == pytest.approx(3 / 11)
    assert piped["DDP (ZeRO-0)"]["activations (GB)"] == pytest.approx(full["DDP (ZeRO-0)"]["activations (GB)"])
    with pytest.raises(ValueError, match="recompute must be one of"):
        F.memory_calculator(**base, recompute="some")
    with pytest.raises(ValueError, match="unknown preset"):
        F.memory_calculator(**{**base, "preset": "gpt-5"}, recompute="full")


def test_styler_results_render_and_table_returns_the_data():
    calc = Calculator(lambda n: pd.DataFrame({"x": [n]}).style.format("{:.1f}"), {"n": [1, 2]})
    pd.testing.assert_frame_equal(calc.table(n=2), pd.DataFrame({"x": [2]}))
    assert "2.0" in calc._repr_html_()


def test_text_is_escaped_and_nothing_comes_from_the_network():
    calc = Calculator(table_of, {"model": ["</script><b>", "xl"], "world_size": [1]}, title="a < b", note="10⁹")
    block = calc._repr_html_()
    assert block.count("</script>") == 1 and "&lt;/script&gt;&lt;b&gt;" in block and "a &lt; b" in block
    assert not re.search(r"https?:|wss?:|//[a-z]|\bsrc=|\bhref=|@import", block, re.I)


def test_notebook_tables_state_their_unit():
    """Notebooks 05 and 07's calculator tables: every memory column says GB, which is 10⁹ bytes."""
    zero, strat = S.zero_table("xl", 8, "mixed"), X.strategies_table("xl", 8, 80e9)
    for frame in (zero, strat):
        numeric = frame.select_dtypes("number").columns
        assert len(numeric) >= 4 and all(c.endswith("(GB)") for c in numeric), list(frame.columns)
    exact = zero_memory("xl", 8, 3, "mixed")
    assert zero.loc[3, "total (GB)"] == pytest.approx(exact["total"] / 1e9, abs=1e-4)
    assert strat.loc["DDP", "left on GPU (GB)"] == pytest.approx(80 - strat.loc["DDP", "total (GB)"], abs=2e-4)


# ---- in a real browser ----


@pytest.mark.ci  # drives Chromium: make test-ci (tests/browser.py)
def test_two_calculators_on_one_page_work_offline_and_apart(tmp_path):
    browser = pytest.importorskip("browser", reason="tests/browser.py (headless Chromium helpers)")
    if not (browser.CHROMIUM and browser.CHROMEDRIVER):
        pytest.skip("no Chromium/chromedriver on PATH")
    from selenium.webdriver.common.by import By

    first = Calculator(table_of, INPUTS, default={"world_size": 2})
    second = Calculator(table_of, INPUTS, default={"model": "xl"})
    path = tmp_path / "two.html"
    path.write_text(
        f'<!doctype html><html><head><meta charset="utf-8"></head><body>{first._repr_html_()}'
        f"{second._repr_html_()}</body></html>",
        encoding="utf-8",
    )
    driver = browser.start_chrome(offline=True)
    try:
        browser.visit(driver, path.as_uri())
        a, b = driver.find_elements(By.CSS_SELECTOR, ".calc")
        out = {calc: calc.find_element(By.CSS_SELECTOR, ".calc-output") for calc in (a, b)}
        b_before = out[b].get_attribute("innerHTML")
        slider = a.find_element(By.CSS_SELECTOR, '[data-input="world_size"]')
        assert browser.change_input(driver, slider)  # to its far end: 8 ranks
        assert out[a].get_attribute("innerHTML") == compact(table_of("small", 8, "mixed"))
        assert a.find_element(By.CSS_SELECTOR, "output").text == "8"
        assert browser.change_input(driver, a.find_element(By.CSS_SELECTOR, '[data-input="precision"]'))
        assert out[a].get_attribute("innerHTML") == compact(table_of("small", 8, "fp32"))
        assert out[b].get_attribute("innerHTML") == b_before == compact(table_of("xl", 1, "mixed"))  # untouched
        assert browser.exercise_calc(driver, b) == {name: True for name in INPUTS}
        assert browser.console_errors(driver) == [] and browser.remote_requests(driver) == []
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def notebook_calculators():
    """Notebook 07's two calculators over their full grids (825 and 1,440 combinations), built once."""
    from helpers.experiments import fsdp_plans

    return [fsdp_plans.strategies_calculator(), fsdp_plans.memory_calculator()]


def test_notebook_calculators_page_is_small_and_gives_back_every_table(notebook_calculators):
    """Issue 41: 825 precomputed tables made notebook 07's page 2.4 MB. The grid gives back every combination's table
    exactly (grid_table mirrors the page's script), in under 100 kB per calculator (each was 0.7-1.1 MB)."""
    for calc in notebook_calculators:
        block = calc._repr_html_()
        assert len(block.encode()) < 100_000, (calc, len(block.encode()))
        data = json.loads(re.search(r"var data = (.*?);\n", block).group(1))
        combos = itertools.product(*(range(n) for n in data["sizes"]))
        assert all(grid_table(data, p) == calc.html[i] for i, p in enumerate(combos)), calc


@pytest.mark.ci  # drives Chromium: make test-ci (tests/browser.py)
def test_the_page_script_gives_the_python_closed_forms_in_chromium(notebook_calculators, tmp_path):
    """Notebook 07's calculators, offline, full grids: every input changes the table, and at 12 random choices per
    calculator the table the page's script assembles is the one the Python function returns for those inputs."""
    browser = pytest.importorskip("browser", reason="tests/browser.py (headless Chromium helpers)")
    if not (browser.CHROMIUM and browser.CHROMEDRIVER):
        pytest.skip("no Chromium/chromedriver on PATH")
    import random

    from selenium.webdriver.common.by import By

    path = tmp_path / "calculators.html"
    blocks = "".join(calc._repr_html_() for calc in notebook_calculators)
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"></head><body>{blocks}</body></html>', "utf-8")
    rng = random.Random(41)
    driver = browser.start_chrome(offline=True)
    try:
        browser.visit(driver, path.as_uri())
        for calc, block in zip(notebook_calculators, driver.find_elements(By.CSS_SELECTOR, ".calc"), strict=True):
            assert browser.exercise_calc(driver, block) == {c.name: True for c in calc.inputs}
            for _ in range(12):
                positions = [rng.randrange(len(c.values)) for c in calc.inputs]
                shown = driver.execute_script(
                    """const [root, positions] = arguments;
                    root.querySelectorAll("[data-input]").forEach((control, i) => {
                        control.value = String(positions[i]);
                        control.dispatchEvent(new Event("change"));
                    });
                    return root.querySelector(".calc-output").innerHTML;""",
                    block,
                    positions,
                )
                kwargs = {c.name: c.values[p] for c, p in zip(calc.inputs, positions, strict=True)}
                assert shown == compact(evaluate(calc.fn, kwargs)), kwargs  # a fresh call of the Python function
        assert browser.console_errors(driver) == [] and browser.remote_requests(driver) == []
    finally:
        driver.quit()


# ---- the 2025/2026 closed forms in the handouts' terms (issue 32: each figure derived by hand, then checked here) ----

from helpers import formulas as F  # noqa: E402


def test_communication_accounting_2025_uses_the_mesh_links():
    """C/(W·M_X) with C 4.6e14, W 1.8e11, M_X 2: 1,278 tokens per FSDP shard, 319 per device (Y 4), 20.4k overall."""
    b = F.xxl_compute_bound()
    assert round(b["per_fsdp_shard"]) == 1278 and round(b["per_device"]) == 319 and round(b["overall"]) == 20444
    assert b["tp_ok"] and round(b["tp_min_d_ff"]) == 10222  # F = 53,248 >= Y·C/(W·M_Y)
    assert F.xxl_compute_bound_tokens(n_tp=4) == pytest.approx(319.44, abs=0.01)  # notebook 07 prints this × 64
    assert F.xxl_compute_bound_tokens(n_tp=4) * 64 == pytest.approx(20_444, abs=1)  # not 40,889
    # collectives summed, not overlapped: 4BDF/(XYC) >= 4DF/(Y·W·M_X) + 4BD/(X·W·M_Y), solved for B by hand
    C, W, Fd = 4.6e14, 1.8e11, 53_248
    by_hand = (Fd / (4 * W * 2)) / (Fd / (16 * 4 * C) - 1 / (16 * W * 1))
    assert b["overall_summed"] == pytest.approx(by_hand) and round(b["overall_summed"]) == 25_302
    moved = F.xxl_compute_bound(X=8, Y=8)  # the same 64 chips, half of them moved from FSDP to TP
    assert round(moved["overall"]) == 10_222 and moved["tp_ok"]
    assert F.xxl_compute_bound(d_ff=1000)["overall_summed"] == float("inf")  # TP alone communication-bound


def test_communication_accounting_2025_memory():
    assert F.xxl_activation_bytes_per_token() == 126 * 2 * (16_384 + 53_248) == 17_547_264  # 17.5 MB per token
    assert F.xxl_memory(0)["states"] == pytest.approx(3.5176e12, rel=1e-4)
    cap = F.xxl_max_tokens()
    assert round(cap) == 10_828  # 2 · 95e9 / 17,547,264: no N fits above
    assert F.xxl_min_fsdp(int(cap)) is not None and F.xxl_min_fsdp(int(cap) + 1) is None


def test_gradient_checkpointing_2026_xl_and_the_least_memory():
    xl = F.get_config("xl-2026", context_length=2048)
    assert (xl.d_model, xl.d_ff, xl.n_layers, xl.n_heads) == (2560, 10240, 32, 32)
    assert F.get_config("xl").d_model == 1600  # the 2024/2025 xl keeps its meaning
    block_in = F.residual_stream_bytes(4, 2048, xl.d_model)  # I: one block's input
    A = F.activation_bytes(xl, 4, 2048)["blocks"] / xl.n_layers
    # the handout's block as the staff code computes it (issue 49): SwiGLU with silu = x·sigmoid(x) saves five
    # d_ff-wide tensors, softmax = exp / sum the exp and the output (B·H·T² each), the sum (B·H·T) and the max's
    # int64 indices (B·H·T): (10R + 2BT + 5BT·d_ff + 2BHT² + BHT)·4 + 8BHT + T², R = B·T·d; about 6.35 GiB
    B, T, H, R = 4, 2048, 32, 4 * 2048 * 2560
    assert A == (10 * R + 2 * B * T + 5 * B * T * 10240 + 2 * B * H * T**2 + B * H * T) * 4 + 8 * B * H * T + T**2
    assert round(A / 2**30, 2) == 6.35
    k, best = F.best_segment(xl.n_layers, block_in, A)
    assert round(k, 2) == 0.63 and best == 1  # k* = sqrt(L·I/A); 0.79 with our fused block's 4.04 GiB
    s = F.checkpoint_strategies(12)
    assert (s["nested"]["memory_blocks"], s["sqrt"]["memory_blocks"], s["prefix"]["memory_blocks"]) == (5, 7, 2)
    assert min(s, key=lambda name: s[name]["memory_blocks"]) == "prefix"
    assert F.checkpoint_strategies(64)["prefix"]["forward_passes"] * 64 == 64 + 64 * 63 / 2  # O(N²) block forwards


def test_fsdp_accounting_2026_xl_on_two_gpus():
    psi = F.basics_params("xl-2026")
    assert psi == count_parameters("xl-2026")  # the closed form is the zoo's basics model
    assert psi == 32 * (4 * 2560**2 + 3 * 2560 * 10240 + 2 * 2560) + 2 * 10_000 * 2560 + 2560
    st = F.sharded_state_bytes(psi, 2)
    assert round((st["DDP"] - st["FSDP"]) / 1e9, 1) == 27.3 and round((st["ZeRO-1"] - st["FSDP"]) / 1e9) == 14


EX = F.CALC_EXAMPLE


def test_tp_forward_bound_is_tighter_than_backward():
    fwd, bwd = (F.tp_calc(p, **EX) for p in ("forward", "backward"))
    assert round(fwd.example["max_devices"], 1) == 12.2 and round(bwd.example["max_devices"], 1) == 23.4
    for c in (fwd, bwd):  # at the bound, compute equals communication; one device more and it is comm-bound
        n = int(c.example["max_devices"])
        assert not F.tp_calc(c.part, **{**EX, "N": n}).example["comm_bound"]
        assert F.tp_calc(c.part, **{**EX, "N": n + 1}).example["comm_bound"]
    assert "1.5·D_FF·W/C" in fwd.inequality and "3·D_FF·W/C" in bwd.inequality


@pytest.mark.parametrize("calc", [F.dp_calc, F.fsdp_calc])
def test_dp_and_fsdp_bounds_in_n(calc):
    bwd = calc("backward", **EX)
    bound = 1 + EX["B"] * EX["W"] / EX["C"]
    assert bwd.example["max_devices"] == pytest.approx(bound)
    assert not calc("backward", **{**EX, "N": int(bound)}).example["comm_bound"]
    assert calc("backward", **{**EX, "N": int(bound) + 1}).example["comm_bound"]
    assert bwd.example["flops"] == 12 * EX["B"] * EX["D"] * EX["D_FF"] / EX["N"]
    assert F.dp_calc("forward", **EX).example["bytes_sent"] == 0


def test_fsdp_tp_forward_parts():
    kw = dict(B=EX["B"], D=EX["D"], D_FF=EX["D_FF"], C=EX["C"], W=EX["W"])
    a = F.fsdp_tp_calc("(a)", N_FSDP=2, N_TP=4, **kw)
    assert a.example["flops"] == 6 * EX["B"] * EX["D"] * EX["D_FF"] / 8
    b = F.fsdp_tp_calc("(b)", N_FSDP=2, N_TP=4, **kw)
    assert b.example["comm_s"] == max(b.example["fsdp_comm_s"], b.example["tp_comm_s"])
    c, d = (F.fsdp_tp_calc(p, N_FSDP=2, N_TP=4, **kw) for p in ("(c)", "(d)"))
    r = EX["W"] / EX["C"]
    assert c.example["max_devices"] == pytest.approx(1.5 * EX["B"] * EX["D_FF"] * r**2)
    assert d.example["max_devices"] == pytest.approx(3 * EX["B"] * EX["D_FF"] * r**2 / 8)
    # (d) is the largest product under the summed constraint 6·F·n_f + 4·B·n_t <= 6·B·F·W/C (searched on a grid)
    budget = 6 * EX["B"] * EX["D_FF"] * r
    best = max(
        n_f * (budget - 6 * EX["D_FF"] * n_f) / (4 * EX["B"])
        for n_f in (i * budget / (6 * EX["D_FF"]) / 1000 for i in range(1001))
    )
    assert best == pytest.approx(d.example["max_devices"], rel=1e-5)
    with pytest.raises(ValueError, match="parts"):
        F.fsdp_tp_calc("(e)", N_FSDP=2, N_TP=4, **kw)


def test_every_2026_calculator_part_has_an_expression_an_inequality_and_math():
    parts = F.calc_parts(**EX)
    assert [(c.problem, c.part) for c in parts] == [
        (p, s) for p in ("data_parallel_calcs", "fsdp_calcs", "tp_calcs") for s in ("forward", "backward")
    ] + [("fsdp_tp_calcs", s) for s in ("(a)", "(b)", "(c)", "(d)")]
    for c in parts:
        assert c.expressions and c.latex and c.example
        md = c._repr_markdown_()
        assert md.startswith(f"**{c.problem} · {c.part}**") and "$$" in md
    bounds = [c for c in parts if c.inequality != "—"]
    assert all("≤" in c.inequality or c.inequality == "always compute-bound" for c in bounds)
