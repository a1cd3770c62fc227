"""Ring all-reduce by hand (helpers.ring): both rings give dist.all_reduce's result on 2 and 3 ranks (gloo, CPU),
for sizes divisible by N, not divisible, smaller than N, empty, and a non-contiguous 2-D tensor: exactly on
integer-valued floats, within the fp32 summation bound on random ones; bytes sent vs the formulas; the formulas."""

import math

import pytest
import torch
import torch.distributed as dist

from helpers import ring as R
from helpers.launch import launch

U32 = 2.0**-24  # float32 unit roundoff


def gamma(k: int) -> float:
    """Higham's gamma_k = k u / (1 - k u): |fl(sum of k+1 terms) - exact sum| <= gamma_k * sum of |terms|."""
    return k * U32 / (1 - k * U32)


def numels(world: int) -> list[int]:
    return [0, 1, world - 1, world, 3 * world, 3 * world + 1, 1000 * world + world - 1]


def ring_worker(seed: int) -> dict:
    """{N: every case on this rank}, for the 3 ranks and for a 2-rank subgroup (global ranks 1 and 2, so group and
    global ranks differ; rank 0 waits): its input, dist.all_reduce's result, both rings' results and bytes sent."""
    groups = {3: None, 2: dist.new_group([1, 2])}  # every rank creates every group
    return {n: cases(seed, group) for n, group in groups.items() if n == 3 or dist.get_rank() > 0}


def cases(seed: int, group) -> list[dict]:
    rank = dist.get_rank(group)
    g = torch.Generator().manual_seed(seed + rank)  # different data on every rank
    inputs = []
    for numel in numels(dist.get_world_size(group)):
        inputs.append(("integers", numel, torch.randint(-1000, 1000, (numel,), generator=g).float()))
        scales = 2.0 ** torch.randint(-8, 8, (numel,), generator=g)  # magnitudes over 16 binades
        inputs.append(("random", numel, torch.randn(numel, generator=g) * scales))
    inputs.append(("random 2-D transposed", 35, torch.randn(5, 7, generator=g).t()))  # not contiguous
    out = []
    for kind, numel, x in inputs:
        expected, magnitude = x.clone(), x.double().abs()  # magnitude: sum over ranks of |x| (float64)
        if numel:
            dist.all_reduce(expected, group=group)
            dist.all_reduce(magnitude, group=group)
        ring, alt = x.clone(), x.clone()
        out.append(
            {
                "kind": kind,
                "numel": numel,
                "x": x,
                "expected": expected,
                "magnitude": magnitude,
                "ring": ring,
                "ring_sent": R.ring_all_reduce(ring, group=group),
                "ring_contiguous": ring.is_contiguous(),
                "alt": alt,
                "alt_sent": R.alternate_ring_all_reduce(alt, group=group),
            }
        )
    return out


@pytest.fixture(scope="module")
def launched():
    """One 3-rank launch: per rank, {N: cases} for N = 3 (all ranks) and N = 2 (ranks 1 and 2)."""
    return launch(ring_worker, 3, 0, backend="gloo", device="cpu", timeout_s=120)


@pytest.fixture(params=[2, 3])
def runs(request, launched):
    """(N, per-rank cases) for the N-rank ring."""
    return request.param, [per_rank[request.param] for per_rank in launched[3 - request.param :]]


def test_integer_valued_sums_are_exact(runs):
    world, per_rank = runs
    for rank, cases in enumerate(per_rank):
        for c in cases:
            if c["kind"] == "integers":
                assert torch.equal(c["ring"], c["expected"]), (world, rank, c["numel"])
                assert torch.equal(c["alt"], c["expected"]), (world, rank, c["numel"])


