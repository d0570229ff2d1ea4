"""Selection rules: what the search loop asks at every node it descends through.

A rule is a callable ``rule(tree, node, depth) -> action``: ``node`` is a
``[B]`` long tensor (one node per tree, all at the same ``depth``; 0 is the
root) and the rule returns the ``[B]`` long action to follow. The loop
(:func:`torchrl_muzero.mcts.loop.run_search`) takes a *root rule* and an
*interior rule*, as mctx's ``search(root_action_selection_fn,
interior_action_selection_fn)`` does, so a variant is a pair of rules plus its
own root preparation and its own reading of the finished tree, never a copy of
the loop.

A rule that the C++ kernel also implements names itself in ``cpp_rule``
(with its constants in ``cpp_params``); the loop runs the C++ descent when
both rules have one the loaded kernel knows, and the torch descent otherwise.

Variant data that a rule reads (root Gumbel noise, the number of considered
actions) lives in ``tree.extra``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from torchrl_muzero.mcts.puct import puct_scores
from torchrl_muzero.mcts.tree import Tree

__all__ = ["SelectionRule", "PUCT"]


class SelectionRule(Protocol):
    """``rule(tree, node [B] long, depth: int) -> action [B] long``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.rules import SelectionRule
        >>> def most_prior(tree, node, depth):  # a rule is any such callable
        ...     rows = torch.arange(tree.batch_size)
        ...     return tree.children_prior[rows, node].argmax(-1)
        >>> tree = allocate_tree(1, 2, 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.children_prior[:, 0] = torch.tensor([0.1, 0.7, 0.2])
        >>> rule: SelectionRule = most_prior
        >>> rule(tree, torch.zeros(1, dtype=torch.long), 0)
        tensor([1])
    """

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class PUCT:
    """MuZero's pUCT rule (appendix B): ``argmax q_norm + prior * sqrt(N) / (1 + n) * c(N)``.

    Ties go to the lowest action index. Used at the root and inside the tree
    by MuZero and EfficientZero, at decision nodes by Stochastic MuZero.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.rules import PUCT
        >>> tree = allocate_tree(2, 4, 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.visit_count[:, 0] = 1
        >>> tree.children_prior[:, 0] = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
        >>> PUCT()(tree, torch.zeros(2, dtype=torch.long), 0)
        tensor([1, 0])
    """

    pb_c_base: float = 19652.0
    pb_c_init: float = 1.25
    cpp_rule = "puct"

    @property
    def cpp_params(self) -> tuple[float, float]:
        return (self.pb_c_base, self.pb_c_init)

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor:
        return puct_scores(tree, node, self.pb_c_base, self.pb_c_init).argmax(-1)
