"""The writeups' front page: one measured sentence per notebook, read from this machine's saved results.

    sentence("04_ddp.ipynb", "cpu")   # "bucketed DDP (25 MB), small/cpu: <b ...>0.86</b>× torch DDP's step time
                                      #  on this CPU [0.80–0.93]" (HTML; the numbers in marked elements)

`python -m helpers writeup` hands `sentence` to helpers.writeup.main as `front`; the writeup puts it beside the
notebook's headline figure (its cell tagged `headline`). Each number is a column of one saved row, and the HTML says
which (data-source, data-row, data-column, data-scale), so the browser test can read it back from the file.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from helpers.course.answers.core import NotMeasured, Saved
from helpers.course.answers.page import default_folder
from helpers.timing import MIN_PAIRS, Ratio


@dataclass(frozen=True)
class Claim:
    """`lead` VALUE`unit` `tail` [LOW–HIGH]: VALUE is rows[row][column] × scale of the saved run `source`."""

    source: str
    row: int
    column: str
    value: float
    low: float
    high: float
    lead: str
    tail: str
    unit: str = "×"
    scale: float = 1.0
    digits: int = 2
    interval: str = "95% interval of the paired ratio"

    def html(self) -> str:
        """The sentence, its number marked with where it was read from."""
        f = f"{{:.{self.digits}f}}".format
        return (
            f"{html.escape(self.lead)}<b class='claim-value' data-source='{html.escape(self.source)}' "
            f"data-row='{self.row}' data-column='{html.escape(self.column)}' data-scale='{self.scale!r}' "
            f"data-digits='{self.digits}'>{f(self.value)}</b>{html.escape(self.unit)} {html.escape(self.tail)} "
            f"<span class='claim-interval' title='{html.escape(self.interval)}'>[<span class='claim-low'>"
            f"{f(self.low)}</span>–<span class='claim-high'>{f(self.high)}</span>]</span>"
        )


def _rows(saved: Saved, name: str, **where) -> list[tuple[int, dict]]:
    """(index in the file, row) of the saved run `name` whose columns equal `where`; NotMeasured when none do."""
    rows = [(i, r) for i, r in enumerate(saved.run(name).rows) if all(r.get(k) == v for k, v in where.items())]
    if not rows:
        raise NotMeasured(f"{name} has no row with {where}")
    return rows


def _machine(saved: Saved, name: str) -> str:
    """'this CPU' or 'this GPU', from the run's provenance."""
    return "this GPU" if saved.run(name).provenance.get("gpu_count") else "this CPU"


def _ratio(saved: Saved, name: str, i: int, row: dict, lead: str, tail: str) -> Claim:
    """A Claim on a saved paired-ratio row (helpers.timing.ratio_columns)."""
    return Claim(
        name, i, "ratio", row["ratio"], row["ratio_low"], row["ratio_high"], lead, f"{tail} on {_machine(saved, name)}"
    )


def warmup(saved: Saved) -> Claim:
    """00: a warm step's median time, with the run's fastest and slowest step."""
    i, r = _rows(saved, "00_warmup", warmup_kind="3 steps")[0]
    model = saved.run("00_warmup").provenance.get("model", "the model")
    return Claim(
        "00_warmup",
        i,
        "median_s",
        r["median_s"] * 1e3,
        r["min_s"] * 1e3,
        r["max_s"] * 1e3,
        f"a {model} training step after warm-up: ",
        f"median of {r['steps']} steps on {_machine(saved, '00_warmup')}",
        unit=" ms",
        scale=1e3,
        interval="fastest and slowest step",
    )


def autocast(saved: Saved) -> Claim:
    """01: bf16 (or fp16) autocast's step time over fp32's, at the largest size timed."""
    rows = [(i, r) for i, r in _rows(saved, "01_precision_ratios", b="fp32")]
    i, r = rows[-1]
    label = r["a"] if str(r["a"]).startswith("autocast") else f"{r['a']} autocast"  # rows say "autocast bfloat16"
    return _ratio(saved, "01_precision_ratios", i, r, f"{label}, {r['size']}: ", "fp32's step time")


def rmsnorm(saved: Saved) -> Claim:
    """02: RMSNorm in PyTorch ops over LayerNorm, forward, at the largest hidden size of float32."""
    rows = _rows(saved, "rmsnorm_ratios", a="torch", b="layernorm")
    rows = [
        (i, r) for i, r in rows if r.get("pass") == rows[0][1].get("pass") and r.get("dtype") == rows[0][1].get("dtype")
    ]
    i, r = max(rows, key=lambda ir: ir[1].get("H", 0))
    return _ratio(
        saved, "rmsnorm_ratios", i, r, f"RMSNorm (PyTorch ops), H = {r.get('H')}, {r.get('pass')}: ", "LayerNorm's time"
    )


