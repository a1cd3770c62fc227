"""Notebook 06 §4's cost sections: the kernels' closed forms at the leaderboard shape, and measured passes as a
fraction of peak (issue 50 item 3)."""

import dataclasses

import pandas as pd
import pytest

from helpers.attention import attention_flops
from helpers.experiments import attention as X
from helpers.experiments import attention_costs as C
from helpers.section import Result


def test_the_kernel_table_agrees_with_the_forwards_flop_count_and_the_split_backward():
    r = C.kernel_cost_section(X.setup("cpu"))
    B, H, T, d = (C.LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    fwd = attention_flops(B * H, T, T, d, True)  # the count every TFLOP/s in notebook 06 uses
    assert r.values["GFLOP"]["fwd"] * 1e9 == pytest.approx(fwd, rel=1 / T)  # T(T+1)/2 kept pairs against T^2/2
    assert r.values["backward_over_forward"] == 3.5  # dK/dV 8d + dQ 6d per pair over the forward's 4d
    assert (r.table["GFLOP computed"] >= r.table["GFLOP"]).all()  # diagonal tiles are computed whole
    floor_ms = sum(r.values["GFLOP"].values()) * 1e9 / C.peak_flops(C.YARDSTICK, "bf16") * 1e3
    assert f"cannot take less than {floor_ms:.2f} ms" in r.notes[2]  # 2.50 ms: the FLOPs at the bf16 peak


def test_measured_passes_are_held_under_the_devices_peak():
    rows = pd.DataFrame(
        [dict(impl=i, dtype="bfloat16", T=4096, d=64, ms=1.0, TFLOPs=t, **{"pass": "fwd+bwd"}) for i, t in
         (("flash_triton", 500.0), ("sdpa", 600.0), ("naive", 100.0))]
    )  # fmt: skip
    h100 = dataclasses.replace(X.setup("cpu"), device_name="NVIDIA H100 80GB HBM3")
    r = C.pass_rate_section(h100, Result(None, values={"rows": rows}))
    assert set(r.values["rows"]["impl"]) == {"flash_triton", "sdpa"}  # ours (compiled where timed) and SDPA
    assert r.values["rows"]["of peak"].round(3).tolist() == [round(500 / 989, 3), round(600 / 989, 3)]
    B, H, T, d = (C.LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
    both = attention_flops(B * H, T, T, d, True) + attention_flops(B * H, T, T, d, True, backward=True)
    assert r.values["best_tflops"] == pytest.approx(both / 5.36e-3 / 1e12)
    with pytest.raises(AssertionError):  # a rate above the peak: a timing or counting error, never shown
        C.pass_rate_section(h100, Result(None, values={"rows": rows.assign(TFLOPs=2000.0)}))
