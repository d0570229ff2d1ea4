"""Stochastic MuZero's search policy over the shared loop (:mod:`torchrl_muzero.mcts.loop`).

Decision nodes (states) and chance nodes (afterstates) alternate in one tree
whose nodes all have ``A + C`` edge slots: ``0..A-1`` are actions (used at
decision nodes), ``A..A+C-1`` chance codes (used at chance nodes); the model
marks the other kind's slots with ``-inf`` logits, which no rule selects
(:func:`~torchrl_muzero.mcts.puct.selectable`). The node type is the
``"is_chance"`` entry of the node state
(:class:`~torchrl_muzero.modules.StochasticMuZeroModel`).

* Root: a decision node; Dirichlet noise on its ``A`` legal slots, pUCT.
* Interior decision nodes: pUCT (the tree-wide min-max statistics see every
  edge, the ``q = 0 + 1 * value(chance node)`` of decision-to-chance edges
  included).
* Chance nodes: :class:`ChanceRule`, the deterministic
  ``argmax_c sigma(c) / (N(c) + 1)`` of mctx's ``stochastic_muzero_policy``
  and of the paper's footnote 1 (its pseudocode samples ``c ~ sigma``, as
  LightZero does with an unseeded generator).
* Edge discounts (the model step's): 1 into a chance node, ``config.discount``
  into a decision node, so one environment step is discounted once (mctx; the
  paper's pseudocode backs up with the discount on every edge, twice a step).
* Result: visit counts, policy target and action over the first ``A``
  slots only.

Backends: the tree bookkeeping runs in the C++ kernel when ``config.backend``
allows it, the tree is on the CPU and the loaded kernel lists both rules'
``cpp_rule`` names (pUCT at the root, ``"stochastic"`` inside); otherwise in
batched torch ops (any device). With the kernel, a
``StochasticMuZeroMLPModel`` with one hidden layer per network is searched
in a single C++ call, network included (its ``fused_kernel_spec()`` is
``"stochastic"``, ``csrc/stochastic_search.cpp``); other models are called
once per simulation.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.loop import cpp_rules_supported, run_search, start_tree
from torchrl_muzero.mcts.noise import sample_dirichlet
from torchrl_muzero.mcts.puct import selectable
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.search import (SearchResult, _resolve_backend, _run_fused, check_action_mask,
                                        search_observations, select_action)
from torchrl_muzero.mcts.tree import Tree
from torchrl_muzero.modules.fused_spec import FusedSpec
from torchrl_muzero.modules.step import ModelStep

__all__ = ["ChanceRule", "StochasticRule", "stochastic_muzero_search", "stochastic_search"]


@dataclass(frozen=True)
class ChanceRule:
    """Chance-node selection: ``argmax_c sigma(c) / (N(c) + 1)`` over the chance slots.

    ``sigma`` is the node's stored prior (``tree.children_prior``, the softmax
    of its logits; no noise is mixed in below the root), ``N(c)`` the visit
    count of the child on slot ``c`` (0 while unexpanded). Deterministic;
    ties go to the lowest slot. The first ``num_actions`` slots (decision
    slots) and slots with ``-inf`` logits are never picked.

    Float expression order (float32, for a C++ port): ``score_c =
    prior_c / (1.0f + (float)N_c)``, then the first index of the maximum over
    the selectable chance slots.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.stochastic import ChanceRule
        >>> tree = allocate_tree(1, 4, 1 + 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.children_logits[0, 0] = torch.tensor([0.0, 0.5, 0.25, 0.25]).log()
        >>> tree.children_prior[0, 0] = torch.softmax(tree.children_logits[0, 0], -1)
        >>> rule, node = ChanceRule(num_actions=1), torch.zeros(1, dtype=torch.long)
        >>> picks = []
        >>> for n in range(1, 5):   # expand the picked slot as node n and visit it once
        ...     slot = int(rule(tree, node, 1))
        ...     picks.append(slot)
        ...     if tree.children_index[0, 0, slot] < 0:
        ...         tree.children_index[0, 0, slot] = n
        ...     tree.visit_count[0, tree.children_index[0, 0, slot]] += 1
        >>> picks   # codes 0, 0, 1, 2: visits [2, 1, 1]
        [1, 1, 2, 3]
    """

    num_actions: int
    cpp_rule = "chance"

    @property
    def cpp_params(self) -> tuple[float]:
        return (float(self.num_actions),)

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor:
        rows = torch.arange(tree.batch_size, device=node.device)
        child = tree.children_index[rows, node].long()
        visits = torch.where(child >= 0, tree.visit_count.gather(1, child.clamp_min(0)), 0).float()
        score = tree.children_prior[rows, node] / (1.0 + visits)
        ok = selectable(tree, node)
        ok[:, : self.num_actions] = False
        return score.masked_fill(~ok, -math.inf).argmax(-1)


@dataclass(frozen=True)
class StochasticRule:
    """The interior rule: ``where(node is a chance node, chance rule, decision rule)``.

    Reads the node type from ``tree.embeddings[state_key]`` (``[B, N]``
    bool). Both rules are evaluated on the whole batch and one is kept per
    row.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.rules import PUCT
        >>> from torchrl_muzero.mcts.stochastic import ChanceRule, StochasticRule
        >>> rule = StochasticRule(PUCT(), ChanceRule(num_actions=2))
        >>> rule.cpp_rule, rule.cpp_params
        ('stochastic', ((19652.0, 1.25), (2.0,)))
    """

    decision: PUCT
    chance: ChanceRule
    state_key: str = "is_chance"
    cpp_rule = "stochastic"

    @property
    def cpp_params(self) -> tuple:
        return (self.decision.cpp_params, self.chance.cpp_params)

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor:
        rows = torch.arange(tree.batch_size, device=node.device)
        is_chance = tree.embeddings.get(self.state_key)[rows, node]
        return torch.where(is_chance, self.chance(tree, node, depth), self.decision(tree, node, depth))


def _run_stochastic(tree: Tree, spec: FusedSpec, config: MCTSConfig, root_rule, interior_rule,
                    discount: float, generator: torch.Generator | None = None) -> None:
    _cpp.cpp_stochastic_search(tree, spec.tensors, *spec.floats, discount, root_rule, interior_rule,
                               config.kernel_precision)


#: Stochastic MuZero's fused entry (``search._run_fused``'s ``entries``): ``StochasticMuZeroMLPModel`` with one
#: hidden layer per network, float32, on the ``{"latent", "is_chance"}`` node state its spec declares.
_FUSED_ENTRIES = {"stochastic": ("stochastic_search", _run_stochastic)}


def stochastic_muzero_search(
    model,
    root: ModelStep,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    two_player: bool = False,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
) -> SearchResult:
    """Stochastic MuZero's policy over the shared loop, from a root :class:`ModelStep`.

    ``root`` is ``model.search_root(observation)`` (logits ``[B, A + C]``,
    ``-inf`` on the chance slots); ``model.search_step(state, slot,
    discount=config.discount)`` expands the tree, or, with the C++ kernel
    and a model whose ``fused_kernel_spec()`` is ``"stochastic"``, the fused
    C++ search runs the same step in its own loops (all simulations in one
    call; a few float ulps from the torch model). ``action_mask [B, A]``
    masks the root's actions. The result's ``visit_counts``,
    ``search_policy`` and ``action`` cover the ``A`` actions; ``tree`` keeps
    all ``A + C`` slots.

    Raises:
        ValueError: for ``two_player`` (not supported: the chance player's
            turn makes the sign convention of the alternating-value search
            ambiguous), for ``config.backend == "cpp"`` when the loaded kernel
            lacks the rules, or root logits that are not ``[B, A + C]``.
        RuntimeError: ``backend == "cpp"`` without a C++ kernel for this tree.
    """
    if two_player:
        raise ValueError(
            "stochastic_muzero_search does not support two-player games (to_play / two_player): "
            "Stochastic MuZero's search here is single-agent."
        )
    A = int(model.num_actions)
    B, slots = root.policy_logits.shape
    C = slots - A
    expected = getattr(model, "chance_space_size", None)
    if C < 1 or (expected is not None and C != expected):
        raise ValueError(
            f"stochastic_muzero_search expects root logits of shape [B, A + C] = [{B}, {A} + "
            f"{expected if expected is not None else 'C'}] (model.search_root pads the chance slots), "
            f"got {tuple(root.policy_logits.shape)}."
        )
    device = root.policy_logits.device
    legal = check_action_mask(action_mask, B, A, device)
    no_chance = torch.zeros(B, C, dtype=torch.bool, device=device)
    tree = start_tree(root, config.num_simulations, torch.cat([legal, no_chance], -1), config.discount)
    if add_noise and config.dirichlet_fraction > 0:
        noise = sample_dirichlet(config.dirichlet_alpha, legal, generator)  # same draws as MuZero's
        noise = torch.cat([noise, torch.zeros(B, C, device=device)], -1)
        tree.children_prior[:, 0] = (
            (1 - config.dirichlet_fraction) * tree.children_prior[:, 0] + config.dirichlet_fraction * noise
        )
    decision = PUCT(config.pb_c_base, config.pb_c_init)
    interior = StochasticRule(decision, ChanceRule(A))
    ops = _resolve_backend(config, device)
    if ops is not None and not cpp_rules_supported(ops, decision, interior):
        if config.backend == "cpp":
            raise ValueError(
                "MCTSConfig(backend='cpp'): the loaded C++ kernel does not run Stochastic MuZero's rules "
                f"({decision.cpp_rule!r} at the root, {interior.cpp_rule!r} inside); use backend='auto' or 'torch'."
            )
        ops = None
    # every simulation in one C++ call (select, network, expand, backup) when the model's spec is "stochastic"
    if _run_fused(model, ops, tree, config, decision, interior, config.discount, _FUSED_ENTRIES):
        engine = "cpp-fused"
    else:
        step = functools.partial(model.search_step, discount=config.discount)
        run_search(tree, step, config.num_simulations, decision, interior, config.discount, ops)
        engine = "torch" if ops is None else "cpp"  # ops is None unless the kernel runs both rules (above)

    visit_counts = tree.root_child_visits()[:, :A]
    search_policy = visit_counts.float() / visit_counts.sum(-1, keepdim=True).clamp_min(1)
    root_value = tree.value_sum[:, 0] / tree.visit_count[:, 0].clamp_min(1).float()
    action = select_action(visit_counts, config.temperature, generator)
    return SearchResult(visit_counts, search_policy, root_value, action, tree, engine)


@torch.no_grad()
def stochastic_search(
    model,
    observation: torch.Tensor,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    to_play: torch.Tensor | None = None,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
) -> SearchResult:
    """Run one Stochastic MuZero search for each of the ``B`` observations (``mcts.search``'s signature).

    Args:
        model: a :class:`~torchrl_muzero.modules.StochasticMuZeroModel`.
        observation: ``[B, *observation_shape]``, moved to the model's device.
        config: the search settings (``config.discount`` is the discount of
            the chance-to-decision edges; decision-to-chance edges use 1).
        action_mask: optional ``[B, A]`` bool, legal actions at the root.
        to_play: must be ``None`` (two-player games are not supported).
        add_noise: mix Dirichlet noise into the root priors.
        generator: source of randomness (noise and action draws).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.stochastic import stochastic_search
        >>> model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
        >>> out = stochastic_search(model, torch.randn(3, 4), MCTSConfig(num_simulations=10))
        >>> out.visit_counts.shape, out.visit_counts.sum(-1)
        (torch.Size([3, 2]), tensor([10, 10, 10]))
        >>> out.tree.num_actions, bool(out.tree.embeddings["is_chance"][:, 0].any())
        (5, False)
    """
    if to_play is not None:
        raise ValueError(
            "stochastic_search does not support two-player games: got to_play; "
            "Stochastic MuZero's search here is single-agent."
        )
    return search_observations(stochastic_muzero_search, "stochastic_search", model, observation, config,
                               action_mask, None, add_noise, generator)
