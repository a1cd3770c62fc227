"""One helper picks the tiles, warps and stages of every FlashAttention kernel (the PyTorch spec's loops and the
three Triton kernels), per head dim, dtype and GPU architecture, from the table in helpers.attention.tuned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.attention.tuned import TILES

KERNELS = ("fwd", "dkdv", "dq")  # forward (owns queries, streams keys); dK/dV (owns keys); dQ (owns queries)
ARCHS = ("sm_80", "sm_90a")  # Ampere's mma.sync and Hopper's wgmma: the two code paths Triton compiles


@dataclass(frozen=True)
class Tiles:
    """One kernel's launch: a program owns `own` rows (queries or keys) and streams `loop` rows of the other side
    per step (own % loop == 0, so causal bounds fall on tile borders)."""

    own: int
    loop: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class LaunchConfig:
    """Tiles for one (d, dtype, device): the forward's, the dK/dV kernel's and the dQ kernel's."""

    fwd: Tiles
    dkdv: Tiles
    dq: Tiles
    dot_precision: str  # "ieee" for fp32: full fp32 dots (no tf32), so fp32 results match the spec to ~1e-6

    # the names the PyTorch spec's loops read: forward query x key tiles; backward owned x streamed rows
    @property
    def block_q(self) -> int:
        return self.fwd.own

    @property
    def block_k(self) -> int:
        return self.fwd.loop

    @property
    def block_own(self) -> int:
        return self.dkdv.own

    @property
    def block_loop(self) -> int:
        return self.dkdv.loop

    @property
    def num_warps(self) -> int:
        return self.fwd.num_warps

    @property
    def num_stages(self) -> int:
        return self.fwd.num_stages


BOTH, HOPPER, AMPERE = ARCHS, ("sm_90a",), ("sm_80",)
# What `python -m helpers tune attention` times: (dtype, d) -> kernel -> [(tiles, the architectures it may run on)].
# Every candidate compiles for its architectures without spills (`python -m helpers kernels --grid`); the 4-warp
# 128 x 32 tiles of Triton's tutorial spill our dK/dV kernel on both (its dQ on sm_80 only), so 8 warps stand in.
# sm_80's candidates are the first sweep's (not yet timed on an A100). sm_90a's sit around the H200's winners
# (data/reference/nvidia-h200/attention_tune.jsonl, bf16 causal, d = 64 at T = 16,384, d = 128 at 8,192): each
# kernel's winner, its nearest rivals (within 4% at d = 64 for the forward and dQ, 18-20% for dK/dV), and new
# tiles, warps and stages next to them; the other candidates timed there (4.6-230% behind) are sm_80's only, and
# the tutorial's Hopper-only rows (11-13% behind) are gone. On Hopper a warp group's wgmma owns 64 rows: 4 warps
# for 64-row programs (8 warps split the columns instead and ran 2-3.3x slower there), 8 (two groups) for 128 rows;
# 32-row programs fall back to mma.sync (no wgmma in their PTX) and double the streamed side's L2 traffic
# (formulas.attention_cost at the leaderboard shape: 8.7 GB for the forward and dQ at 64 rows, 17 GB at 32), so
# none is listed.
# fp32 has one candidate: on FMA units it is for checking, not for speed.
GRID = {
    ("bfloat16", 64): {
        "fwd": [  # H200 winner 64 x 64 w4 s3 (1.36 ms)
            (Tiles(128, 64, 8, 3), BOTH),
            (Tiles(128, 64, 4, 3), AMPERE),
            (Tiles(128, 128, 8, 3), AMPERE),
            (Tiles(128, 64, 8, 4), AMPERE),
            (Tiles(128, 32, 4, 4), AMPERE),
            (Tiles(64, 64, 4, 3), BOTH),
            (Tiles(64, 64, 4, 2), HOPPER),
            (Tiles(64, 64, 4, 4), HOPPER),
            (Tiles(64, 32, 4, 4), HOPPER),
        ],
        "dkdv": [  # H200 winner 64 x 32 w4 s4 (2.43 ms; the others 2.86-5.0)
            (Tiles(128, 32, 8, 5), AMPERE),
            (Tiles(128, 32, 8, 3), AMPERE),
            (Tiles(128, 16, 4, 5), AMPERE),
            (Tiles(64, 32, 4, 4), BOTH),
            (Tiles(64, 32, 8, 3), AMPERE),
            (Tiles(64, 16, 4, 5), BOTH),
            (Tiles(128, 64, 8, 3), HOPPER),
            (Tiles(64, 16, 4, 4), HOPPER),
            (Tiles(64, 32, 4, 2), HOPPER),
            (Tiles(64, 32, 4, 3), HOPPER),
            (Tiles(64, 32, 4, 5), HOPPER),
            (Tiles(64, 64, 4, 2), HOPPER),
            (Tiles(64, 64, 4, 3), HOPPER),
            (Tiles(128, 16, 8, 4), HOPPER),
        ],
        "dq": [  # H200 winner 64 x 32 w4 s4 (1.54 ms)
            (Tiles(128, 32, 8, 5), BOTH),
            (Tiles(128, 32, 8, 3), AMPERE),
            (Tiles(128, 16, 4, 5), AMPERE),
            (Tiles(64, 32, 4, 4), BOTH),
            (Tiles(64, 32, 8, 3), AMPERE),
            (Tiles(64, 16, 4, 4), HOPPER),
            (Tiles(64, 32, 4, 3), HOPPER),
            (Tiles(64, 32, 4, 5), HOPPER),
            (Tiles(64, 64, 4, 2), HOPPER),
            (Tiles(64, 64, 4, 3), HOPPER),
            (Tiles(128, 32, 8, 4), HOPPER),
            (Tiles(128, 64, 8, 3), HOPPER),
        ],
    },
    ("bfloat16", 128): {
        # 64 x 64 with 4 warps spills 12 B on sm_80 (255 registers): Hopper's only
        "fwd": [  # H200 winner 64 x 64 w4 s3 (0.62 ms)
            (Tiles(128, 32, 8, 2), AMPERE),
            (Tiles(128, 64, 8, 3), AMPERE),
            (Tiles(64, 64, 4, 3), HOPPER),
            (Tiles(64, 64, 4, 2), HOPPER),
            (Tiles(64, 32, 4, 3), HOPPER),
        ],
        "dkdv": [  # H200 winner 64 x 32 w4 s3 (1.16 ms)
            (Tiles(64, 32, 8, 2), AMPERE),
            (Tiles(64, 32, 4, 3), BOTH),
            (Tiles(64, 32, 4, 2), HOPPER),
            (Tiles(64, 16, 4, 3), HOPPER),
        ],
        "dq": [  # H200 winner 64 x 32 w4 s3 (0.83 ms)
            (Tiles(64, 32, 8, 2), AMPERE),
            (Tiles(64, 32, 4, 3), BOTH),
            (Tiles(64, 32, 4, 2), HOPPER),
            (Tiles(64, 16, 4, 3), HOPPER),  # 64 x 64 w4 s2 spilled 64 B (non-causal)
        ],
    },
    ("float32", 64): {"fwd": [(Tiles(64, 32, 8, 2), BOTH)], "dkdv": [(Tiles(64, 16, 8, 2), BOTH)]},
    ("float32", 128): {"fwd": [(Tiles(16, 16, 8, 3), BOTH)], "dkdv": [(Tiles(16, 16, 8, 3), BOTH)]},
}
GRID[("float32", 64)]["dq"] = GRID[("float32", 64)]["dkdv"]
GRID[("float32", 128)]["dq"] = GRID[("float32", 128)]["dkdv"]

