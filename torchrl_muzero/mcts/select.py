"""Selection: walk every tree from the root to an unexpanded edge."""
from __future__ import annotations

import torch

from torchrl_muzero.mcts.puct import puct_scores
from torchrl_muzero.mcts.tree import Tree

__all__ = ["select_leaves"]


def select_leaves(
    tree: Tree, pb_c_base: float, pb_c_init: float, discount: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(leaf_node [B], leaf_action [B])``: the edge each tree expands next.

    All trees descend one level per iteration; a tree that reached an
    unexpanded edge stays put while the deeper ones finish. Ties go to the
    lowest action index (``argmax`` returns the first maximum).
    """
    B = tree.batch_size
    rows = torch.arange(B, device=tree.visit_count.device)
    node = torch.zeros(B, dtype=torch.long, device=rows.device)
    leaf_node = torch.zeros_like(node)
    leaf_action = torch.zeros_like(node)
    active = torch.ones(B, dtype=torch.bool, device=rows.device)
    for _ in range(tree.num_nodes):
        action = puct_scores(tree, node, pb_c_base, pb_c_init, discount).argmax(-1)
        child = tree.children_index[rows, node, action].long()
        reached = active & (child < 0)
        leaf_node = torch.where(reached, node, leaf_node)
        leaf_action = torch.where(reached, action, leaf_action)
        active = active & ~reached
        if not bool(active.any()):
            break
        node = torch.where(active, child, node)
    return leaf_node, leaf_action
