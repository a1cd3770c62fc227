"""The answers page (writeups/answers.html): every question of the course's profiling, kernel and data-parallel
sections, answered in a sentence or two with the numbers this machine saved (`helpers.results`).

    write_page(Path("writeups/answers.html"), profile="cpu")   # after the notebooks ran; reads data/local/<device>/
    QUESTIONS                                                  # the table: number, question, notebook, reads, ...
    timing.pairwise_ratios({"fp32": [...], "bf16": [...]}, size="small/cpu")   # what a notebook saves to compare

A comparison is answered only from rows that carry a paired ratio and its interval (`timing.pairwise_ratios`, saved by the
notebook that timed both sides in one interleaved loop): inside the noise the page says so and names no winner.
A result that was not saved (or was saved by the other profile) gives "not measured in this run (run notebook NN)".
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from helpers import formulas
from helpers.env import machine_facts
from helpers.model import get_config
from helpers.results import DATA_DIR, Results, device_slug, load_results
from helpers.timing import Ratio, ratio_of, verdict

NOTEBOOKS = {"01": "01_benchmarking_and_profiling", "02": "02_rmsnorm_triton", "03": "03_collectives",
             "04": "04_ddp", "05": "05_optimizer_state_sharding"}  # number -> file stem (and writeup page)
WRITEUP = "004_7287c5c69baef1ef.txt"  # the published full writeup (H100s)
ZERO1 = "000_6835ed27c4bcad4a.txt"  # the published ZeRO-1 accounting commentary (H100s)
SECTIONS = {"2": "Single-device performance: timing, profiling, mixed precision, norms, kernels, compilation, memory",
            "3": "Distributed data-parallel training: collectives, DDP variants, buckets, optimizer-state sharding"}


# ---- comparisons: the rows a notebook saves, and the sentence they give ---------------------------------------------

def compare_text(a: str, b: str, r: Ratio, what: str = "time") -> str:
    """One clause: the measurably faster of a and b with the ratio, or no winner inside the noise."""
    if not r.differs:
        return verdict(a, b, r, what)
    faster, slower = (a, b) if r.median < 1 else (b, a)
    return f"{faster} is measurably faster than {slower}: {a} takes {r.median:.2f}x {b}'s {what} ({r})"


def series_text(rows: pd.DataFrame, a: str, b: str, over: str, names: dict | None = None, what: str = "time") -> str:
    """a's time over b's at each value of `over` (rows of pairwise_ratios), then how many are measurable each way."""
    names = names or {}
    na, nb = names.get(a, a), names.get(b, b)
    part = rows[(rows["a"] == a) & (rows["b"] == b)]
    if part.empty:
        raise NotMeasured(f"no {a} vs {b} comparison saved")
    ratios = [(str(key), ratio_of(row)) for key, row in zip(part[over], part.to_dict("records"))]
    items = ", ".join(f"{key}: {r.median:.2f}x [{r.low:.2f}-{r.high:.2f}]" for key, r in ratios)
    faster = [k for k, r in ratios if r.differs and r.median < 1]
    slower = [k for k, r in ratios if r.differs and r.median > 1]
    same = [k for k, r in ratios if not r.differs]
    every, any_ = ((f"for every {over}", f"for any {over}") if len(ratios) > 1 else
                   (f"for {over} {ratios[0][0]}",) * 2)
    if len(faster) == len(ratios):
        head = f"{na} is measurably faster than {nb} {every}"
    elif len(slower) == len(ratios):
        head = f"{nb} is measurably faster than {na} {every}"
    elif len(same) == len(ratios):
        head = f"no measurable difference between {na} and {nb} {any_} on this machine"
    else:
        head = "; ".join(text for keys, text in (
            (faster, f"{na} is measurably faster than {nb} for {over} {', '.join(faster)}"),
            (slower, f"{nb} is measurably faster than {na} for {over} {', '.join(slower)}"),
            (same, f"no measurable difference between them for {over} {', '.join(same)}")) if keys)
    return f"{head} ({na}'s {what} over {nb}'s, median of paired ratios [95% interval] per {over}: {items})"


# ---- reading what this machine saved ---------------------------------------------------------------------------------

class NotMeasured(Exception):
    """A saved result an answer reads is missing, empty, or was saved by the other profile."""


class Saved:
    """This machine's saved results for one profile, each read once; remembers which ones answers used."""

    def __init__(self, folder: Path, profile: str):
        self.folder, self.profile = Path(folder), profile
        self.used: dict[str, Results] = {}
        self._cache: dict[str, Results | NotMeasured] = {}

    def _get(self, name: str) -> Results | NotMeasured:
        """The saved run, or why there is none (read once)."""
        if name not in self._cache:
            path = self.folder / f"{name}.jsonl"
            run = load_results(path) if path.is_file() else None
            saved_by = None if run is None else run.provenance.get("profile")
            self._cache[name] = (NotMeasured(f"nothing saved as {name}") if run is None else
                                 NotMeasured(f"{name} was saved by a {saved_by}-profile run")
                                 if saved_by not in (None, self.profile) else
                                 run if run.rows else NotMeasured(f"{name} has no rows"))
        return self._cache[name]

    def run(self, name: str) -> Results:
        """The saved run `name` (marked as used), or NotMeasured."""
        found = self._get(name)
        if isinstance(found, NotMeasured):
            raise found
        self.used[name] = found
        return found

    def frame(self, name: str) -> pd.DataFrame:
        """The rows of the saved run `name` as a DataFrame."""
        return self.run(name).frame()

    def has(self, name: str) -> bool:
        """Whether `name` was saved by this profile (without marking it used)."""
        return not isinstance(self._get(name), NotMeasured)


def _shown(path: Path) -> str:
    """A path relative to the repository when it lies inside it."""
    try:
        return Path(path).resolve().relative_to(DATA_DIR.parent).as_posix()
    except ValueError:
        return Path(path).name


def fmt_s(seconds: float) -> str:
    """Seconds in the unit that suits them: 1.23 s, 12.3 ms, 456 µs."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def fmt_mib(mib: float) -> str:
    """MiB, or GiB above 1024 MiB."""
    return f"{mib / 1024:.3g} GiB" if mib >= 1024 else f"{mib:.3g} MiB"


def pct(x: float) -> str:
    """A share as a percentage: one decimal below 10%."""
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"


def cap(text: str) -> str:
    """The text with a capital first letter, unless it opens with a model name ("xl/cpu") or a dtype ("fp32")."""
    keep = not text[:1].islower() or re.match(r"\S*/|fp\d|bf\d", text)
    return text if keep else text[0].upper() + text[1:]


def span(values, digits: int = 1) -> str:
    """"1.2x to 1.9x" over the values, or "1.5x" when they agree to `digits`."""
    lo, hi = f"{min(values):.{digits}f}x", f"{max(values):.{digits}f}x"
    return lo if lo == hi else f"{lo} to {hi}"


# ---- the questions ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    """A published figure, cited by the file it comes from (a measurement made elsewhere, not here)."""
    value: str
    source: str


@dataclass(frozen=True)
class Question:
    """One numbered question of the course: what it asks, where it is answered, what it reads, how it carries over."""
    number: str  # as the course numbers it: "2.1.1(b)"
    ask: str  # the question in our words
    notebook: str  # "01"
    section: str  # the notebook section with the details
    reads: tuple[str, ...]  # the saved results the answer reads
    gpu: str  # does the answer on a CPU carry over to a GPU, and why
    references: tuple[Reference, ...] = ()

    @property
    def group(self) -> str:
        """The problem's number without the part: "2.1.1"."""
        return self.number.split("(")[0]

    @property
    def problem(self) -> str:
        """The course's name for the problem: "benchmarking_script"."""
        return PROBLEMS[self.group]


def ref(value: str, source: str = WRITEUP) -> tuple[Reference, ...]:
    """One published figure, from the full writeup unless `source` says otherwise."""
    return (Reference(value, source),)


