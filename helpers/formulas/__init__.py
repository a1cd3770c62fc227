"""Closed forms, in one place: parameters, FLOPs, peaks and MFU, bytes of every kind, ZeRO 0-3, collective bytes.

One submodule per family; every name is re-exported here, so `formulas.X` and `from helpers.formulas import X` work
whichever submodule holds X:

    units          KiB, MiB, GiB, dtype_bytes
    flops          param counts in matmuls, FLOPs, peak FLOP/s and MFU; train_flops("small", 4, 128), mfu(...)
    step_bytes     bytes of a training step, per part: step_breakdown("xl/cpu", 8, 128), peak_breakdown(...)  (01, 02)
    collectives    busbw_factor("all_reduce", 8), wire_factor(...), bucket_overhead(n, S, T_b, alpha, beta)  (03-05)
    zero           zero_memory("xl", 8, stage=1), live_bytes(...), fsdp_live_bytes(...)  (05, 07)
    checkpointing  checkpoint_memory(L, k, I, A), best_segment(...), checkpoint_strategies(L), halving_forwards  (07)
    calculators    tp_calc("forward", **CALC_EXAMPLE).inequality: the 2026 calculators in the handout's variables  (07)
    xxl            xxl_memory(tokens, n), xxl_compute_bound(): the 2025 accounting  (07)
    plans          leaderboard_plan(), fastest_plan(plan, "B200 ~180 GB"): the 2026 leaderboard as a plan  (07)
    presets        memory_calculator(preset, dp, pp, micro_batch, n_micro, recompute)  (07)

Every function here is checked against a measurement (a test or a notebook assert), or, for the handouts' closed
forms, against figures derived by hand (tests/test_calculator.py). Counts come from the model's
own parameter table (`helpers.model.parameter_shapes`) and, for sharding, from the optimizers' own partition plan.
"""

from helpers.formulas.calculators import (
    CALC_EXAMPLE,
    TP_BACKWARD_EQUATIONS,
    CalcPart,
    calc_parts,
    dp_calc,
    fsdp_calc,
    fsdp_tp_calc,
    gated_ffn,
    gated_ffn_thresholds,
    tp_calc,
)
from helpers.formulas.checkpointing import best_segment, checkpoint_memory, checkpoint_strategies, halving_forwards
from helpers.formulas.collectives import (
    algbw,
    bucket_overhead,
    busbw,
    busbw_factor,
    handout_bucket_size,
    optimal_buckets,
    wire_factor,
)
from helpers.formulas.flops import PEAK_FLOPS, forward_flops, matmul_params, mfu, peak_flops, shape_ratios, train_flops
from helpers.formulas.plans import (
    HANDOUT_PRECISION,
    HEAD_CHUNK_TOKENS,
    LEADERBOARD_GPUS,
    LEADERBOARD_MFU,
    LEADERBOARD_MODEL,
    PLAN_CHECKPOINTING,
    PLAN_HEADS,
    PLAN_MARGIN,
    PLAN_MFUS,
    PLAN_PRECISIONS,
    PLAN_STRATEGIES,
    PLAN_TIE,
    chunked_head_bytes,
    fastest_plan,
    implied_mfu,
    leaderboard_plan,
    llama_block_saved_bytes,
    llama_head_bytes,
    llama_params,
    llama_train_flops,
)
from helpers.formulas.presets import (
    CALCULATOR_PRESETS,
    RECOMPUTATION,
    layer_activation_bytes,
    memory_calculator,
    preset_params,
)
from helpers.formulas.step_bytes import (
    activation_bytes,
    adamw_state_bytes,
    block_saved_parts,
    buffer_bytes,
    ffn_saved_widths,
    loss_grad_bytes,
    norm_bytes,
    param_bytes,
    param_tensor_count,
    peak_breakdown,
    residual_stream_bytes,
    step_breakdown,
    token_bytes,
)
from helpers.formulas.units import GiB, KiB, MiB, dtype_bytes
from helpers.formulas.xxl import (
    MESH_2025,
    TPU_V5P_LIKE,
    XXL,
    xxl_activation_bytes_per_token,
    xxl_compute_bound,
    xxl_compute_bound_tokens,
    xxl_max_tokens,
    xxl_memory,
    xxl_min_fsdp,
)
from helpers.formulas.zero import (
    PRECISIONS,
    SHARDED_KINDS,
    basics_params,
    expected_collectives,
    fsdp_gathered_peak_bytes,
    fsdp_live_bytes,
    fsdp_shard_elements,
    live_bytes,
    meta_numel,
    meta_sizes,
    sharded_state_bytes,
    state_bytes,
    zero_memory,
)
from helpers.model import get_config  # callers reach it as formulas.get_config

__all__ = [
    "KiB",
    "MiB",
    "GiB",
    "dtype_bytes",
    "matmul_params",
    "forward_flops",
    "train_flops",
    "shape_ratios",
    "PEAK_FLOPS",
    "peak_flops",
    "mfu",
    "param_bytes",
    "param_tensor_count",
    "adamw_state_bytes",
    "residual_stream_bytes",
    "buffer_bytes",
    "activation_bytes",
    "block_saved_parts",
    "ffn_saved_widths",
    "token_bytes",
    "step_breakdown",
    "loss_grad_bytes",
    "peak_breakdown",
    "norm_bytes",
    "busbw_factor",
    "algbw",
    "busbw",
    "wire_factor",
    "bucket_overhead",
    "optimal_buckets",
    "handout_bucket_size",
    "SHARDED_KINDS",
    "PRECISIONS",
    "expected_collectives",
    "meta_sizes",
    "meta_numel",
    "zero_memory",
    "state_bytes",
    "live_bytes",
    "fsdp_shard_elements",
    "fsdp_live_bytes",
    "fsdp_gathered_peak_bytes",
    "basics_params",
    "sharded_state_bytes",
    "checkpoint_memory",
    "best_segment",
    "checkpoint_strategies",
    "halving_forwards",
    "gated_ffn",
    "gated_ffn_thresholds",
    "CALC_EXAMPLE",
    "CalcPart",
    "dp_calc",
    "fsdp_calc",
    "TP_BACKWARD_EQUATIONS",
    "tp_calc",
    "fsdp_tp_calc",
    "calc_parts",
    "XXL",
    "TPU_V5P_LIKE",
    "MESH_2025",
    "xxl_activation_bytes_per_token",
    "xxl_memory",
    "xxl_max_tokens",
    "xxl_min_fsdp",
    "xxl_compute_bound",
    "xxl_compute_bound_tokens",
    "LEADERBOARD_MODEL",
    "LEADERBOARD_GPUS",
    "LEADERBOARD_MFU",
    "PLAN_MFUS",
    "PLAN_MARGIN",
    "PLAN_TIE",
    "PLAN_STRATEGIES",
    "PLAN_CHECKPOINTING",
    "PLAN_HEADS",
    "PLAN_PRECISIONS",
    "HANDOUT_PRECISION",
    "HEAD_CHUNK_TOKENS",
    "llama_params",
    "llama_block_saved_bytes",
    "llama_head_bytes",
    "chunked_head_bytes",
    "implied_mfu",
    "llama_train_flops",
    "leaderboard_plan",
    "fastest_plan",
    "CALCULATOR_PRESETS",
    "RECOMPUTATION",
    "preset_params",
    "layer_activation_bytes",
    "memory_calculator",
    "get_config",
]
