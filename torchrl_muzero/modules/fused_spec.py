"""What a model hands the search so that the C++ kernel runs every simulation, network included.

A model offers at most one fused search through one method,
``fused_kernel_spec() -> FusedSpec | None`` (``MuZeroModel``'s answers
``None``; the models the kernel mirrors override it: ``MuZeroMLPModel``,
``EfficientZeroMLPModel``, ``StochasticMuZeroMLPModel``, ``UniZeroModel``).
The :class:`FusedSpec` names the kernel entry, carries the network's tensors
and scalars in that entry's order, and declares the node state the entry
reads and writes (keys, dtypes, dims). The search (``mcts/search.py``'s
``run_engine``, ``mcts/stochastic.py``) is the only place that decides between
the fused kernel, the C++ bookkeeping and torch: it runs the spec's entry
when the loaded kernel has it and the tree's node state is the declared one
(:meth:`FusedSpec.matches`), so it needs to know no variant's node-state keys.

This module sits in ``modules`` (not ``mcts``) because the models build specs
and the modules layer does not import the search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from tensordict import TensorDictBase

__all__ = ["FUSED_KERNELS", "FusedSpec", "StateLeaf", "fused_spec_of"]

#: The kernel entries a :class:`FusedSpec` may name: MuZero's MLP step, EfficientZero's
#: value-prefix LSTM step, Stochastic MuZero's afterstate/chance steps, UniZero's transformer step,
#: and the sampled search over a box on EfficientZero's or MuZero's MLP step (``SampledModel``: the K
#: draws in the kernel).
FUSED_KERNELS = ("mlp", "ez", "stochastic", "unizero", "sampled_ez", "sampled_mlp")


class StateLeaf(NamedTuple):
    """One leaf of the node state a fused kernel reads and writes (``tree.embeddings``).

    ``key`` is the TensorDict key (a tuple for a nested leaf: a sampled
    model's ``("node", "latent")``), or ``None`` for a node state that is one
    plain tensor (MuZero's latent); ``ndim`` the dims of the tree's
    ``[B, N, ...]`` leaf, ``None`` for any.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.fused_spec import StateLeaf
        >>> StateLeaf("steps", torch.int64)
        StateLeaf(key='steps', dtype=torch.int64, ndim=None)
    """

    key: str | tuple[str, ...] | None
    dtype: torch.dtype
    ndim: int | None = None


@dataclass(frozen=True, eq=False)  # eq would compare tensors; a spec is compared by identity
class FusedSpec:
    """One fused C++ search a model offers: the kernel entry, its network, its node state.

    Attributes:
        kernel: the entry (:data:`FUSED_KERNELS`).
        tensors: the network's contiguous float32 CPU tensors, in the entry's order.
        ints: the entry's integer settings (EfficientZero: the LSTM horizon;
            UniZero: layers, heads, ...), in its order.
        floats: its float settings (the supports' epsilons first), in its order.
        node_state: the leaves of the node state the entry reads and writes;
            a tree whose ``embeddings`` are not exactly these (:meth:`matches`)
            is searched without the fused entry.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel
        >>> from torchrl_muzero.modules.fused_spec import FusedSpec
        >>> spec = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8).fused_kernel_spec()
        >>> spec.kernel, len(spec.tensors), spec.node_state
        ('mlp', 14, (StateLeaf(key=None, dtype=torch.float32, ndim=3),))
        >>> spec.matches(torch.zeros(2, 5, 8)), spec.matches(torch.zeros(2, 5, 8, dtype=torch.float64))
        (True, False)
        >>> EfficientZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8).fused_kernel_spec().kernel
        'ez'
        >>> FusedSpec("conv", [], node_state=())
        Traceback (most recent call last):
        ...
        ValueError: FusedSpec.kernel must be one of ('mlp', 'ez', ..., 'sampled_mlp'), got 'conv'.
    """

    kernel: str
    tensors: Sequence[torch.Tensor]
    ints: Sequence[int] = ()
    floats: Sequence[float] = ()
    node_state: tuple[StateLeaf, ...] = ()

    def __post_init__(self) -> None:
        # a misspelt entry would otherwise fall back to the slow path without a word
        if self.kernel not in FUSED_KERNELS:
            raise ValueError(f"FusedSpec.kernel must be one of {FUSED_KERNELS}, got {self.kernel!r}.")

    def matches(self, state) -> bool:
        """Whether ``state`` (a tree's ``embeddings``) is the node state the entry reads: exactly the declared
        leaves (no more, no fewer), each a contiguous tensor of the declared dtype and dims."""
        leaves = self.node_state
        if isinstance(state, torch.Tensor):
            return len(leaves) == 1 and leaves[0].key is None and _leaf_ok(state, leaves[0])
        if not isinstance(state, TensorDictBase):
            return False
        # every leaf, nested ones as tuple keys (a flat TensorDict's are its plain keys)
        if set(state.keys(include_nested=True, leaves_only=True)) != {leaf.key for leaf in leaves}:
            return False
        return all(_leaf_ok(state.get(leaf.key), leaf) for leaf in leaves)


def _leaf_ok(t, leaf: StateLeaf) -> bool:
    return (
        isinstance(t, torch.Tensor) and t.dtype == leaf.dtype and t.is_contiguous()
        and (leaf.ndim is None or t.dim() == leaf.ndim)
    )


def fused_spec_of(model) -> FusedSpec | None:
    """``model.fused_kernel_spec()``; ``None`` for a duck-typed model without the method.

    The search takes any object with a ``search_step`` (or the older
    ``recurrent_inference_scalar``); only models that declare a spec get
    the fused kernel.

    Examples:
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.modules.fused_spec import fused_spec_of
        >>> fused_spec_of(MuZeroMLPModel((4,), 2)).kernel, fused_spec_of(object())
        ('mlp', None)
    """
    spec = getattr(model, "fused_kernel_spec", None)
    return None if spec is None else spec()
