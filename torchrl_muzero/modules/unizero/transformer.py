"""The causal GPT that is UniZero's world model (pre-LN blocks, absolute positions or RoPE).

One forward serves both uses:

* full sequence (training, a root's window, a rebuild): ``cache=None``; the
  tokens attend to each other causally by *slot*;
* incremental (search): ``cache`` is a ``[B, S, num_layers, 2, H, Dh]``
  key/value buffer; each new token's keys and values are written at its slot
  (per row) before the attention, and it attends to every slot ``<=`` its own.

Slots are positions. A row's tokens always occupy slots ``0 .. length - 1``
(right padding), so position ``p`` of a token is its slot, the causal mask
``key_slot <= query_slot`` is also the padding mask (nothing after a query is
ever read), and ragged rows of one batch need no per-row offsets. Keys are
cached after RoPE, at the position they will always keep: a cache is never
shifted in place (:mod:`.model` rebuilds it from raw tokens instead).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["RotaryEmbedding", "CausalTransformer", "head_mlp"]

_POSITIONS = ("absolute", "rope")


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer): rotate query/key feature pairs by ``position * frequency``.

    Args:
        head_dim: features per head (even).
        max_positions: positions the tables cover.
        base: frequency base.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import RotaryEmbedding
        >>> rope = RotaryEmbedding(head_dim=4, max_positions=8)
        >>> q = torch.randn(1, 1, 2, 4)
        >>> rope(q, torch.zeros(1, 2, dtype=torch.long)).equal(q)  # position 0 is the identity
        True
    """

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}.")
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [B, H, T, Dh]`` rotated at ``positions [B, T]``."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)  # [B, 1, T, Dh/2]
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _Attention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, rope: RotaryEmbedding | None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self._rope = [rope]  # shared by every layer; a list so it is not registered per layer

    def forward(self, x, slots, layer_cache, key_mask):
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim).unbind(2)  # [B, T, H, Dh]
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        rope = self._rope[0]
        if rope is not None:
            q, k = rope(q, slots), rope(k, slots)
        new_kv = torch.stack([k.transpose(1, 2), v], dim=2)  # [B, T, 2, H, Dh]
        if layer_cache is None:
            keys, values = k, v.transpose(1, 2)
        else:
            rows = torch.arange(B, device=x.device)[:, None]
            layer_cache[rows, slots] = new_kv  # in place: the caller's buffer, per-row slots
            keys = layer_cache[:, :, 0].transpose(1, 2)
            values = layer_cache[:, :, 1].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_mask)
        return self.proj(out.transpose(1, 2).reshape(B, T, E)), new_kv


class _Block(nn.Module):
    """Pre-LN GPT block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int, rope: RotaryEmbedding | None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = _Attention(embed_dim, num_heads, rope)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(
            nn.Linear(embed_dim, mlp_ratio * embed_dim), nn.GELU(), nn.Linear(mlp_ratio * embed_dim, embed_dim)
        )

    def forward(self, x, slots, layer_cache, key_mask):
        attn, new_kv = self.attn(self.ln1(x), slots, layer_cache, key_mask)
        x = x + attn
        return x + self.mlp(self.ln2(x)), new_kv


class CausalTransformer(nn.Module):
    """A stack of pre-LN causal self-attention blocks over token slots, with an optional KV cache.

    Args:
        embed_dim: token width.
        num_layers / num_heads: depth and heads (``embed_dim % num_heads == 0``).
        max_tokens: slots a sequence (or a cache) may hold.
        position: ``"absolute"`` (a learned embedding added to the input
            tokens) or ``"rope"`` (rotary embedding of queries and keys).
        mlp_ratio: hidden width of the blocks' MLP over ``embed_dim``.

    :meth:`forward` ``(x [B, T, E], slots [B, T], cache=None)`` returns the
    final-LN outputs ``[B, T, E]`` and the new tokens' keys/values
    ``[B, T, num_layers, 2, H, Dh]``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import CausalTransformer
        >>> gpt = CausalTransformer(8, num_layers=1, num_heads=2, max_tokens=6, position="rope")
        >>> x, slots = torch.randn(1, 3, 8), torch.arange(3)[None]
        >>> full, kv = gpt(x, slots)
        >>> cache = gpt.empty_cache(1)
        >>> steps = [gpt(x[:, t:t + 1], slots[:, t:t + 1], cache)[0] for t in range(3)]
        >>> torch.allclose(torch.cat(steps, 1), full, atol=1e-5), kv.shape
        (True, torch.Size([1, 3, 1, 2, 2, 4]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_layers: int,
        num_heads: int,
        max_tokens: int,
        position: str = "rope",
        mlp_ratio: int = 4,
    ) -> None:
        super().__init__()
        if position not in _POSITIONS:
            raise ValueError(f"position must be one of {_POSITIONS}, got {position!r}.")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be a multiple of num_heads={num_heads}.")
        self.embed_dim, self.num_layers, self.num_heads = int(embed_dim), int(num_layers), int(num_heads)
        self.head_dim = embed_dim // num_heads
        self.max_tokens = int(max_tokens)
        self.position = position
        self.rope = RotaryEmbedding(self.head_dim, max_tokens) if position == "rope" else None
        self.pos_emb = nn.Embedding(max_tokens, embed_dim) if position == "absolute" else None
        self.blocks = nn.ModuleList(_Block(embed_dim, num_heads, mlp_ratio, self.rope) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(embed_dim)

    def empty_cache(self, batch_size: int, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
        """A zero key/value buffer ``[B, max_tokens, num_layers, 2, H, Dh]``."""
        ref = self.ln_f.weight
        return torch.zeros(
            batch_size, self.max_tokens, self.num_layers, 2, self.num_heads, self.head_dim,
            dtype=dtype or ref.dtype, device=device or ref.device,
        )

    def forward(
        self, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``x [B, T, E]`` at ``slots [B, T]``; with ``cache``, write into it and attend to it."""
        if int(slots.max()) >= self.max_tokens:
            raise ValueError(f"slot {int(slots.max())} is beyond max_tokens={self.max_tokens}.")
        if self.pos_emb is not None:
            x = x + self.pos_emb(slots)
        key_slots = slots if cache is None else torch.arange(cache.shape[1], device=x.device).expand(x.shape[0], -1)
        key_mask = (key_slots[:, None, :] <= slots[:, :, None]).unsqueeze(1)  # [B, 1, T, S]
        kvs = []
        for layer, block in enumerate(self.blocks):
            x, new_kv = block(x, slots, None if cache is None else cache[:, :, layer], key_mask)
            kvs.append(new_kv)
        return self.ln_f(x), torch.stack(kvs, dim=2)


def head_mlp(embed_dim: int, out_dim: int) -> nn.Sequential:
    """A world-model head over the transformer's output: ``Linear -> GELU -> Linear`` (what the fused kernel reads)."""
    return nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, out_dim))
