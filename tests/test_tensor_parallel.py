"""Tensor and sequence parallelism (helpers.tensor_parallel, notebook 08) on 2 gloo ranks: logits and every gradient
shard within the fp32 bound of one process, collectives counted equal to the closed forms, one block's saved bytes
equal to the formula; mutants (f without its backward all-reduce, SP without the gains' all-reduce) break exactly
the mode they touch; sizes that do not split are refused before any rank starts. TP against DP at equal tokens
(the same launch): each one's counted all-reduces equal to its formula, the paired ratio over enough rounds, and
a verdict that names a winner only outside the interval."""

import pytest

from helpers import tensor_parallel as TP
from helpers.experiments import model_parallel as X
from helpers.experiments import model_parallel_dp as XD
from helpers.formulas import model_parallel as FM
from helpers.model import ModelConfig

SMALL = ModelConfig("tp/test", d_model=32, d_ff=64, n_layers=1, n_heads=2, vocab_size=64, context_length=8)
CONFIG = dict(model=SMALL, batch=2, world=2)


def _both_worker(cfg, batch_size):
    """The correct run, then two bugs at once, each touching one mode only: f's backward skips its all-reduce (TP;
    SP's fused column layer does not use f) and the SP gains are never all-reduced (TP+SP). One launch for both."""
    from helpers import tensor_parallel
    from helpers.experiments import model_parallel, model_parallel_dp

    correct = model_parallel.tensor_parallel_worker(cfg, batch_size)
    versus_dp = model_parallel_dp.tp_dp_worker(cfg, batch_size, steps=6, warmup=1)  # before the bugs are planted
    tensor_parallel.CopyToTensorParallel.backward = staticmethod(lambda ctx, grad: (grad, None))
    model_parallel.sync_sequence_parallel_grads = lambda model, group=None: None
    return correct, model_parallel.tensor_parallel_worker(cfg, batch_size), versus_dp


@pytest.fixture(scope="module")
def launched():
    return X.L.launch(_both_worker, 2, SMALL, CONFIG["batch"], backend="gloo", device="cpu")


@pytest.fixture(scope="module")
def runs(launched):
    return [X.TPRun([r[i] for r in launched], CONFIG, "test", "test") for i in (0, 1)]


DP_CONFIG = {**CONFIG, "dp_steps": 6, "dp_warmup": 1}


def test_tp_against_dp_at_equal_tokens(launched, tmp_path):
    r = XD.tp_dp_section(XD.TPDPRun([r[2] for r in launched], DP_CONFIG, "test", "test"), directory=tmp_path)
    assert r.values["all_equal"], r.table  # TP: 4L all-reduces of B·T·C; DP: one of Ψ
    assert r.table.loc["TP", "calls"] == 4 * SMALL.n_layers and r.table.loc["DP", "calls"] == 1, r.table
    assert r.table.loc["TP", "tokens_per_rank"] == 2 * r.table.loc["DP", "tokens_per_rank"]
    ratio = r.values["ratio"]
    assert ratio.pairs == 6 and ratio.low <= ratio.median <= ratio.high and r.saved.exists()