def test_random_floats_within_the_fp32_summation_bound(runs):
    """Each side sums N fp32 terms in some order: |fl - exact| <= gamma_{N-1} sum|x_r|, so the two differ by at most
    twice that. At N = 2 both are one correctly rounded addition: bitwise equal."""
    world, per_rank = runs
    for rank, cases in enumerate(per_rank):
        for c in cases:
            if c["kind"] == "integers":
                continue
            bound = (2 * gamma(world - 1) * c["magnitude"]).float()
            for name in ("ring", "alt"):
                assert c[name].shape == c["x"].shape and c[name].dtype == torch.float32
                diff = (c[name] - c["expected"]).abs()
                assert (diff <= bound).all(), (world, rank, name, c["kind"], c["numel"], (diff - bound).max().item())
                if world == 2:
                    assert torch.equal(c[name], c["expected"]), (rank, name, c["numel"])
            assert c["ring_contiguous"] == c["x"].is_contiguous()


def test_every_rank_gets_the_same_bits(runs):
    world, per_rank = runs
    for cases in per_rank[1:]:
        for c, c0 in zip(cases, per_rank[0], strict=True):
            same = torch.equal(c["ring"], c0["ring"]) and torch.equal(c["alt"], c0["alt"])
            assert same, (world, c["kind"], c["numel"])


def test_the_inputs_differ_across_ranks(runs):
    """Precondition that lets the checks above fail: a ring that forgot a rank's data would give another sum."""
    world, per_rank = runs
    big = [c for c in per_rank[0] if c["numel"] > world]
    assert big and all(not torch.equal(c["x"], per_rank[1][i]["x"]) for i, c in enumerate(per_rank[0]) if c in big)


def test_bytes_sent_match_the_formulas(runs):
    """Standard ring: rank r sends every chunk but (r+1) in reduce-scatter and every chunk but (r+2) in all-gather,
    so 2S - c_{r+1} - c_{r+2}, whose mean over ranks is 2(N-1)/N S exactly. Alternate: (N-1) S on every rank."""
    world, per_rank = runs
    for c_index, c0 in enumerate(per_rank[0]):
        S = c0["numel"] * 4
        sizes = [4 * n for n in R.chunk_sizes(c0["numel"], world)]
        sent = [per_rank[r][c_index]["ring_sent"] for r in range(world)]
        assert sent == [2 * S - sizes[(r + 1) % world] - sizes[(r + 2) % world] for r in range(world)]
        assert math.isclose(sum(sent) / world, R.ring_bytes_sent(S, world), abs_tol=1e-9)
        assert all(per_rank[r][c_index]["alt_sent"] == R.alternate_ring_bytes_sent(S, world) for r in range(world))


def test_chunk_sizes():
    assert R.chunk_sizes(10, 3) == [4, 3, 3]
    assert R.chunk_sizes(2, 3) == [1, 1, 0]
    assert R.chunk_sizes(0, 2) == [0, 0]
    assert all(sum(R.chunk_sizes(n, w)) == n for n in range(20) for w in range(1, 5))


def test_time_and_byte_formulas():
    S, alpha, W = 1e6, 1e-5, 1e9
    assert R.ring_time(S, 1, alpha, W) == R.alternate_ring_time(S, 1, alpha, W) == 0
    assert math.isclose(R.ring_time(S, 4, alpha, W), 6 * (alpha + S / (4 * W)))
    assert math.isclose(R.alternate_ring_time(S, 4, alpha, W), 3 * (alpha + S / W))
    assert R.ring_bytes_sent(S, 4) == 1.5e6 and R.alternate_ring_bytes_sent(S, 4) == 3e6
    assert R.alternate_ring_time(S, 2, alpha, W) < R.ring_time(S, 2, alpha, W)  # N = 2: same bytes, half the alphas
    for N in (3, 4, 8):
        x = R.crossover_bytes(N, alpha, W)
        assert math.isclose(R.ring_time(x, N, alpha, W), R.alternate_ring_time(x, N, alpha, W))
        assert R.alternate_ring_time(x / 2, N, alpha, W) < R.ring_time(x / 2, N, alpha, W)
        assert R.alternate_ring_time(x * 2, N, alpha, W) > R.ring_time(x * 2, N, alpha, W)
