"""Notebook 03's questions (collectives on one node and two: 2024's 3.1.1 and 3.2.1) and their answers."""

from __future__ import annotations

from helpers.course.answers.core import Answer, Question, and_join, answers, fmt_s, ref, register
from helpers.experiments import collectives

Q = Question
QUESTIONS = [
    Q(
        "3.1.1",
        "How long does an all-reduce take per backend, device, message size and process count on one node?",
        notebook="03",
        section="Plots, with the α–β model drawn over the points",
        reads=("03_collectives",),
        gpu="Only gloo on CPU runs here. NCCL needs one GPU per rank: `torchrun --standalone --nproc-per-node 8 -m "
        "helpers bench collectives --backend nccl --device cuda`.",
        references=ref("gloo on CPU, 2 processes: 0.83 ms for 512 KB, 762 ms for 1 GB"),
    ),
    Q(
        "3.2.1",
        "The same benchmark with the processes split over two nodes?",
        notebook="03",
        section="Two nodes",
        reads=("03_two_node_rehearsal",),
        gpu="Needs two GPU nodes (the commands are in the answer); this machine only rehearses the launch path.",
    ),
]
register(QUESTIONS)

# ---- 3.1-3.2 collectives (notebook 03) -------------------------------------------------------------------------------


@answers("3.1.1")
def collectives_single_node(q, saved):
    df = saved.frame("03_collectives")
    ar = df[(df["op"] == "all_reduce") & (df["wrong"] == 0)]
    fits = collectives.fit_table(ar).set_index(["backend", "device", "world_size"])
    parts = []

    def size(row) -> str:  # from the bytes, as computed (binary units), not a label saved by an older run
        return collectives.format_size(int(row["size_bytes"]))

    for (backend, device, n), g in ar.groupby(["backend", "device", "world_size"]):
        g = g.sort_values("size_bytes")
        lo, hi, fit = g.iloc[0], g.iloc[-1], fits.loc[(backend, device, n)]
        parts.append(
            f"{backend}+{device}, {n} ranks: {size(lo)} in {fmt_s(lo['time_s'])}, {size(hi)} in "
            f"{fmt_s(hi['time_s'])} ({hi['busbw_GBps']:.2f} GB/s busbw); the α–β fit (α ≈ "
            f"{fit['alpha_us']:.0f} µs, β ≈ {fit['beta_GBps']:.2f} GB/s) puts the latency-bound messages "
            f"below ≈ {collectives.format_size(int(fit['crossover_bytes']))}"
        )
    cores = saved.run("03_collectives").provenance.get("cpu_count")
    crowded = sorted({n for n in ar["world_size"] if ar["device"].eq("cpu").any() and cores and n > cores})
    if crowded:
        parts.append(
            f"with {', '.join(map(str, crowded))} ranks on {cores} cores the ranks take turns on the cores, "
            "so those times measure the scheduler as much as the collective"
        )
    ran, missing = grid_cut(ar, saved.run("03_collectives").provenance)
    text = f"{ran} All-reduce, every result checked exact: " + "; ".join(parts) + "."
    return Answer(text, status="partial" if missing else "", missing=missing)


HANDOUT_GRID = dict(  # 3.1.1 / distributed_communication_single_node: every edition's sizes, ranks, backend+device
    sizes=collectives.SEED_SIZES,  # 2024's seven, 512 KB to 1 GB; 2025/2026 ask four of them: 1, 10, 100 MB, 1 GB
    world_sizes=(2, 4, 6),
    combos=(("gloo", "cpu"), ("nccl", "cuda")),
)
COMBO_NAMES = {("gloo", "cpu"): "gloo+CPU", ("nccl", "cuda"): "NCCL+GPU", ("gloo", "cuda"): "gloo+GPU"}


def _sizes(sizes) -> str:
    """Message sizes in notebook 03's units, smallest first."""
    return and_join(collectives.format_size(int(b)) for b in sorted(sizes))


def grid_cut(ar, provenance: dict) -> tuple[str, str]:
    """What of the handouts' grid (HANDOUT_GRID) the saved all-reduce rows cover: (a sentence naming what ran, what is
    missing: "" when none), per backend+device and process count, from the rows themselves."""
    ran_parts, missing = [], []
    for combo in dict.fromkeys([*HANDOUT_GRID["combos"], *zip(ar["backend"], ar["device"], strict=True)]):
        name = COMBO_NAMES.get(combo, "+".join(combo))
        rows = ar[(ar["backend"] == combo[0]) & (ar["device"] == combo[1])]
        if rows.empty:
            gpus = provenance.get("gpu_count") or "none"
            why = f", which needs one GPU per rank (this machine has {gpus})" if combo[1] == "cuda" else ""
            missing.append(f"{name}{why}")
            continue
        counts = sorted(int(n) for n in set(rows["world_size"]))
        ran_parts.append(f"{name} with {and_join(counts)} ranks at {_sizes(set(rows['size_bytes']))}")
        if combo not in HANDOUT_GRID["combos"]:
            continue
        left = [n for n in HANDOUT_GRID["world_sizes"] if n not in counts]
        if left:
            missing.append(f"{name} with {and_join(left)} ranks")
        by_n = {
            int(n): tuple(b for b in HANDOUT_GRID["sizes"] if b not in set(g["size_bytes"]))
            for n, g in rows.groupby("world_size")
        }
        for sizes in dict.fromkeys(v for v in by_n.values() if v):
            missing.append(f"{name} at {_sizes(sizes)} ({and_join(n for n, v in by_n.items() if v == sizes)} ranks)")
    said = "Ran " + "; ".join(ran_parts) + "."
    if not missing:
        return said, ""
    return said, (
        "not run here, of the handouts' grid (2025 and 2026 ask 1 MB, 10 MB, 100 MB and 1 GB, 2024 also 512 KB, 50 MB "
        f"and 500 MB; 2, 4 and 6 processes; gloo+CPU and NCCL+GPU): {'; '.join(missing)}. The "
        f"{provenance.get('profile', 'saved')} profile's grid (notebook 03's PROFILE_GRID) stops short of them; on "
        "GPUs `make writeup PROFILE=gpu` or `torchrun --standalone --nproc-per-node 6 -m helpers bench collectives "
        "--backend nccl --device cuda` runs them"
    )


@answers("3.2.1")
def collectives_two_nodes(q, saved):
    r = saved.frame("03_two_node_rehearsal")
    recipe = " and ".join(f"`{c}`" for c in collectives.two_node_recipe("HEAD_NODE:29500", nproc_per_node=8))
    return Answer(
        f"Not measurable on one machine. What ran here is a rehearsal of the path: two torchrun agents on this "
        f"host as two nodes, {len(r)} all-reduce sizes, {int(r['wrong'].sum())} wrong results; their loopback "
        f"times say nothing about a network. On two real GPU nodes run {recipe} (one per node); rank 0 saves the "
        "rows and notebook 03 plots them.",
        status="partial",
        missing="the times over a network need two nodes; only the path was rehearsed here",
    )