def test_tp_against_dp_names_a_winner_only_outside_the_noise(tmp_path):
    act, psi = 2 * 8 * 32 * 4, FM.dp_collectives(SMALL, 2)["all_reduce"][1]
    logs = {"TP": [("all_reduce", act)] * 4, "DP": [("all_reduce", psi)]}

    def section(tp, dp, logs=logs):
        ranks = [{"seconds": {"TP": tp, "DP": dp}, "logs": logs}] * 2
        return XD.tp_dp_section(XD.TPDPRun(ranks, DP_CONFIG, "test", "test"), directory=tmp_path)

    dp = [0.010, 0.012, 0.011, 0.013, 0.010, 0.012]
    noise = section([t * f for t, f in zip(dp, [0.9, 1.1, 0.95, 1.05, 0.9, 1.1], strict=True)], dp)
    assert "no measurable difference between TP and DP" in noise.notes[0] and noise.values["all_equal"]
    slower = section([2 * t for t in dp], dp)
    assert "TP takes 2.00x DP's step time" in slower.notes[0]
    per_tensor = section(dp, dp, {**logs, "DP": [("all_reduce", psi // 2)] * 2})  # a DP of two all-reduces
    assert not per_tensor.values["all_equal"] and per_tensor.table.loc["DP", "calls"] == 2


def test_tp_against_dp_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="batch"):
        XD.tp_dp_run({**DP_CONFIG, "batch": 3}, "test")


def test_exact_bytes_and_memory_against_formulas(runs):
    run = runs[0]
    table = X.exactness_table(run)
    assert (table["diff/bound"] <= 1).all(), table
    assert X.bytes_table(run)["equal"].all(), X.bytes_table(run)
    assert (X.memory_table(run)["measured/formula"] == 1).all(), X.memory_table(run)  # byte-exact


def test_mutants_break_the_bound(runs):
    table = X.exactness_table(runs[1])
    grads = table[table["tensor"] == "gradients"].set_index(["mode", "rank"])
    assert (grads["diff/bound"] > 10).all(), grads  # both modes' gradients far outside the bound
    assert grads.loc[("TP+SP", 0), "worst"].endswith(("norm1.weight", "norm2.weight")), grads
    logits = table[table["tensor"] == "logits"]
    assert (logits["diff/bound"] <= 1).all(), logits  # forward untouched by either bug


@pytest.mark.parametrize(
    "overrides, match",
    [(dict(n_heads=4, d_model=36), "n_heads"), (dict(d_ff=63), "d_ff"), (dict(context_length=9), "sequence length")],
)
def test_sizes_that_do_not_split_are_refused_before_launch(overrides, match):
    cfg = ModelConfig(**{**SMALL.__dict__, **overrides})
    with pytest.raises(ValueError, match=match):
        X.tensor_parallel_run({**CONFIG, "model": cfg, "world": 3 if "n_heads" in overrides else 2}, "test")


def test_shard_parameter_takes_heads_from_q_k_and_v():
    import torch

    full = torch.arange(6 * 4, dtype=torch.float32).view(6, 4)  # qkv weight, C = 2: q rows 0-1, k 2-3, v 4-5
    assert TP.shard_parameter("attn.qkv.weight", full, 1, 2).tolist() == full[[1, 3, 5]].tolist()
    assert TP.shard_parameter("ffn.w2.weight", full, 1, 2).tolist() == full[:, 2:].tolist()


def test_closed_forms():
    assert FM.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert (
        FM.pipeline_peak_micro_batches("1f1b", 4, 8, 0) == 4 and FM.pipeline_peak_micro_batches("gpipe", 4, 8, 3) == 8
    )
    sent = {sp: FM.tp_bytes_sent(SMALL, 2, 8, 2, sp) for sp in (False, True)}
    act = 2 * 8 * 32 * 4
    assert sent[False] == 8 * act * 1 / 2  # 4 all-reduces of BTC, each 2(N-1)/N
    assert sent[True] == (10 + 2) * act / 2 + 2 * 32 * 4  # 8 all-gathers, 4 reduce-scatters: (N-1)/N each


def test_the_alpha_beta_model_of_a_tp_step():
    from helpers.experiments import model_parallel_calc as S

    m = FM.tp_ffn_seconds(B=256, D=64, D_FF=1024, N=2, C=1e10, alpha=1e-4, beta=1e9)
    at_star = FM.tp_ffn_seconds(B=256, D=64, D_FF=m["d_ff_star"], N=2, C=1e10, alpha=1e-4, beta=1e9)
    assert at_star["comm_share"] == pytest.approx(0.5, abs=1e-12)  # compute == communication at d_ff*
    # a run whose step is exactly the model's: compute at C, two all-reduces on the fitted α-β line
    sizes, alpha, beta = [4096, 65536, 262144], 1e-4, 1e9
    ar = {s: alpha + s / beta for s in sizes}
    comm = 2 * (alpha + 65536 / beta)  # two all-reduces of B·D·4 = 65536 bytes, 2(N-1)/N = 1
    steps = {f: (12 * 256 * 64 * f / 2 / 1e10 + comm, 12 * 256 * 64 * f / 2 / 1e10) for f in (64, 4096)}
    run = S.SpeedRun(
        [{"all_reduce": ar, "steps": steps}] * 2, dict(tokens=256, d_model=64, widths=[64, 4096]), "test", "test"
    )
    table = S.speed_section(run).table
    assert table["holds"].all() and (table["comm_share"] - table["model_comm_share"]).abs().max() < 1e-9, table
    steps[64] = (steps[64][0] * 3, steps[64][1])  # a step that spends far more than its all-reduces
    assert not S.speed_section(run).table.set_index("d_ff").loc[64, "holds"]


SYNC_S = 0.02  # what each host sync costs under the stub (a GPU's synchronize, inflated to stand out of the noise)


def _alpha_worker():
    """tp_speed_worker's all-reduce times under the NCCL stub, host syncs free and then costing SYNC_S each."""
    from nccl_stub import NcclStub

    from helpers.experiments import model_parallel_calc

    out = []
    for sync_s in (0.0, SYNC_S):
        with NcclStub(delay_s=0.002, sync_s=sync_s, check_pairing=False) as stub:
            out.append(model_parallel_calc.tp_speed_worker(64, 16, [32], 3)["all_reduce"])
        assert not stub.races, stub.races  # no tensor read before its collective's wait
    return out


def test_the_alpha_beta_fit_times_the_all_reduce_alone():
    """A timing with a host sync (or an allocation and fill) per call puts their cost in α: with syncs of SYNC_S,
    the fitted α may grow by at most 0.3·SYNC_S (a sync per call: by SYNC_S), over enough sizes for a fit."""
    from helpers.experiments import model_parallel_calc as S

    ranks = X.L.launch(_alpha_worker, 2, backend="gloo", device="cpu")
    alphas = []
    for i in (0, 1):
        ar = {k: max(r[i][k] for r in ranks) for k in ranks[0][i]}
        assert len(ar) >= 6, ar
        alphas.append(S.fit_alpha_beta(list(ar), list(ar.values())).alpha_s)
    assert alphas[1] - alphas[0] <= 0.3 * SYNC_S, alphas
