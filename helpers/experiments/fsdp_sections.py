"""Notebook 07's sections, one function each: it runs the section's experiment (the workers and tables of
helpers.experiments.fsdp), checks what must hold, saves the tables the answers page reads and returns one
helpers.section.Result whose notes are made from the same values as its table. The tests call the same functions.

    setup = Setup.resolve("auto")          # the profile's sizes, the backend, where results are saved
    r = equivalence_section(setup)         # §1: launches, the table, its notes; saved as 07_equivalence
    m = measure_section(setup)             # §2-§4's one launch; m.runs feeds the sections that read it
    memory_formula_section(m.runs); zero_section(setup, m.runs); bytes_section(setup, m.runs)
    timeliness_section(setup, m.runs); speed_section(setup, m.runs)
    checkpoint_section(setup); ring_section(setup)  # §5, §6; §7-8's closed forms: helpers.experiments.fsdp_plans
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from helpers import env, results
from helpers import formulas as F
from helpers.experiments import fsdp as X
from helpers.experiments.common import name_models
from helpers.experiments.fsdp_plans import leaderboard_section, memory_calculator, strategies_calculator
from helpers.experiments.gpu_plans_bytes import card_note, in_place_of, retained_graph_bytes
from helpers.formulas import MiB
from helpers.launch import choose_backend, launch
from helpers.model import get_config, size_edition, sizes_for
from helpers.section import Result
from helpers.timing import Ratio, verdict

__all__ = [
    "FFN_EXAMPLE",
    "Setup",
    "Measured",
    "equivalence_section",
    "measure_section",
    "memory_formula_section",
    "zero_section",
    "bytes_section",
    "timeliness_section",
    "speed_section",
    "checkpoint_section",
    "ring_section",
    "ffn_section",
    "strategies_calculator",
    "memory_calculator",
    "leaderboard_section",
]


FFN_EXAMPLE = dict(tokens=4096, d=4096, f=16384, n=8, C=989e12, W=450e9)  # H100-like: bf16 dense FLOP/s, NVLink B/s


MODEL_KEYS = ("check_model", "model", "ckpt_model")  # PROFILES' entries that name a model size


def config_for(profile: str, edition: str = "2026", gpu_bytes: float | None = None) -> dict:
    """X.PROFILES[profile] with its models as `edition`'s Table 1 names them. §5's sweep first steps its model without
    checkpointing (gpu_plans_bytes.retained_graph_bytes at ckpt_batch × ckpt_context): where a card of gpu_bytes
    cannot hold that, the edition's largest smaller model it holds is swept instead, named in config["left_out"]
    (None: no card known, the profile's model)."""
    config = name_models(X.PROFILES[profile], MODEL_KEYS, edition)
    m, B, T, layers = (config[k] for k in ("ckpt_model", "ckpt_batch", "ckpt_context", "ckpt_layers"))

    def need(size) -> int:
        return retained_graph_bytes(get_config(size, **({"n_layers": layers} if layers else {})), B, T)

    instead = in_place_of(m, sizes_for(profile, edition), need, gpu_bytes)
    if instead == m:
        return config
    note = card_note(
        f"{m}'s step without checkpointing ({B} × {T})", need(m), gpu_bytes, f"{instead} swept in its place"
    )
    return {**config, "ckpt_model": instead, "left_out": [note]}


@dataclass
class Setup:
    """What every section of notebook 07 runs with: the profile and its sizes (helpers.experiments.fsdp.PROFILES),
    the ranks' backend and device, and where results are saved (None: data/local/<device>/)."""

    profile: str
    config: dict
    backend: str = "gloo"
    device: str = "cpu"
    world: int = 2
    machine: str = "this machine"
    directory: Path | None = None

    @classmethod
    def resolve(cls, profile: str = "auto", edition: str = "2026") -> Setup:
        """The notebook's set-up: "auto" is gpu when CUDA is present, else cpu; gloo on the CPU, or both ranks on
        one GPU through gloo; the models as `edition`'s Table 1 names them (FSDP is asked by 2026 only: its
        cs336-basics model), §5's sweep on a model this GPU holds (config_for)."""
        profile = env.resolve_profile(profile)
        backend, device = choose_backend(2)
        config = config_for(profile, edition, env.card_bytes())
        return cls(profile, config, backend, device, 2, env.machine_facts()["device"])

    @property
    def where(self) -> str:
        return f"{self.machine} · {self.profile} profile · {self.backend} on {self.device}, {self.world} ranks"

    @property
    def edition(self) -> str:
        """The edition whose Table 1 names the model that runs (model.size_edition)."""
        return size_edition(self.config["model"])

    def save(self, frame: pd.DataFrame, name: str, **extra) -> Path:
        """Save with the profile and the edition whose model ran (the answers page says which)."""
        return results.save_results(
            frame, name, profile=self.profile, directory=self.directory, edition=self.edition, **extra
        )


@dataclass(repr=False)  # Result's own repr: notes, table, saved path (never the runs)
class Measured(Result):
    """§2's Result, with the per-rank runs (helpers.experiments.fsdp.MeasureRun) of the launch §2-§4 read."""

    runs: list = field(default_factory=list)


def _require(ok: bool, what: str, table) -> None:
    """A section's bound that must hold before its table is saved for the answers page."""
    if not ok:
        raise AssertionError(f"{what}:\n{table}")


# ---- §1 ----


def equivalence_section(setup: Setup) -> Result:
    """FSDP on `world` ranks and on 1 against one process (3 SGD steps, fp32 and fp16) with the derived bound."""
    c = setup.config
    check = dict(
        model=c["check_model"],
        n_layers=c["check_layers"],
        steps=3,
        batch_size=c["check_batch"],
        context_length=c["check_context"],
    )
    start, worlds = time.perf_counter(), (setup.world, 1)
    worker = partial(X.equivalence_worker, dtypes=["fp32", "fp16"], **check)
    runs = {n: launch(worker, n, backend=setup.backend, device=setup.device) for n in worlds}
    table = pd.concat([X.equivalence_table(runs[n], **check) for n in worlds], ignore_index=True)
    v = dict(
        max_ratio=float(table["max_diff/bound"].max()),
        replicated_equal=bool(table["replicated_equal"].all()),
        one_rank_bitwise=bool(table.loc[table["ranks"] == 1, "bitwise"].all()),
        fp16_whole_batch=float(table.loc[table["dtype"] == "fp16", "whole batch max_abs_diff"].max()),
    )
    _require(v["max_ratio"] <= 1 and v["replicated_equal"], "FSDP outside the derived bound", table)
    v["terms_equal"] = bool(table.loc[table["dtype"] == "fp32", "terms_equal"].all())
    saved = setup.save(table, "07_equivalence", model=c["model"], world_size=setup.world)
    notes = [
        f"{check['model']} ({check['n_layers']} layers), 3 SGD steps in fp32 and fp16, on {setup.world} ranks and on "
        f"1, against one process: the largest difference / bound is {v['max_ratio']:.2g} (at most 1 passes); the "
        f"replicated gains are {'bitwise equal' if v['replicated_equal'] else 'different'} on every rank; one rank is "
        f"{'bitwise equal to' if v['one_rank_bitwise'] else 'not bitwise'} plain PyTorch with the same casts.",
        "fp32's bound against the whole batch: n·eps·Σ|term| for the two orders of the last sum, plus how far one "
        "process's per-token terms (activations, upstream gradients) on each rank's rows are from the whole batch's: "
        + (
            "none here, they are bitwise equal (this device computes a row the same whatever the batch)."
            if v["terms_equal"]
            else "not zero here: this device's matmuls accumulate in an order picked by the batch's shape. An entry "
            "made of one term (an embedding row one token read) differs by exactly that term's difference, so the "
            "ratio can sit just under 1 there (max_at names the parameter)."
        ),
        f"fp16 against one process on the whole batch (measured, not bounded): up to {v['fp16_whole_batch']:.2g}.",
        f"{time.perf_counter() - start:.0f} s · {setup.where}",
    ]
    return Result(table=table.round(4), notes=notes, saved=saved, values=v)


# ---- §2 ----


def measure_section(setup: Setup) -> Measured:
    """§2-§4's one launch (FSDP, DDP, ZeRO-1 and fully_shard: memory, bytes, a trace, interleaved steps); shows the
    MiB per rank at each point (rank 0) and saves every rank's as 07_memory."""
    c, start = setup.config, time.perf_counter()
    worker = partial(
        X.measure_worker,
        model=c["model"],
        batch_size=c["batch"],
        context_length=c["context"],
        steps=c["steps"],
        warmup=c["warmup"],
    )
    runs = launch(worker, setup.world, backend=setup.backend, device=setup.device)  # per rank: MeasureRun
    mem = X.memory_table(runs)
    _require(bool((mem[["live_MiB", "peak_MiB"]] > 0).all().all()), "a kind held no bytes", mem)
    saved = setup.save(mem, "07_memory", model=c["model"], world_size=setup.world)
    after = mem[mem["point"] == mem["point"].iloc[-1]].groupby("kind")["live_MiB"].max()
    peak = mem.groupby("kind")["peak_MiB"].max()
    notes = [
        f"{c['model']}, global batch {c['batch']} × {c['context']}, AdamW fp32, MiB per rank "
        f"({time.perf_counter() - start:.0f} s for §2-§4) · {setup.where}",
        "Largest per rank, live at the last point / peak: "
        + "; ".join(f"{k} {after[k]:.3f} / {peak[k]:.3f}" for k in peak.index),
    ]
    table = mem[mem["rank"] == 0].pivot(index="point", columns="kind", values=["live_MiB", "peak_MiB"]).round(3)
    values = {"live_after": after.to_dict(), "peak": peak.to_dict()}
    return Measured(table=table, notes=notes, saved=saved, values=values, runs=runs)


def memory_formula_section(runs: list) -> Result:
    """FSDP's measured live bytes against formulas.fsdp_live_bytes: exact after init and after each step; after
    backward and at the forward/backward peak within PEAK_TOL. A point outside raises, naming it (rank, point,
    bytes measured, formula and their difference), above every rank's table."""
    check = X.fsdp_memory_check(runs)
    exact = check[check["tolerance"] == 0]
    loose = check[check["tolerance"] > 0]
    dev = (loose["measured"] / loose["formula"] - 1).abs()
    v = dict(within=bool(check["within"].all()), exact=bool((exact["measured"] == exact["formula"]).all()))
    v["largest_deviation"] = float(dev.max()) if len(dev) else 0.0
    v["largest_at"] = str(loose.loc[dev.idxmax(), "point"]) if len(dev) else ""
    out = check[~check["within"]]
    _require(
        out.empty,
        f"FSDP's live bytes off formulas.fsdp_live_bytes (after init / after step: exact; after backward and at the "
        f"peak: within {X.PEAK_TOL:.0%}) at {len(out)} point(s):\n{out.to_string()}\n\nevery rank's points",
        check.to_string(),
    )
    notes = [
        f"After init and after each step ({len(exact)} points over all ranks): measured "
        f"{'= formula, to the byte' if v['exact'] else '≠ formula'}. After backward and at the forward/backward peak "
        f"({len(loose)} points): largest deviation {v['largest_deviation']:.1%} ({v['largest_at']}; tolerance "
        f"{X.PEAK_TOL:.0%}). Rank 0:"
    ]
    return Result(table=check[check["rank"] == 0], notes=notes, values=v)


def zero_section(setup: Setup, runs: list) -> Result:
    """Model states after the last step per kind against ZeRO's formula (formulas.zero_memory); what FSDP saves
    against DDP in states and in the peak. Saved as 07_zero_check."""
    zero, mem = X.zero_check(runs), X.memory_table(runs)
    dev = float((zero["measured/zero"] - 1).abs().max())
    states = zero.groupby("kind")["measured_MiB"].max()
    peak = mem.groupby("kind")["peak_MiB"].max()
    _require(bool((zero["measured_MiB"] > 0).all()), "no model states measured", zero)
    saved = setup.save(zero, "07_zero_check", model=setup.config["model"], world_size=setup.world)
    v = dict(largest_deviation=dev, states=states.to_dict(), peak=peak.to_dict())
    notes = [f"Measured model states against ZeRO's formula: within {dev:.2%} for every kind and rank."]
    if "ddp" in states and "fsdp" in states:
        v["states_saved"], v["peak_fall"] = states["ddp"] - states["fsdp"], peak["ddp"] - peak["fsdp"]
        share = v["peak_fall"] / v["states_saved"]
        inside = abs(v["peak_fall"] - v["states_saved"]) <= X.PEAK_TOL * peak["ddp"]  # the peak check's tolerance
        than = (
            f"no measurable difference from the states saved ({share:.0%} of them, inside the {X.PEAK_TOL:.0%} of "
            "DDP's peak the tracker's peaks are checked to)"
            if inside
            else f"{'more' if share > 1 else 'less'} than the states saved ({share:.0%} of them, beyond the "
            f"{X.PEAK_TOL:.0%} peak check)"
        )
        notes.append(
            f"FSDP keeps {v['states_saved']:.3f} MiB less model state per rank than DDP; its forward/backward peak "
            f"is {v['peak_fall']:.3f} MiB lower: {than}."
        )
    return Result(table=zero, notes=notes, saved=saved, values=v)


# ---- §3 ----


def bytes_section(setup: Setup, runs: list) -> Result:
    """One FSDP step's bytes per collective against fsdp_bytes_per_step (exact), and against DDP's formula."""
    model = setup.config["model"]
    table = X.bytes_table(runs, model)
    v = dict(
        equal=bool(table["equal"].all()),
        ratio=float(table["FSDP / DDP"].iloc[0]),
        sent_bytes=float(table["sent MiB"].iloc[0] * MiB),
    )
    notes = [
        f"{model}: each rank sends {v['sent_bytes'] / MiB:.3f} MiB per step, "
        f"{'exactly' if v['equal'] else 'not'} the formula's; FSDP / DDP = {v['ratio']:.4f} · rank 0 · {setup.where}"
    ]
    return Result(table=table.round(4), notes=notes, values=v)


def timeliness_section(setup: Setup, runs: list) -> Result:
    """Per rank and forward module: did its prefetched all-gather end in time, and the stall (µs) otherwise.
    Saved as 07_gather_timeliness."""
    timely = X.gather_timeliness(runs)
    pre = timely[timely["prefetched"]]
    _require(bool((timely["stall_us"] >= 0).all()), "a negative stall", timely)
    saved = setup.save(timely, "07_gather_timeliness", model=setup.config["model"], world_size=setup.world)
    v = dict(in_time=float(pre["in_time"].mean()), prefetched=len(pre), stall_ms=float(pre["stall_us"].sum() / 1e3))
    notes = [
        f"Forward all-gathers in time: {v['in_time']:.0%} of {v['prefetched']} prefetched; total stall "
        f"{v['stall_ms']:.2f} ms over {setup.world} ranks · {setup.where}. Stall (µs) per module and rank:"
    ]
    table = timely.pivot(index="module", columns="rank", values="stall_us").round(1)
    return Result(table=table, notes=notes, saved=saved, values=v)


# ---- §4 ----


def speed_section(setup: Setup, runs: list) -> Result:
    """Step time per kind, interleaved, with the paired ratio to FSDP's and its 95 % interval."""
    speed = X.speed_table(runs)
    _require(bool((speed["median_ms"] > 0).all()), "a step took no time", speed)
    pairs = min(len(s) for s in runs[0].samples.values())
    notes = []
    for kind in (k for k in speed.index if k != "fsdp"):
        r = speed.loc[kind]
        notes.append(verdict(kind, "FSDP", Ratio(r["/ fsdp"], r["low"], r["high"], pairs)) + ".")
    notes.append(f"{setup.config['steps']} interleaved steps · {setup.where}")
    v = {"ratio": speed["/ fsdp"].to_dict(), "measurable": speed["measurable"].to_dict()}
    return Result(table=speed.round(3), notes=notes, values=v)


# ---- §5 ----


def checkpoint_section(setup: Setup) -> Result:
    """Peak memory and step time per segment size (X.checkpoint_sweep) beside the model M(k) = ⌈L/k⌉I + kA
    (X.checkpoint_model). Saved as 07_checkpoint."""
    c = setup.config
    ck = dict(
        n_layers=c["ckpt_layers"],
        batch_size=c["ckpt_batch"],
        context_length=c["ckpt_context"],
        segments=c["segments"],
    )
    sweep = X.checkpoint_sweep(c["ckpt_model"], steps=c["ckpt_steps"], **ck)
    model = X.checkpoint_model(c["ckpt_model"], **ck)
    sweep["model_MiB"], attrs = model["model_MiB"], model.attrs
    used = sweep.index[sweep.index > 0]
    best = int(sweep.loc[used, "peak_MiB"].idxmin())
    split = [k for k in used if k < attrs["n_blocks"]]  # k = L is one segment: its recompute rebuilds every activation
    above = sweep.loc[used, "peak_MiB"] - sweep.loc[used, "model_MiB"]
    v = dict(
        measured_best=best,
        k_best=attrs["k_best"],
        k_continuous=attrs["k_continuous"],
        split_saves=bool((sweep.loc[split, "peak_MiB"] < sweep.loc[0, "peak_MiB"]).all()),
    )
    _require(bool((sweep["peak_MiB"] > 0).all()), "a step held no activations", sweep)
    saved = setup.save(
        sweep.reset_index(),
        "07_checkpoint",
        model=c["ckpt_model"],
        n_blocks=attrs["n_blocks"],
        batch=c["ckpt_batch"],
        context=c["ckpt_context"],
        k_continuous=attrs["k_continuous"],
        k_best=attrs["k_best"],
        steps=c["ckpt_steps"],
    )
    r = sweep.loc[best]
    notes = [
        f"{c['ckpt_model']}, {attrs['n_blocks']} blocks: k* = √(LI/A) = {attrs['k_continuous']:.2f}, the model's "
        f"best integer k = {attrs['k_best']}; the measured lowest peak is at k = {best} · {setup.where}",
        f"Measured peak minus the model, k ≥ 1: {above.min():+.3f} to {above.max():+.3f} MiB "
        "(the model leaves out backward's temporaries).",
        f"At k = {best}: "
        + verdict("checkpointing", "no checkpointing", Ratio(r["time / none"], r["low"], r["high"], c["ckpt_steps"]))
        + "; one more forward is about 4/3 of a step's FLOPs.",
        *c.get("left_out", []),  # the model this GPU could not hold without checkpointing (config_for)
    ]
    return Result(table=sweep.round(3), notes=notes, saved=saved, values=v)


# ---- §6 ----


def ring_section(setup: Setup) -> Result:
    """The hand-written rings (and dist.all_reduce) on each world size and message size: bitwise dist.all_reduce's
    result, bytes sent per rank against the formulas (exact), times against 2(N−1)(α + S/(NW)) with α, W fitted.
    Saved as 07_ring."""
    c = setup.config
    backend, device = X.ring_backend(c["ring_worlds"])  # NCCL with a GPU per rank, else gloo on the CPU
    worker = partial(X.ring_worker, sizes=c["ring_sizes"], steps=c["ring_steps"], warmup=1)
    fit = X.ring_fit(X.ring_table([launch(worker, n, backend=backend, device=device) for n in c["ring_worlds"]]))
    ring = fit["table"]
    hand = ring[ring["method"] != "dist.all_reduce"]
    v = dict(
        exact=bool(ring["exact"].all()),
        bytes_exact=bool((hand["sent/S"] == hand["formula/S"]).all()),
        alpha_s=fit["alpha_s"],
        W_Bps=fit["W_Bps"],
    )
    _require(v["exact"] and v["bytes_exact"], "a ring's result or bytes differ", ring)
    saved = setup.save(ring, "07_ring", alpha_s=fit["alpha_s"], W_Bps=fit["W_Bps"])
    fitted = (
        f"α = {v['alpha_s'] * 1e6:.0f} µs, W = {v['W_Bps'] / 1e9:.2f} GB/s"
        if v["W_Bps"] < 1e14  # ring_fit's floor on 1/W: the bandwidth term came out at or below zero
        else f"α = {v['alpha_s'] * 1e6:.0f} µs per step alone (the bandwidth term came out at or below zero: "
        "per-call latency and the machine's load dominate these sizes)"
    )
    notes = [
        f"Every result bitwise dist.all_reduce's; bytes sent per rank exactly the formulas'. Fitted to the ring's "
        f"times: {fitted} · {setup.machine} · {backend} on {device}, {c['ring_worlds']} ranks"
    ]
    table = ring.pivot_table(index=["N", "S_bytes"], columns="method", values=["median_us", "model_us"]).round(0)
    return Result(table=table, notes=notes, saved=saved, values=v)


# ---- §7 ----


def ffn_section(setup: Setup, ffn: dict | None = None, n_tp: int = 4) -> Result:
    """The 2026 gated FFN per device under DP, FSDP, TP and FSDP×TP (formulas.gated_ffn), with where each turns
    communication-bound. Saved as 07_ffn_calcs."""
    ffn = ffn or FFN_EXAMPLE
    table = X.ffn_table(n_tp=n_tp, **ffn)
    limits = F.gated_ffn_thresholds(**{k: ffn[k] for k in ("d", "f", "n", "C", "W")})
    _require(table.loc["dp", "bytes_sent"] == table.loc["fsdp", "bytes_sent"], "DP and FSDP bytes differ", table)
    saved = setup.save(table.reset_index(), "07_ffn_calcs", n_tp=n_tp, **ffn)
    notes = [
        f"Per device, {ffn}: DP/FSDP communication-bound below {limits['dp_min_tokens']:.0f} tokens; TP above "
        f"{limits['tp_max_devices']:.1f} devices (calculator)"
    ]
    v = {"dp_bytes": float(table.loc["dp", "bytes_sent"]), "fsdp_bytes": float(table.loc["fsdp", "bytes_sent"])}
    return Result(table=table, notes=notes, saved=saved, values={**v, **limits})