PROBLEMS = {  # the course's name for each numbered problem
    "2.1.1": "benchmarking_script", "2.1.2": "function_call_table", "2.1.3": "flame_graph",
    "2.1.4": "benchmarking_mixed_precision", "2.1.5": "pytorch_layernorm", "2.2.1": "rmsnorm_forward_benchmarking",
    "2.2.2": "rmsnorm_jvp_g", "2.2.3": "rmsnorm_jvp_x", "2.2.4": "rmsnorm_benchmarking", "2.3.1": "torch_compile",
    "2.4.1": "memory_profiling", "3.1.1": "distributed_communication_single_node",
    "3.2.1": "distributed_communication_multi_node", "3.3.1": "naive_ddp", "3.3.2": "naive_ddp_benchmarking",
    "3.4.1": "minimal_ddp_flat_benchmarking", "3.4.2": "minimal_ddp_benchmarking",
    "3.4.3": "ddp_overlap_individual_parameters_benchmarking", "3.4.4": "ddp_bucketed_benchmarking",
    "3.4.5": "optimizer_state_sharding_accounting",
}

Q = Question
QUESTIONS = [
    Q("2.1.1(a)", "How is a forward / backward pass timed: model built, warm-up, synchronised steps?",
      notebook="01", section="§1 Timing", reads=("01_timing",),
      gpu="The same code runs; each step is then timed by a pair of CUDA events."),
    Q("2.1.1(b)", "How long do forward, backward and both take per model size after warm-up, and how much do the "
      "steps vary?",
      notebook="01", section="§1 Timing", reads=("01_timing",),
      gpu="Absolute times do not carry over: a GPU runs the reference sizes, and small models there are bound by "
          "kernel launches rather than arithmetic.",
      references=ref("xl forward+backward 180 ms, 2.7B 213 ms (H100, 1 warm-up, 5 steps)")),
    Q("2.1.1(c)", "Without warm-up, what changes and why?",
      notebook="01", section="§1 Timing", reads=("01_timing",),
      gpu="The effect is larger there (CUDA context, kernel loading, cuBLAS heuristics on the first call).",
      references=ref("small forward without warm-up: mean 79.8 ms with std 103 ms, against 13.6 ms warmed up (H100)")),
    Q("2.1.2(a)", "How long is a forward pass according to the profiler, against the timing script?",
      notebook="01", section="§2 Profiler tables", reads=("01_profile", "01_timing"),
      gpu="The profiler then reports CUDA kernel time, not CPU time: rerun with `make writeup PROFILE=gpu`.",
      references=ref("xl forward: about 90 ms in the profiler against 81 ms timed (H100)")),
    Q("2.1.2(b)", "Which op (kernel) takes the most time in the forward pass, how often is it called, and is it the "
      "same once backward runs too?",
      notebook="01", section="§2 Profiler tables", reads=("01_profile",),
      gpu="The table then lists CUDA kernels (cuBLAS GEMMs); matmuls usually still lead.",
      references=ref("a TF32 cuBLAS GEMM, 192 calls per xl forward; another GEMM leads forward+backward (H100)")),
    Q("2.1.2(c)", "Besides matrix multiplies, which ops take a non-trivial share of the forward pass?",
      notebook="01", section="§2 Profiler tables", reads=("01_profile",),
      gpu="Elementwise ops are memory-bound on both; their share is typically larger there, where matmuls are much "
          "faster.",
      references=ref("aten::mul, add_, div, sum, copy_ and clone (H100)")),
    Q("2.1.2(d)", "With the optimizer step included, how does the matmul share change?",
      notebook="01", section="§2 Profiler tables", reads=("01_profile",),
      gpu="Direction carries over (AdamW is all elementwise); the shares do not.",
      references=ref("aten::mm share falls from 30% to 18% once AdamW runs (H100)")),
    Q("2.1.3(a)", "What does the full training step look like as a flame graph?",
      notebook="01", section="§3 Flame graph", reads=("01_flame",),
      gpu="The stack structure is the same; the widths become kernel times."),
    Q("2.1.3(b)", "What share of the step goes to RMSNorm?",
      notebook="01", section="§3 Flame graph", reads=("01_flame",),
      gpu="The shares move: matmuls speed up more than the norms' elementwise work.",
      references=ref("2.91% for xl, 97 norm layers (H100)")),
    Q("2.1.3(c)", "What share of the step goes to softmax?",
      notebook="01", section="§3 Flame graph", reads=("01_flame",),
      gpu="As for RMSNorm: the shares move.",
      references=ref("2.88% for xl, 48 calls (H100)")),
    Q("2.1.3(d)", "Does the graph match expectations; what is surprising?",
      notebook="01", section="§3 Flame graph", reads=("01_flame", "01_profile"),
      gpu="The lesson (FLOPs are not time) holds on both; the numbers differ."),
    Q("2.1.4(a)", "Is forward+backward faster under autocast (bf16/fp16) than in fp32, per size?",
      notebook="01", section="§4 Mixed precision", reads=("01_precision_ratios",),
      gpu="Does not carry over: GPU tensor cores run bf16/fp16 matmuls many times faster than fp32, while a CPU "
          "without bf16 instructions only adds casts.",
      references=ref("2.7B forward+backward 213 ms fp32 vs 197 ms mixed; small 24.1 vs 30.6 ms (H100)")),
    Q("2.1.4(b)", "Under autocast, which dtype do the parameters, fc1's output, the norm's output, the logits, the "
      "loss and the gradients get?",
      notebook="01", section="§4 Mixed precision", reads=("01_autocast_dtypes",),
      gpu="Partly: CUDA autocast keeps layer_norm in fp32, CPU autocast does not; the rest agree.",
      references=ref("fc1 output fp16, LayerNorm output fp32, logits fp16 (H100, fp16 autocast)")),
    Q("2.1.4(c)", "Why keep the norm in fp32, and does that change with bf16?",
      notebook="01", section="§4 Mixed precision", reads=("01_norm_precision",),
      gpu="Carries over exactly: rounding is the same arithmetic everywhere."),
    Q("2.1.5(a)", "Is PyTorch's LayerNorm faster than RMSNorm written in PyTorch ops, per width?",
      notebook="02", section="§1 LayerNorm vs RMSNorm", reads=("rmsnorm_ratios",),
      gpu="Direction usually carries over (one fused kernel vs several passes); the ratio depends on the bandwidth.",
      references=ref("RMSNorm in PyTorch ops takes 2.6x-3.4x LayerNorm's time, H 1024-8192 (H100)")),
    Q("2.1.5(b)", "What does swapping RMSNorm for LayerNorm do to the whole model's time?",
      notebook="02", section="§1 The norm swapped inside the model", reads=("rmsnorm_model_ratios",),
      gpu="The norms are a smaller share of the step there, so the difference shrinks.",
      references=ref("xl forward+backward 166 ms with LayerNorm vs 180 ms with RMSNorm (H100)")),
    Q("2.2.1(a)", "Is the Triton RMSNorm forward faster than LayerNorm and the PyTorch-ops RMSNorm?",
      notebook="02", section="§4 Speed and bandwidth", reads=("rmsnorm_ratios",),
      gpu="Only there: compiled Triton needs CUDA (`make writeup PROFILE=gpu`, or `python -m helpers bench rmsnorm "
          "--impls triton layernorm torch`).",
      references=ref("H=8192 forward: Triton 1.79 ms, LayerNorm 1.67 ms, RMSNorm 4.29 ms (H100)")),
    Q("2.2.1(b)", "Inside the model, is the forward faster with the Triton norm?",
      notebook="02", section="§1 The norm swapped inside the model", reads=("rmsnorm_model_ratios",),
      gpu="Only there (`make writeup PROFILE=gpu`).",
      references=ref("2.7B forward: Triton 55.8 ms, LayerNorm 56.0 ms, RMSNorm 59.1 ms (H100)")),
    Q("2.2.2(a)", "What is the gradient of the loss with respect to the gain g?",
      notebook="02", section="§2 The gradients, derived", reads=("rmsnorm_grad_checks",),
      gpu="A derivation: the same on every machine."),
    Q("2.2.2(b)", "Implement the backward (a PyTorch autograd Function) and check it.",
      notebook="02", section="§2 and §3", reads=("rmsnorm_grad_checks",),
      gpu="The PyTorch Function runs anywhere; the Triton one is checked here in the interpreter and compiled for "
          "sm_80/sm_90a by `python -m helpers kernels`."),
    Q("2.2.3(a)", "What is the gradient of the loss with respect to the input x?",
      notebook="02", section="§2 The gradients, derived", reads=("rmsnorm_grad_checks",),
      gpu="A derivation: the same on every machine."),
    Q("2.2.4(a)", "Forward+backward: how do LayerNorm, the PyTorch RMSNorm and the fused kernel compare?",
      notebook="02", section="§4 Speed and bandwidth", reads=("rmsnorm_ratios",),
      gpu="The Triton kernel is timed there only (`make writeup PROFILE=gpu`).",
      references=ref("H=8192 forward+backward: LayerNorm 2.84 ms, RMSNorm 6.43 ms, Triton 5.07 ms (H100, its "
                     "§2.3.1(b))")),
    Q("2.2.4(b)", "Inside the model, forward and backward with each norm?",
      notebook="02", section="§1 The norm swapped inside the model", reads=("rmsnorm_model_ratios",),
      gpu="The Triton norm inside the model is timed there only (`make writeup PROFILE=gpu`).",
      references=ref("2.7B backward: Triton 145 ms, LayerNorm 145 ms, RMSNorm 155 ms (H100)")),
    Q("2.3.1(a)", "Is torch.compile of the PyTorch RMSNorm faster than the other norms (forward)?",
      notebook="02", section="§4 Speed and bandwidth", reads=("rmsnorm_ratios",),
      gpu="Does not carry over: torch.compile emits C++ loops for a CPU and Triton kernels for a GPU.",
      references=ref("H=8192 forward: compiled 1.93 ms, Triton 1.44 ms, RMSNorm 4.29 ms (H100)")),
    Q("2.3.1(b)", "The same with the backward pass?",
      notebook="02", section="§4 Speed and bandwidth", reads=("rmsnorm_ratios",),
      gpu="As (a): a different code generator.",
      references=ref("H=8192 forward+backward: compiled 4.44 ms, Triton 5.07 ms (H100)")),
    Q("2.3.1(c)", "Is the whole model faster compiled than eager, forward and forward+backward?",
      notebook="02", section="§5 torch.compile of the whole model", reads=("rmsnorm_model_ratios",),
      gpu="Fusion there saves memory traffic and kernel launches; the gain is usually larger.",
      references=ref("2.7B forward+backward 213 ms eager vs 155 ms compiled (H100)")),
    Q("2.4.1(a)", "How does memory move through a forward-only pass and through a full step?",
      notebook="01", section="§5 Memory", reads=("01_memory_peaks",),
      gpu="The shape of the timeline carries over; the CUDA caching allocator keeps its own reserve on top."),
    Q("2.4.1(b)", "What is the peak memory per size, forward only and full step?",
      notebook="01", section="§5 Memory", reads=("01_memory_peaks",),
      gpu="Scales with the model: the reference sizes need GiB, not MiB.",
      references=ref("full-step peak: small 2.81 GiB, 2.7B 38.56 GiB (H100)")),
    Q("2.4.1(c)", "Does mixed precision change the peak?",
      notebook="01", section="§5 Memory", reads=("01_memory_peaks",),
      gpu="Carries over: autocast keeps fp32 parameters and adds 16-bit copies on every device.",
      references=ref("2.7B with autocast: forward 14.63 GiB (from 10.07), full step 43.30 GiB (from 38.56) (H100)")),
    Q("2.4.1(d)", "How large is the residual stream's activation?",
      notebook="01", section="§5 Memory", reads=("01_memory_peaks",),
      gpu="A formula: B·T·d_model·4 bytes on any device.",
      references=ref("20 MiB for 2.7B at batch 16 × context 128")),
    Q("2.4.1(e)", "Which tensors are largest at the peak, and where were they allocated?",
      notebook="01", section="§5 Memory", reads=("01_largest_tensors",),
      gpu="The kinds of tensor carry over; their sizes scale with the model.",
      references=ref("100 MiB tensors: the 2.7B feed-forward weights (H100)")),
    Q("3.1.1", "How long does an all-reduce take per backend, device, message size and process count on one node?",
      notebook="03", section="Tables, plots and the α–β fit", reads=("03_collectives",),
      gpu="Only gloo on CPU runs here. NCCL needs one GPU per rank: `torchrun --standalone --nproc-per-node 8 -m "
          "helpers bench collectives --backend nccl --device cuda`.",
      references=ref("gloo on CPU, 2 processes: 0.83 ms for 512 KB, 762 ms for 1 GB")),
    Q("3.2.1", "The same benchmark with the processes split over two nodes?",
      notebook="03", section="Two nodes", reads=("03_two_node_rehearsal",),
      gpu="Needs two GPU nodes (the commands are in the answer); this machine only rehearses the launch path."),
    Q("3.3.1", "Does naive DDP (one all-reduce per parameter after backward) train exactly like one process on "
      "the full batch?",
      notebook="04", section="§1 Correctness", reads=("04_ddp_checks",),
      gpu="Carries over: the bound is float arithmetic and covers any reduction order, NCCL's included."),
    Q("3.3.2", "How long is a naive DDP step, and how much of it is communication?",
      notebook="04", section="§2 Speed", reads=("04_ddp_speed", "04_ddp_ratios"),
      gpu="Does not carry over: two gloo ranks share this CPU's cores; NCCL over NVLink is orders of magnitude "
          "faster.",
      references=ref("xl naive DDP step 201 ms on one node, 334 ms over two nodes (H100s)")),
    Q("3.4.1", "Does one all-reduce of all gradients (flattened) beat one per parameter?",
      notebook="04", section="§2 Speed", reads=("04_ddp_ratios",),
      gpu="The per-call start-up cost α is smaller with NCCL, so flattening saves less there.",
      references=ref("xl step 195 ms flat vs 201 ms naive, one node (H100s)")),
    Q("3.4.2", "With the gradients batched into one call, how much communication time is left?",
      notebook="04", section="§2 Speed", reads=("04_ddp_speed", "04_ddp_ratios"),
      gpu="As 3.4.1.",
      references=ref("xl step 197 ms with batched gradients, one node (H100s)")),
    Q("3.4.3(a)", "Does overlapping each parameter's all-reduce with backward make the step faster?",
      notebook="04", section="§2 Speed", reads=("04_ddp_ratios",),
      gpu="Does not carry over: NCCL runs on its own stream and copy engines, gloo here shares the CPU cores with "
          "backward.",
      references=ref("xl overlapped 216 ms vs 201 ms naive, one node (H100s)")),
    Q("3.4.3(b)", "What do traces show for overlapped vs naive communication?",
      notebook="04", section="§3 Overlap", reads=("04_ddp_overlap",),
      gpu="Use NCCL and a CUDA trace there; the gloo events recorded here do not exist with NCCL."),
    Q("3.4.3(c)", "What fraction of the communication overlaps backward?",
      notebook="04", section="§3 Overlap", reads=("04_ddp_overlap",),
      gpu="The fraction depends on the backend and its streams.",
      references=ref("12.5% on rank 0, 9.1% on rank 1; naive 0% (H100s)")),
    Q("3.4.4(a)", "How does the step time change with the bucket size?",
      notebook="04", section="§4 The bucket-size model", reads=("04_ddp_bucket_sweep", "04_ddp_ratios"),
      gpu="The optimum moves with α, β and the backward time, all different there.",
      references=ref("NCCL, large: 128-130 ms for every bucket size from 5 to 500 MB (H100s)")),
    Q("3.4.4(b)", "What bucket size minimises the overhead, from α, β, the gradient bytes and the backward time?",
      notebook="04", section="§4 The bucket-size model", reads=("04_ddp_bucket_sweep",),
      gpu="The formula carries over; plug in the GPU's α, β and backward time."),
    Q("3.4.5(a)", "Peak memory after model initialisation, directly before and directly after the optimizer step, "
      "with and without sharding; what is it made of?",
      notebook="05", section="§2 (a) Memory", reads=("05_sharding_memory",),
      gpu="The accounting carries over exactly; the sizes scale with the model (xl on GPUs).",
      references=(
          Reference("xl, 2 GPUs: after the optimizer step 40.73 GB unsharded vs 28.67 GB sharded; 24.38 GB before "
                    "the step in both", ZERO1),
          Reference("xl, 2 GPUs: after the optimizer step 23.01 GiB unsharded vs 17.38 GiB sharded", WRITEUP),
      )),
    Q("3.4.5(b)", "How does sharding change the time per iteration?",
      notebook="05", section="§3 (b) Time per iteration", reads=("05_sharding_speed", "05_sharding_ratios"),
      gpu="Does not carry over: the broadcast's cost against the update it saves depends on the link (NVLink vs "
          "gloo).",
      references=(
          Reference("xl, 2 GPUs: 783.5 ms unsharded vs 836.1 ms sharded (+6.7%)", ZERO1),
          Reference("xl, 2 GPUs: 202 ms unsharded vs 198 ms sharded", WRITEUP),
      )),
    Q("3.4.5(c)", "How does this optimizer-state sharding differ from ZeRO stage 1?",
      notebook="05", section="§4 (c) ZeRO stage 1", reads=("05_sharding_memory", "05_sharding_comm"),
      gpu="Bytes counted by formula: the same anywhere.",
      references=(
          Reference("counts gradient sharding as part of stage 1; in the ZeRO paper that is stage 2 (P_os+g)", ZERO1),
          Reference("broadcasts per parameter instead of one all-gather; same bytes claimed", WRITEUP),
      )),
]
BY_NUMBER = {q.number: q for q in QUESTIONS}
ANSWERS: dict[str, object] = {}  # number -> function(saved) -> str


