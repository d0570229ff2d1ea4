"""Root exploration noise drawn from a ``torch.Generator``.

``torch.distributions.Dirichlet`` cannot take a generator, and a search must
be reproducible from a seeded one, so the Gamma variates come from ATen's
``_standard_gamma`` op, which takes one (the op behind
``torch.distributions.Gamma``; Marsaglia & Tsang's method in one kernel).
Two or three ops a draw where a rejection loop of torch ops cost ~25 (and,
on a GPU, a device sync per rejection round); the fused searches' C++ noise
(``csrc/root_ops.cpp``) calls the same op, so both draw the same noise.
"""
from __future__ import annotations

import torch

__all__ = ["sample_dirichlet"]


def sample_dirichlet(
    alpha: float, legal: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Symmetric Dirichlet(alpha) over the legal actions of each row of ``legal [B, A]``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.noise import sample_dirichlet
        >>> legal = torch.tensor([[True, True, False, True]])
        >>> noise = sample_dirichlet(0.25, legal, torch.Generator().manual_seed(0))
        >>> float(noise[0, 2]), round(float(noise.sum()), 5)  # nothing on the illegal action; sums to 1
        (0.0, 1.0)
    """
    concentration = torch.full(legal.shape, float(alpha), device=legal.device)
    gamma = torch._standard_gamma(concentration, generator=generator) * legal
    return gamma / gamma.sum(-1, keepdim=True).clamp_min(1e-30)
