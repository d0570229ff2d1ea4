"""Root exploration noise drawn from a ``torch.Generator``.

``torch.distributions.Dirichlet`` cannot take a generator, and a search must
be reproducible from a seeded one, so Gamma variates are drawn here with
Marsaglia & Tsang's method from the generator's normals and uniforms.
"""
from __future__ import annotations

import torch

__all__ = ["sample_dirichlet"]


def _sample_gamma(alpha: float, shape: torch.Size, generator, device) -> torch.Tensor:
    boost = alpha < 1.0  # Gamma(a) = Gamma(a + 1) * U ** (1 / a) for a < 1
    a = alpha + 1.0 if boost else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    out = torch.empty(shape, device=device)
    pending = torch.ones(shape, dtype=torch.bool, device=device)
    while bool(pending.any()):
        x = torch.randn(shape, generator=generator, device=device)
        v = (1.0 + c * x) ** 3
        u = torch.rand(shape, generator=generator, device=device)
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-30)))
        take = pending & ok
        out = torch.where(take, d * v, out)
        pending = pending & ~ok
    if boost:
        u = torch.rand(shape, generator=generator, device=device)
        out = out * u.pow(1.0 / alpha)
    return out


def sample_dirichlet(
    alpha: float, legal: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Symmetric Dirichlet(alpha) over the legal actions of each row of ``legal [B, A]``."""
    gamma = _sample_gamma(alpha, legal.shape, generator, legal.device) * legal
    return gamma / gamma.sum(-1, keepdim=True).clamp_min(1e-30)
