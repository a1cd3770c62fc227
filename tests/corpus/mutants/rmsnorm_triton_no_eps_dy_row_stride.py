"""Two bugs at once, as go-akshit's 2024 repository has them: no eps, and a Triton backward that indexes the incoming
gradient with the input's row stride (rmsnorm_triton_dy_row_stride's, imported from beside this file as pytest would).
The missing eps fails the rules above; the stride bug shows only on an expanded gradient (y.sum().backward(): stride
0), where the backward reads rows of memory that are not dy's, and must be found there although the contiguous twin
fails too."""
from rmsnorm_triton_dy_row_stride import DyRowStride


class NoEpsDyRowStride(DyRowStride):
    eps = 0.0


def get_rmsnorm_autograd_function_triton() -> type:
    return NoEpsDyRowStride
