"""Selection: walk every tree from the root to an unexpanded edge."""
from __future__ import annotations

import torch

from torchrl_muzero.mcts.puct import puct_scores
from torchrl_muzero.mcts.rules import SelectionRule
from torchrl_muzero.mcts.tree import Tree

__all__ = ["descend", "select_leaves"]


def descend(
    tree: Tree, root_rule: SelectionRule, interior_rule: SelectionRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(leaf_node [B], leaf_action [B])``: the edge each tree expands next.

    The root picks with ``root_rule``, every deeper node with
    ``interior_rule``. All trees descend one level per iteration (so every
    rule call sees one depth); a tree that reached an unexpanded edge stays
    put while the deeper ones finish.
    """
    B = tree.batch_size
    rows = torch.arange(B, device=tree.visit_count.device)
    node = torch.zeros(B, dtype=torch.long, device=rows.device)
    leaf_node = torch.zeros_like(node)
    leaf_action = torch.zeros_like(node)
    active = torch.ones(B, dtype=torch.bool, device=rows.device)
    for depth in range(tree.num_nodes):
        rule = root_rule if depth == 0 else interior_rule
        action = rule(tree, node, depth)
        child = tree.children_index[rows, node, action].long()
        reached = active & (child < 0)
        leaf_node = torch.where(reached, node, leaf_node)
        leaf_action = torch.where(reached, action, leaf_action)
        active = active & ~reached
        if not bool(active.any()):
            break
        node = torch.where(active, child, node)
    return leaf_node, leaf_action


def select_leaves(
    tree: Tree, pb_c_base: float, pb_c_init: float, discount: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """pUCT descent with one discount for every edge (the C++ ``select``'s contract).

    Ties go to the lowest action index (``argmax`` returns the first maximum).
    """
    def rule(tree, node, depth):
        return puct_scores(tree, node, pb_c_base, pb_c_init, discount).argmax(-1)

    return descend(tree, rule, rule)

