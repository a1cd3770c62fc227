"""Pipeline parallelism (helpers.pipeline, notebook 08) on 4 and 2 gloo ranks: GPipe, 1F1B and interleaved 1F1B give
one process's gradients on the whole batch within the fp32 bound; each stage's activation peak holds the
micro-batches its schedule says; mutants (each micro-batch's loss not divided by m; the layers put on the chunks
contiguously) break the bound, the second for the interleaved schedule only; the replay of equal passes gives the
bubble formula exactly and every schedule receives in the order its neighbour sends; a model or batch that does not
cut is refused before any rank starts."""

import dataclasses

import pytest
from nccl_stub import deadlock

from helpers import pipeline as PP
from helpers.experiments import model_parallel_pipeline as P
from helpers.formulas import model_parallel as FM
from helpers.model import ModelConfig

TINY = ModelConfig("pp/test", d_model=16, d_ff=32, n_layers=8, n_heads=2, vocab_size=32, context_length=8)
CONFIG = dict(
    model=TINY, batch=2, pipe_world=4, pipe_micro=4, pipe_layers=8, pipe_chunks=2, pipe_batch=8, pipe_steps=1,
    pipe_fixed_ms=(1, 2),
)  # fmt: skip


def _mutants_worker(*args):
    """The correct run, then two mutants, gradients only: every micro-batch's loss counted whole instead of 1/m of
    the batch's mean; the layers put on the chunks contiguously (rank r holding blocks r·v, ..., r·v + v − 1), so the
    interleaved pipeline runs the blocks out of order (one chunk per rank, as GPipe and 1F1B have, is unchanged)."""
    from helpers import pipeline
    from helpers.experiments import model_parallel_pipeline

    correct = model_parallel_pipeline.pipeline_worker(*args)
    gradients_only = (*args[:3], 0, *args[4:])
    whole, strided = pipeline.lm_loss, pipeline.chunk_layers
    pipeline.lm_loss = lambda logits, targets: whole(logits, targets) * args[2]
    unscaled = model_parallel_pipeline.pipeline_worker(*gradients_only)
    pipeline.lm_loss = whole
    pipeline.chunk_layers = _contiguous_chunks
    contiguous = model_parallel_pipeline.pipeline_worker(*gradients_only)
    pipeline.chunk_layers = strided
    return correct, unscaled, contiguous


def _contiguous_chunks(stage: int, stages: int, chunks: int, n_layers: int) -> list[range]:
    """The mutant's cut: stage s's L/p consecutive blocks, split into its v chunks in order."""
    n = n_layers // (stages * chunks)
    return [range((stage * chunks + c) * n, (stage * chunks + c + 1) * n) for c in range(chunks)]


def _args(config):
    return (P.pipe_model(config), config["pipe_batch"], config["pipe_micro"], 1, config["pipe_fixed_ms"], 2)


@pytest.fixture(scope="module")
def runs():
    ranks = P.L.launch(_mutants_worker, 4, *_args(CONFIG), backend="gloo", device="cpu")
    return [P.PipeRun([r[i] for r in ranks], CONFIG, "test", "test") for i in (0, 1, 2)]


def test_gradients_and_memory(runs):
    assert runs[0].p == 4
    grads = P.gradients_section(runs[0]).table
    assert (grads["diff/bound"] <= 1).all(), grads
    assert set(grads["schedule"]) == set(PP.SCHEDULES)
    memory = P.memory_section(runs[0]).table
    assert memory["within"].all(), memory  # each schedule's micro-batches, plus at most one backward's
    bubble = P.bubble_table(runs[0])
    assert ((bubble["bubble"] > 0) & (bubble["bubble"] < 1)).all() and len(bubble) == 3 * 2 * 4, bubble
    formula = bubble.groupby("schedule")["formula"].first()
    assert formula["interleaved"] == pytest.approx(3 / (2 * 4 + 3)) and formula["1f1b"] == pytest.approx(3 / 7)
    own, shared = (dataclasses.replace(runs[0], device="cuda", own_device=own) for own in (True, False))
    assert P.bubble_section(own).values["held_to_replay"]  # a GPU per rank: the replay is held to the measurement
    assert "share a GPU" in P.bubble_section(shared).notes[-1]  # 4 ranks on fewer GPUs: a reading aid, as on a CPU


