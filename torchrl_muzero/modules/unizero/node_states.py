"""A searched UniZero tree's node states in the model's layout, rebuilt on demand.

The fused C++ search with the KV cache (``csrc/unizero_search.cpp``) keeps, in
each node's ``kv`` buffer of ``tree.embeddings``, only the keys/values the node
computed itself: its own two tokens' slots (the root, and a node whose context
slid at ``max_blocks``, hold their whole window). A new token reads its
ancestors' slots through the parent links, so the search never needs a node's
whole context in one buffer, and copying every ancestor's slots into every
node (~130 MB per search at B = 64, CartPole sizes) was work for nobody
during the search. :func:`complete_node_states` rebuilds the full layout of
:meth:`UniZeroModel.search_step` (every slot below a node's ``length`` filled,
the root's buffer past it, as the tree allocation used to repeat it) for
whoever reads the node states after a search: the exactness tests, a user
inspecting ``result.tree``. ``latents``, ``actions`` and ``length`` are always
complete.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

__all__ = ["complete_node_states"]


@torch.no_grad()
def complete_node_states(tree) -> None:
    """Fill every expanded node's ``kv`` buffer in place to the layout ``search_step`` gives.

    For each node (parents first: a parent's index is smaller than its
    child's) whose context did not slide, the slots below its parent's length
    are copied from the parent's completed buffer and the slots from its own
    length on from the root's; a node that slid already holds its whole
    window and zeros past it. A node slid exactly when its length is not its
    parent's plus two (a slid context is shorter than any parent that has to
    slide). Idempotent, and a no-op on a tree without ``kv`` (the recompute
    mode) or whose states are complete already (the torch step's). The copies
    are exact, so the result equals the completed states of a search that
    copied every ancestor's slots into every node.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.search import muzero_search
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5)
        >>> result = muzero_search(model, model.search_root(torch.randn(2, 4)), MCTSConfig(num_simulations=6))
        >>> complete_node_states(result.tree)
        >>> tree = result.tree
        >>> child = model.search_step(tree.embeddings[:, 0], tree.action_from_parent[:, 1].long())
        >>> bool(torch.allclose(tree.embeddings[:, 1]["kv"], child.state["kv"], atol=1e-5))
        True
    """
    states = tree.embeddings
    if not isinstance(states, TensorDictBase) or "kv" not in states.keys():
        return
    kv, length = states.get("kv"), states.get("length")
    parent = tree.parent.long()
    B, N, MT = kv.shape[:3]
    rows = torch.arange(B, device=kv.device)
    slots = torch.arange(MT, device=kv.device)
    extra = (1,) * (kv.dim() - 3)  # the slot's [layers, 2, H, Dh]
    root = kv[:, 0]
    for n in range(1, N):
        p = parent[:, n]
        expanded = p >= 0
        if not bool(expanded.any()):
            continue
        p = p.clamp_min(0)
        p_length = length[rows, p]
        grown = expanded & (length[:, n] == p_length + 2)  # not slid: the parent's slots below p_length
        inherit = (slots[None] < p_length[:, None]) & grown[:, None]
        past = (slots[None] >= length[:, n, None]) & grown[:, None]
        node = kv[:, n]
        node.copy_(torch.where(inherit.view(B, MT, *extra), kv[rows, p], node))
        node.copy_(torch.where(past.view(B, MT, *extra), root, node))
