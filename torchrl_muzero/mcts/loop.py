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

Slots and env actions. A node's edges are *slots* ``0..A-1``; the rules
select slots and the tree stores them (``action_from_parent``). For today's
discrete models a slot *is* the env action. A model whose nodes propose
their own actions (a fixed set of candidates per node, e.g. over a box
space) passes a ``slot_actions(parent_states, slots) -> actions`` map
(:class:`CandidateActions` reads them from the node state), and its step
receives the env actions of the chosen slots, never the slot ids. A step
that draws (sampling its node's candidates) declares it with
:func:`step_with_generator` and gets the search's generator as
``generator=``, as mctx's ``recurrent_fn`` gets an rng key.
"""
from __future__ import annotations

import math
from typing import Callable, Protocol

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.backup import expand_and_backup
from torchrl_muzero.mcts.rules import SelectionRule
from torchrl_muzero.mcts.select import descend
from torchrl_muzero.mcts.tree import Tree, allocate_tree, node_states
from torchrl_muzero.modules.policy_distribution import CategoricalPolicy
from torchrl_muzero.modules.step import ModelStep

__all__ = ["start_tree", "run_search", "cpp_rules_supported", "CandidateActions", "StepFn", "SlotActionsFn",
           "step_with_generator", "takes_generator", "slot_actions_of", "slot_candidates", "root_env_actions"]


class StepFn(Protocol):
    """``step(parent_states, actions) -> ModelStep``: what the loop calls once per simulation.

    A step whose attribute ``takes_generator`` is true (set by
    :func:`step_with_generator`) is called ``step(states, actions,
    generator=...)`` with the search's ``torch.Generator`` (or ``None``);
    every other step keeps the two-argument call.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.loop import StepFn, takes_generator
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> step: StepFn = model.search_step
        >>> step(model.search_root(torch.randn(3, 4)).state, torch.tensor([0, 1, 1])).policy_logits.shape
        torch.Size([3, 2])
        >>> takes_generator(step)
        False
    """

    def __call__(self, states, actions: torch.Tensor) -> ModelStep: ...


#: ``slot_actions(parent_states, slots [B]) -> env actions [B, ...]``: the actions of the chosen slots.
SlotActionsFn = Callable[[object, torch.Tensor], torch.Tensor]


def step_with_generator(step: Callable) -> Callable:
    """Mark ``step`` (a function or method) as taking ``generator=``: the loop then passes the search's.

    An explicit flag, read by :func:`takes_generator`, rather than a look at
    the signature: a wrapper that forwards ``**kwargs`` says so itself.

    Examples:
        >>> from torchrl_muzero.mcts.loop import step_with_generator, takes_generator
        >>> @step_with_generator
        ... def step(states, actions, generator=None): ...
        >>> takes_generator(step), takes_generator(lambda states, actions: None)
        (True, False)
    """
    step.takes_generator = True
    return step


def takes_generator(step: Callable) -> bool:
    """Whether the loop calls ``step`` with ``generator=`` (see :func:`step_with_generator`).

    Examples:
        >>> from torchrl_muzero.mcts.loop import takes_generator
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> takes_generator(MuZeroMLPModel((4,), 2).search_step)
        False
    """
    return bool(getattr(step, "takes_generator", False))  # a bound method reads its function's flag


class CandidateActions:
    """The slot map of nodes that carry their own candidate actions ``[S, ...]`` in their state.

    ``CandidateActions(key)(states, slots)`` is ``states[key][b, slots[b]]``:
    the env actions of the chosen slots. A model whose node states (a
    TensorDict) hold ``key`` exposes one as its ``slot_actions``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.mcts.loop import CandidateActions
        >>> states = TensorDict({"candidate_actions": torch.arange(12.).view(2, 3, 2)}, [2])
        >>> CandidateActions()(states, torch.tensor([2, 0])).tolist()
        [[4.0, 5.0], [6.0, 7.0]]
    """

    def __init__(self, key: NestedKey = "candidate_actions") -> None:
        self.key = key

    def __call__(self, states: TensorDictBase, slots: torch.Tensor) -> torch.Tensor:
        candidates = states.get(self.key)
        rows = torch.arange(slots.shape[0], device=slots.device)
        return candidates[rows, slots.long()]

    def __repr__(self) -> str:
        return f"CandidateActions({self.key!r})"


def slot_actions_of(model) -> SlotActionsFn | None:
    """The model's ``slot_actions`` map, or ``None`` when its slots are its actions (every discrete model).

    Examples:
        >>> from torchrl_muzero.mcts.loop import slot_actions_of
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> slot_actions_of(MuZeroMLPModel((4,), 2)) is None
        True
    """
    return getattr(model, "slot_actions", None)


def root_env_actions(model, tree: Tree, slots: torch.Tensor) -> torch.Tensor:
    """The env actions of the chosen root ``slots [B]`` of a finished search ``tree``: the slots themselves for
    a model whose slots are its actions, else its ``slot_actions`` of the roots' states (a sampled model's
    candidates). What any code that plays a search's ``action`` in an env must hand it.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import MCTSConfig, search
        >>> from torchrl_muzero.mcts.loop import root_env_actions
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> out = search(model, torch.randn(3, 4), MCTSConfig(num_simulations=4))
        >>> torch.equal(root_env_actions(model, out.tree, out.action), out.action)
        True
    """
    slot_actions = slot_actions_of(model)
    if slot_actions is None:
        return slots
    return slot_actions(tree.embeddings[:, 0], slots)


def slot_candidates(slot_actions: SlotActionsFn, states, num_slots: int) -> torch.Tensor:
    """Every slot's env action ``[B, S, ...]`` of nodes ``states [B]`` (a root's candidates, to store).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.mcts.loop import CandidateActions, slot_candidates
        >>> states = TensorDict({"candidate_actions": torch.rand(2, 3, 2)}, [2])
        >>> bool((slot_candidates(CandidateActions(), states, 3) == states["candidate_actions"]).all())
        True
    """
    B = states.shape[0]
    # each node repeated once per slot: one call of the map, whatever it reads
    repeated = states.unsqueeze(1).expand(B, num_slots, *states.shape[1:]).reshape(B * num_slots, *states.shape[1:])
    slots = torch.arange(num_slots, device=repeated.device).repeat(B)
    actions = slot_actions(repeated, slots)
    return actions.reshape(B, num_slots, *actions.shape[1:])


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
    tree.children_prior[:, 0] = CategoricalPolicy.from_logits(logits).prior()  # the softmax over the slots
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
    slot_actions: SlotActionsFn | None = None,
    generator: torch.Generator | None = None,
) -> Tree:
    """Run ``num_simulations`` simulations on ``tree`` in place and return it.

    Each simulation descends every tree with the rules, calls
    ``step(parent_states, actions) -> ModelStep`` once for the whole batch,
    stores the new node (its state, raw value, prior logits and softmax
    prior, the edge's reward and discount) and backs its value up.
    ``discount`` is the search's discount (the default of
    ``tree.children_discount``, which both backends read per edge); ``ops``
    the loaded kernel or ``None`` for the torch path.

    ``slot_actions(parent_states, slots) -> actions`` maps the selected slots
    to the actions ``step`` receives (``None``: the slots themselves, as
    every discrete model takes them). ``generator`` is handed to a step that
    :func:`takes_generator` (and to no other).

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
    step_kwargs = {"generator": generator} if takes_generator(step) else {}
    for sim in range(num_simulations):
        n = sim + 1
        if use_cpp:
            leaf_node, leaf_action = cpp_select()
        else:
            leaf_node, leaf_action = descend(tree, root_rule, interior_rule)
        # leaf_action is the edge's slot: the tree keeps it, the model gets the env action
        parent_states = tree.embeddings[rows, leaf_node]
        actions = leaf_action if slot_actions is None else slot_actions(parent_states, leaf_action)
        out = step(parent_states, actions, **step_kwargs)
        tree.embeddings[:, n] = out.state
        logits = out.policy_logits.float()
        tree.children_logits[:, n] = logits
        tree.raw_value[:, n] = out.value.float()
        prior = CategoricalPolicy.from_logits(logits).prior()
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
