"""Two bugs at once: the scores lack 1/sqrt(d), and Q, K, V are read from memory as if they were contiguous (their
strides ignored, as a Triton wrapper that passes d for every row stride does). The missing scale fails the rules
above; the strides show only on q, k, v sliced from one wider projection, where rows lie 3d apart and the reads
land on other columns, and must be found there although the contiguous twin fails too."""
import torch


def _as_if_contiguous(t):  # BUG: t's memory read with the strides of a contiguous tensor of its shape
    return torch.as_strided(t, t.shape, torch.empty(t.shape, device="meta").stride(), t.storage_offset())


def _attend(q, k, v, is_causal):
    q, k, v = (_as_if_contiguous(t) for t in (q, k, v))
    s = q @ k.transpose(-1, -2)  # BUG: no 1 / sqrt(d)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


class UnscaledAsIfContiguous(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = _attend(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        _, q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            qkv = [t.detach().requires_grad_() for t in (q, k, v)]
            o, _ = _attend(*qkv, ctx.is_causal)
        return (*torch.autograd.grad(o, qkv, do), None)


def get_flashattention_autograd_function_pytorch() -> type:
    return UnscaledAsIfContiguous