def answers(*numbers: str):
    """Register a function as the answer to these question numbers (called with the question and the saved data)."""
    def register(fn):
        for n in numbers:
            if n not in BY_NUMBER:
                raise ValueError(f"{fn.__name__} answers {n!r}, which is not in QUESTIONS")
            ANSWERS[n] = fn
        return fn
    return register


# ---- 2.1 timing, profiling, mixed precision (notebook 01) -----------------------------------------------------------

def _warm_cold(saved: Saved) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """01_timing's rows that ran, indexed by (size, pass): cold (no warm-up), warm, and the warm-up count."""
    t = saved.frame("01_timing")
    ok = t[t["status"] == "ok"]
    warmup = int(ok["warm-up"].max())
    if warmup == 0:
        raise NotMeasured("01_timing has no warmed-up run")
    idx = ok.set_index(["size", "pass"])
    return idx[idx["warm-up"] == 0], idx[idx["warm-up"] == warmup], warmup


@answers("2.1.1(a)")
def timing_script(q, saved):
    _, warm, warmup = _warm_cold(saved)
    prov = saved.run("01_timing").provenance
    sizes = list(dict.fromkeys(warm.index.get_level_values("size")))
    return (f"`benchmarking.time_sizes` builds a fresh model per size and pass, and `helpers.timing.benchmark` runs "
            f"{warmup} untimed warm-up calls, then times each of {int(warm['steps'].iloc[0])} calls between device "
            f"synchronisations (a cold run repeats it with no warm-up). Here it timed {len(sizes)} sizes "
            f"({', '.join(sizes)}) × forward, backward and forward+backward at batch {prov.get('batch')} × context "
            f"{prov.get('context')}.")


