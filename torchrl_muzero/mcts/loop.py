"""The one search loop every variant runs: select, model step, expand, back up.

:func:`start_tree` puts the root (a :class:`~torchrl_muzero.modules.ModelStep`)
into freshly allocated arrays, :func:`run_search` runs the simulations with a
root rule and an interior rule (:mod:`torchrl_muzero.mcts.rules`). A variant
writes its own *policy* around these two calls, as mctx's
``gumbel_muzero_policy`` composes ``search()``: prepare the root priors and
its ``tree.extra`` data, pick its rules, read its action and policy target
from the finished tree (:mod:`torchrl_muzero.mcts.search` is MuZero's,
:mod:`torchrl_muzero.mcts.gumbel` Gumbel MuZero's).

Backends. The C++ kernel (``torchrl_muzero._C``) implements the descent for
the rules that name a ``cpp_rule`` it lists (``ROOT_RULES`` /
``INTERIOR_RULES``), and the expand/backup with each edge's own discount (a
model step's ``discount`` included). The loop uses it when ``ops`` is given
and both rules are C++ rules; otherwise the same simulation runs in batched
torch ops. Both give the same visit counts (test/test_tree_ops.py,
test/test_cpp_rules.py, test/test_golden_search.py).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.backup import expand_and_backup
from torchrl_muzero.mcts.rules import SelectionRule
from torchrl_muzero.mcts.select import descend
from torchrl_muzero.mcts.tree import Tree, allocate_tree, node_states
from torchrl_muzero.modules.step import ModelStep

__all__ = ["start_tree", "run_search", "cpp_rules_supported"]

StepFn = Callable[[object, torch.Tensor], ModelStep]


# The arrays of a Tree that the kernel's start_tree_arrays returns, in its order.
_TREE_ARRAYS = ("visit_count", "value_sum", "parent", "action_from_parent", "children_index", "children_prior",
                "children_reward", "min_q", "max_q", "root_legal", "raw_value", "children_logits",
                "children_discount")


def start_tree(
    root: ModelStep,
    num_simulations: int,
    legal: torch.Tensor,
    discount: float,
    ops=None,
) -> Tree:
    """Allocate ``B`` trees and write the root: its state, raw value, masked logits and softmax prior.

    ``legal [B, A]`` bool masks the root's actions (their logits become
    ``-inf``). ``discount`` is every edge's default discount (already negated
    for two-player games). With the C++ kernel ``ops`` (a policy's resolved
    backend) a CPU tree's arrays are made in one call (``root_ops.cpp``: the
    same tensors, ~18 torch ops fewer); the node states are made here either way.
    """
    if ops is not None and hasattr(ops, "start_tree_arrays") and root.policy_logits.device.type == "cpu":
        arrays = ops.start_tree_arrays(root.policy_logits, legal, root.value, num_simulations + 1, float(discount))
        return Tree(**dict(zip(_TREE_ARRAYS, arrays)), embeddings=node_states(root.state, num_simulations + 1))
    logits = root.policy_logits.float().masked_fill(~legal, -math.inf)
    B, A = logits.shape
    tree = allocate_tree(
        B, num_simulations, A, None, logits.device, discount=discount, root_state=root.state
    )
    tree.root_legal.copy_(legal)
    tree.children_logits[:, 0] = logits
    tree.children_prior[:, 0] = torch.softmax(logits, -1)
    tree.raw_value[:, 0] = root.value.float()
    return tree


def cpp_rules_supported(ops, root_rule: SelectionRule, interior_rule: SelectionRule) -> bool:
    """Whether the loaded kernel ``ops`` runs this pair of rules.

    True when the root rule's ``cpp_rule`` is one of the kernel's
    ``ROOT_RULES`` and the interior rule's one of its ``INTERIOR_RULES``
    (each rule passes its own ``cpp_params``).
    """
    if ops is None:
        return False
    roots, interiors = _cpp.cpp_rule_names(ops)
    return getattr(root_rule, "cpp_rule", None) in roots and getattr(interior_rule, "cpp_rule", None) in interiors


def run_search(
    tree: Tree,
    step: StepFn,
    num_simulations: int,
    root_rule: SelectionRule,
    interior_rule: SelectionRule,
    discount: float,
    ops=None,
) -> Tree:
    """Run ``num_simulations`` simulations on ``tree`` in place and return it.

    Each simulation descends every tree with the rules, calls
    ``step(parent_states, actions) -> ModelStep`` once for the whole batch,
    stores the new node (its state, raw value, prior logits and softmax
    prior, the edge's reward and discount) and backs its value up.
    ``discount`` is the search's discount (the default of
    ``tree.children_discount``, which both backends read per edge); ``ops``
    the loaded kernel or ``None`` for the torch path.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.mcts.loop import run_search, start_tree
        >>> from torchrl_muzero.mcts.rules import PUCT
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> root = model.search_root(torch.randn(3, 4))
        >>> tree = start_tree(root, 5, torch.ones(3, 2, dtype=torch.bool), discount=0.997)
        >>> tree = run_search(tree, model.search_step, 5, PUCT(), PUCT(), discount=0.997)
        >>> tree.root_child_visits().sum(-1)
        tensor([5, 5, 5])
    """
    use_cpp = cpp_rules_supported(ops, root_rule, interior_rule)
    if use_cpp:  # the kernel's calls with the tree and the rules bound once
        cpp_select, cpp_expand_and_backup = _cpp.bind_cpp_search(tree, root_rule, interior_rule)
    rows = torch.arange(tree.batch_size, device=tree.visit_count.device)
    for sim in range(num_simulations):
        n = sim + 1
        if use_cpp:
            leaf_node, leaf_action = cpp_select()
        else:
            leaf_node, leaf_action = descend(tree, root_rule, interior_rule)
        out = step(tree.embeddings[rows, leaf_node], leaf_action)
        tree.embeddings[:, n] = out.state
        logits = out.policy_logits.float()
        tree.children_logits[:, n] = logits
        tree.raw_value[:, n] = out.value.float()
        prior = torch.softmax(logits, -1)
        if use_cpp:
            cpp_expand_and_backup(
                n, leaf_node, leaf_action, out.reward.float(), out.value.float(), prior, out.discount
            )
        else:
            expand_and_backup(
                tree, n, leaf_node, leaf_action, out.reward.float(), out.value.float(), prior,
                edge_discount=out.discount,
            )
    return tree
