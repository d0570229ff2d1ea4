"""What one model step hands the search: :class:`ModelStep`.

Every variant's network meets the search through two methods of its model,
``search_root(observation) -> ModelStep`` and
``search_step(state, action) -> ModelStep``. The search stores ``state`` per
node without looking inside it, so a variant keeps whatever it needs there: a
latent tensor (MuZero), a TensorDict of latent, LSTM state and value prefix
(EfficientZero), a latent plus a node-type flag (Stochastic MuZero).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

__all__ = ["ModelStep"]


@dataclass
class ModelStep:
    """The typed output of one search step of a model, for ``B`` nodes at once.

    Attributes:
        state: the new node's state ``[B, ...]``: a tensor or a TensorDict
            with batch size ``[B]``; stored in the tree as it is.
        reward: ``[B]`` float, the reward of the edge into the new node (the
            mover's view); zeros for a root.
        policy_logits: ``[B, A]`` prior logits of the new node's edges;
            ``-inf`` marks an edge the search must never select (a chance
            node's decision slots, an illegal action).
        value: ``[B]`` float, the network's value of the new node.
        discount: ``[B]`` float discount of the edge into the new node, or
            ``None`` for the search's own discount (negated in two-player
            games). Stochastic MuZero's decision-to-chance edges use 1.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel, ModelStep
        >>> model = MuZeroMLPModel((4,), 3, latent_dim=8, hidden_dim=8)
        >>> root = model.search_root(torch.randn(2, 4))
        >>> step = model.search_step(root.state, torch.tensor([0, 2]))
        >>> isinstance(step, ModelStep), step.state.shape, step.policy_logits.shape, step.discount
        (True, torch.Size([2, 8]), torch.Size([2, 3]), None)
    """

    state: torch.Tensor | TensorDictBase
    reward: torch.Tensor
    policy_logits: torch.Tensor
    value: torch.Tensor
    discount: torch.Tensor | None = None