@answers("2.1.1(b)")
def warm_timings(q, saved):
    _, warm, warmup = _warm_cold(saved)
    order = list(dict.fromkeys(warm.index.get_level_values("size")))
    per = warm["mean_s"].unstack("pass").reindex(index=order, columns=["forward", "backward", "both"])
    spread = (warm["std_s"] / warm["mean_s"])
    sizes = ", ".join(f"{s} {fmt_s(r['forward'])} / {fmt_s(r['backward'])} / {fmt_s(r['both'])}"
                      for s, r in per.iterrows())
    return (f"Mean forward / backward / forward+backward after {warmup} warm-up steps: {sizes}. Step-to-step spread "
            f"(std/mean): {pct(spread.median())} in the median run, at most {pct(spread.max())} "
            f"({spread.idxmax()[0]} {spread.idxmax()[1]}).")


@answers("2.1.1(c)")
def cold_timings(q, saved):
    cold, warm, _ = _warm_cold(saved)
    first = (cold["first_s"] / warm["median_s"]).dropna()
    noise = (warm["std_s"] / warm["mean_s"]).median()
    spread = ((cold["std_s"] / cold["mean_s"]) / (warm["std_s"] / warm["mean_s"])).median()
    worst = first.idxmax()
    text = (f"Without warm-up the first call takes {first.median():.1f}x the warm median (median over sizes and "
            f"passes; up to {first.max():.1f}x for {worst[0]} {worst[1]}), and the cold runs' relative spread is "
            f"{spread:.1f}x the warm runs'. ")
    if first.median() <= 1 + 2 * noise:
        return text + (f"That is within twice the warm steps' own spread ({pct(noise)} std/mean): no measurable "
                       "first-call cost on this machine in this run.")
    return text + ("The first call pays one-time work (allocating every buffer, lazy initialisation; on a GPU also the "
                   "CUDA context and kernel selection), so a mean without warm-up mixes two different things.")


def _profile(saved: Saved, run: str) -> pd.DataFrame:
    """01_profile's op table of one profiled step ("forward", "forward+backward", "full step")."""
    p = saved.frame("01_profile")
    part = p[p["run"] == run]
    if part.empty:
        raise NotMeasured(f"01_profile has no {run!r} table")
    return part.sort_values("ms/step", ascending=False)


@answers("2.1.2(a)")
def profiled_forward(q, saved):
    fwd = _profile(saved, "forward")
    size = saved.run("01_profile").provenance.get("size")
    total_ms = float((fwd["ms/step"] / fwd["share"]).iloc[0])
    _, warm, _ = _warm_cold(saved)
    timed = warm.loc[(size, "forward"), "median_s"] * 1e3
    ratio, steps = total_ms / timed, saved.run("01_profile").provenance.get("steps")
    return (f"The profiler puts a forward pass of {size} at {total_ms:.3g} ms of op self time; the timing script's "
            f"warm forward has a median of {timed:.3g} ms, so the profiler's figure is {ratio:.2f}x the timed one. "
            "They differ in what they include: the profiled pass builds no autograd graph, the timed one does, and "
            "the profiler adds its own overhead per op."
            + ("" if 0.5 <= ratio <= 2 else f" A factor this large is more than those differences: the profiler "
               f"averaged only {steps} steps, so a change in the machine's load between the two runs is the likely "
               "cause; re-run notebook 01 on a quiet machine to compare them."))


@answers("2.1.2(b)")
def top_op(q, saved):
    fwd, both = _profile(saved, "forward").iloc[0], _profile(saved, "forward+backward").iloc[0]
    same = "the same op" if fwd["op"] == both["op"] else f"a different op, {both['op']}"
    return (f"In the forward pass {fwd['op']} takes the most time: {pct(fwd['share'])} of it, "
            f"{fwd['calls/step']:g} calls per pass. With backward too, {same} leads with {pct(both['share'])} "
            f"({both['calls/step']:g} calls per step).")


@answers("2.1.2(c)")
def non_matmul_ops(q, saved):
    fwd = _profile(saved, "forward")
    other = fwd[fwd["class"] != "matmul"]
    listed = ", ".join(f"{r['op']} {pct(r['share'])}" for _, r in other.head(5).iterrows())
    return (f"Outside matrix multiplies, the forward pass's largest ops are {listed or 'none among the top ops'}; all "
            f"non-matmul ops together take {pct(1 - fwd['matmul_share'].iloc[0])} of it. They do few FLOPs but read "
            "and write whole tensors, so memory bandwidth sets their time.")


@answers("2.1.2(d)")
def matmul_share(q, saved):
    share = {run: _profile(saved, run)["matmul_share"].iloc[0] for run in ("forward", "forward+backward", "full step")}
    top = _profile(saved, "full step").iloc[0]
    return (f"Matrix multiplies take {pct(share['forward'])} of the forward pass, {pct(share['forward+backward'])} of "
            f"forward+backward and {pct(share['full step'])} of the full step with AdamW, whose update is all "
            f"elementwise (mul_, lerp_, addcdiv_, sqrt over every parameter); the full step's top op is {top['op']} "
            f"({pct(top['share'])}).")


def _flame(saved: Saved) -> pd.DataFrame:
    """01_flame's shares (parts and stages of the step), indexed by part."""
    return saved.frame("01_flame").set_index("part")


@answers("2.1.3(a)")
def flame_stages(q, saved):
    f = _flame(saved)
    stages = f[f["kind"] == "stage"]["share"]
    size = saved.run("01_flame").provenance.get("size")
    return (f"The flame graph of one full step of {size} is drawn in notebook 01 §3 (stacks: step part → module → op; "
            "backward ops attributed to the module whose forward recorded them). The step splits into "
            + ", ".join(f"{k} {pct(v)}" for k, v in stages.items())
            + "; every block repeats the same pattern, one tower per layer.")


