"""Pipeline parallelism (helpers.pipeline, notebook 08) on 4 gloo ranks: GPipe and 1F1B give one process's gradients
on the whole batch within the fp32 bound; each stage's activation peak holds the micro-batches its schedule says;
a mutant (each micro-batch's loss not divided by m) breaks the bound; the replay of equal passes gives the bubble
formula exactly; a model or batch that does not cut is refused before any rank starts."""

import pytest

from helpers import pipeline as PP
from helpers.experiments import model_parallel_pipeline as P
from helpers.formulas import model_parallel as FM
from helpers.model import ModelConfig

TINY = ModelConfig("pp/test", d_model=16, d_ff=32, n_layers=4, n_heads=2, vocab_size=32, context_length=8)
CONFIG = dict(
    model=TINY, batch=2, pipe_world=4, pipe_micro=4, pipe_layers=4, pipe_batch=8, pipe_steps=1, pipe_fixed_ms=(1, 2)
)


def _both_worker(*args):
    """The correct run, then a mutant: every micro-batch's loss counted whole instead of 1/m of the batch's mean."""
    from helpers import pipeline
    from helpers.experiments import model_parallel_pipeline

    correct = model_parallel_pipeline.pipeline_worker(*args)
    whole = pipeline.lm_loss
    pipeline.lm_loss = lambda logits, targets: whole(logits, targets) * args[2]
    return correct, model_parallel_pipeline.pipeline_worker(args[0], args[1], args[2], 0, args[4])  # gradients only


@pytest.fixture(scope="module")
def runs():
    args = (P.pipe_model(CONFIG), 8, 4, 1, (1, 2))
    ranks = P.L.launch(_both_worker, 4, *args, backend="gloo", device="cpu")
    return [P.PipeRun([r[i] for r in ranks], CONFIG, "test", "test") for i in (0, 1)]


def test_gradients_and_memory(runs):
    assert runs[0].p == 4
    grads = P.gradients_section(runs[0]).table
    assert (grads["diff/bound"] <= 1).all(), grads
    memory = P.memory_section(runs[0]).table
    assert memory["within"].all(), memory  # GPipe m, 1F1B p − s micro-batches, plus at most one backward's
    bubble = P.bubble_table(runs[0])
    assert ((bubble["bubble"] > 0) & (bubble["bubble"] < 1)).all() and len(bubble) == 2 * 2 * 4, bubble


def test_mutant_breaks_the_bound(runs):
    grads = P.gradients_section(runs[1]).table
    assert (grads["diff/bound"] > 10).all(), grads


@pytest.mark.parametrize("kind", PP.SCHEDULES)
@pytest.mark.parametrize("p, m", [(2, 8), (4, 4), (4, 8), (3, 7)])
def test_replay_of_equal_passes_gives_the_formula(kind, p, m):
    lines = [[(k, i, 0.0, 0.0) for k, i in PP.schedule(kind, p, m, r)] for r in range(p)]
    for bubble in PP.bubble_of(PP.replay(lines, {"F": 1.0, "B": 2.0})):
        assert bubble == pytest.approx(FM.bubble_fraction(p, m), abs=1e-12)
    for stage in range(p):  # micro-batches held at once, from the schedule itself
        held, most = 0, 0
        for k, _ in PP.schedule(kind, p, m, stage):
            held += 1 if k == "F" else -1
            most = max(most, held)
        assert most == FM.pipeline_peak_micro_batches(kind, p, m, stage)


def test_replay_refuses_a_deadlock():
    lines = [[("B", 0, 0, 1), ("F", 0, 1, 2)], [("F", 0, 0, 1), ("B", 0, 1, 2)]]  # stage 0 waits for B 0 first
    with pytest.raises(ValueError, match="wait on each other"):
        PP.replay(lines)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(pipe_layers=3), "n_layers"),
        (dict(pipe_micro=2), "micro-batches cannot fill"),
        (dict(pipe_batch=6), "divisible"),
    ],
)
def test_cuts_that_do_not_fit_are_refused_before_launch(overrides, match):
    with pytest.raises(ValueError, match=match):
        P.pipeline_run({**CONFIG, **overrides}, "test")
