"""Categorical value / reward supports (MuZero appendix F).

A scalar ``x`` is squashed with the signed hyperbolic transform ``h(x)`` and
two-hot encoded over evenly spaced bins; decoding takes the expectation in
``h`` space and maps it back with ``h^{-1}``. The transforms and the two-hot
helpers are torchrl's; this class only fixes the bins.
"""
from __future__ import annotations

import torch
from torch import nn
from torchrl.modules.functional import signed_hyperbolic, signed_parabolic
from torchrl.modules.models.model_based import two_hot_decode, two_hot_encode

__all__ = ["CategoricalSupport", "inverse_signed_hyperbolic"]


def inverse_signed_hyperbolic(y: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``h^{-1}`` in the fewest ops, for the search's hot path.

    Same function as torchrl's ``signed_parabolic`` (tested equal), written
    as one closed form because that one builds scalar tensors and masks on
    every call, which the search pays twice per simulation (figure:
    docs/performance_search.md, "Design figures quoted from the code").
    """
    root = (torch.sqrt(y.abs() * (4 * epsilon) + (1 + 4 * epsilon * (1 + epsilon))) - 1) / (2 * epsilon)
    return torch.sign(y) * (root * root - 1)


class CategoricalSupport(nn.Module):
    """A categorical support over ``h``-transformed scalars.

    Args:
        support_size (int): half-width of the support: bins are the integers
            ``-support_size .. support_size`` in ``h`` space, i.e.
            ``2 * support_size + 1`` bins (300 -> 601 bins as in MuZero Atari).
        epsilon (float): the ``epsilon`` of the signed hyperbolic transform.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import CategoricalSupport
        >>> support = CategoricalSupport(support_size=10)
        >>> support.num_bins
        21
        >>> x = torch.tensor([-3.0, 0.0, 42.0])
        >>> probs = support.encode(x)
        >>> torch.allclose(support.decode(probs.log()), x, atol=1e-3)
        True
    """

    def __init__(self, support_size: int, epsilon: float = 1e-3) -> None:
        super().__init__()
        if support_size < 1:
            raise ValueError(f"support_size must be >= 1, got {support_size}.")
        self.support_size = int(support_size)
        self.epsilon = float(epsilon)
        self.register_buffer(
            "bins",
            torch.arange(-support_size, support_size + 1, dtype=torch.float32),
            persistent=False,
        )

    @property
    def num_bins(self) -> int:
        return 2 * self.support_size + 1

    @property
    def max_value(self) -> float:
        """Largest scalar the support can represent (``h^{-1}(support_size)``)."""
        return float(signed_parabolic(torch.tensor(float(self.support_size)), self.epsilon))

    def encode(self, value: torch.Tensor) -> torch.Tensor:
        """Scalars ``[...]`` -> two-hot probabilities ``[..., num_bins]``."""
        return two_hot_encode(signed_hyperbolic(value, self.epsilon), self.bins)

    def decode(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., num_bins]`` -> scalars ``[...]``."""
        self._check(logits)
        return signed_parabolic(two_hot_decode(logits, self.bins), self.epsilon)

    def expectation(self, logits: torch.Tensor) -> torch.Tensor:
        """Expected bin ``E[h(x)]`` under ``softmax(logits)`` (one softmax, one product)."""
        bins = self.bins if logits.dtype == self.bins.dtype else self.bins.to(logits.dtype)
        return torch.softmax(logits, dim=-1) @ bins

    def decode_fast(self, logits: torch.Tensor) -> torch.Tensor:
        """Same value as :meth:`decode` in a handful of kernel launches.

        The search decodes a value and a reward at every simulation, and on
        CPU every aten call costs microseconds: torchrl's ``two_hot_decode``
        and ``signed_parabolic`` together take several times this path's time
        for one row (tested equal to :meth:`decode`; figures:
        docs/performance_search.md, "Design figures quoted from the code").
        """
        self._check(logits)
        return inverse_signed_hyperbolic(self.expectation(logits), self.epsilon)

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``logits [..., num_bins]`` against scalar targets ``[...]``."""
        self._check(logits)
        target_probs = self.encode(target.to(logits.dtype))
        return -(target_probs * torch.log_softmax(logits, dim=-1)).sum(-1)

    def _check(self, logits: torch.Tensor) -> None:
        if logits.shape[-1] != self.num_bins:
            raise ValueError(
                f"expected logits with {self.num_bins} bins in the last dimension "
                f"(support_size={self.support_size}), got shape {tuple(logits.shape)}."
            )

    def extra_repr(self) -> str:
        return f"support_size={self.support_size}, num_bins={self.num_bins}"