def test_mutants_break_the_bound(runs):
    grads = P.gradients_section(runs[1]).table
    assert (grads["diff/bound"] > 10).all(), grads
    grads = P.gradients_section(runs[2]).table.set_index("schedule")
    assert (grads.loc["interleaved", "diff/bound"] > 10).all(), grads  # the blocks ran out of order
    assert (grads.loc[["gpipe", "1f1b"], "diff/bound"] <= 1).all(), grads


def test_two_stages_where_both_neighbours_are_one_rank():
    """p = 2: a rank's forward sends and backward sends go to the same peer, one queue for both kinds (gradients
    only: notebook 08 measures the bubble and memory at p = 2 under make test)."""
    config = {**CONFIG, "pipe_world": 2, "pipe_layers": 4, "pipe_steps": 0}
    grads = P.gradients_section(P.pipeline_run(config, "test", backend="gloo", device="cpu")).table
    assert (grads["diff/bound"] <= 1).all() and len(grads) == 3 * 2, grads


def _equal_passes(kind, p, m, v):
    return [[(k, i, c, 0.0, 0.0) for k, i, c in PP.schedule(kind, p, m, r, v)] for r in range(p)]


GRID = [(kind, p, m, 1) for kind in ("gpipe", "1f1b") for p, m in [(2, 8), (4, 4), (4, 8), (3, 7)]] + [
    ("interleaved", p, m, v) for p, m, v in [(2, 4, 2), (2, 2, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 2)]
]


@pytest.mark.parametrize("kind, p, m, v", GRID)
def test_replay_of_equal_passes_gives_the_formula(kind, p, m, v):
    for bubble in PP.bubble_of(PP.replay(_equal_passes(kind, p, m, v), {"F": 1.0, "B": 2.0})):
        assert bubble == pytest.approx(FM.bubble_fraction(p, m, v), abs=1e-12)
    for stage in range(p):  # micro-batches held at once, from the schedule itself, chunks of equal size
        actions = PP.schedule(kind, p, m, stage, v)
        assert sorted(actions) == sorted((k, i, c) for k in "BF" for i in range(m) for c in range(v))  # each once
        assert PP.held_micro_batches(actions, [1] * v) == FM.pipeline_peak_micro_batches(kind, p, m, stage, v)


@pytest.mark.parametrize("kind, p, m, v", GRID)
def test_every_rank_receives_in_the_order_its_neighbour_sends(kind, p, m, v):
    """send/recv between two ranks is one queue per direction: the receiver's order must be the sender's."""
    sent, received = {}, {}
    for rank, line in enumerate(_equal_passes(kind, p, m, v)):
        for k, i, c, _, _ in line:
            frm = PP.upstream(rank, k, i, c, p, v)
            if frm is not None:
                received.setdefault((frm[0], rank), []).append(frm[1:])
            to = PP.upstream(rank, "B" if k == "F" else "F", i, c, p, v)  # the pass that receives this one's output
            if to is not None:
                sent.setdefault((rank, to[0]), []).append((k, i, c))
    assert sent == received


def test_replay_refuses_a_deadlock():
    lines = [[("B", 0, 0, 0, 1), ("F", 0, 0, 1, 2)], [("F", 0, 0, 0, 1), ("B", 0, 0, 1, 2)]]  # stage 0 waits for B 0
    with pytest.raises(ValueError, match="wait on each other"):
        PP.replay(lines)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(pipe_layers=3), "n_layers"),
        (dict(pipe_micro=2), "micro-batches cannot fill"),
        (dict(pipe_batch=6), "divisible"),
        (dict(pipe_layers=4), r"divisible by p·v = 8"),
        (dict(pipe_micro=6, pipe_batch=12), "a multiple of the 4 stages"),
    ],
)
def test_cuts_that_do_not_fit_are_refused_before_launch(overrides, match):
    with pytest.raises(ValueError, match=match):
        P.pipeline_run({**CONFIG, **overrides}, "test")
    with pytest.raises(ValueError, match="for 'interleaved'"):
        PP.schedule("1f1b", 4, 8, 0, chunks=2)


NCCL_DELAY_S = 0.02  # the stub's data lands this long after gloo delivered it, and only when the stream needs it


