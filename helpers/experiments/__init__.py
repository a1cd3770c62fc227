"""Experiments: one module per notebook (its profiles, bench command and the names its notebook calls), its sections
in sibling modules `<name>_*.py` that it re-exports, plus what they share.

    setup         notebook 00: the CPU presets' ratios beside the reference sizes'
    benchmarking  notebook 01: step timing per size, profiler tables, FLOPs; _precision, _memory: mixed precision,
                  memory of a step
    rmsnorm       notebook 02: RMSNorm implementations timed against copy bandwidth; _bench, _compare, _checks,
                  _model; `bench rmsnorm`
    collectives   notebook 03: collective benchmarks, algbw/busbw; _tables: the alpha-beta fit, plots, marks, ratios;
                  `bench collectives`
    ddp           notebook 04: _equivalence, _speed, _overlap, _buckets, _bench; `bench ddp`
    sharding      notebook 05: _build, _equivalence, _memory, _speed, the calculator; `bench sharding`
    attention     notebook 06: naive vs FlashAttention-2 (PyTorch, Triton); _impls, _bench, _memory, _checks,
                  _model, _leaderboard; `bench attention`
    fsdp          notebook 07: activation checkpointing; _correctness, _measure, _trace, _ring, _plans, _common;
                  `bench fsdp`
    gpu_plans     every notebook's gpu profile: peak memory per GPU from the closed forms (checked in the tests)
    common        toy models, model and batch builders, each rank's share of a batch, one training step, the
                  slowest-rank summary, the bench argument parser

Cross-notebook work (the answers page, the reference runner, `yours`, the dry run) lives a floor up, in
helpers.course. The library (helpers.model, .formulas, .memory, .profiling, .rmsnorm, .attention, .comm, .ddp,
.sharding, .fsdp, .ring, .kernel_check) never imports these.
"""
