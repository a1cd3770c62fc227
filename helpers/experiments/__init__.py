"""Experiments: one module per notebook (its workers, table builders and bench command), plus what they share.

    benchmarking  notebook 01: step timing per size, memory of a step, mixed precision, FLOPs
    rmsnorm       notebook 02: RMSNorm implementations timed against copy bandwidth; `bench rmsnorm`
    collectives   notebook 03: collective benchmarks, algbw/busbw, the alpha-beta fit, two simulated nodes;
                  `bench collectives`
    ddp           notebook 04: DDP equivalence, speed, overlap, bucket sweep; `bench ddp`
    sharding      notebook 05: sharded optimizers' equivalence, memory, speed, calculator; `bench sharding`
    attention     notebook 06: naive vs FlashAttention-2 (PyTorch, Triton): time, memory, the model; `bench attention`
    fsdp          notebook 07: FSDP by hand, checkpointing, ring all-reduce, parallelism calculators; `bench fsdp`
    answers       writeups/answers.html: every course question answered from the results the notebooks saved
    gpu_plans     every notebook's gpu profile: peak memory per GPU from the closed forms (checked in the tests)
    common        toy models, model and batch builders, each rank's share of a batch, one training step, the
                  slowest-rank summary, the bench argument parser

The library (helpers.model, .formulas, .memory, .profiling, .rmsnorm, .attention, .comm, .ddp, .sharding, .fsdp,
.ring, .kernel_check) never imports these.
"""
