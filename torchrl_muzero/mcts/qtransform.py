"""Gumbel MuZero's completed Q-values (Danihelka et al., ICLR 2022, appendix D; mctx ``qtransforms``).

``sigma(completedQ)`` of the edges below one node per tree, over the tree
arrays. The visited edges keep their ``q = reward + discount * value(child)``
(:meth:`~torchrl_muzero.mcts.tree.Tree.child_values`, each edge's own
discount: in two-player games the discount is negated, so ``q`` is already
from the point of view of the player to move at the node); the unvisited ones
get the node's *mixed value*, an interpolation of its raw network value and
the prior-weighted mean ``q`` of its visited children. The result is min-max
rescaled over all the node's actions (unselectable ones included, holding the
mixed value, as mctx) and scaled by ``(maxvisit_init + max_a N(a)) *
value_scale``.
"""
from __future__ import annotations

import torch

from torchrl_muzero.mcts.tree import Tree

__all__ = ["mixed_value", "completed_qvalues", "sigma_completed_q", "sigma_and_visits"]

_TINY = torch.finfo(torch.float32).tiny


def mixed_value(
    raw_value: torch.Tensor, q: torch.Tensor, visits: torch.Tensor, prior: torch.Tensor
) -> torch.Tensor:
    """The mixed value ``[B]`` of nodes with raw value ``raw_value [B]`` and child ``q, visits, prior [B, A]``.

    float32 order (``visited = visits > 0``, sums over the ``A`` actions)::

        p       = max(prior, tiny)                        # tiny = float32 smallest normal
        sum_n   = sum(visits)
        sum_p   = sum(p if visited else 0)
        wq      = sum(p * q / sum_p if visited else 0)    # (p * q) / sum_p, per action
        mixed   = (raw_value + sum_n * wq) / (sum_n + 1)

    With no visited child ``mixed = raw_value``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.qtransform import mixed_value
        >>> mixed_value(torch.tensor([1.0]), torch.tensor([[3.0, 0.0]]), torch.tensor([[3.0, 0.0]]),
        ...             torch.tensor([[0.5, 0.5]]))
        tensor([2.5000])
    """
    visited = visits > 0
    p = prior.clamp_min(_TINY)
    sum_n = visits.sum(-1)
    sum_p = torch.where(visited, p, 0.0).sum(-1, keepdim=True)
    safe_sum_p = torch.where(visited, sum_p, 1.0)
    wq = torch.where(visited, p * q / safe_sum_p, 0.0).sum(-1)
    return (raw_value + sum_n * wq) / (sum_n + 1.0)


def completed_qvalues(
    tree: Tree, node: torch.Tensor, rescale_values: bool = True, epsilon: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(completedQ [B, A], visits [B, A])`` of the edges below ``node [B]``, before the sigma scale.

    ``completedQ(a) = q(a)`` for a visited edge, else the :func:`mixed_value`
    of the node (from ``tree.raw_value[node]``, the prior
    ``softmax(tree.children_logits[node])``). With ``rescale_values``::

        completedQ = (completedQ - min_a completedQ) / max(max_a completedQ - min_a completedQ, epsilon)

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.qtransform import completed_qvalues
        >>> tree = allocate_tree(1, 2, 3, torch.Size([1]), torch.device("cpu"))
        >>> q, n = completed_qvalues(tree, torch.zeros(1, dtype=torch.long))  # nothing visited
        >>> q, n
        (tensor([[0., 0., 0.]]), tensor([[0., 0., 0.]]))
    """
    rows = torch.arange(tree.batch_size, device=node.device)
    q, visits, _ = tree.child_values(node)
    prior = torch.softmax(tree.children_logits[rows, node], -1)
    value = mixed_value(tree.raw_value[rows, node], q, visits, prior)
    completed = torch.where(visits > 0, q, value.unsqueeze(-1))
    if rescale_values:
        lo = completed.min(-1, keepdim=True).values
        hi = completed.max(-1, keepdim=True).values
        completed = (completed - lo) / torch.clamp_min(hi - lo, epsilon)
    return completed, visits


def sigma_completed_q(
    tree: Tree,
    node: torch.Tensor,
    value_scale: float = 0.1,
    maxvisit_init: float = 50.0,
    rescale_values: bool = True,
    epsilon: float = 1e-8,
) -> torch.Tensor:
    """``sigma(completedQ) [B, A]`` of the edges below ``node [B]`` (mctx ``qtransform_completed_by_mix_value``).

    float32 order: ``((maxvisit_init + max_a N(a)) * value_scale) * completedQ``
    with ``completedQ`` from :func:`completed_qvalues`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.qtransform import sigma_completed_q
        >>> tree = allocate_tree(1, 2, 2, torch.Size([1]), torch.device("cpu"))
        >>> tree.children_index[0, 0, 0] = 1; tree.visit_count[0, 1] = 2; tree.value_sum[0, 1] = 4.0
        >>> tree.raw_value[0, 0] = -1.0  # the mixed value (-1 + 2 * 2) / 3 = 1 fills action 1
        >>> sigma_completed_q(tree, torch.zeros(1, dtype=torch.long), value_scale=0.5, maxvisit_init=2.0)
        tensor([[2., 0.]])
    """
    return sigma_and_visits(tree, node, value_scale, maxvisit_init, rescale_values, epsilon)[0]


def sigma_and_visits(
    tree: Tree,
    node: torch.Tensor,
    value_scale: float = 0.1,
    maxvisit_init: float = 50.0,
    rescale_values: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sigma(completedQ) [B, A], child visits [B, A] float)`` below ``node [B]``: what the Gumbel rules read."""
    completed, visits = completed_qvalues(tree, node, rescale_values, epsilon)
    scale = (maxvisit_init + visits.max(-1, keepdim=True).values) * value_scale
    return scale * completed, visits
