"""Thin wrappers for the optional C++ tree kernel (``torchrl_muzero._C``), loaded by :mod:`torchrl_muzero.kernel`.

The kernel (``torchrl_muzero/csrc/``: ``tree_ops.cpp`` and the files it
lists) does the search's select and expand/backup bookkeeping as one loop over
the ``B`` trees per call; see ``tree_common.h`` (backup) and ``rules.h`` (the
rules) for the exact float32 contracts the plain-torch path mirrors.

Rules. The descent is written once in C++ and templated on the rule pair;
a Python rule names its C++ counterpart in ``cpp_rule`` with its float
constants in ``cpp_params`` (:mod:`torchrl_muzero.mcts.rules`). The loaded
module lists the names it knows in ``ROOT_RULES`` and ``INTERIOR_RULES``
(:func:`cpp_rule_names`); a rule that reads variant data finds it by name in
``tree.extra``, whose tensors every call passes along.

The extension is optional (see :mod:`torchrl_muzero.kernel`, whose
:func:`load_tree_ops` and :func:`tree_ops_unavailable_reason` this module
re-exports): without it :func:`load_tree_ops` returns ``None`` and the search
falls back to its torch path.
"""
from __future__ import annotations

import functools
import warnings
from types import ModuleType

import torch

from torchrl_muzero.kernel import load_tree_ops, tree_ops_unavailable_reason
from torchrl_muzero.mcts.tree import Tree

__all__ = [
    "load_tree_ops",
    "tree_ops_unavailable_reason",
    "cpp_rule_names",
    "cpp_rule_args",
    "cpp_select",
    "cpp_expand_and_backup",
    "cpp_mlp_search",
    "cpp_stochastic_search",
    "cpp_ez_search",
    "EZ_STATE_KEYS",
    "cpp_unizero_search",
    "cpp_sampled_search",
    "bind_cpp_search",
    "has_gumbel_readout",
    "cpp_gumbel_readout",
    "fma_available",
]


def _require() -> ModuleType:
    mod = load_tree_ops()
    if mod is None:
        raise RuntimeError(f"the C++ tree kernel is unavailable: {tree_ops_unavailable_reason()}")
    return mod