def collectives(saved: Saved) -> Claim:
    """03: all-reduce's bus bandwidth at the largest size on the fewest ranks, with the calls' quartiles."""
    rows = [(i, r) for i, r in _rows(saved, "03_collectives", op="all_reduce") if not r.get("wrong")]
    i, r = max(rows, key=lambda ir: (ir[1]["size_bytes"], -ir[1]["world_size"]))  # fewest ranks: not oversubscribed
    bw, t = r["busbw_GBps"], r["time_s"]
    return Claim(
        "03_collectives",
        i,
        "busbw_GBps",
        bw,
        bw * t / r.get("p75_s", t),
        bw * t / r.get("p25_s", t),
        f"all-reduce of {r['size']} on {r['world_size']} {r['backend']} ranks: ",
        f"bus bandwidth on {_machine(saved, '03_collectives')}",
        unit=" GB/s",
        interval="from the quartiles of the call times",
    )


def ddp(saved: Saved) -> Claim:
    """04: bucketed DDP's step time over torch DDP's (both 25 MB buckets), for the last model timed."""
    i, r = _rows(saved, "04_ddp_ratios", field="step", a="bucketed 25 MB", b="torch_ddp 25 MB")[-1]
    return _ratio(saved, "04_ddp_ratios", i, r, f"bucketed DDP (25 MiB), {r.get('model')}: ", "torch DDP's step time")


def sharding(saved: Saved) -> Claim:
    """05: ShardedOptimizer's time per iteration over the unsharded optimizer's."""
    i, r = _rows(saved, "05_sharding_ratios", a="sharded", b="unsharded")[0]
    return _ratio(
        saved, "05_sharding_ratios", i, r, "ShardedOptimizer: ", "the unsharded optimizer's time per iteration"
    )


def compiled_attention(saved: Saved) -> Claim:
    """06: torch.compile'd naive attention's time over eager's (Comparison.table rows), forward+backward if saved."""
    i, r = _rows(saved, "06_compile_ratios", label="compiled")[-1]
    return _ratio(
        saved, "06_compile_ratios", i, r, f"torch.compile'd attention, {r.get('pass')}: ", "eager attention's time"
    )


def checkpointing(saved: Saved) -> Claim:
    """07: the step time of the segment size with the least peak memory, over no checkpointing's."""
    rows = _rows(saved, "07_checkpoint")
    none = next(r for _, r in rows if r["segment"] == 0)
    i, r = min(((i, r) for i, r in rows if r["segment"] > 0), key=lambda ir: ir[1]["peak_MiB"])
    pairs = int(saved.run("07_checkpoint").provenance.get("steps") or 0)
    ratio = Ratio(r["time / none"], r["low"], r["high"], pairs)
    said = (
        f"measurably {'slower' if ratio.median > 1 else 'faster'}"
        if ratio.beyond()
        else f"no measurable difference: {pairs} paired steps, fewer than {MIN_PAIRS}"
        if not ratio.enough
        else "no measurable difference"
    )
    return Claim(
        "07_checkpoint",
        i,
        "time / none",
        r["time / none"],
        r["low"],
        r["high"],
        f"activation checkpointing in segments of {r['segment']} blocks: peak {r['peak_MiB']:.1f} MiB "
        f"instead of {none['peak_MiB']:.1f} MiB, at ",
        f"the step time without it on {_machine(saved, '07_checkpoint')} ({said})",
    )


def pipeline_bubble(saved: Saved) -> Claim:
    """08: 1F1B's idle share on the model's stages, mean over ranks, against (p − 1)/(m + p − 1); the ranks' range."""
    rows = _rows(saved, "08_pipeline_bubble", schedule="1f1b", stages="model")
    shares = [r["bubble"] for _, r in rows]
    i, r = rows[0]
    return Claim(
        "08_pipeline_bubble",
        i,
        "bubble",
        r["bubble"],
        min(shares),
        max(shares),
        f"pipeline parallelism, 1F1B over {len(rows)} stages: stage 0 idles ",
        f"of a step on {_machine(saved, '08_pipeline_bubble')}, against (p − 1)/(m + p − 1) = {r['formula']:.2f} "
        "for equal stages",
        unit="",
        interval="range over the stages",
    )


CLAIMS = {
    "00": warmup,
    "01": autocast,
    "02": rmsnorm,
    "03": collectives,
    "04": ddp,
    "05": sharding,
    "06": compiled_attention,
    "07": checkpointing,
    "08": pipeline_bubble,
}  # notebook number -> its front-page sentence


def sentence(notebook: str, profile: str, folder: Path | None = None) -> str:
    """The front page's HTML sentence for `notebook` (a file name like 04_ddp.ipynb) from the results saved in
    `folder` (this machine's data/local/<device>/) by a `profile` run, or a line saying what is missing."""
    claim = CLAIMS.get(Path(notebook).name[:2])
    if claim is None:
        return "<span class='not-measured'>no measured sentence for this notebook</span>"
    saved = Saved(default_folder() if folder is None else Path(folder), profile)
    try:
        return claim(saved).html()
    except NotMeasured as why:
        return f"<span class='not-measured'>no measured sentence: {html.escape(str(why))} (run the notebook)</span>"
