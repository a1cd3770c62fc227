"""The key loop runs over N_q tiles instead of N_k: keys beyond the first N_q are never seen."""
import math

import torch

from cs336_systems.flash.flash_einsum import FlashAttentionEinsum


class KeysIgnored(FlashAttentionEinsum):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        B, N_q, d = Q.shape
        T = 16
        O, L = torch.empty_like(Q), torch.empty(B, N_q)
        for i in range(N_q // T):
            q = Q[:, i * T:(i + 1) * T]
            m = torch.full((B, T), -math.inf)
            l, o = torch.zeros(B, T), torch.zeros(B, T, d)
            for j in range(min(N_q, K.shape[1]) // T):
                S = q @ K[:, j * T:(j + 1) * T].transpose(1, 2) / math.sqrt(d)
                m_new = torch.maximum(m, S.amax(-1))
                P = torch.exp(S - m_new[..., None])
                l = torch.exp(m - m_new) * l + P.sum(-1)
                o = torch.exp(m - m_new)[..., None] * o + P @ V[:, j * T:(j + 1) * T]
                m = m_new
            O[:, i * T:(i + 1) * T], L[:, i * T:(i + 1) * T] = o / l[..., None], m + torch.log(l)
        ctx.save_for_backward(L, Q, K, V, O)
        return O


def get_flashattention_autograd_function_pytorch() -> type:
    return KeysIgnored
