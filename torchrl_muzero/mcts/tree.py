"""The search tree: a handful of preallocated, batch-first tensors.

``B`` trees are searched together. Node 0 is the root; the node created by
simulation ``s`` (0-based) is ``s + 1``, so ``N = num_simulations + 1`` nodes
are allocated up front and nothing is reallocated or copied during a search.

Per node ``[B, N]``:
    ``visit_count`` (int32), ``value_sum`` (float32, from the point of view of
    the player to move at that node), ``parent`` (int32, -1 at the root),
    ``action_from_parent`` (int32, -1 at the root).
    ``raw_value`` (float32): the network's own value of the node when it was
    expanded (Gumbel MuZero's mixed value needs it; the search statistics
    are ``value_sum / visit_count``).
Per edge ``[B, N, A]``:
    ``children_index`` (int32, -1 while the edge is unexpanded),
    ``children_prior`` (float32, what pUCT reads: the softmax of the logits,
    with root noise mixed in), ``children_logits`` (float32, the network's
    prior logits; ``-inf`` marks an edge no rule may select),
    ``children_reward`` (float32, the reward the dynamics predicted for taking
    that action, from the mover's point of view), ``children_discount``
    (float32, the discount of that edge: the search's discount unless the
    model step returned its own, e.g. 1 on Stochastic MuZero's
    decision-to-chance edges).
Per tree ``[B]``:
    ``min_q`` / ``max_q`` (float32): the min-max statistics of every edge value
    ``q = reward + discount * value(child)`` seen in the tree (MuZero appendix
    B); ``+inf`` / ``-inf`` before the first backup.
Per root ``[B, A]``: ``root_legal`` (bool).
Per node ``embeddings``: the model's node states, a tensor
``[B, N, *latent_shape]`` or a TensorDict of batch ``[B, N]`` (the
``state`` of :class:`~torchrl_muzero.modules.ModelStep`); node 0 is the
root's, the others are written by the search (uninitialised before).
``extra``: the one slot for a variant's own data (a dict of tensors with
leading dim ``B``: root Gumbel noise, the considered-visit table, ...).

``discount`` is the search discount; in two-player zero-sum games it is
negated, so that ``q = r + discount * v`` turns the child's value (its own
mover's view) into the parent's view (mctx's convention).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["Tree", "allocate_tree"]


@dataclass
class Tree:
    """The arrays of ``B`` search trees (layout in the module docstring).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import allocate_tree
        >>> tree = allocate_tree(4, num_simulations=10, num_actions=3, latent_shape=torch.Size([8]),
        ...                      device=torch.device("cpu"))
        >>> tree.batch_size, tree.num_nodes, tree.num_actions
        (4, 11, 3)
        >>> tree.children_index.shape, tree.embeddings.shape
        (torch.Size([4, 11, 3]), torch.Size([4, 11, 8]))
    """

    visit_count: torch.Tensor
    value_sum: torch.Tensor
    parent: torch.Tensor
    action_from_parent: torch.Tensor
    children_index: torch.Tensor
    children_prior: torch.Tensor
    children_reward: torch.Tensor
    min_q: torch.Tensor
    max_q: torch.Tensor
    root_legal: torch.Tensor
    embeddings: torch.Tensor | TensorDictBase
    raw_value: torch.Tensor | None = None
    children_logits: torch.Tensor | None = None
    children_discount: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.visit_count.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.visit_count.shape[1]

    @property
    def num_actions(self) -> int:
        return self.children_index.shape[2]

    def node_value(self) -> torch.Tensor:
        """Mean value of every node ``[B, N]`` (0 for unvisited nodes)."""
        return self.value_sum / self.visit_count.clamp_min(1)

    def root_child_visits(self) -> torch.Tensor:
        """Visit counts of the root's children ``[B, A]`` (0 for unexpanded edges)."""
        return child_visits(self, 0)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor field by name (``extra`` and absent optional fields left out)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (torch.Tensor, TensorDictBase)):
                out[f.name] = value
        return out

    def child_values(self, node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q [B, A], visits [B, A], expanded [B, A])`` of the edges below ``node [B]``.

        ``q = reward + discount * value(child)`` with each edge's own discount;
        ``q`` of an unexpanded edge is its reward alone (callers mask it).
        """
        rows = torch.arange(self.batch_size, device=node.device)
        child = self.children_index[rows, node].long()
        expanded = child >= 0
        safe = child.clamp_min(0)
        visits = torch.where(expanded, self.visit_count.gather(1, safe), 0).float()
        value = self.value_sum.gather(1, safe) / visits.clamp_min(1.0)
        q = self.children_reward[rows, node] + self.children_discount[rows, node] * value
        return q, visits, expanded


def child_visits(tree: Tree, node: int) -> torch.Tensor:
    """Visit counts ``[B, A]`` of the children of ``node`` in every tree."""
    index = tree.children_index[:, node].long()
    return tree.visit_count.gather(1, index.clamp_min(0)).masked_fill_(index < 0, 0)


def node_states(root_state: torch.Tensor | TensorDictBase, N: int) -> torch.Tensor | TensorDictBase:
    """The ``[B, N]`` node states of a tree whose root state is ``root_state`` (a tensor ``[B, ...]``
    or a TensorDict of batch ``[B]``): node 0 holds it, the others are left for the search to write."""
    if isinstance(root_state, TensorDictBase):
        return _node_states(root_state, N)
    states = root_state.new_empty((root_state.shape[0], N, *root_state.shape[1:]))
    states[:, 0] = root_state
    return states


def _node_states(root_state: TensorDictBase, N: int) -> TensorDictBase:
    """Node states ``[B, N]`` with ``root_state [B]`` as node 0 and the other nodes left uninitialised.

    Every search step writes its node's whole state (the torch loop assigns
    it, the fused kernels fill every leaf), so repeating the root into every
    node was a copy nobody read; it was also the largest cost of a UniZero
    search at B = 64 (~65 MB of K/V buffers per search at CartPole sizes). The
    one exception, the fused UniZero search's K/V cache, writes only each
    node's own slots (:func:`~torchrl_muzero.modules.unizero.node_states.complete_node_states`
    rebuilds the rest on demand). A flat TensorDict of plain tensors (every
    model's node state) is allocated leaf by leaf, without the TensorDict ops'
    cost per search (docs/performance_search.md, "Design figures quoted from
    the code").
    """
    B = root_state.batch_size[0]
    if type(root_state) is TensorDict and root_state.batch_dims == 1 and all(n is None for n in root_state.names):
        leaves = dict(root_state.items())
        if all(type(v) is torch.Tensor for v in leaves.values()):
            nodes = {}
            for k, v in leaves.items():
                nodes[k] = v.new_empty((B, N, *v.shape[1:]))
                nodes[k][:, 0] = v
            return TensorDict(nodes, [B, N], device=root_state.device)
    return root_state.unsqueeze(1).expand(B, N).clone()  # nested or typed states: the generic way (a copy)


def allocate_tree(
    batch_size: int,
    num_simulations: int,
    num_actions: int,
    latent_shape: torch.Size | None,
    device: torch.device,
    latent_dtype: torch.dtype = torch.float32,
    discount: float = 1.0,
    root_state: torch.Tensor | TensorDictBase | None = None,
) -> Tree:
    """Preallocate the arrays of ``batch_size`` trees of ``num_simulations + 1`` nodes.

    ``discount`` fills ``children_discount`` (edges keep it unless a model step
    returns its own). With ``root_state`` (a tensor ``[B, ...]`` or a TensorDict
    of batch ``[B]``) the node states take its structure and it is stored as
    node 0; otherwise they are a tensor of ``latent_shape``.
    """
    B, N, A = batch_size, num_simulations + 1, num_actions
    i32 = dict(dtype=torch.int32, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    if root_state is None:
        embeddings = torch.zeros(B, N, *latent_shape, dtype=latent_dtype, device=device)
    else:
        embeddings = node_states(root_state, N)
    return Tree(
        visit_count=torch.zeros(B, N, **i32),
        value_sum=torch.zeros(B, N, **f32),
        parent=torch.full((B, N), -1, **i32),
        action_from_parent=torch.full((B, N), -1, **i32),
        children_index=torch.full((B, N, A), -1, **i32),
        children_prior=torch.zeros(B, N, A, **f32),
        children_reward=torch.zeros(B, N, A, **f32),
        min_q=torch.full((B,), float("inf"), **f32),
        max_q=torch.full((B,), float("-inf"), **f32),
        root_legal=torch.ones(B, A, dtype=torch.bool, device=device),
        embeddings=embeddings,
        raw_value=torch.zeros(B, N, **f32),
        children_logits=torch.zeros(B, N, A, **f32),
        children_discount=torch.full((B, N, A), float(discount), **f32),
    )
