"""FlashAttention-2 with einops: Q, K, V split into tiles of 16 by rearrange, causal masking by index comparison
(masked scores -1e6, as the handout says)."""
import math

import torch
from einops import einsum, rearrange

TILE = 16


class FlashAttentionEinops(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        scale = 1 / math.sqrt(Q.shape[-1])
        Qt = rearrange(Q, "b (tq r) d -> tq b r d", r=TILE)
        Kt = rearrange(K, "b (tk c) d -> tk b c d", c=TILE)
        Vt = rearrange(V, "b (tk c) d -> tk b c d", c=TILE)
        outs, lses = [], []
        for i, q in enumerate(Qt):
            o = torch.zeros_like(q)
            l = torch.zeros(q.shape[:-1], device=q.device)
            m = torch.full(q.shape[:-1], -math.inf, device=q.device)
            for j, (k, v) in enumerate(zip(Kt, Vt)):
                S = einsum(q, k, "b r d, b c d -> b r c") * scale
                if is_causal:
                    rows = i * TILE + torch.arange(TILE, device=q.device)
                    cols = j * TILE + torch.arange(TILE, device=q.device)
                    S = torch.where(rows[:, None] >= cols[None, :], S, -1e6)
                m_new = torch.maximum(m, S.max(dim=-1).values)
                P = torch.exp(S - m_new.unsqueeze(-1))
                l = torch.exp(m - m_new) * l + P.sum(-1)
                o = torch.exp(m - m_new).unsqueeze(-1) * o + einsum(P, v, "b r c, b c d -> b r d")
                m = m_new
            outs.append(o / l.unsqueeze(-1))
            lses.append(m + torch.log(l))
        O = rearrange(torch.stack(outs), "tq b r d -> b (tq r) d")
        L = rearrange(torch.stack(lses), "tq b r -> b (tq r)")
        ctx.is_causal = is_causal
        ctx.save_for_backward(L, Q, K, V, O)
        return O

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        scale = 1 / math.sqrt(Q.shape[-1])
        S = einsum(Q, K, "b q d, b k d -> b q k") * scale
        if ctx.is_causal:
            S = torch.where(torch.ones_like(S[0], dtype=torch.bool).tril(), S, -1e6)
        P = torch.exp(S - L.unsqueeze(-1))
        dV = einsum(P, dO, "b q k, b q d -> b k d")
        dP = einsum(dO, V, "b q d, b k d -> b q k")
        dS = P * (dP - (O * dO).sum(-1, keepdim=True))
        return einsum(dS, K, "b q k, b k d -> b q d") * scale, einsum(dS, Q, "b q k, b q d -> b k d") * scale, dV, None