@answers("2.1.3(b)", "2.1.3(c)")
def flame_part(q, saved):
    part, what = ("RMSNorm", "norm layers") if q.number == "2.1.3(b)" else ("softmax", "calls")
    f = _flame(saved)
    share, count = float(f.loc[part, "share"]), f.loc[part, "count"]
    return (f"{part} (forward and backward) takes {pct(share)} of the full step here, over {int(count)} {what}: "
            f"{share / count:.2%} each.")


@answers("2.1.3(d)")
def flame_surprise(q, saved):
    f = _flame(saved)
    stages = f[f["kind"] == "stage"]["share"]
    mm = _profile(saved, "full step")["matmul_share"].iloc[0]
    backward = stages.get("backward", 0.0) / stages.get("forward", float("nan"))
    return (f"Matmuls carry nearly all the FLOPs yet take {pct(mm)} of the full step; the rest is elementwise work "
            "(norms, GELU, softmax, AdamW), and the optimizer step alone takes "
            f"{pct(stages.get('optimizer step', 0.0))}. Backward takes {backward:.1f}x the forward's time, against "
            "the 2x its two matmuls per forward matmul predict.")


@answers("2.1.4(a)")
def autocast_speed(q, saved):
    rows = saved.frame("01_precision_ratios")
    rows = rows[rows["b"] == "fp32"]
    parts = [series_text(rows, a, "fp32", "size", what="forward+backward time") for a in sorted(set(rows["a"]))]
    return ("Forward+backward: " + "; ".join(parts) + ". Autocast pays only where the hardware multiplies 16-bit "
            "numbers faster than 32-bit ones (GPU tensor cores, CPUs with bf16 instructions); elsewhere the casts it "
            "inserts are extra work.")


@answers("2.1.4(b)")
def autocast_dtypes(q, saved):
    d = saved.frame("01_autocast_dtypes").set_index("tensor")
    return " ".join(f"Under {col}: " + ", ".join(f"{t} {str(v).replace('torch.', '')}" for t, v in d[col].items()) + "."
                    for col in d.columns)


@answers("2.1.4(c)")
def norm_precision(q, saved):
    err = saved.frame("01_norm_precision").set_index("dtype")["max_rel_error"]
    return (f"The mean of squares over 4096 values, rounded in each dtype, is off by at most {err['float32']:.1e} "
            f"(fp32), {err['bfloat16']:.1e} (bf16) and {err['float16']:.1e} (fp16) relative to fp64, and the norm "
            "scales every activation by it. bf16 has fp32's range (no overflow above 65,504 as fp16 has) but only 8 "
            "significant bits, so its error stays large: keep norms and their reductions in fp32 with either.")


# ---- 2.1.5-2.3 norms, kernels, torch.compile (notebook 02) -----------------------------------------------------------

NORM_NAMES = {"layernorm": "LayerNorm", "torch": "RMSNorm (PyTorch ops)", "rmsnorm": "RMSNorm (PyTorch ops)",
              "F.rms_norm": "F.rms_norm", "torchfn": "RMSNorm (autograd Function)", "rmsnorm_torchfn":
              "RMSNorm (autograd Function)", "triton": "Triton RMSNorm", "rmsnorm_triton": "Triton RMSNorm",
              "compiled": "compiled RMSNorm", "True": "compiled model", "False": "eager model"}
PASS_NAMES = {"fwd": "forward", "fwd+bwd": "forward+backward"}


def _norm_rows(saved: Saved, pass_: str) -> pd.DataFrame:
    """rmsnorm_ratios for one pass, in the first dtype saved (float32 on both profiles)."""
    r = saved.frame("rmsnorm_ratios")
    r = r[(r["pass"] == pass_) & (r["dtype"] == r["dtype"].iloc[0])]
    return r.sort_values("H")


def _norm_series(rows: pd.DataFrame, pairs, over: str, what: str) -> str:
    """series_text for each (a, b) of `pairs`, with the norms' display names."""
    return "; ".join(series_text(rows, a, b, over, NORM_NAMES, what) for a, b in pairs) + "."


def _by_pass(rows_of, pairs, over: str) -> str:
    """"Forward: ... Forward+backward: ...": _norm_series of rows_of(pass) for each pass."""
    return " ".join(f"{PASS_NAMES[p].capitalize()}: " + _norm_series(rows_of(p), pairs, over, f"{PASS_NAMES[p]} time")
                    for p in PASS_NAMES)


def _triton_absent(what: str) -> str:
    """Why the Triton kernel has no timing on a machine without a GPU, and what checks it here."""
    return (f"The Triton kernel was not timed {what} on this machine: without a GPU it runs in Triton's interpreter, "
            "correct (checked against its PyTorch spec in notebook 02 §3) but far too slow to time; "
            "`python -m helpers kernels` compiles it for sm_80/sm_90a here to check registers and spills. To time it, "
            "run `make writeup PROFILE=gpu` or `python -m helpers bench rmsnorm --impls triton layernorm torch` on a "
            "GPU machine.")


@answers("2.1.5(a)")
def layernorm_vs_rmsnorm(q, saved):
    return _by_pass(lambda p: _norm_rows(saved, p), [("torch", "layernorm")], "H")


def _model_rows(saved: Saved, loop: str, pass_: str) -> pd.DataFrame:
    """rmsnorm_model_ratios of one loop ("norms": the norms swapped in the model, "compile": eager vs compiled)."""
    r = saved.frame("rmsnorm_model_ratios")
    return r[(r["loop"] == loop) & (r["pass"] == pass_)]


@answers("2.1.5(b)")
def model_norm_swap(q, saved):
    return _by_pass(lambda p: _model_rows(saved, "norms", p), [("layernorm", "rmsnorm")], "size")


def _kernel_answer(rows: pd.DataFrame, impl: str, others, over: str, what: str, absent: str) -> str:
    """impl against each of `others` present in the rows, or why impl was not timed here."""
    if impl not in set(rows["a"]):
        return absent
    return _norm_series(rows, [(impl, o) for o in others if o in set(rows["b"])], over, what)


@answers("2.2.1(a)")
def triton_forward(q, saved):
    return _kernel_answer(_norm_rows(saved, "fwd"), "triton", ["layernorm", "torch"], "H", "forward time",
                          _triton_absent("on (rows, H) tensors"))


@answers("2.2.1(b)")
def triton_model_forward(q, saved):
    return _kernel_answer(_model_rows(saved, "norms", "fwd"), "rmsnorm_triton", ["layernorm", "rmsnorm"], "size",
                          "forward time", _triton_absent("inside the model"))


def _grad_checks(saved: Saved) -> pd.Series:
    """The largest error of each gradient check notebook 02 §2 ran, when all of them passed."""
    c = saved.frame("rmsnorm_grad_checks").set_index("check")
    if not c["passed"].all():
        raise NotMeasured("a gradient check failed in the saved run")
    return c["max_abs_error"]


@answers("2.2.2(a)")
def grad_g(q, saved):
    err = _grad_checks(saved)
    return ("With r = (mean(x²) + ε)^(-1/2) per row and x̂ = r·x, y = g ⊙ x̂ depends on g_j only through y_j, so "
            "∇_g L = Σ over rows of ∇_y L ⊙ x̂ (the sum because every row shares g). Derived step by step in notebook "
            f"02 §2 and checked there in float64 against autograd (largest difference here "
            f"{err.iloc[0]:.1e}) and by gradcheck.")


@answers("2.2.2(b)")
def grad_impl(q, saved):
    _grad_checks(saved)
    return ("`helpers.rmsnorm.RMSNormPyTorchFunction` saves x, g and r in forward; its backward calls "
            "`rmsnorm_backward_x` and `rmsnorm_backward_g`. In this run both passed the float64 comparison with "
            "autograd and `torch.autograd.gradcheck` (notebook 02 §2); the Triton Function is checked against the same "
            "spec in fp32, fp16 and bf16 in §3.")


@answers("2.2.3(a)")
def grad_x(q, saved):
    err = _grad_checks(saved)
    return ("∇_x L = r·(∇_y L ⊙ g − x̂ · mean(∇_y L ⊙ g ⊙ x̂)) per row: the first term is the direct path through "
            "x, the second comes from r depending on every x_k (∂r/∂x_j = −r³x_j/H). Derived in notebook 02 §2 with ε "
            f"inside the square root as in the code, and checked in float64 against autograd (largest difference here "
            f"{err.iloc[0]:.1e}) and by gradcheck.")


