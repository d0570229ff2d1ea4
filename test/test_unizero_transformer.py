"""UniZero's causal transformer against a naive per-token re-implementation, and its slot-addressed cache."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from torchrl_muzero.modules.unizero import CausalTransformer

E, H, LAYERS, S = 8, 2, 2, 10


def make(position: str) -> CausalTransformer:
    torch.manual_seed(0)
    gpt = CausalTransformer(E, LAYERS, H, S, position=position)
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(0.0, 0.4)
    return gpt


def naive_rope(x: torch.Tensor, pos: int) -> torch.Tensor:
    """Rotate feature pairs ``(i, i + Dh/2)`` by ``pos * 10000^(-2i/Dh)``, written as complex products."""
    half = x.shape[-1] // 2
    freq = torch.tensor([10000.0 ** (-2 * i / x.shape[-1]) for i in range(half)], dtype=torch.float64)
    rot = torch.polar(torch.ones(half, dtype=torch.float64), pos * freq)
    c = torch.complex(x[..., :half].double(), x[..., half:].double()) * rot
    return torch.cat([c.real, c.imag], -1).float()


def naive_forward(gpt: CausalTransformer, x: torch.Tensor) -> torch.Tensor:
    """One sequence ``[T, E]``: every query attends to keys ``0..t`` with explicit loops."""
    T, Dh = x.shape[0], E // H
    if gpt.pos_emb is not None:
        x = x + gpt.pos_emb.weight[:T]
    for block in gpt.blocks:
        a = block.ln1(x)
        q, k, v = block.attn.qkv(a).split(E, -1)
        heads = []
        for h in range(H):
            sl = slice(h * Dh, (h + 1) * Dh)
            qs, ks = q[:, sl], k[:, sl]
            if gpt.rope is not None:
                qs = torch.stack([naive_rope(qs[t], t) for t in range(T)])
                ks = torch.stack([naive_rope(ks[t], t) for t in range(T)])
            rows = []
            for t in range(T):
                w = torch.softmax(torch.stack([qs[t] @ ks[s] for s in range(t + 1)]) / math.sqrt(Dh), 0)
                rows.append((w[:, None] * v[: t + 1, sl]).sum(0))
            heads.append(torch.stack(rows))
        x = x + block.attn.proj(torch.cat(heads, -1))
        x = x + block.mlp[2](F.gelu(block.mlp[0](block.ln2(x))))
    return gpt.ln_f(x)


@pytest.mark.parametrize("position", ["rope", "absolute"])
@torch.no_grad()
def test_full_forward_equals_naive_causal_attention(position):
    gpt = make(position)
    x = torch.randn(2, 7, E)
    out, kv = gpt(x, torch.arange(7).expand(2, -1))
    for b in range(2):
        torch.testing.assert_close(out[b], naive_forward(gpt, x[b]), atol=1e-5, rtol=0)
    assert kv.shape == (2, 7, LAYERS, 2, H, E // H)


@pytest.mark.parametrize("position", ["rope", "absolute"])
@torch.no_grad()
def test_ragged_incremental_cache_equals_full_forward(position):
    """Rows at different lengths in one batch, one or two new tokens per call, each at its own slots."""
    gpt = make(position)
    x = torch.randn(3, S, E)
    full, kv_full = gpt(x, torch.arange(S).expand(3, -1))
    start = torch.tensor([0, 3, 5])  # prefix each row already holds
    cache = gpt.empty_cache(3)
    for b in range(3):
        n = int(start[b])
        if n:
            cache[b, :n] = gpt(x[b : b + 1, :n], torch.arange(n)[None])[1][0]
    length = start.clone()
    rows = torch.arange(3)
    while int(length.max()) + 2 <= S:
        slots = length[:, None] + torch.arange(2)  # two tokens at once, causal between them too
        out, _ = gpt(x[rows[:, None], slots], slots, cache)
        torch.testing.assert_close(out, full[rows[:, None], slots], atol=1e-5, rtol=0)
        length += 2
    for b in range(3):  # the cache holds each row's keys/values at its slots, zeros beyond
        n = int(length[b])
        torch.testing.assert_close(cache[b, :n], kv_full[b, :n], atol=1e-5, rtol=0)
        assert not cache[b, n:].any()


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="position"):
        CausalTransformer(8, 1, 2, 4, position="alibi")
    with pytest.raises(ValueError, match="multiple"):
        CausalTransformer(9, 1, 2, 4)
    gpt = CausalTransformer(8, 1, 2, 4)
    with pytest.raises(ValueError, match="max_tokens"):
        gpt(torch.randn(1, 5, 8), torch.arange(5)[None])
