"""Search settings."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MCTSConfig"]

_BACKENDS = ("auto", "torch", "cpp")
_KERNEL_PRECISIONS = ("exact", "fma")


@dataclass
class MCTSConfig:
    """Settings of one MuZero search.

    Args:
        num_simulations: simulations (model calls) per search.
        discount: discount used inside the tree (negated internally for
            two-player games).
        pb_c_base / pb_c_init: constants of the MuZero pUCT rule.
        dirichlet_alpha / dirichlet_fraction: root exploration noise; a
            fraction of 0 turns the noise off.
        temperature: the action is drawn from ``visits ** (1 / temperature)``;
            0 takes the most visited action.
        backend: ``"cpp"`` runs the tree bookkeeping in the C++ kernel (CPU
            only), ``"torch"`` in batched tensor ops (any device), ``"auto"``
            takes the kernel when it is built and the tree lives on the CPU.
            The one switch for every part of a search: with ``"torch"``
            nothing of it reaches the kernel, UniZero's root window included
            (and, in a trainer, the learner's value-target roots and
            reanalyze). ``SearchResult.engine`` says what ran
            (``"cpp-fused"``, ``"cpp"``, ``"torch"``); a run prints it once.
        kernel_precision: arithmetic of the fused C++ searches' network
            (MuZero / Gumbel / EfficientZero / Stochastic MuZero MLPs,
            UniZero's expansions). ``"exact"`` (default): products rounded
            before their sums, fixed order, so results are bit-identical on
            every CPU and vector width. ``"fma"``: fused multiply-adds in the
            linear layers and the support decodes, ~1.1-1.3x faster network
            on x86 with AVX2 + FMA; results still independent of the batch
            size, but a few float32 ulps from the exact path (near-tied
            choices can differ). On a CPU without FMA, or a kernel built
            without it, ``"fma"`` runs the exact path and warns once. Other
            paths (``backend="torch"``, the per-simulation C++ loop) ignore it.

    Examples:
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> MCTSConfig(num_simulations=25, temperature=0.0).num_simulations
        25
        >>> MCTSConfig(kernel_precision="fma").kernel_precision
        'fma'
        >>> MCTSConfig(kernel_precision="fast")
        Traceback (most recent call last):
            ...
        ValueError: MCTSConfig.kernel_precision must be one of ('exact', 'fma'), got 'fast'.
    """

    num_simulations: int = 50
    discount: float = 0.997
    pb_c_base: float = 19652.0
    pb_c_init: float = 1.25
    dirichlet_alpha: float = 0.3
    dirichlet_fraction: float = 0.25
    temperature: float = 1.0
    backend: str = "auto"
    kernel_precision: str = "exact"

    def __post_init__(self) -> None:
        if int(self.num_simulations) < 1:
            raise ValueError(f"MCTSConfig.num_simulations must be >= 1, got {self.num_simulations}.")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"MCTSConfig.discount must be in [0, 1], got {self.discount}.")
        if self.pb_c_base <= 0:
            raise ValueError(f"MCTSConfig.pb_c_base must be > 0, got {self.pb_c_base}.")
        if not 0.0 <= self.dirichlet_fraction <= 1.0:
            raise ValueError(
                f"MCTSConfig.dirichlet_fraction must be in [0, 1], got {self.dirichlet_fraction}."
            )
        if self.dirichlet_fraction > 0 and self.dirichlet_alpha <= 0:
            raise ValueError(f"MCTSConfig.dirichlet_alpha must be > 0, got {self.dirichlet_alpha}.")
        if self.temperature < 0:
            raise ValueError(f"MCTSConfig.temperature must be >= 0, got {self.temperature}.")
        if self.backend not in _BACKENDS:
            raise ValueError(f"MCTSConfig.backend must be one of {_BACKENDS}, got {self.backend!r}.")
        if self.kernel_precision not in _KERNEL_PRECISIONS:
            raise ValueError(
                f"MCTSConfig.kernel_precision must be one of {_KERNEL_PRECISIONS}, got {self.kernel_precision!r}."
            )
        self.num_simulations = int(self.num_simulations)
