"""Expansion and backup, in place on the tree arrays."""
from __future__ import annotations

import torch

from torchrl_muzero.mcts.tree import Tree

__all__ = ["expand_and_backup"]


def expand_and_backup(
    tree: Tree,
    node_index: int,
    leaf_node: torch.Tensor,
    leaf_action: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    prior: torch.Tensor,
    discount: float | None = None,
    edge_discount: torch.Tensor | None = None,
) -> None:
    """Attach node ``node_index`` under ``(leaf_node, leaf_action)`` and back its value up.

    Walks the parent pointers from the new node to the root (no stored path):
    the return ``G`` is ``r + d * G`` per edge, every node on the way gains
    one visit and ``G``, and the per-tree min-max statistics see each edge's
    updated ``q = r + d * value(child)``. ``d`` is ``discount`` for every edge
    when given (the C++ kernel's contract), else each edge's
    ``tree.children_discount``; ``edge_discount [B]`` is written as the new
    edge's discount first. (The caller writes the new node's state into
    ``tree.embeddings``.)
    """
    B = tree.batch_size
    rows = torch.arange(B, device=leaf_node.device)
    n = node_index
    tree.children_index[rows, leaf_node, leaf_action] = n
    tree.parent[:, n] = leaf_node.to(torch.int32)
    tree.action_from_parent[:, n] = leaf_action.to(torch.int32)
    tree.children_reward[rows, leaf_node, leaf_action] = reward.float()
    tree.children_prior[:, n] = prior.float()
    if edge_discount is not None:
        tree.children_discount[rows, leaf_node, leaf_action] = edge_discount.float()

    ret = value.float().clone()
    tree.value_sum[:, n] += ret
    tree.visit_count[:, n] += 1
    node = torch.full((B,), n, dtype=torch.long, device=rows.device)
    active = torch.ones(B, dtype=torch.bool, device=rows.device)
    while True:
        parent = tree.parent[rows, node].long().clamp_min(0)
        action = tree.action_from_parent[rows, node].long().clamp_min(0)
        r = tree.children_reward[rows, parent, action]
        d = discount if discount is not None else tree.children_discount[rows, parent, action]
        q = r + d * (tree.value_sum[rows, node] / tree.visit_count[rows, node].float())
        tree.min_q.copy_(torch.where(active, torch.minimum(tree.min_q, q), tree.min_q))
        tree.max_q.copy_(torch.where(active, torch.maximum(tree.max_q, q), tree.max_q))
        ret = r + d * ret
        tree.value_sum[rows, parent] += torch.where(active, ret, 0.0)
        tree.visit_count[rows, parent] += active.to(torch.int32)
        node = torch.where(active, parent, node)
        active = active & (node != 0)
        if not bool(active.any()):
            break
