"""Experiments: one module per notebook (its workers, table builders and bench command), plus `common`.

    benchmarking  notebook 01: step timing per size, memory of a step, mixed precision, FLOPs
    rmsnorm       notebook 02: RMSNorm implementations timed against copy bandwidth; `bench rmsnorm`
    collectives   notebook 03: collective benchmarks, algbw/busbw, the alpha-beta fit; `bench collectives`
    ddp           notebook 04: DDP equivalence, speed, overlap, bucket sweep; `bench ddp`
    sharding      notebook 05: sharded optimizers' equivalence, memory, speed, calculator; `bench sharding`
    common        what several of them share: toy models, model and batch builders, each rank's share of a batch,
                  one training step, the interleaved timing loop, the slowest-rank summary, the bench parser

The library (helpers.model, .formulas, .memory, .profiling, .rmsnorm, .comm, .ddp, .sharding) never imports these.
"""
