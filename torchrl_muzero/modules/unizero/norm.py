"""The normalisation at the end of UniZero's encoder and of its next-latent head.

UniZero (arXiv 2406.10667) keeps latent tokens on a fixed scale with SimNorm
(simplicial normalisation, from TD-MPC2): the token is cut into groups of
``simnorm_dim`` features and each group goes through a softmax, so every
group is a point on a probability simplex. The encoder output and the
transformer's predicted next latent share the same normalisation, so the
predicted token lives where the encoded ones do and can be fed back as input.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["SimNorm", "make_latent_norm"]


class SimNorm(nn.Module):
    """Softmax over consecutive groups of ``simnorm_dim`` features of the last dimension.

    Args:
        simnorm_dim: features per group; the last dimension must be a multiple of it.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import SimNorm
        >>> out = SimNorm(4)(torch.randn(2, 8))
        >>> torch.allclose(out.view(2, 2, 4).sum(-1), torch.ones(2, 2))
        True
    """

    def __init__(self, simnorm_dim: int = 8) -> None:
        super().__init__()
        if simnorm_dim < 1:
            raise ValueError(f"simnorm_dim must be >= 1, got {simnorm_dim}.")
        self.simnorm_dim = int(simnorm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % self.simnorm_dim:
            raise ValueError(
                f"SimNorm needs a last dimension divisible by simnorm_dim={self.simnorm_dim}, "
                f"got {x.shape[-1]}."
            )
        groups = x.unflatten(-1, (-1, self.simnorm_dim))
        return torch.softmax(groups, dim=-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"simnorm_dim={self.simnorm_dim}"


def make_latent_norm(kind: str, embed_dim: int, simnorm_dim: int = 8) -> nn.Module:
    """``"simnorm"`` -> :class:`SimNorm`, ``"layernorm"`` -> ``nn.LayerNorm(embed_dim)``."""
    if kind == "simnorm":
        if embed_dim % simnorm_dim:
            raise ValueError(f"embed_dim={embed_dim} must be a multiple of simnorm_dim={simnorm_dim}.")
        return SimNorm(simnorm_dim)
    if kind == "layernorm":
        return nn.LayerNorm(embed_dim)
    raise ValueError(f"latent_norm must be 'simnorm' or 'layernorm', got {kind!r}.")
