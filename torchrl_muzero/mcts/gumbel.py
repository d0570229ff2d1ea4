"""Gumbel MuZero's search policy (Danihelka et al., "Policy improvement by planning with Gumbel", ICLR 2022).

A policy over the shared loop (:mod:`torchrl_muzero.mcts.loop`), as mctx's
``gumbel_muzero_policy`` composes ``search()``:

* the root draws Gumbel noise ``g`` once per search (no Dirichlet noise) and
  picks with Sequential Halving (:class:`GumbelRootRule`,
  :mod:`torchrl_muzero.mcts.seq_halving`) among ``m = min(max_num_considered_actions,
  #legal)`` actions: score ``g + logits + sigma(completedQ)`` over the actions
  whose visit count is the one Sequential Halving considers now;
* every other node picks deterministically (:class:`GumbelInteriorRule`):
  ``argmax softmax(logits + sigma(completedQ)) - N / (1 + sum N)``;
* the action is the Sequential Halving winner (the best ``g + logits +
  sigma(completedQ)`` among the most visited actions), the policy target the
  improved policy ``softmax(logits + sigma(completedQ))`` over the legal
  actions (:mod:`torchrl_muzero.mcts.qtransform` for ``sigma(completedQ)``).

The rules read the root noise and the per-root considered-visit sequence from
``tree.extra`` (``"gumbel" [B, A]``, ``"num_considered" [B]``,
``"considered_visits" [B, n]``). They name ``cpp_rule`` / ``cpp_params`` for
a C++ port; until the kernel knows them the loop runs the torch descent even
when ``ops`` is given.

float32 contract (for the C++ port; every quantity float32, ``A`` actions of
the node ``s``, ``N[a]`` its child visit counts as floats, ``q[a] =
children_reward[s, a] + children_discount[s, a] * (value_sum[c] /
max(N[a], 1))`` for the child ``c``, sums over ``a`` by torch's ``sum``)::

    # completed Q (qtransform.py), the same at the root and below it
    prior   = softmax(children_logits[s])                 # torch.softmax, -inf logits give 0
    p       = max(prior, FLT_MIN)                         # float32 smallest normal
    sum_n   = sum(N)
    sum_p   = sum(N > 0 ? p : 0)
    wq      = sum(N > 0 ? (p * q) / sum_p : 0)
    mixed   = (raw_value[s] + sum_n * wq) / (sum_n + 1)
    cq      = N > 0 ? q : mixed                          # every action, unselectable ones too
    cq      = (cq - min(cq)) / max(max(cq) - min(cq), 1e-8)          # if rescale_values
    sigma   = ((maxvisit_init + max(N)) * value_scale) * cq

    # root rule (GumbelRootRule, seq_halving.score_considered); i = sum(N) as an integer
    v       = considered_visits[b, i]
    z       = children_logits[0] - max(children_logits[0])
    score   = max(-1e9, (gumbel + z) + sigma)
    score   = (N == v && root_legal) ? score : -inf      ->  first argmax

    # interior rule (GumbelInteriorRule)
    pi      = softmax(children_logits[s] + sigma)
    score   = pi - N / (1 + sum(N))
    score   = children_logits[s] > -inf ? score : -inf  ->  first argmax

``cpp_params`` of both rules: ``(value_scale, maxvisit_init,
float(rescale_values))``; epsilon is 1e-8.

Fast path (CPU, C++ kernel, a model whose ``fused_kernel_spec()`` is not ``None``): the
simulations run in one fused C++ call and the result (visit counts, winner,
improved policy, root value) is read by one more (``gumbel_readout``,
``csrc/gumbel_readout.h``); the considered-visit table is built once per
``(m, n)`` (:func:`~torchrl_muzero.mcts.seq_halving.cached_considered_visit_table`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.loop import start_tree
from torchrl_muzero.mcts.puct import selectable
from torchrl_muzero.mcts.qtransform import sigma_and_visits
from torchrl_muzero.mcts.search import SearchResult, _root_ops, check_action_mask, run_engine, search_observations
from torchrl_muzero.mcts.seq_halving import cached_considered_visit_table, score_considered
from torchrl_muzero.mcts.tree import Tree
from torchrl_muzero.modules.step import ModelStep

__all__ = [
    "GumbelMCTSConfig",
    "GumbelRootRule",
    "GumbelInteriorRule",
    "sample_gumbel",
    "gumbel_muzero_search",
    "gumbel_result",
    "gumbel_search",
]


@dataclass
class GumbelMCTSConfig(MCTSConfig):
    """Settings of one Gumbel MuZero search: :class:`~torchrl_muzero.mcts.MCTSConfig` plus the Gumbel ones.

    Args:
        max_num_considered_actions: ``m``, the most root actions Sequential
            Halving considers (``min(m, #legal)`` per root); mctx's default 16.
        gumbel_scale: scale of the root Gumbel noise (0: no noise).
        value_scale / maxvisit_init: ``sigma(q) = (maxvisit_init + max_a N(a))
            * value_scale * q`` (mctx's 0.1 and 50).
        rescale_values: min-max rescale the completed Q-values to ``[0, 1]``
            over the node's actions before ``sigma``.

    ``temperature``, ``dirichlet_alpha`` / ``dirichlet_fraction`` and
    ``pb_c_*`` are not used by the Gumbel search (the action is the Sequential
    Halving winner; there is no Dirichlet noise; no pUCT);
    ``dirichlet_fraction`` defaults to 0 here to say so.

    Examples:
        >>> from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig
        >>> config = GumbelMCTSConfig(num_simulations=16, max_num_considered_actions=4)
        >>> config.max_num_considered_actions, config.gumbel_scale, config.value_scale
        (4, 1.0, 0.1)
        >>> GumbelMCTSConfig(max_num_considered_actions=0)
        Traceback (most recent call last):
        ...
        ValueError: GumbelMCTSConfig.max_num_considered_actions must be an integer >= 1, got 0.
    """

    dirichlet_fraction: float = 0.0
    max_num_considered_actions: int = 16
    gumbel_scale: float = 1.0
    value_scale: float = 0.1
    maxvisit_init: float = 50.0
    rescale_values: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        m = self.max_num_considered_actions
        integral = isinstance(m, int) or (isinstance(m, float) and m.is_integer())
        if isinstance(m, bool) or not integral or m < 1:
            raise ValueError(
                f"GumbelMCTSConfig.max_num_considered_actions must be an integer >= 1, got {m!r}."
            )
        self.max_num_considered_actions = int(m)
        for name, lo, strict in (("gumbel_scale", 0.0, False), ("value_scale", 0.0, True),
                                 ("maxvisit_init", 0.0, False)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value > lo if strict else value >= lo)
            if not ok:
                allowed = f"a finite number {'>' if strict else '>='} {lo:g}"
                raise ValueError(f"GumbelMCTSConfig.{name} must be {allowed}, got {value!r}.")
            setattr(self, name, float(value))
        if not isinstance(self.rescale_values, bool):
            raise ValueError(
                f"GumbelMCTSConfig.rescale_values must be True or False, got {self.rescale_values!r}."
            )


def sample_gumbel(shape: tuple[int, ...], generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Standard Gumbel(0, 1) variates ``-log(E)``, ``E ~ Exp(1)`` drawn from ``generator``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.gumbel import sample_gumbel
        >>> g = sample_gumbel((2, 3), torch.Generator().manual_seed(0))
        >>> g.shape, bool(torch.isfinite(g).all())
        (torch.Size([2, 3]), True)
    """
    e = torch.empty(shape, device=device).exponential_(1.0, generator=generator)
    return e.clamp_min_(torch.finfo(torch.float32).tiny).log_().neg_()  # -log(max(E, tiny)), in place


@dataclass(frozen=True)
class GumbelRootRule:
    """Sequential Halving with Gumbel at the root (mctx ``gumbel_muzero_root_action_selection``).

    With ``i = sum_a N(a)`` (the simulation index) and ``v =
    tree.extra["considered_visits"][b, i]``, it takes the argmax of
    :func:`~torchrl_muzero.mcts.seq_halving.score_considered` with
    ``g = tree.extra["gumbel"]``, the root's logits and
    :func:`~torchrl_muzero.mcts.qtransform.sigma_completed_q`; illegal
    actions are never taken; ties go to the lowest index.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.gumbel import GumbelRootRule
        >>> tree = allocate_tree(1, 3, 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.children_logits[0, 0] = torch.tensor([0.0, 2.0, 1.0])
        >>> tree.extra = {"gumbel": torch.zeros(1, 3), "considered_visits": torch.zeros(1, 3, dtype=torch.long)}
        >>> GumbelRootRule()(tree, torch.zeros(1, dtype=torch.long), 0)
        tensor([1])
    """

    value_scale: float = 0.1
    maxvisit_init: float = 50.0
    rescale_values: bool = True
    cpp_rule = "gumbel_root"

    @property
    def cpp_params(self) -> tuple[float, float, float]:
        return (self.value_scale, self.maxvisit_init, float(self.rescale_values))

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor:
        rows = torch.arange(tree.batch_size, device=node.device)
        sigma, visits = sigma_and_visits(tree, node, self.value_scale, self.maxvisit_init, self.rescale_values)
        sim = visits.sum(-1).long()
        table = tree.extra["considered_visits"]
        considered = table[rows, sim.clamp_max(table.shape[1] - 1)]
        score = score_considered(
            considered, tree.extra["gumbel"], tree.children_logits[rows, node], sigma,
            visits, selectable(tree, node),
        )
        return score.argmax(-1)


@dataclass(frozen=True)
class GumbelInteriorRule:
    """Full Gumbel MuZero's deterministic selection below the root (mctx ``gumbel_muzero_interior_action_selection``).

    float32 order, per action ``a`` of the node (``N`` the child visits)::

        pi  = softmax(logits + sigma(completedQ))
        s   = pi[a] - N[a] / (1 + sum_b N[b])
        s   = s if selectable[a] else -inf          # logit -inf (or illegal at a root)

    Ties go to the lowest index. Over repeated selections the visit
    frequencies track ``pi``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.gumbel import GumbelInteriorRule
        >>> tree = allocate_tree(1, 3, 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.children_logits[0, 0] = torch.tensor([0.0, 2.0, -float("inf")])
        >>> GumbelInteriorRule()(tree, torch.zeros(1, dtype=torch.long), 1)
        tensor([1])
    """

    value_scale: float = 0.1
    maxvisit_init: float = 50.0
    rescale_values: bool = True
    cpp_rule = "gumbel_interior"

    @property
    def cpp_params(self) -> tuple[float, float, float]:
        return (self.value_scale, self.maxvisit_init, float(self.rescale_values))

    def __call__(self, tree: Tree, node: torch.Tensor, depth: int) -> torch.Tensor:
        rows = torch.arange(tree.batch_size, device=node.device)
        sigma, visits = sigma_and_visits(tree, node, self.value_scale, self.maxvisit_init, self.rescale_values)
        pi = torch.softmax(tree.children_logits[rows, node] + sigma, -1)
        score = pi - visits / (1.0 + visits.sum(-1, keepdim=True))
        return score.masked_fill(~selectable(tree, node), -math.inf).argmax(-1)


def _num_considered(legal: torch.Tensor, max_num_considered: int) -> torch.Tensor:
    return legal.sum(-1).clamp_max(max_num_considered).long()


@torch.no_grad()
def gumbel_muzero_search(
    model,
    root: ModelStep,
    config: GumbelMCTSConfig,
    action_mask: torch.Tensor | None = None,
    two_player: bool = False,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
) -> SearchResult:
    """Gumbel MuZero's policy over the shared loop (mctx ``gumbel_muzero_policy``).

    ``root`` is the model's :meth:`search_root` output; ``model.search_step``
    expands the tree. ``add_noise=False`` (evaluation) sets ``g = 0``; so
    does ``config.gumbel_scale = 0``. ``config.temperature`` does not apply:
    the action is the Sequential Halving winner.

    Returns a :class:`~torchrl_muzero.mcts.search.SearchResult` whose
    ``search_policy`` is the improved policy ``softmax(logits +
    sigma(completedQ))`` over the legal actions (the policy target),
    ``action`` the winner, ``visit_counts`` the root visits and
    ``root_value`` the mean return of the simulations (as MuZero's).
    With the C++ kernel the rules run in C++ (``csrc/gumbel_rules.h``), for
    a one-hidden-layer ``MuZeroMLPModel`` fused with the network and the
    result read in C++ as well (:func:`gumbel_result` ``kernel=True``); the
    C++ rules use ``std::exp``, so a near-tie may resolve differently from
    the torch path in the last bit (test/test_cpp_rules.py).
    """
    if not isinstance(config, GumbelMCTSConfig):
        raise TypeError(f"gumbel_muzero_search needs a GumbelMCTSConfig, got {type(config).__name__}.")
    B, A = root.policy_logits.shape
    device = root.policy_logits.device
    legal = check_action_mask(action_mask, B, A, device)
    discount = -config.discount if two_player else config.discount
    n = config.num_simulations
    # the tree's arrays in one C++ call on a CPU tree, as MuZero's search makes them (the same
    # tensors: test_root_ops.py); small torch ops less per search (docs/performance_search.md,
    # "Design figures quoted from the code")
    tree = start_tree(root, n, legal, discount, _root_ops(config, device))

    if add_noise and config.gumbel_scale > 0:
        gumbel = sample_gumbel((B, A), generator, device)
        if config.gumbel_scale != 1.0:  # x * 1.0 == x: skip the op at mctx's default scale
            gumbel.mul_(config.gumbel_scale)
    else:
        gumbel = torch.zeros(B, A, device=device)
    max_m = min(config.max_num_considered_actions, A)
    num_considered = _num_considered(legal, max_m)
    table = cached_considered_visit_table(max_m, n, device)
    tree.extra.update(gumbel=gumbel, num_considered=num_considered, considered_visits=table[num_considered])

    rule_args = (config.value_scale, config.maxvisit_init, config.rescale_values)
    root_rule, interior_rule = GumbelRootRule(*rule_args), GumbelInteriorRule(*rule_args)
    # a fused search's tree is read in C++ too; the per-simulation loop's C++ rules give torch's bits, read in torch
    engine = run_engine(model, tree, config, root_rule, interior_rule, discount, generator=generator)
    result = gumbel_result(tree, config, kernel=engine == "cpp-fused")
    result.engine = engine
    return result


def gumbel_result(tree: Tree, config: GumbelMCTSConfig, kernel: bool = False) -> SearchResult:
    """Gumbel MuZero's reading of a finished tree: the halving winner and the improved policy.

    With ``kernel=True`` (and a CPU tree, a kernel that has ``gumbel_readout``)
    it is read in one C++ call (:func:`~torchrl_muzero.mcts._cpp.cpp_gumbel_readout`):
    the same visit counts, root value and, but for near-ties of a few ulps,
    action; the improved policy to float32 rounding (the kernel's ``std::exp``
    is not torch's).
    """
    if kernel and tree.visit_count.device.type == "cpu" and _cpp.has_gumbel_readout():
        params = (config.value_scale, config.maxvisit_init, float(config.rescale_values))
        visit_counts, improved, root_mean, action = _cpp.cpp_gumbel_readout(tree, params)
        return SearchResult(visit_counts, improved, root_mean, action, tree)
    root = torch.zeros(tree.batch_size, dtype=torch.long, device=tree.visit_count.device)
    sigma, _ = sigma_and_visits(tree, root, config.value_scale, config.maxvisit_init, config.rescale_values)
    visit_counts = tree.root_child_visits()
    logits = tree.children_logits[:, 0]
    legal = tree.root_legal
    most = visit_counts.max(-1).values
    score = score_considered(most, tree.extra["gumbel"], logits, sigma, visit_counts, legal)
    action = score.argmax(-1)
    improved = torch.softmax((logits + sigma).masked_fill(~legal, -math.inf), -1)
    root_mean = tree.value_sum[:, 0] / tree.visit_count[:, 0].clamp_min(1).float()
    return SearchResult(visit_counts, improved, root_mean, action, tree)


@torch.no_grad()
def gumbel_search(
    model,
    observation: torch.Tensor,
    config: GumbelMCTSConfig,
    action_mask: torch.Tensor | None = None,
    to_play: torch.Tensor | None = None,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
) -> SearchResult:
    """Run one Gumbel MuZero search for each of the ``B`` observations (:func:`~torchrl_muzero.mcts.search`'s signature).

    Args:
        model: a :class:`~torchrl_muzero.modules.MuZeroModel`.
        observation: ``[B, *observation_shape]`` (moved to the model's device).
        config: :class:`GumbelMCTSConfig`.
        action_mask: optional ``[B, A]`` bool, legal actions at the root.
        to_play: optional ``[B]`` player ids; when given the game is
            two-player zero-sum (the tree's discount is negated).
        add_noise: draw the root Gumbel noise (``False``: ``g = 0``, a
            deterministic search, for evaluation).
        generator: source of the Gumbel noise.

    ``config.temperature`` does not apply: ``action`` is the Sequential
    Halving winner and ``search_policy`` the improved policy.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_search
        >>> model = MuZeroMLPModel((4,), 3, latent_dim=16, hidden_dim=16)
        >>> config = GumbelMCTSConfig(num_simulations=8, max_num_considered_actions=2)
        >>> out = gumbel_search(model, torch.randn(2, 4), config, generator=torch.Generator().manual_seed(0))
        >>> out.visit_counts.sum(-1), (out.visit_counts > 0).sum(-1)
        (tensor([8, 8]), tensor([2, 2]))
        >>> torch.allclose(out.search_policy.sum(-1), torch.ones(2))
        True
    """
    return search_observations(gumbel_muzero_search, "gumbel_search", model, observation, config, action_mask,
                               to_play, add_noise, generator)