@answers("2.2.4(a)")
def norms_fwd_bwd(q, saved):
    rows = _norm_rows(saved, "fwd+bwd")
    if "triton" in set(rows["a"]):
        return _norm_series(rows, [("triton", "layernorm"), ("triton", "torch")], "H", "forward+backward time")
    return (_triton_absent("on (rows, H) tensors") + " What this machine does answer: "
            + _norm_series(rows, [("torchfn", "torch"), ("torch", "layernorm")], "H", "forward+backward time"))


@answers("2.2.4(b)")
def model_norms_fwd_bwd(q, saved):
    rows = _model_rows(saved, "norms", "fwd+bwd")
    impl = "rmsnorm_triton" if "rmsnorm_triton" in set(rows["a"]) else "rmsnorm_torchfn"
    text = _norm_series(rows, [(impl, "rmsnorm"), (impl, "layernorm")], "size", "forward+backward time")
    return text if impl == "rmsnorm_triton" else _triton_absent("inside the model") + " Measured here: " + text


def _compiled_answer(saved: Saved, pass_: str) -> str:
    """torch.compile of the PyTorch RMSNorm against every other norm timed in the same loops."""
    rows = _norm_rows(saved, pass_)
    others = [o for o in ("triton", "torch", "layernorm") if o in set(rows["b"][rows["a"] == "compiled"])]
    return _norm_series(rows, [("compiled", o) for o in others], "H", f"{PASS_NAMES[pass_]} time")


@answers("2.3.1(a)")
def compiled_forward(q, saved):
    return _compiled_answer(saved, "fwd")


@answers("2.3.1(b)")
def compiled_fwd_bwd(q, saved):
    return _compiled_answer(saved, "fwd+bwd")


@answers("2.3.1(c)")
def compiled_model(q, saved):
    return _by_pass(lambda p: _model_rows(saved, "compile", p), [("True", "False")], "size")


# ---- 2.4 memory (notebook 01) ----------------------------------------------------------------------------------------

def _peaks(saved: Saved, precision: str = "fp32") -> pd.DataFrame:
    """01_memory_peaks: peak MiB per size (rows, in run order) and pass (columns) for one precision."""
    p = saved.frame("01_memory_peaks")
    p = p[(p["precision"] == precision) & (p["status"] == "ok")]
    if p.empty:
        raise NotMeasured(f"01_memory_peaks has no {precision} rows")
    return p.pivot_table(index="size", columns="pass", values="peak_MiB", sort=False)


@answers("2.4.1(a)")
def memory_timeline(q, saved):
    p = _peaks(saved)
    ratio = p["full step"] / p["forward"]
    return ("Forward-only (no graph) stays nearly flat: each block's intermediates are freed once used. A full step "
            "climbs through forward as every block saves tensors for backward, peaks as backward starts, falls as "
            f"backward frees them and stays flat through AdamW (plot in notebook 01 §5). Here the full step's peak is "
            f"{span(ratio)} the forward-only peak over the sizes.")


@answers("2.4.1(b)")
def memory_peaks(q, saved):
    p = _peaks(saved)
    return ("Peak live tensor memory, forward only / full step (fp32, parameters and AdamW state included): "
            + ", ".join(f"{s} {fmt_mib(r['forward'])} / {fmt_mib(r['full step'])}" for s, r in p.iterrows()) + ".")


@answers("2.4.1(c)")
def memory_autocast(q, saved):
    p = saved.frame("01_memory_peaks")
    fp32 = _peaks(saved)
    parts = []
    for precision in [x for x in dict.fromkeys(p["precision"]) if x != "fp32"]:
        r = (_peaks(saved, precision) / fp32).dropna()
        parts.append(f"{precision}: forward peak {span(r['forward'], 2)} fp32's, full step {span(r['full step'], 2)}")
    if not parts:
        raise NotMeasured("01_memory_peaks has no autocast rows")
    return ("; ".join(parts) + ". Autocast keeps the fp32 parameters, gradients and AdamW state and adds 16-bit copies "
            "of the weights and 16-bit activations beside the fp32 ones it keeps (norms, softmax, loss), so the peak "
            "is not halved.")


@answers("2.4.1(d)")
def residual_stream(q, saved):
    prov = saved.run("01_memory_peaks").provenance
    batch, context = int(prov["batch"]), int(prov["context"])
    sizes = list(_peaks(saved).index)
    here = formulas.residual_stream_bytes(batch, context, get_config(sizes[-1]).d_model)
    ref_ = formulas.residual_stream_bytes(16, 128, get_config("2.7B").d_model)
    return (f"One (B, T, d_model) fp32 tensor: B·T·d·4 bytes, {fmt_mib(here / 2**20)} for {sizes[-1]} at {batch} × "
            f"{context} here and {fmt_mib(ref_ / 2**20)} for 2.7B at 16 × 128. Notebook 01 §5 checks the formula "
            "against the block output a forward hook sees, byte for byte.")


@answers("2.4.1(e)")
def largest_tensors(q, saved):
    run = saved.run("01_largest_tensors")
    top = run.frame().groupby(["MiB", "op", "module"], sort=False).size().reset_index(name="n")
    where = lambda r: ("already live when the step began (parameters, AdamW state or the batch)"  # noqa: E731
                       if r["op"] == "existing" else f"allocated by {r['op']} in {r['module']}")
    listed = "; ".join(f"{r['n']} × {fmt_mib(r['MiB'])} {where(r)}" for _, r in top.iterrows())
    return (f"At the full step's peak ({run.provenance.get('size')}, {fmt_mib(run.provenance.get('peak_MiB', 0))} in "
            f"all) the {int(top['n'].sum())} largest live storages are: {listed}.")


# ---- 3.1-3.2 collectives (notebook 03) -------------------------------------------------------------------------------

@answers("3.1.1")
def collectives_single_node(q, saved):
    from helpers.experiments import collectives

    df = saved.frame("03_collectives")
    ar = df[(df["op"] == "all_reduce") & (df["wrong"] == 0)]
    fits = collectives.fit_table(ar).set_index(["backend", "device", "world_size"])
    parts = []
    for (backend, device, n), g in ar.groupby(["backend", "device", "world_size"]):
        g = g.sort_values("size_bytes")
        lo, hi, fit = g.iloc[0], g.iloc[-1], fits.loc[(backend, device, n)]
        parts.append(f"{backend}+{device}, {n} ranks: {lo['size']} in {fmt_s(lo['time_s'])}, {hi['size']} in "
                     f"{fmt_s(hi['time_s'])} ({hi['busbw_GBps']:.2f} GB/s busbw); the α–β fit (α ≈ "
                     f"{fit['alpha_us']:.0f} µs, β ≈ {fit['beta_GBps']:.2f} GB/s) puts the latency-bound messages "
                     f"below ≈ {collectives.format_size(int(fit['crossover_bytes']))}")
    cores = saved.run("03_collectives").provenance.get("cpu_count")
    crowded = sorted({n for n in ar["world_size"] if ar["device"].eq("cpu").any() and cores and n > cores})
    if crowded:
        parts.append(f"with {', '.join(map(str, crowded))} ranks on {cores} cores the ranks take turns on the cores, "
                     "so those times measure the scheduler as much as the collective")
    combos = set(zip(ar["backend"], ar["device"]))
    missing = "" if ("nccl", "cuda") in combos else (" NCCL was not measured: it needs one GPU per rank, and this "
                                                     "machine has none to spare.")
    return "All-reduce, every result checked exact: " + "; ".join(parts) + "." + missing


@answers("3.2.1")
def collectives_two_nodes(q, saved):
    from helpers.experiments import collectives

    r = saved.frame("03_two_node_rehearsal")
    recipe = " and ".join(f"`{c}`" for c in collectives.two_node_recipe("HEAD_NODE:29500", nproc_per_node=8))
    return (f"Not measurable on one machine. What ran here is a rehearsal of the path: two torchrun agents on this "
            f"host as two nodes, {len(r)} all-reduce sizes, {int(r['wrong'].sum())} wrong results; their loopback "
            f"times say nothing about a network. On two real GPU nodes run {recipe} (one per node); rank 0 saves the "
            "rows and notebook 03 plots them.")


# ---- 3.3-3.4 DDP (notebook 04) ---------------------------------------------------------------------------------------

DDP_NAMES = {"naive": "naive DDP", "flat": "flat DDP", "per_parameter": "overlapped per-parameter DDP",
             "local": "compute alone", "torch_ddp 25 MB": "torch DDP (25 MB)", "bucketed 25 MB": "bucketed (25 MB)"}