def _nccl_worker(cfg, batch_size: int, micro_batches: int, fixed_ms: tuple, chunks: int) -> dict:
    """Each schedule's step of fixed-cost stages under the NCCL stub: its timeline, when each received tensor's data
    landed, whether every gradient is finite (NcclDeadlock on leaving the stub where NCCL would hang)."""
    import torch
    import torch.distributed as dist
    from nccl_stub import NcclStub

    from helpers.model import build_model, random_batch

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model(cfg)
    x, y = random_batch(cfg, batch_size, generator=torch.Generator().manual_seed(1))
    out = {}
    for kind in PP.SCHEDULES:
        v = chunks if kind == "interleaved" else 1
        stage = PP.FixedCostStage(PP.PipelineStage(model, rank, world, v), fixed_ms[0] / 1e3, fixed_ms[1] / 1e3)
        lines = [PP.schedule(kind, world, micro_batches, r, v) for r in range(world)]
        with NcclStub(delay_s=NCCL_DELAY_S) as stub:
            line = PP.run_schedule(stage, lines[rank], x, y, micro_batches, cfg.d_model)  # lines gathered
        finite = all(bool(p.grad.isfinite().all()) for p in stage.parameters())
        out[kind] = {
            "line": line,
            "landed": [ready for *_, ready in stub.landed],
            "finite": finite,
            "races": stub.races,
        }
    return out


def test_stamps_wait_for_the_data_under_nccl_semantics():
    """On NCCL, recv returns before the data has arrived: each pass that receives must start after its input landed
    (not when the host queued it), so waiting is not counted as compute; 1F1B's send and the next receive between
    the same two ranks are one group, or NCCL hangs (the stub's replay of every rank's posts)."""
    cfg = dataclasses.replace(TINY, n_layers=4, d_model=8, d_ff=8, n_heads=1)
    ranks = P.L.launch(_nccl_worker, 2, cfg, 8, 4, (5, 10), 2, backend="gloo", device="cpu")
    for kind in PP.SCHEDULES:
        lines = [r[kind]["line"] for r in ranks]
        for rank, r in enumerate(ranks):
            assert r[kind]["finite"] and not r[kind]["races"], (kind, rank, r[kind]["races"])  # no read before a wait
            receiving = [
                (k, i, c, s)
                for k, i, c, s, _ in r[kind]["line"]
                if PP.upstream(rank, k, i, c, 2, 2 if kind == "interleaved" else 1)
            ]
            assert len(receiving) == len(r[kind]["landed"]), (kind, rank)
            early = [(p, ready - p[3]) for p, ready in zip(receiving, r[kind]["landed"], strict=True) if p[3] < ready]
            assert not early, f"{kind}, rank {rank}: passes stamped before their input landed: {early}"
        latency = PP.handoff_latency(lines)
        assert latency >= NCCL_DELAY_S, (kind, latency)  # the wait is the handoff's, not a pass's


@pytest.mark.parametrize("kind, p, m, v", GRID)
def test_sends_and_receives_are_grouped_so_nccl_cannot_hang(kind, p, m, v):
    """Every rank's posts (p2p_posts) replayed with NCCL's rules (the stub's): nothing waits forever; without the
    groups, 1F1B at p = 2 would (a send and, behind it, the receive of the peer's own send on both ranks)."""
    lines = [PP.schedule(kind, p, m, r, v) for r in range(p)]
    assert deadlock([_log(PP.p2p_posts(lines, r, v)) for r in range(p)]) is None
    if (kind, p) == ("1f1b", 2):
        alone = [[(op,) for step in PP.p2p_posts(lines, r, v) if step != "take" for op in step] for r in range(p)]
        assert "NCCL would hang" in deadlock([_log(steps) for steps in alone])


def _log(steps: list) -> list:
    """p2p_posts' steps as the NCCL stub logs them: a barrier, then posts, and a wait and a sync at each take."""
    log, holding, taken = [("post", 0, (("collective", "barrier", 4),)), ("sync",)], [], 0
    for step in steps:
        if step == "take":
            log += [("wait", holding[taken]), ("sync",)]
            taken += 1
        else:
            holding += [len(log)] * sum(op == "recv" for op, _ in step)
            log.append(("post", len(log), tuple((op, peer, 1) for op, peer in step)))
    return log
