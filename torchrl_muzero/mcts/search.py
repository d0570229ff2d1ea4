"""MuZero's search policy, over the shared loop (:mod:`torchrl_muzero.mcts.loop`).

One call searches ``B`` roots at once. Each simulation selects one leaf in
every tree with pUCT, calls the model's search step once for the whole batch,
expands and backs up in place. The tree bookkeeping runs either in the C++
kernel (CPU) or in batched torch ops (any device); both give the same visit
counts. With the C++ kernel, a model whose ``fused_kernel_spec()`` names one
of the kernel's fused entries is searched in a single C++ call, network
included (:func:`_run_fused`): a ``MuZeroMLPModel`` or ``EfficientZeroMLPModel``
with one hidden layer, a ``UniZeroModel`` (the transformer step in C++, KV
cache or recompute). The search checks the tree's node state against the
spec's declaration and knows no variant's keys.

``MCTSConfig.backend`` is the one switch: with ``"torch"`` nothing of a search
runs in the kernel, the root included (:func:`backend_scope`), and every
:class:`SearchResult` says which engine ran its simulations (``engine``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.loop import SlotActionsFn, cpp_rules_supported, run_search, slot_actions_of, start_tree
from torchrl_muzero.mcts.noise import sample_dirichlet
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.tree import Tree
from torchrl_muzero.modules.fused_spec import FusedSpec, fused_spec_of
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.unizero.fused import use_kernel

__all__ = ["ENGINES", "FUSED_ENTRIES", "SLOT_FUSED_ENTRIES", "SearchResult", "backend_scope", "check_action_mask", "muzero_search",
           "run_engine", "run_rules", "search", "search_from_root", "search_observations",
           "select_action", "visit_result"]

#: The values of :attr:`SearchResult.engine`: every simulation in one C++ call, network included;
#: the tree bookkeeping in C++ with the model called from Python each simulation; all in torch ops.
ENGINES = ("cpp-fused", "cpp", "torch")


@dataclass
class SearchResult:
    """What a search returns, per root.

    Attributes:
        visit_counts: ``[B, A]`` visits of the root's children.
        search_policy: ``[B, A]`` normalised visit counts (the policy target).
        root_value: ``[B]`` mean return of the root over the simulations,
            from the point of view of the player to move at the root.
        action: ``[B]`` long, drawn from the visits with the configured
            temperature (argmax at temperature 0).
        tree: the search tree, for inspection.
        engine: what ran the simulations (:data:`ENGINES`): ``"cpp-fused"``
            (all of them in one C++ call, network included), ``"cpp"`` (the
            tree bookkeeping in C++, the model's step from Python) or
            ``"torch"`` (batched torch ops; with ``backend="torch"`` nothing of
            the search, root included, ran in the kernel). ``"unknown"`` for a
            result built by other code.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.mcts import MCTSConfig, search
        >>> result = search(MuZeroMLPModel((4,), 3), torch.randn(2, 4), MCTSConfig(num_simulations=6))
        >>> result.visit_counts.sum(-1), result.tree.num_nodes
        (tensor([6, 6]), 7)
        >>> search(MuZeroMLPModel((4,), 3), torch.randn(2, 4), MCTSConfig(num_simulations=6, backend="torch")).engine
        'torch'
    """

    visit_counts: torch.Tensor
    search_policy: torch.Tensor
    root_value: torch.Tensor
    action: torch.Tensor
    tree: Tree
    engine: str = "unknown"


def select_action(
    visit_counts: torch.Tensor, temperature: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw actions ``[B]`` from ``visit_counts ** (1 / temperature)``; argmax at 0."""
    if temperature == 0:
        return visit_counts.argmax(-1)
    logits = torch.log(visit_counts.float())  # -inf for unvisited actions
    if temperature != 1:  # x / 1 is x: one op fewer at the default temperature
        logits = logits / temperature
    probs = torch.softmax(logits, -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


_NO_SCOPE = contextlib.nullcontext()


def backend_scope(config) -> contextlib.AbstractContextManager:
    """The context to build a search's root in, so that ``config.backend`` decides for the root too.

    ``backend="torch"``: :func:`~torchrl_muzero.modules.unizero.fused.use_kernel`
    ``(False)``, which keeps a UniZero root's window forward out of the C++
    kernel (the model's only kernel call outside the simulations). Otherwise
    a no-op context: the root takes the kernel where it can, as before.
    :func:`search_observations`, :class:`~torchrl_muzero.mcts.MCTSPolicy` and
    the reanalyze searches enter it; code that builds a root itself and hands
    it to ``muzero_search`` should too.

    Examples:
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.search import backend_scope
        >>> from torchrl_muzero.modules.unizero.fused import kernel_enabled
        >>> with backend_scope(MCTSConfig(backend="torch")):
        ...     kernel_enabled()
        False
        >>> with backend_scope(MCTSConfig(backend="auto")):
        ...     kernel_enabled()
        True
    """
    return use_kernel(False) if getattr(config, "backend", "auto") == "torch" else _NO_SCOPE


def _resolve_backend(config: MCTSConfig, device: torch.device):
    if config.backend == "torch":
        return None
    ops = _cpp.load_tree_ops() if device.type == "cpu" else None
    if config.backend == "cpp" and ops is None:
        raise RuntimeError(
            "MCTSConfig(backend='cpp') needs the C++ tree kernel on a CPU tree: "
            f"{_cpp.tree_ops_unavailable_reason() or f'the tree is on {device}'}. "
            "Use backend='auto' or 'torch'."
        )
    return ops


def _run_mlp(tree: Tree, spec: FusedSpec, config: MCTSConfig, root_rule, interior_rule, discount: float,
             generator: torch.Generator | None = None) -> None:
    _cpp.cpp_mlp_search(tree, spec.tensors, *spec.floats, root_rule, interior_rule, config.kernel_precision)


def _run_ez(tree: Tree, spec: FusedSpec, config: MCTSConfig, root_rule, interior_rule, discount: float,
            generator: torch.Generator | None = None) -> None:
    _cpp.cpp_ez_search(tree, (spec.tensors, *spec.floats, *spec.ints), root_rule, interior_rule,
                       config.kernel_precision)


def _run_unizero(tree: Tree, spec: FusedSpec, config: MCTSConfig, root_rule, interior_rule, discount: float,
                 generator: torch.Generator | None = None) -> None:
    _cpp.cpp_unizero_search(tree, (spec.tensors, spec.ints, spec.floats), root_rule, interior_rule,
                            config.kernel_precision)


def _run_sampled(tree: Tree, spec: FusedSpec, config: MCTSConfig, root_rule, interior_rule, discount: float,
                 generator: torch.Generator | None = None) -> None:
    _cpp.cpp_sampled_search(tree, spec, root_rule, interior_rule, generator, config.kernel_precision)


#: The fused entries :func:`run_engine` runs: ``FusedSpec.kernel`` -> (the loaded kernel's function, the
#: ``_cpp`` call), for models whose slots are their actions. (``"stochastic"`` is Stochastic MuZero's
#: search's own: its interior rule and edge discounts are not these searches'.)
FUSED_ENTRIES = {"mlp": ("mlp_search", _run_mlp), "ez": ("ez_search", _run_ez),
                 "unizero": ("unizero_search", _run_unizero)}
#: The fused entries for a model whose nodes carry their own candidates (its ``slot_actions``): the
#: sampled search over a box, which draws every new node's candidates in the kernel.
SLOT_FUSED_ENTRIES = {"sampled_ez": ("sampled_ez_search", _run_sampled),
                      "sampled_mlp": ("sampled_mlp_search", _run_sampled)}


def _run_fused(model, ops, tree: Tree, config: MCTSConfig, root_rule, interior_rule, discount: float,
               entries: dict, generator: torch.Generator | None = None) -> bool:
    """Run every simulation in one C++ call (select, network, expand, backup) if the model's
    :class:`~torchrl_muzero.modules.fused_spec.FusedSpec` allows it here; answer whether it ran.

    It runs when there is a kernel (``ops``: backend "auto" or "cpp" on a CPU
    tree, rules supported: the caller checks), the model's
    ``fused_kernel_spec()`` names one of this search's ``entries``
    (:data:`FUSED_ENTRIES`), the loaded kernel has that entry, and the tree's
    node state is the one the spec declares (:meth:`FusedSpec.matches`);
    otherwise nothing runs and the caller takes the per-simulation loop. The
    per-simulation model call costs ~25-30 aten dispatches for the MLP
    models (a UniZero step's cost at B = 1: docs/performance_search.md,
    "Design figures quoted from the code"), which dominate small-batch
    searches. The fused network rounds differently from BLAS in the last
    bits, so near-tied choices can differ from the torch path
    (test/test_fused_search.py). ``generator`` is the search's: an entry that
    draws (the sampled search's candidates) draws from it.
    """
    if ops is None:
        return False
    spec = fused_spec_of(model)
    if spec is None:
        return False
    entry = entries.get(spec.kernel)
    if entry is None or getattr(ops, entry[0], None) is None or not spec.matches(tree.embeddings):
        return False
    entry[1](tree, spec, config, root_rule, interior_rule, discount, generator)
    return True


def check_action_mask(action_mask: torch.Tensor | None, B: int, A: int, device) -> torch.Tensor:
    """``[B, A]`` bool legal actions (all legal for ``None``); one clear error for a bad mask."""
    if action_mask is None:
        return torch.ones(B, A, dtype=torch.bool, device=device)
    legal = action_mask.to(device=device, dtype=torch.bool)
    if legal.shape != (B, A):
        raise ValueError(f"action_mask must have shape [{B}, {A}], got {tuple(legal.shape)}.")
    if not bool(legal.any(-1).all()):
        raise ValueError("action_mask has a row with no legal action.")
    return legal


def visit_result(tree: Tree, temperature: float, generator: torch.Generator | None) -> SearchResult:
    """MuZero's reading of a finished tree: the visit distribution and an action drawn from it."""
    visit_counts = tree.root_child_visits()
    counts = visit_counts.float()  # whole numbers, so its float sum is the integer sum exactly
    search_policy = counts / counts.sum(-1, keepdim=True).clamp_min(1)
    root_mean = tree.value_sum[:, 0] / tree.visit_count[:, 0].clamp_min(1).float()
    action = select_action(visit_counts, temperature, generator)
    return SearchResult(visit_counts, search_policy, root_mean, action, tree)


@torch.no_grad()
def search_from_root(
    model,
    root_latent: torch.Tensor,
    root_policy_logits: torch.Tensor,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    two_player: bool = False,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
    root_value: torch.Tensor | None = None,
) -> SearchResult:
    """MuZero search from already-computed root outputs (``model.initial_inference``'s latent and logits).

    The root's own value estimate is not needed: the root is not backed up
    with it (MuZero pseudocode), and its reported value is the mean return of
    the simulations (``root_value`` only fills ``tree.raw_value[:, 0]``).
    """
    B, A = root_policy_logits.shape
    value = root_value if root_value is not None else torch.zeros(B, device=root_latent.device)
    root = ModelStep(root_latent, torch.zeros_like(value), root_policy_logits, value)
    return muzero_search(model, root, config, action_mask, two_player, add_noise, generator)


def run_rules(model, tree: Tree, config: MCTSConfig, root_rule, interior_rule, discount: float) -> bool:
    """:func:`run_engine`, answering whether a fused search ran (``"cpp-fused"``)."""
    return run_engine(model, tree, config, root_rule, interior_rule, discount) == "cpp-fused"


def run_engine(model, tree: Tree, config: MCTSConfig, root_rule, interior_rule, discount: float,
               slot_actions: SlotActionsFn | None = None, generator: torch.Generator | None = None) -> str:
    """Run a prepared tree's simulations on the fastest path for ``config.backend`` and the model.

    The fused C++ search (network included) when the kernel knows both rules
    and the model's ``fused_kernel_spec()`` is one of :data:`FUSED_ENTRIES`
    (``"mlp"``: MuZero, ``"ez"``: EfficientZero, ``"unizero"``: UniZero) for
    this tree (:func:`_run_fused`), else the shared loop
    (:func:`~torchrl_muzero.mcts.loop.run_search`) with the C++ or torch
    bookkeeping. Every variant policy ends its preparation here. Returns the
    engine that ran (:data:`ENGINES`): a fused search's results differ from
    the torch model's in the last bits, so a policy may read such a tree in
    C++ too, as Gumbel's does.

    ``slot_actions`` maps the tree's slots to the actions the model's step
    takes (default: the model's own ``slot_actions``, none for a discrete
    model: slots are actions). A model with its own map may still be fused
    when its spec is one of :data:`SLOT_FUSED_ENTRIES` (the sampled search
    over a box); a map given here always takes the loop. ``generator``
    reaches a step that asks for it
    (:func:`~torchrl_muzero.mcts.loop.step_with_generator`), and a fused
    entry that draws.
    """
    ops = _resolve_backend(config, tree.visit_count.device)
    cpp_rules = cpp_rules_supported(ops, root_rule, interior_rule)
    own_map = slot_actions is None
    if slot_actions is None:
        slot_actions = slot_actions_of(model)
    entries = FUSED_ENTRIES if slot_actions is None else SLOT_FUSED_ENTRIES
    if own_map and cpp_rules and _run_fused(model, ops, tree, config, root_rule, interior_rule, discount,
                                            entries, generator):
        return "cpp-fused"
    # the loop descends in C++ exactly when the kernel knows both rules (loop.run_search)
    run_search(tree, step_of(model), config.num_simulations, root_rule, interior_rule, discount, ops,
               slot_actions=slot_actions, generator=generator)
    return "cpp" if cpp_rules else "torch"


def step_of(model):
    """``model.search_step``; for a duck-typed model without it (only ``recurrent_inference_scalar``,
    as before the search took a :class:`~torchrl_muzero.modules.ModelStep`), a wrapper of that."""
    step = getattr(model, "search_step", None)
    if step is not None:
        return step

    def legacy_step(state, action):
        next_latent, reward, policy_logits, value = model.recurrent_inference_scalar(state, action)
        return ModelStep(next_latent, reward, policy_logits, value)

    return legacy_step


def root_of(model, observation: torch.Tensor) -> ModelStep:
    """``model.search_root(observation)``; for a duck-typed model, ``initial_inference``'s latent and
    logits (its value output is not decoded: MuZero's search does not read the root's raw value)."""
    root = getattr(model, "search_root", None)
    if root is not None:
        return root(observation)
    latent, policy_logits, _ = model.initial_inference(observation)
    zeros = torch.zeros(policy_logits.shape[0], device=policy_logits.device)
    return ModelStep(latent, zeros, policy_logits, zeros)


def muzero_search(
    model,
    root: ModelStep,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    two_player: bool = False,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
) -> SearchResult:
    """MuZero's policy over the shared loop: Dirichlet-noised root priors, pUCT everywhere, visit counts.

    ``root`` is the model's :meth:`search_root` output; ``model.search_step``
    expands the tree (with the model's ``slot_actions``, if it has one, mapping
    slots to its actions, and ``generator`` if the step asks for it:
    :func:`run_engine`); ``action`` is the chosen root *slot*. EfficientZero
    runs this same policy with its own model step (the value-prefix LSTM
    lives in the node state).
    """
    B, A = root.policy_logits.shape
    device = root.policy_logits.device
    legal = check_action_mask(action_mask, B, A, device)
    discount = -config.discount if two_player else config.discount
    # The tree, the noise and the readout in one C++ call each on a CPU tree (as small torch ops
    # they cost as much at B = 1 as ten cached UniZero simulations: docs/performance_search.md,
    # "Design figures quoted from the code"); the same ATen draws and ops, so the same bits.
    ops = _root_ops(config, device)
    tree = start_tree(root, config.num_simulations, legal, discount, ops)
    if add_noise and config.dirichlet_fraction > 0:
        if ops is not None:
            ops.mix_dirichlet_noise(tree.children_prior, legal, config.dirichlet_alpha, config.dirichlet_fraction,
                                    generator)
        else:
            noise = sample_dirichlet(config.dirichlet_alpha, legal, generator)
            # (1 - f) * prior + f * noise, written in place (the same float32 products and sum)
            tree.children_prior[:, 0].mul_(1 - config.dirichlet_fraction).add_(noise.mul_(config.dirichlet_fraction))

    rule = PUCT(config.pb_c_base, config.pb_c_init)
    engine = run_engine(model, tree, config, rule, rule, discount, generator=generator)
    if ops is not None:
        counts, policy, value, action = ops.visit_readout(tree.visit_count, tree.value_sum, tree.children_index,
                                                          float(config.temperature), generator)
        return SearchResult(counts, policy, value, action, tree, engine)
    result = visit_result(tree, config.temperature, generator)
    result.engine = engine
    return result


def _root_ops(config: MCTSConfig, device: torch.device):
    """The kernel when it runs the root noise and the readout for this search (``root_ops.cpp``), else ``None``."""
    ops = _resolve_backend(config, device)
    return ops if ops is not None and hasattr(ops, "visit_readout") else None


@torch.no_grad()
def search(
    model,
    observation: torch.Tensor,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    to_play: torch.Tensor | None = None,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
    root: ModelStep | None = None,
) -> SearchResult:
    """Run one MuZero search for each of the ``B`` observations.

    Args:
        model: a :class:`~torchrl_muzero.modules.MuZeroModel`.
        observation: ``[B, *observation_shape]``, on any device (moved to the model's).
        config: the search settings.
        action_mask: optional ``[B, A]`` bool, legal actions at the root.
        to_play: optional ``[B]`` player ids; when given the game is treated
            as two-player zero-sum with alternating turns (values flip sign
            at each ply, rewards are the mover's).
        add_noise: mix Dirichlet noise into the root priors.
        generator: source of randomness (noise and action draws).
        root: the root to search from instead of ``model.search_root(observation)``
            (a policy acting from memory, :mod:`torchrl_muzero.mcts.acting_memory`).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.mcts import MCTSConfig, search
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16)
        >>> out = search(model, torch.randn(3, 4), MCTSConfig(num_simulations=8))
        >>> out.visit_counts.sum(-1)
        tensor([8, 8, 8])
        >>> out.search_policy.shape, out.root_value.shape
        (torch.Size([3, 2]), torch.Size([3]))
    """
    return search_observations(muzero_search, "search", model, observation, config, action_mask, to_play,
                               add_noise, generator, root=root)


def search_observations(policy, name: str, model, observation, config, action_mask, to_play, add_noise,
                        generator, root: ModelStep | None = None) -> SearchResult:
    """What every ``*_search(model, observation, ...)`` shares: check the batch, root inference, the policy.

    ``policy(model, root, config, action_mask=, two_player=, add_noise=, generator=)``
    is the variant's search from a :class:`~torchrl_muzero.modules.ModelStep` root
    (:func:`muzero_search`, ``gumbel_muzero_search``, ...); ``name`` is the public
    function named in the shape error. A given ``root`` (on the model's device)
    replaces the root inference.
    """
    model.check_observation(observation)
    if observation.ndim != len(model.observation_shape) + 1:
        raise ValueError(
            f"{name} expects observations of shape [B, {', '.join(map(str, model.observation_shape))}], "
            f"got {tuple(observation.shape)}."
        )
    device = next(model.parameters()).device
    with backend_scope(config):  # backend="torch": the root stays out of the kernel too
        if root is None:
            root = root_of(model, observation.to(device))
        return policy(
            model,
            root,
            config,
            action_mask=None if action_mask is None else action_mask.to(device),
            two_player=to_play is not None,
            add_noise=add_noise,
            generator=generator,
        )