INTERPRETER = Tiles(32, 16, 4, 1)  # small tiles: small test shapes still cross many tile borders and ragged edges


def device_arch(device) -> str:
    """The table's architecture for a CUDA device: sm_90a from compute capability 9 (Hopper) on, else sm_80; sm_90a
    where there is no CUDA (a "cuda" device named on a CPU machine: the dry run, the compile check)."""
    if not torch.cuda.is_available():
        return "sm_90a"
    major, _ = torch.cuda.get_device_capability(device)
    return "sm_90a" if major >= 9 else "sm_80"


def table_key(d: int, dtype: torch.dtype) -> tuple[str, int]:
    """(dtype name, d) as the table stores them: fp16 shares bf16's rows (same tensor-core paths), d <= 64 rounds up
    to 64's (smaller heads only shrink the tiles' registers)."""
    name = "float32" if dtype == torch.float32 else "bfloat16"
    return name, 64 if d <= 64 else 128


def tiles_for(d: int, dtype: torch.dtype, arch: str, table=TILES) -> LaunchConfig:
    """The table's LaunchConfig for (d, dtype) on `arch` (sm_80 | sm_90a); a later architecture uses sm_90a's."""
    name, d_key = table_key(d, dtype)
    rows = {r[3]: Tiles(*r[4:]) for r in table if r[:3] == (arch, name, d_key)}
    if set(rows) != set(KERNELS):
        raise ValueError(
            f"the tiles table has no complete entry for {arch} {name} d={d_key}: run `python -m helpers tune`"
        )
    return LaunchConfig(rows["fwd"], rows["dkdv"], rows["dq"], "ieee" if dtype == torch.float32 else "tf32")


def _launch_config(d: int, dtype: torch.dtype, device) -> LaunchConfig:
    """Tiles for FlashAttentionPyTorch and FlashAttentionTriton on `device`: the tuned table on CUDA, small tiles in
    the interpreter (block_q = 2 * block_k gives two diagonal key tiles per query tile, as on the GPU)."""
    if torch.device(device).type != "cuda":
        return LaunchConfig(INTERPRETER, INTERPRETER, INTERPRETER, "ieee" if dtype == torch.float32 else "tf32")
    return tiles_for(d, dtype, device_arch(device))