def _ddp_ratios(saved: Saved, field: str = "step") -> pd.DataFrame:
    """04_ddp_ratios for one timed field: "step", "backward" or "comm"."""
    r = saved.frame("04_ddp_ratios")
    return r[r["field"] == field]


@answers("3.3.1")
def ddp_correct(q, saved):
    c = saved.frame("04_ddp_checks")
    naive = c[c["variant"] == "naive"]
    ok = naive["start_equal"].all() and naive["ranks_equal"].all() and (naive["grad_ratio"] <= 1).all()
    verdict_ = "Yes" if ok else "No"
    return (f"{verdict_}: on {', '.join(naive['model'])} (tied weights, a frozen and an unused parameter in the toy "
            f"model), after the broadcast both ranks start from one process's weights, end bit-identical, and every "
            f"averaged gradient is within {naive['grad_ratio'].max():.2g} of the float32 rounding bound of one "
            f"process's full-batch gradient (≤ 1 required). All {len(c)} wrapper runs pass the same check: "
            f"{'yes' if (c['grad_ratio'] <= 1).all() else 'no'}.")


@answers("3.3.2")
def ddp_naive_speed(q, saved):
    speed = saved.frame("04_ddp_speed")
    naive = speed[speed["variant"] == "naive"]
    shares = ", ".join(f"{row.model} {fmt_s(row.step_s)} ({pct(row.comm_s / row.step_s)} communicating)"
                       for row in naive.itertuples())
    return (f"Naive DDP step (slowest rank's median) and its share spent in the after-backward all-reduces: {shares}. "
            + cap(series_text(_ddp_ratios(saved), "naive", "local", "model", DDP_NAMES, "step time")) + ".")


@answers("3.4.1")
def ddp_flat(q, saved):
    return series_text(_ddp_ratios(saved), "flat", "naive", "model", DDP_NAMES, "step time") + "."


@answers("3.4.2")
def ddp_flat_comm(q, saved):
    s = saved.frame("04_ddp_speed").set_index(["model", "variant"])
    models = list(dict.fromkeys(s.index.get_level_values("model")))
    calls = ", ".join(f"{m} {fmt_s(s.loc[(m, 'naive'), 'comm_s'])} → {fmt_s(s.loc[(m, 'flat'), 'comm_s'])}"
                      for m in models)
    return (f"Time waiting for communication after backward, naive (one call per parameter) → flat (one call): "
            f"{calls}. "
            + cap(series_text(_ddp_ratios(saved, "comm"), "flat", "naive", "model", DDP_NAMES, "communication time"))
            + ".")


@answers("3.4.3(a)")
def ddp_overlap_speed(q, saved):
    r = _ddp_ratios(saved)
    texts = [series_text(r, "per_parameter", b, "model", DDP_NAMES, "step time") for b in ("naive", "flat")]
    return "; ".join(texts) + "."


@answers("3.4.3(b)")
def ddp_traces(q, saved):
    o = saved.frame("04_ddp_overlap")
    model = saved.run("04_ddp_overlap").provenance.get("model")
    where = ("profiler traces (gloo's own all-reduce events)" if any(c.startswith("trace") for c in o.columns)
             else "launch → done intervals")
    traces = saved.folder / "04_traces"
    folder = f" under `{_shown(traces)}/`" if traces.is_dir() else ""
    return (f"Notebook 04 §3 draws, for {model}, each variant's backward and its all-reduces from {where}; one Chrome "
            f"trace per variant and rank is saved{folder} (open it in Perfetto). Naive DDP's all-reduces all start "
            "after backward ends; the per-parameter ones start from the gradient hooks, inside backward.")


@answers("3.4.3(c)")
def ddp_overlap_fraction(q, saved):
    o = saved.frame("04_ddp_overlap").set_index("variant")
    col = "trace overlap" if "trace overlap" in o.columns else "launch→done overlap"
    return (f"Share of communication time inside backward ({col.split(' overlap')[0]}, mean over ranks and steps): "
            + ", ".join(f"{DDP_NAMES.get(v, v)} {pct(x)}" for v, x in o[col].items())
            + ". Naive is 0 by construction; torch DDP waits for its last bucket inside backward, so its share says "
            "little about how much it overlapped.")


@answers("3.4.4(a)")
def bucket_sweep(q, saved):
    sweep = saved.frame("04_ddp_bucket_sweep")
    model = saved.run("04_ddp_bucket_sweep").provenance.get("model")
    best = sweep.loc[sweep["step_s"].idxmin()]
    r = _ddp_ratios(saved)
    r = r[(r["model"] == model) & (r["b"] == best["variant"]) & r["a"].isin(sweep["variant"])]
    tied = [f"{mb:g}" for v, mb in zip(sweep["variant"], sweep["bucket_MB"])
            if v != best["variant"] and not ratio_of(r[r["a"] == v].iloc[0]).differs]
    return (f"{model}, {len(sweep)} bucket sizes from {sweep['bucket_MB'].min():g} to {sweep['bucket_MB'].max():g} MB: "
            f"step medians from {fmt_s(sweep['step_s'].min())} to {fmt_s(sweep['step_s'].max())}; the lowest median is "
            f"{best['bucket_MB']:g} MB ({int(best['buckets'])} bucket{'s' if best['buckets'] != 1 else ''}), and "
            + (f"no measurable difference from it for {', '.join(tied)} MB (paired interval of the step-time ratio "
               "includes 1), so the sweep cannot rank those." if tied else
               "every other size is measurably slower (paired per step)."))


@answers("3.4.4(b)")
def bucket_model(q, saved):
    run = saved.run("04_ddp_bucket_sweep")
    p, sweep = run.provenance, run.frame()
    S, Tb, a, b, n = (float(p[k]) for k in ("grad_bytes", "backward_s", "alpha_s", "beta_Bps", "n_star"))
    best = sweep.loc[sweep["step_s"].idxmin(), "bucket_MB"]
    tensors = formulas.param_tensor_count(run.provenance["model"])
    finest = (f" That is more buckets than {run.provenance['model']} has gradient tensors ({tensors}): the finest "
              "split DDPBucketed can build is one tensor per bucket." if n > tensors else "")
    return (f"With n equal buckets of S/n bytes, each all-reduce costing α + S/(nβ), the overhead after backward is "
            f"max(α + S/(nβ), nα + S/β − T_b(1 − 1/n)), minimised at n* = max((T_b − S/β)/α, √(T_b/α)) and "
            f"b* = S/n* (derived and checked numerically in notebook 04 §4). Here S = {S / 2**20:.3g} MiB, "
            f"T_b = {fmt_s(Tb)}, α = {a * 1e6:.0f} µs, β = {b / 1e9:.2f} GB/s give n* = {n:.1f} and b* = "
            f"{S / n / 2**20:.3g} MiB; the sweep's lowest median was at {best:g} MB." + finest)


# ---- 3.4.5 optimizer-state sharding (notebook 05) --------------------------------------------------------------------

def _memory_points(saved: Saved) -> tuple[str, pd.DataFrame]:
    """The largest model of 05_sharding_memory: MiB per point (rows) and kind (columns), the worst rank."""
    mem = saved.frame("05_sharding_memory")
    model = list(dict.fromkeys(mem["model"]))[-1]
    m = mem[mem["model"] == model]
    table = (m.groupby(["label", "kind"], sort=False)[["live_bytes", "peak_bytes", "phase_peak_bytes"]].max() / 2**20)
    return model, table


@answers("3.4.5(a)")
def sharding_memory(q, saved):
    model, t = _memory_points(saved)
    names = {"unsharded": "unsharded", "sharded": "ShardedOptimizer", "zero1": "Zero1Optimizer"}
    kinds = [k for k in names if k in t.index.get_level_values("kind")]
    labels = list(dict.fromkeys(t.index.get_level_values("label")))
    last = [label for label in labels if label.startswith("after step")][-1]
    before = [label for label in labels if label.startswith("before step")][-1]
    cell = lambda label, col: " vs ".join(fmt_mib(t.loc[(label, k), col]) for k in kinds)  # noqa: E731
    world = saved.run("05_sharding_memory").provenance.get("world_size")
    return (f"{model}, worst of {world} ranks, {' vs '.join(names[k] for k in kinds)}: after init "
            f"{cell('after init', 'live_bytes')} "
            f"live; peak of forward+backward before the step ({before}) {cell(before, 'phase_peak_bytes')}; after the "
            f"step ({last}) {cell(last, 'live_bytes')} live and {cell(last, 'peak_bytes')} peak so far. Sharding "
            "changes nothing until step() creates the AdamW state; then each rank holds only its share. Every part "
            "(parameters, gradients, optimizer state, activations) is computed from the configuration and checked "
            "against these measurements in notebook 05 §2: live bytes exactly, the forward/backward peak within 1%.")


