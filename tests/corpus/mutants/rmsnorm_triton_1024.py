"""The Triton RMSNorm caps its block at 1024 columns (to spare registers) without looping over the rest of a row:
right up to H = 1024 (the course's tests use 50), wrong at the benchmark's 2048 to 8192."""
import triton

from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused


class Block1024(RMSNormTritonFused):
    @staticmethod
    def block_size(H):
        return min(1024, triton.next_power_of_2(H))


def get_rmsnorm_autograd_function_triton() -> type:
    return Block1024
