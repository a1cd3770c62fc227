"""Notebook 03's questions (collectives on one node and two: 2024's 3.1.1 and 3.2.1) and their answers."""

from __future__ import annotations

from helpers.course.answers.core import Answer, Question, answers, fmt_s, ref, register

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
    from helpers.experiments import collectives

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
    combos = set(zip(ar["backend"], ar["device"], strict=True))
    missing = (
        ""
        if ("nccl", "cuda") in combos
        else (" NCCL was not measured: it needs one GPU per rank, and this machine has none to spare.")
    )
    return "All-reduce, every result checked exact: " + "; ".join(parts) + "." + missing


@answers("3.2.1")
def collectives_two_nodes(q, saved):
    from helpers.experiments import collectives

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
