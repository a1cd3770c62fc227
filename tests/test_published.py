"""Published marks (helpers.published): each labelled with its source and year, a share that knows a time from a
bandwidth, "% of mark" only where comparable, and drawn on the plots that show them."""

import matplotlib
import pandas as pd
import pytest

from helpers.experiments import collectives, rmsnorm
from helpers.published import MARKS, draw_mark, share_column

matplotlib.use("Agg")


def test_every_mark_names_its_source_and_year():
    for m in MARKS.values():
        assert m.source in m.label and str(m.year) in m.label and m.value > 0 and m.setting, m


def test_a_share_is_the_fraction_of_the_mark_reached():
    assert MARKS["leaderboard_2025_best"].share(10.72) == pytest.approx(0.5)  # a time: twice as slow, half the speed
    assert MARKS["nccl_allreduce_h100"].share(185.0) == pytest.approx(0.5)  # a bandwidth
    assert share_column([185.0, 370.0], MARKS["nccl_allreduce_h100"], comparable=False) == [None, None]
    with pytest.raises(ValueError, match="positive"):
        MARKS["nccl_allreduce_h100"].share(0.0)


def test_a_mark_not_comparable_is_labelled_as_what_a_gpu_reaches():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    draw_mark(ax, MARKS["rmsnorm_quack"], comparable=False)
    (line,) = ax.get_lines()
    assert line.get_ydata()[0] == MARKS["rmsnorm_quack"].value and "what a GPU reaches" in line.get_label()
    plt.close(fig)


def test_the_collectives_plot_and_table_show_the_nccl_mark():
    import matplotlib.pyplot as plt

    rows = [
        {
            "backend": b,
            "device": d,
            "world_size": 2,
            "op": "all_reduce",
            "size_bytes": s,
            "time_s": 1e-3,
            "busbw_GBps": g,
            "wrong": 0,
        }
        for b, d, g in (("gloo", "cpu", 1.0), ("nccl", "cuda", 185.0))
        for s in (1024, 2048)
    ]
    df = pd.DataFrame(rows)
    fig = collectives.plot_collectives(df)
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    mark = MARKS["nccl_allreduce_h100"]
    assert any(mark.source in label and "not comparable" not in label for label in labels), labels  # NCCL ran
    plt.close(fig)
    t = collectives.mark_table(df)
    col = next(c for c in t.columns if c.startswith("% of mark"))
    assert t.loc[("nccl", "cuda", 2), col] == 50.0 and pd.isna(t.loc[("gloo", "cpu", 2), col])


def test_the_rmsnorm_table_compares_only_when_asked():
    big = pd.DataFrame([{"dtype": "float32", "pass": "fwd", "impl": "triton", "H": 4096, "GBps": 3015.0 / 2}])
    col = f"% of mark ({MARKS['rmsnorm_quack'].label})"
    assert rmsnorm.bandwidth_mark_table(big, MARKS["rmsnorm_quack"], True)[col].iloc[0] == 50.0
    assert pd.isna(rmsnorm.bandwidth_mark_table(big, MARKS["rmsnorm_quack"], False)[col].iloc[0])


def test_the_attention_and_plan_plots_carry_their_marks():
    import matplotlib.pyplot as plt

    from helpers import formulas
    from helpers.experiments import attention, fsdp

    board = [MARKS["leaderboard_2025_best"], MARKS["leaderboard_2025_naive"]]
    rows = pd.DataFrame(
        [
            {"impl": "flash_triton", "pass": "fwd+bwd", "median_ms": 10.72},
            {"impl": "naive", "pass": "fwd+bwd", "median_ms": 80.0},
        ]
    )
    t = attention.leaderboard_mark_table(rows, board, comparable=True)
    assert t.loc["flash_triton", f"% of {board[0].label}"] == 50.0 and t.loc["naive", f"% of {board[1].label}"] == 100.0
    assert attention.leaderboard_mark_table(rows, board, comparable=False).iloc[:, 1:].isna().all().all()
    fig = attention.plot_leaderboard_marks(rows, board, comparable=False)
    assert sum("not comparable" in line.get_label() for line in fig.axes[0].get_lines()) == 2
    plt.close(fig)
    plan, marks = formulas.leaderboard_plan(), [MARKS["leaderboard_2026_best"]]
    fig = fsdp.plot_plan(plan, marks)
    assert [line.get_ydata()[0] for line in fig.axes[0].get_lines()] == [3.837]
    plt.close(fig)
    table = fsdp.plan_table(plan, marks)
    assert len(table) == len(plan) and table[f"% of {marks[0].name}"].between(50, 200).all()