def cpp_rule_names(ops: ModuleType | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(root rule names, interior rule names)`` the kernel ``ops`` (default: the loaded one) runs.

    Empty when no kernel is loaded.
    """
    ops = load_tree_ops() if ops is None else ops
    if ops is None:
        return (), ()
    return tuple(getattr(ops, "ROOT_RULES", ())), tuple(getattr(ops, "INTERIOR_RULES", ()))


def cpp_rule_args(rule) -> tuple[str, list[float]]:
    """``(name, params)`` of a rule for the kernel: a rule object's ``cpp_rule`` / ``cpp_params``.

    A ``(name, params)`` pair is passed through, so tests and benchmarks may
    name a C++ rule directly. Raises ``ValueError`` for a rule without a C++
    counterpart.
    """
    if isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str):
        name, params = rule
    else:
        name = getattr(rule, "cpp_rule", None)
        if name is None:
            raise ValueError(f"{rule!r} has no C++ rule (no `cpp_rule`)")
        params = getattr(rule, "cpp_params", ())
    return str(name), _flat_floats(params)


def _flat_floats(params) -> list[float]:
    # A composite rule's params nest its parts' (StochasticRule: ((base, init), (num_actions,))).
    out: list[float] = []
    for p in params:
        if isinstance(p, (tuple, list)):
            out.extend(_flat_floats(p))
        else:
            out.append(float(p))
    return out


def _extra(tree: Tree, *rules) -> dict[str, torch.Tensor]:
    """The tensors the kernel's rules may read: ``tree.extra``'s, plus a node-type flag from the node states.

    A rule with a ``state_key`` (Stochastic MuZero's ``StochasticRule``) reads
    its ``[B, N]`` node flag from ``tree.embeddings[state_key]``; the kernel
    takes it as ``"is_chance"``.
    """
    extra = {k: v for k, v in tree.extra.items() if isinstance(v, torch.Tensor)}
    for rule in rules:
        key = getattr(rule, "state_key", None)
        if key is not None and "is_chance" not in extra and not isinstance(tree.embeddings, torch.Tensor):
            extra["is_chance"] = tree.embeddings.get(key)
    return extra


def cpp_select(tree: Tree, root_rule, interior_rule) -> tuple[torch.Tensor, torch.Tensor]:
    """Descend every tree with ``root_rule`` at the root and ``interior_rule`` below: ``(leaf_node [B], leaf_action [B])``.

    Both int64; ``leaf_action`` of ``leaf_node`` is the first unexpanded edge
    the descent chose. The rules are objects with ``cpp_rule`` /
    ``cpp_params`` (e.g. :class:`~torchrl_muzero.mcts.rules.PUCT`) or
    ``(name, params)`` pairs. Edge values use each edge's
    ``tree.children_discount``; edges whose ``tree.children_logits`` is
    ``-inf`` and illegal root actions are never chosen. Reads the tree only.
    Tensors must be CPU, contiguous, of the dtypes of
    :func:`~torchrl_muzero.mcts.tree.allocate_tree`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> from torchrl_muzero.mcts.rules import PUCT
        >>> tree = allocate_tree(2, 4, 3, torch.Size([1]), torch.device("cpu"))
        >>> tree.visit_count[:, 0] = 1
        >>> tree.children_prior[:, 0] = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
        >>> tree.children_logits[1, 0, 0] = float("-inf")  # never selectable
        >>> cpp_select(tree, PUCT(), PUCT())[1]  # doctest: +SKIP
        tensor([1, 2])
    """
    return _require().select(*_select_arguments(tree, root_rule, interior_rule))


def _select_arguments(tree: Tree, root_rule, interior_rule) -> tuple:
    """The kernel ``select``'s arguments: the tree arrays, both rules by name and params, the rules' extras."""
    root_name, root_params = cpp_rule_args(root_rule)
    interior_name, interior_params = cpp_rule_args(interior_rule)
    return (
        tree.visit_count,
        tree.value_sum,
        tree.children_index,
        tree.children_prior,
        tree.children_reward,
        tree.children_discount,
        tree.children_logits,
        tree.raw_value,
        tree.min_q,
        tree.max_q,
        tree.root_legal,
        root_name,
        root_params,
        interior_name,
        interior_params,
        _extra(tree, root_rule, interior_rule),
    )


def _backup_arrays(tree: Tree) -> tuple:
    """The tree arrays the kernel's ``expand_and_backup`` updates, in its argument order."""
    return (
        tree.visit_count,
        tree.value_sum,
        tree.parent,
        tree.action_from_parent,
        tree.children_index,
        tree.children_prior,
        tree.children_reward,
        tree.children_discount,
        tree.min_q,
        tree.max_q,
    )


def cpp_expand_and_backup(
    tree: Tree,
    node_index: int,
    leaf_node: torch.Tensor,
    leaf_action: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    prior: torch.Tensor,
    edge_discount: torch.Tensor | None = None,
) -> None:
    """Attach node ``node_index`` under ``(leaf_node, leaf_action)`` and back ``value`` up, in place.

    ``leaf_node`` / ``leaf_action``: ``[B]`` int64 (as :func:`cpp_select` returns);
    ``reward`` / ``value``: ``[B]`` float32; ``prior``: ``[B, A]`` float32 (the
    new node's children priors); ``edge_discount``: optional ``[B]`` float32,
    written as the new edge's ``children_discount`` before the backup (else
    the edge keeps the one the tree holds). Each edge on the way up uses its
    own discount. Updates visit counts, value sums and ``min_q`` / ``max_q``;
    the new node's state, logits and raw value are the caller's to write.
    """
    _require().expand_and_backup(
        *_backup_arrays(tree),
        int(node_index),
        leaf_node,
        leaf_action,
        reward,
        value,
        prior,
        None if edge_discount is None else edge_discount.float().contiguous(),
    )


def bind_cpp_search(tree: Tree, root_rule, interior_rule):
    """``(select, expand_and_backup)`` bound to ``tree`` and the rules, for a search's simulations.

    ``select() -> (leaf_node, leaf_action)`` is :func:`cpp_select` and
    ``expand_and_backup(node_index, leaf_node, leaf_action, reward, value,
    prior, edge_discount=None)`` is :func:`cpp_expand_and_backup`, with the
    tree's arrays, the rules' names and parameters and ``tree.extra``'s
    tensors resolved once (a few microseconds per simulation saved). Valid
    while the tree's tensors are updated in place, as the search loop does.
    """
    ops = _require()
    select = functools.partial(ops.select, *_select_arguments(tree, root_rule, interior_rule))
    backup = functools.partial(ops.expand_and_backup, *_backup_arrays(tree))

    def expand_and_backup(node_index, leaf_node, leaf_action, reward, value, prior, edge_discount=None):
        if edge_discount is not None:
            edge_discount = edge_discount.float().contiguous()
        backup(int(node_index), leaf_node, leaf_action, reward, value, prior, edge_discount)

    return select, expand_and_backup


def _fused_tree_arrays(tree: Tree) -> tuple[torch.Tensor, ...]:
    """The tree arrays every fused search takes first, in the kernels' order."""
    return (tree.visit_count, tree.value_sum, tree.parent, tree.action_from_parent, tree.children_index,
            tree.children_prior, tree.children_reward, tree.children_discount, tree.children_logits,
            tree.raw_value, tree.min_q, tree.max_q, tree.root_legal)


def _fused_rule_arguments(tree: Tree, root_rule, interior_rule) -> tuple:
    """The rule names, their parameters and ``tree.extra``'s tensors every fused search takes last."""
    root_name, root_params = cpp_rule_args(root_rule)
    interior_name, interior_params = cpp_rule_args(interior_rule)
    return root_name, root_params, interior_name, interior_params, _extra(tree, root_rule, interior_rule)


def fma_available(ops: ModuleType | None = None) -> bool:
    """Whether the kernel ``ops`` (default: the loaded one) runs its FMA network path on this CPU.

    True on x86 with AVX2 and FMA for a kernel built with the path
    (``kernel_precision="fma"`` of :class:`~torchrl_muzero.mcts.MCTSConfig`).
    """
    ops = load_tree_ops() if ops is None else ops
    has = getattr(ops, "kernel_has_fma", None)
    return bool(has is not None and has())


_fma_fallback_warned = False


def _precision_kwargs(precision: str) -> dict:
    """The fused kernels' keyword for ``kernel_precision``: ``{"fma": True}`` or nothing.

    ``"fma"`` where the kernel cannot run it (no AVX2 + FMA, or a kernel built
    before the path) falls back to the exact path, with one warning per process.
    """
    global _fma_fallback_warned
    if precision != "fma":
        return {}
    if fma_available():
        return {"fma": True}
    if not _fma_fallback_warned:
        _fma_fallback_warned = True
        warnings.warn("kernel_precision='fma': this CPU (or the loaded C++ kernel) has no AVX2 + FMA path; "
                      "the fused search runs the exact path.", RuntimeWarning, stacklevel=3)
    return {}


def _fused_kernel(name: str, what: str):
    ops = _require()
    if not hasattr(ops, name):
        raise RuntimeError(f"the C++ tree kernel was built without the fused {what} search")
    return getattr(ops, name)


def cpp_mlp_search(
    tree: Tree,
    weights: list[torch.Tensor],
    reward_eps: float,
    value_eps: float,
    root_rule,
    interior_rule,
    precision: str = "exact",
) -> None:
    """Every simulation of a search for ``MuZeroMLPModel`` (one hidden layer) in one C++ call, in place.

    ``tree`` is fresh with its root written (:func:`~torchrl_muzero.mcts.loop.start_tree`,
    root priors prepared, ``tree.extra`` filled); ``weights, reward_eps,
    value_eps`` are ``model.fused_search_weights()``. Simulation ``s`` creates
    node ``s + 1``: its latent, raw value, prior logits and prior are written
    as the loop writes them, its edge keeps ``tree.children_discount``. The
    rules are taken as by :func:`cpp_select`. ``precision`` is
    ``MCTSConfig.kernel_precision`` (``"fma"``: the network's FMA path where
    the CPU has it). Raises ``RuntimeError`` if the kernel was built without
    the fused search.
    """
    _fused_kernel("mlp_search", "MLP")(
        *_fused_tree_arrays(tree), tree.embeddings, weights, float(reward_eps), float(value_eps),
        *_fused_rule_arguments(tree, root_rule, interior_rule), **_precision_kwargs(precision),
    )


def cpp_stochastic_search(
    tree: Tree,
    weights: list[torch.Tensor],
    reward_eps: float,
    value_eps: float,
    discount: float,
    root_rule,
    interior_rule,
    precision: str = "exact",
) -> None:
    """Every simulation of a Stochastic MuZero search for ``StochasticMuZeroMLPModel`` in one C++ call, in place.

    ``tree`` is fresh with its root written (:func:`~torchrl_muzero.mcts.loop.start_tree`
    with the ``{"latent", "is_chance"}`` node state, root priors prepared);
    ``weights, reward_eps, value_eps`` are ``model.fused_search_weights()``;
    ``discount`` is the discount of the chance-to-decision edges (the
    decision-to-chance ones get 1, as ``model.search_step`` gives them).
    Simulation ``s`` creates node ``s + 1`` and writes its latent, node kind,
    raw value, prior logits and prior as the loop writes them. The rules are
    taken as by :func:`cpp_select` (``"is_chance"`` is the node state's),
    ``precision`` as by :func:`cpp_mlp_search`. Raises ``RuntimeError`` if
    the kernel was built without it.
    """
    _fused_kernel("stochastic_search", "Stochastic MuZero")(
        *_fused_tree_arrays(tree), tree.embeddings.get("latent"), tree.embeddings.get("is_chance"), weights,
        float(reward_eps), float(value_eps), float(discount),
        *_fused_rule_arguments(tree, root_rule, interior_rule), **_precision_kwargs(precision),
    )


#: The node-state keys of an EfficientZero tree (``tree.embeddings``), in ``ez_search``'s order.
EZ_STATE_KEYS = ("latent", "lstm_h", "lstm_c", "value_prefix", "steps")


def cpp_ez_search(tree: Tree, fused: tuple, root_rule, interior_rule, precision: str = "exact") -> None:
    """Every simulation of a search for ``EfficientZeroMLPModel`` (one hidden layer) in one C++ call, in place.

    As :func:`cpp_mlp_search`, for the value-prefix model: ``fused`` is
    ``model.fused_value_prefix_weights()`` and ``tree.embeddings`` the
    TensorDict node state of ``search_root`` (``[B, N]`` leaves
    :data:`EZ_STATE_KEYS`, contiguous), which the kernel fills for every new
    node as ``search_step`` would (LSTM state and prefix reset every
    ``lstm_horizon_len`` steps). The edge reward is the prefix difference.
    ``precision`` as by :func:`cpp_mlp_search` (the LSTM cell and LayerNorm
    stay exact). Raises ``RuntimeError`` if the kernel was built without it.
    """
    tensors, reward_eps, value_eps, ln_eps, horizon = fused
    _fused_kernel("ez_search", "EfficientZero")(
        *_fused_tree_arrays(tree), *(tree.embeddings.get(key) for key in EZ_STATE_KEYS), tensors,
        float(reward_eps), float(value_eps), float(ln_eps), int(horizon),
        *_fused_rule_arguments(tree, root_rule, interior_rule), **_precision_kwargs(precision),
    )


def cpp_unizero_search(tree: Tree, fused: tuple, root_rule, interior_rule, precision: str = "exact") -> None:
    """Every simulation of a search for ``UniZeroModel`` in one C++ call, in place.

    As :func:`cpp_ez_search`, for the transformer world model: ``fused`` is
    ``fused_unizero_weights(model)`` (:mod:`torchrl_muzero.modules.unizero.fused`)
    and ``tree.embeddings`` the TensorDict node state of ``search_root``
    (``latents``, ``actions``, ``length`` and, with the KV cache, ``kv``;
    contiguous), which the kernel fills for every new node as
    ``search_step`` would. With ``kv`` each new token attends to the cached
    keys/values of its ancestors (found through the parent links), else the
    node's whole context is recomputed at every expansion. ``precision`` as
    by :func:`cpp_mlp_search`, for the expansions' linear layers and decodes
    (the root's window forward, attention and norms stay exact).
    """
    tensors, ints, floats = fused
    emb = tree.embeddings
    _fused_kernel("unizero_search", "UniZero")(
        *_fused_tree_arrays(tree), emb.get("latents"), emb.get("actions"), emb.get("length"),
        emb.get("kv") if "kv" in emb.keys() else None, tensors, ints, floats,
        *_fused_rule_arguments(tree, root_rule, interior_rule), **_precision_kwargs(precision),
    )


def cpp_sampled_search(tree: Tree, spec, root_rule, interior_rule, generator: torch.Generator | None = None,
                       precision: str = "exact") -> None:
    """Every simulation of a sampled search over a box in one C++ call, in place.

    ``spec`` is ``SampledModel.fused_kernel_spec()``: entry ``"sampled_ez"``
    (kernel ``sampled_ez_search``: the base's 20 EfficientZero tensors, ints
    ``(lstm_horizon_len,)``, floats ``(reward_eps, value_eps, ln_eps, ...)``)
    or ``"sampled_mlp"`` (``sampled_mlp_search``: MuZero's 14 tensors, floats
    ``(reward_eps, value_eps, ...)``), the tensors ending with the box's
    ``low`` / ``high`` and the floats with ``(sigma (0: learned), min_scale,
    temperature, pre-tanh bound)``. ``tree.embeddings`` is the sampled node
    state the spec declares, the root's candidates written. Every new node's
    ``K`` candidates are drawn from ``generator`` with the torch path's
    ``randn`` calls, in its order; its slot prior is uniform. ``precision`` as
    by :func:`cpp_mlp_search`.
    """
    name = {"sampled_ez": "sampled_ez_search", "sampled_mlp": "sampled_mlp_search"}[spec.kernel]
    tensors, (low, high) = list(spec.tensors[:-2]), spec.tensors[-2:]
    net_floats, draw_floats = [float(x) for x in spec.floats[:-4]], [float(x) for x in spec.floats[-4:]]
    emb = tree.embeddings
    _fused_kernel(name, "sampled")(
        *_fused_tree_arrays(tree), *(emb.get(leaf.key) for leaf in spec.node_state), tensors, *net_floats,
        *(int(i) for i in spec.ints), low, high, *draw_floats, generator,
        *_fused_rule_arguments(tree, root_rule, interior_rule), **_precision_kwargs(precision),
    )


def has_gumbel_readout() -> bool:
    """Whether the loaded kernel has ``gumbel_readout`` (a kernel built before it has not)."""
    ops = load_tree_ops()
    return ops is not None and hasattr(ops, "gumbel_readout")


def cpp_gumbel_readout(tree: Tree, params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gumbel MuZero's result of finished trees in one C++ call: ``(visit_counts, improved_policy, root_value, action)``.

    ``params`` are the Gumbel rules' ``(value_scale, maxvisit_init,
    rescale_values)``; the root noise is ``tree.extra["gumbel"]``. The float32
    contract is in ``csrc/gumbel_readout.h``
    (:func:`~torchrl_muzero.mcts.gumbel.gumbel_result` is the torch reading).
    """
    counts, improved, value, action = _require().gumbel_readout(
        tree.visit_count,
        tree.value_sum,
        tree.children_index,
        tree.children_prior,
        tree.children_reward,
        tree.children_discount,
        tree.children_logits,
        tree.raw_value,
        tree.min_q,
        tree.max_q,
        tree.root_legal,
        tree.extra["gumbel"],
        _flat_floats(params),
    )
    return counts, improved, value, action
