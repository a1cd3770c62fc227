"""Published marks: figures measured elsewhere (not here) that the plots and the answers page show beside this
machine's numbers, each with its source and year. Plain data; experiments import MARKS and draw them with their label.

    from helpers.published import MARKS
    MARKS["leaderboard_2025_best"].label          # "2025 leaderboard best, 5.36 ms (course leaderboard, 2025)"
    MARKS["leaderboard_2025_best"].share(6.1)     # what share of the mark a value reaches (time: mark / value)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """One published figure: its value in `unit`, where it comes from, and whether lower is better (a time)."""

    name: str
    value: float
    unit: str
    source: str
    year: int
    setting: str  # the configuration it was measured at
    lower_is_better: bool = False
    status: str = ""  # how far it was checked: "verified ..." / "self-reported ..." (empty: a datasheet or a paper)

    @property
    def label(self) -> str:
        """The legend label: what, how much, source and year."""
        return f"{self.name}, {self.value:g} {self.unit} ({self.source}, {self.year})"

    def share(self, value: float) -> float:
        """This machine's value as a fraction of the mark (1 = reaches it): mark/value for times, value/mark else."""
        if value <= 0:
            raise ValueError(f"a measured value must be positive to compare with {self.name}, got {value}")
        return self.value / value if self.lower_is_better else value / self.value


H100_HBM3_TBPS = 3.35  # H100 SXM datasheet memory bandwidth (NVIDIA, 2022)

MARKS = {  # key -> Mark; keys are what experiments and answers ask for
    "leaderboard_2025_best": Mark(
        "2025 leaderboard best",
        5.36,
        "ms",
        "course leaderboard",
        2025,
        "FlashAttention fwd+bwd, bf16, causal, batch 1 × 16 heads × T 16,384 × d 64, one H100",
        lower_is_better=True,
        status="listed as verified on the 2025 leaderboard (not rechecked here)",
    ),
    "leaderboard_2025_naive": Mark(
        "2025 leaderboard naive",
        80.0,
        "ms",
        "course leaderboard",
        2025,
        "naive attention fwd+bwd at the leaderboard's shape, one H100",
        lower_is_better=True,
    ),
    "rmsnorm_quack": Mark(
        "QuACK RMSNorm, ~90% of H100 HBM3",
        round(0.9 * H100_HBM3_TBPS * 1000),
        "GB/s",
        "QuACK (Dao-AILab)",
        2025,
        "memory-bound kernels at large rows, H100 SXM (3.35 TB/s datasheet)",
    ),
    "nccl_allreduce_h100": Mark(
        "NCCL all-reduce busbw, H100 NVLink",
        370.0,
        "GB/s",
        "nccl-tests documentation",
        2024,
        "8× H100 SXM on one node, large messages, ring algorithm",
    ),
    "leaderboard_2026_best": Mark(
        "2026 leaderboard best",
        3837.0,
        "ms",
        "course leaderboard",
        2026,
        "full AdamW training step, d_model 4096, 34 layers, vocabulary 151,936, batch 2 × 32,768, 2× B200",
        lower_is_better=True,
        status="self-reported: the 2026 leaderboard's table shows no verification",
    ),
    "leaderboard_2026_baseline": Mark(
        "2026 leaderboard baseline",
        10000.0,
        "ms",
        "course handout",
        2026,
        "the same step with the handout's baseline, 2 GPUs",
        lower_is_better=True,
        status="the handout's stated figure",
    ),
}


def draw_mark(ax, mark: Mark, comparable: bool, scale: float = 1.0, style: str = "--"):
    """A horizontal line at the mark (value × scale, in the axis' unit) labelled with its source and year; when this
    machine's numbers are not comparable (another device or shape), the label says the line is what a GPU reaches."""
    note = "" if comparable else "\nwhat a GPU reaches, not comparable with this run"
    label = f"{mark.name}, {mark.value:g} {mark.unit}\n({mark.source}, {mark.year}){note}"  # wrapped for a legend
    ax.axhline(mark.value * scale, color="#c33", linestyle=style, linewidth=1.2, label=label)


def share_column(values, mark: Mark, comparable: bool) -> list:
    """ "% of mark" for a table: each value's share of the mark (mark.share), or None where not comparable."""
    return [round(100 * mark.share(v), 1) if comparable and v == v and v > 0 else None for v in values]
