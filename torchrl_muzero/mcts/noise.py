"""Root exploration noise drawn from a ``torch.Generator``.

``torch.distributions.Dirichlet`` cannot take a generator, and a search must
be reproducible from a seeded one, so Gamma variates are drawn here with
Marsaglia & Tsang's method from the generator's normals and uniforms.
"""
from __future__ import annotations

import math

import torch

__all__ = ["sample_dirichlet"]


def _sample_gamma(alpha: float, shape: torch.Size, generator, device) -> torch.Tensor:
    boost = alpha < 1.0  # Gamma(a) = Gamma(a + 1) * U ** (1 / a) for a < 1
    a = alpha + 1.0 if boost else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    if math.prod(shape) == 0:  # nothing to draw (and no draws, as the rounds below would do)
        return torch.empty(shape, device=device)
    # Rejection rounds until every entry is accepted; the first round, where every entry is
    # pending, keeps all its candidates (a rejected one is replaced in a later round), which skips
    # the bookkeeping ops a B = 1 search otherwise pays in full (usually one round at A = 2).
    out = pending = None
    while True:
        x = torch.randn(shape, generator=generator, device=device)
        v = (1.0 + c * x) ** 3
        u = torch.rand(shape, generator=generator, device=device)
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-30)))
        if out is None:
            out, pending = d * v, ~ok
        else:
            out = torch.where(pending & ok, d * v, out)
            pending = pending & ~ok
        if not bool(pending.any()):
            break
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
