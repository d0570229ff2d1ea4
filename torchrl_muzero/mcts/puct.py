"""The MuZero pUCT selection rule, as a pure function over the tree arrays.

Kept apart from the search loop so that other rules (Gumbel, sampled
actions, chance nodes) plug into the same select / expand / backup loop
(:mod:`torchrl_muzero.mcts.rules`). The float32 expression order mirrors the
C++ kernel (csrc/tree_ops.cpp) so both give identical visit counts:
``u = prior * sqrt(N) / (1 + n) * pb_c`` evaluated left to right, and
``score = q_norm + u``.
"""
from __future__ import annotations

import math

import torch

from torchrl_muzero.mcts.tree import Tree

__all__ = ["puct_scores", "selectable"]


def selectable(tree: Tree, node: torch.Tensor) -> torch.Tensor:
    """``[B, A]`` bool: the edges a rule may pick at ``node [B]``.

    Illegal root actions (``root_legal``) and edges whose prior logit is
    ``-inf`` (a chance node's decision slots and the reverse) are excluded.
    """
    rows = torch.arange(tree.batch_size, device=node.device)
    ok = tree.children_logits[rows, node] > -math.inf
    at_root = (node == 0).unsqueeze(-1)
    return ok & ~(at_root & ~tree.root_legal)


def puct_scores(
    tree: Tree,
    node: torch.Tensor,
    pb_c_base: float,
    pb_c_init: float,
    discount: float | None = None,
) -> torch.Tensor:
    """pUCT score ``[B, A]`` of every action at ``node [B]`` (one node per tree).

    ``q`` is ``reward + discount * value(child)``, min-max normalised with the
    tree's statistics (0 while the tree has seen a single value); unexpanded
    edges count as ``q_norm = 0`` (MuZero pseudocode). Edges that may not be
    selected (:func:`selectable`) score ``-inf``. ``discount=None`` takes
    each edge's own (``tree.children_discount``); a float applies one to all.
    """
    rows = torch.arange(tree.batch_size, device=node.device)
    parent_visits = tree.visit_count[rows, node].float()
    pb_c = pb_c_init + torch.log((parent_visits + pb_c_base + 1.0) / pb_c_base)
    sqrt_n = torch.sqrt(parent_visits)

    if discount is None:
        q, child_visits, expanded = tree.child_values(node)
    else:
        child = tree.children_index[rows, node].long()  # [B, A]
        expanded = child >= 0
        safe_child = child.clamp_min(0)
        child_visits = torch.where(expanded, tree.visit_count.gather(1, safe_child), 0).float()
        child_value = tree.value_sum.gather(1, safe_child) / child_visits.clamp_min(1.0)
        q = tree.children_reward[rows, node] + discount * child_value
    delta = (tree.max_q - tree.min_q).unsqueeze(-1)
    q_norm = torch.where(expanded & (delta > 1e-8), (q - tree.min_q.unsqueeze(-1)) / delta, 0.0)

    prior = tree.children_prior[rows, node]
    u = prior * sqrt_n.unsqueeze(-1) / (1.0 + child_visits) * pb_c.unsqueeze(-1)
    scores = q_norm + u
    if tree.children_logits is None:
        at_root = (node == 0).unsqueeze(-1)
        return scores.masked_fill(at_root & ~tree.root_legal, -math.inf)
    return scores.masked_fill(~selectable(tree, node), -math.inf)