@answers("3.4.5(b)")
def sharding_speed(q, saved):
    s = saved.frame("05_sharding_speed").set_index("kind")
    model = saved.run("05_sharding_speed").provenance.get("model")
    u, sh = s.loc["unsharded"], s.loc["sharded"]
    text = (f"{model}, median of the slowest rank per iteration: {fmt_s(u['iteration_s'])} unsharded, "
            f"{fmt_s(sh['iteration_s'])} with ShardedOptimizer, whose broadcasts take {fmt_s(sh['step_comm_s'])} while "
            f"its update takes {fmt_s(sh['update_s'])} against {fmt_s(u['update_s'])} for the full unsharded update. ")
    if not saved.has("05_sharding_ratios"):
        return text + ("No paired ratio was saved, so no faster or slower is claimed here; notebook 05 §3 prints the "
                       "paired comparison with its interval.")
    r = saved.frame("05_sharding_ratios")
    row = r[(r["a"] == "sharded") & (r["b"] == "unsharded")]
    if row.empty:
        return text + "The two ran in separate launches, so their times are not paired and no winner is named."
    return text + compare_text("ShardedOptimizer", "unsharded", ratio_of(row.iloc[0]), "time per iteration") + "."


@answers("3.4.5(c)")
def sharding_vs_zero1(q, saved):
    mem = saved.frame("05_sharding_memory")
    world = int(saved.run("05_sharding_memory").provenance.get("world_size", 2))
    model = list(dict.fromkeys(mem["model"]))[-1]
    psi = formulas.param_bytes(model)
    traffic = {kind: sum(formulas.wire_factor(op, world) * b
                         for op, b in formulas.expected_collectives(kind, psi, world).items()) / psi
               for kind in ("unsharded", "sharded", "zero1")}
    return ("Both shard only the optimizer state (the paper's stage 1, P_os): parameters and gradients stay whole on "
            "every rank. The difference is communication: ShardedOptimizer all-reduces every gradient and then "
            f"broadcasts each updated parameter from its owner, {traffic['sharded']:.2f}Ψ per rank per step for "
            f"{world} ranks, while ZeRO-1 reduce-scatters the gradients (each rank needs only its slice's mean) and "
            f"all-gathers the parameters, {traffic['zero1']:.2f}Ψ, the same as plain DDP's all-reduce "
            f"({traffic['unsharded']:.2f}Ψ). ZeRO also splits flat element slices (exactly 1/N each) where "
            "ShardedOptimizer assigns whole tensors, balanced by bytes. Notebook 05 §4 counts every byte passed to a "
            f"collective and asserts these formulas ({model}: Ψ = {fmt_mib(psi / 2**20)})." + _counted(saved))


def _counted(saved: Saved) -> str:
    """The per-rank traffic notebook 05 counted during its run, when it saved the table."""
    if not saved.has("05_sharding_comm"):
        return ""
    run = saved.run("05_sharding_comm")
    traffic = run.frame().set_index("kind")["per-rank traffic / Ψ"]
    return (f" Counted in this run ({run.provenance.get('model')}): "
            + ", ".join(f"{k} {v:.3f}Ψ" for k, v in traffic.items()) + " per rank per step.")


# ---- the page --------------------------------------------------------------------------------------------------------

READ_ERRORS = (KeyError, IndexError, ValueError, TypeError)  # a saved result without what an answer reads (old format)


def answer(q: Question, saved: Saved) -> tuple[str, bool]:
    """The answer's text and whether it was measured in this run; a missing or unreadable result never raises."""
    try:
        return cap(ANSWERS[q.number](q, saved)), True
    except NotMeasured as why:
        return f"Not measured in this run (run notebook {q.notebook}; {why}).", False
    except READ_ERRORS as err:
        return (f"Not measured in this run (run notebook {q.notebook}: its saved results lack what this answer reads, "
                f"{type(err).__name__}: {err}).", False)


def default_folder() -> Path:
    """This machine's results: data/local/<device>/."""
    return DATA_DIR / "local" / device_slug(machine_facts()["device"])


def _code(text: str) -> str:
    """HTML-escaped text with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _entry(q: Question, text: str, measured: bool) -> str:
    """One answer: number, question, answer, where the details are, the published figure, the GPU note."""
    page = f"{NOTEBOOKS[q.notebook]}.html"
    refs = "".join(f"<li>published reference ({html.escape(r.source)}): {_code(r.value)}</li>" for r in q.references)
    return (f'<div class="q{"" if measured else " missing"}" id="q{html.escape(q.number)}">'
            f'<p class="ask"><b>{html.escape(q.number)}</b> {_code(q.ask)}</p>'
            f'<p class="ans">{_code(text)}</p><ul class="meta">'
            f'<li>details: <a href="{page}">notebook {q.notebook}</a>, {html.escape(q.section)}; reads '
            f'{", ".join(f"<code>{html.escape(n)}</code>" for n in q.reads)}</li>{refs}'
            f'<li>on a GPU: {_code(q.gpu)}</li></ul></div>')


STYLE = """body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #ccc;margin-top:2rem}
h3{font-size:1rem;margin:1.2rem 0 .3rem}
.q{margin:.6rem 0 1rem;padding-left:.8rem;border-left:3px solid #4a7}.q.missing{border-color:#c94}
.ask{margin:0}.ans{margin:.2rem 0}.meta{margin:.1rem 0;font-size:13px;color:#555}code{background:#f3f3f3;padding:0 .2em}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:.15rem .5rem;text-align:left}"""


def _sources(saved: Saved) -> str:
    """The saved results the answers read: file, device, profile, date, commit."""
    rows = "".join(f"<tr><td><code>{html.escape(name)}.jsonl</code></td><td>{html.escape(str(r.label))}</td>"
                   f"<td>{html.escape(str(r.provenance.get('commit')))}</td></tr>"
                   for name, r in sorted(saved.used.items()))
    return ("<table><tr><th>result</th><th>device · profile · date</th><th>commit</th></tr>" + rows + "</table>"
            if rows else "<p>No saved results were found for this profile.</p>")


def render(profile: str, data_dir: Path | None = None) -> str:
    """The whole page as HTML text."""
    folder = default_folder() if data_dir is None else Path(data_dir)
    saved = Saved(folder, profile)
    body, group, measured = [], None, 0
    for section, title in SECTIONS.items():
        body.append(f"<h2>{section} · {html.escape(title)}</h2>")
        for q in (q for q in QUESTIONS if q.number.startswith(section + ".")):
            if q.group != group:
                group = q.group
                body.append(f"<h3>{html.escape(q.group)} <code>{html.escape(q.problem)}</code></h3>")
            text, ok = answer(q, saved)
            body.append(_entry(q, text, ok))
            measured += ok
    devices = sorted({str(r.provenance.get("device")) for r in saved.used.values()}) or [machine_facts()["device"]]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Answers on this machine</title>'
            f"<style>{STYLE}</style></head><body><h1>The course's questions, answered on this machine</h1>"
            f"<p>Device: <b>{html.escape(', '.join(devices))}</b>; profile: <b>{html.escape(profile)}</b>; results "
            f"read from <code>{html.escape(_shown(folder))}/</code>; page built {now}. {measured} of {len(QUESTIONS)} "
            "answers come from results saved on this machine; the others say which notebook to run. Comparisons name "
            "a faster side only when the 95% interval of the paired ratio excludes 1. Published references are "
            "measurements made elsewhere (H100s), cited by file; they are not ours.</p>"
            f'<p><a href="index.html">All writeups</a></p>{"".join(body)}'
            f"<h2>Saved results read</h2>{_sources(saved)}</body></html>\n")


def write_page(out_path: Path, profile: str, data_dir: Path | None = None) -> None:
    """Write the answers page (self-contained HTML, links relative to the other writeups) for this machine's results
    of `profile` (data_dir: default data/local/<this device>/)."""
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"profile must be 'cpu' or 'gpu', got {profile!r}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render(profile, data_dir), encoding="utf-8")
