"""Sampled MuZero's model: any MuZero-family network searched over K actions drawn at each node.

Sampled MuZero (Hubert et al. 2021, "Learning and Planning in Complex Action
Spaces") does not enumerate the actions of a node: it draws ``K`` of them from
a proposal (the policy by default), searches over those ``K`` *slots*, and
learns the policy from the visit distribution over the drawn actions.
:class:`SampledModel` turns a network of the family (the ``base``: MuZero's or
EfficientZero's MLP with a policy head of the right width) into such a model
without a new search loop: its nodes carry their candidates
(``state["candidate_actions"]``), its ``slot_actions`` map hands the base's
step the env actions of the chosen slots, and its node prior is the
:class:`~torchrl_muzero.modules.sampled_proposal.SampledProposal`'s over the
slots. The shared loop (:mod:`torchrl_muzero.mcts.loop`) searches it as it
searches every other model.

The base model is the network; the wrapper owns only the sampling. Training
unrolls the base along the actions the env took (float ``[B, D]`` for a box,
indices for a discrete space) through the wrapper's ``initial_inference`` /
``recurrent_inference``; the policy head's output is read by
:meth:`SampledModel.policy_distribution` (a
:class:`~torchrl_muzero.modules.tanh_normal.TanhNormalPolicy` for a box, a
:class:`~torchrl_muzero.modules.CategoricalPolicy` for a discrete space).
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl_muzero.envs.action_spaces import ActionSpace, BoxActionSpace
from torchrl_muzero.modules.fused_spec import FusedSpec, StateLeaf
from torchrl_muzero.modules.policy_distribution import CategoricalPolicy, PolicyDistribution
from torchrl_muzero.modules.sampled_proposal import SampledProposal
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.tanh_normal import MIN_SCALE, PRE_TANH_BOUND, TanhNormalPolicy

__all__ = ["SAMPLED_EZ_NODE_STATE", "SAMPLED_MLP_NODE_STATE", "SampledModel", "policy_head_width"]

_CANDIDATES = "candidate_actions"
_NODE = "node"

#: The node state of a box sampled search over ``EfficientZeroMLPModel`` in the order the fused kernel
#: (``sampled_ez_search``) takes it: the base's five leaves under ``"node"``, then the candidates ``[B, N, K, D]``.
SAMPLED_EZ_NODE_STATE = (
    StateLeaf((_NODE, "latent"), torch.float32, 3), StateLeaf((_NODE, "lstm_h"), torch.float32, 3),
    StateLeaf((_NODE, "lstm_c"), torch.float32, 3), StateLeaf((_NODE, "value_prefix"), torch.float32, 2),
    StateLeaf((_NODE, "steps"), torch.int64, 2), StateLeaf(_CANDIDATES, torch.float32, 4),
)

#: The same for ``MuZeroMLPModel``'s latent node state (``sampled_mlp_search``).
SAMPLED_MLP_NODE_STATE = (StateLeaf(_NODE, torch.float32, 3), StateLeaf(_CANDIDATES, torch.float32, 4))

# What the fused kernel's node draws are: SampledModel's own. A subclass that changes any of these is not
# this model any more and keeps the per-simulation loop.
_FUSED_METHODS = ("search_step", "sample_node", "policy_distribution", "slot_actions")


def policy_head_width(action_space: ActionSpace) -> int:
    """The width of the policy head a sampled model's base needs: ``2 * D`` for a box (a tanh-normal's
    location and scale), ``A`` for ``A`` discrete actions.

    Examples:
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace
        >>> from torchrl_muzero.modules.sampled import policy_head_width
        >>> policy_head_width(BoxActionSpace(-2.0, 2.0, (1,))), policy_head_width(DiscreteActionSpace(6))
        (2, 6)
    """
    if action_space.is_discrete:
        return int(action_space.num_actions)
    return 2 * _box_dim(action_space)


def _box_dim(space: BoxActionSpace) -> int:
    shape = tuple(space.shape)
    if len(shape) != 1:
        raise ValueError(f"a sampled model takes box actions of shape (D,), got {shape}.")
    return int(shape[0])


class SampledModel(nn.Module):
    """A MuZero-family ``base`` network searched over ``K`` actions sampled at each node.

    Args:
        base: the network (a :class:`~torchrl_muzero.modules.MuZeroModel`):
            for a box space of ``D`` dims built with ``action_dim=D`` and a
            policy head of ``2 * D`` (:func:`policy_head_width`), for ``A``
            discrete actions an ordinary discrete model over ``A``.
        action_space: the env's :class:`~torchrl_muzero.envs.action_spaces.ActionSpace`.
        proposal: what a node draws and the prior over its slots
            (:class:`~torchrl_muzero.modules.sampled_proposal.SampledProposal`).
        sigma: the tanh-normal's scale: ``None`` learned (the head's second
            half), a float fixed (LightZero's ``fixed_sigma_value`` 0.3).

    The search sees ``num_actions = K`` slots; a node's state is
    ``TensorDict(node=<the base's state>, candidate_actions=[B, K, *action])``,
    its ``policy_logits`` the proposal's slot logits (``-inf`` for a padded
    slot of a discrete node with fewer legal actions than ``K``).
    :meth:`search_step` draws with the search's generator
    (``takes_generator``); the root is drawn by the sampled search policy
    (:func:`~torchrl_muzero.mcts.sampled.sampled_search`), which holds the
    generator and the legal mask.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.modules.sampled import SampledModel
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> space = BoxActionSpace(-2.0, 2.0, (1,))
        >>> base = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1)
        >>> model = SampledModel(base, space, SampledProposal(num_samples=5))
        >>> g = torch.Generator().manual_seed(0)
        >>> root = model.sample_node(model.search_root(torch.zeros(4, 3)), generator=g)
        >>> root.state["candidate_actions"].shape, root.policy_logits.shape
        (torch.Size([4, 5, 1]), torch.Size([4, 5]))
        >>> child = model.search_step(root.state, root.state["candidate_actions"][:, 0], generator=g)
        >>> bool(child.state["candidate_actions"].abs().max() < 2.0)
        True
    """

    def __init__(self, base: nn.Module, action_space: ActionSpace, proposal: SampledProposal,
                 sigma: float | None = None) -> None:
        super().__init__()
        if not isinstance(action_space, ActionSpace):
            raise TypeError(f"SampledModel: action_space must be an ActionSpace, got {type(action_space).__name__}.")
        width = policy_head_width(action_space)
        if int(base.num_actions) != width:
            raise ValueError(
                f"SampledModel: the base's policy head has {base.num_actions} outputs; {action_space.describe()} "
                f"needs {width} ({'A logits' if action_space.is_discrete else '2 * D: location and scale'})."
            )
        if not action_space.is_discrete and getattr(base, "action_dim", None) != _box_dim(action_space):
            raise ValueError(f"SampledModel: a box base must take continuous actions (action_dim="
                             f"{_box_dim(action_space)}), got action_dim={getattr(base, 'action_dim', None)}.")
        if not action_space.is_discrete and not bool(torch.isfinite(torch.as_tensor(action_space.low)).all()
                                                     and torch.isfinite(torch.as_tensor(action_space.high)).all()):
            raise ValueError(f"SampledModel: the box's bounds must be finite (its tanh-squashed policy maps onto "
                             f"them), got {action_space.describe()}.")
        if action_space.is_discrete and not proposal.replacement and proposal.num_samples > action_space.num_actions:
            raise ValueError(
                f"SampledModel: num_samples {proposal.num_samples} > {action_space.num_actions} discrete actions "
                "with sampling without replacement; use num_samples <= the number of actions.")
        self.base = base
        self.action_space = action_space
        self.proposal = proposal
        self.sigma = sigma
        self.observation_shape = base.observation_shape  # the supports and the rest: the base's (__getattr__)
        if not action_space.is_discrete:
            self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32).expand(
                _box_dim(action_space)).clone(), persistent=False)
            self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32).expand(
                _box_dim(action_space)).clone(), persistent=False)

    # -- what the search sees ------------------------------------------------------------------
    @property
    def num_actions(self) -> int:
        """The search's slots per node: ``K``."""
        return int(self.proposal.num_samples)

    @staticmethod
    def slot_actions(states: TensorDictBase, slots: torch.Tensor) -> torch.Tensor:
        """The env actions ``[B, *action]`` of the chosen ``slots [B]`` of nodes ``states [B]``."""
        candidates = states.get(_CANDIDATES)
        return candidates[torch.arange(slots.shape[0], device=slots.device), slots.long()]

    def policy_distribution(self, policy_logits: torch.Tensor, mask: torch.Tensor | None = None) -> PolicyDistribution:
        """The policy the head's output ``[..., 2D]`` (box) or ``[..., A]`` (discrete) stands for."""
        if self.action_space.is_discrete:
            return CategoricalPolicy.from_logits(policy_logits, mask)
        return TanhNormalPolicy.from_params(policy_logits, self.action_low, self.action_high, sigma=self.sigma)

    def sample_node(self, step: ModelStep, generator: torch.Generator | None = None,
                    legal: torch.Tensor | None = None, proposal: SampledProposal | None = None,
                    candidates: torch.Tensor | None = None) -> ModelStep:
        """``step`` (a base's node: policy head output as logits) with ``K`` candidates drawn, as the search
        stores it: the slot logits as its prior logits, the candidates in its state.

        ``legal [B, A]`` (discrete) restricts the draws; ``proposal`` overrides the model's for this node
        (the root's noise or temperature). Given ``candidates [B, K, *action]`` (a position's stored ones,
        which a reanalyze search keeps) nothing is drawn: the prior over them is
        :meth:`~torchrl_muzero.modules.sampled_proposal.SampledProposal.prior_at`'s."""
        proposal = self.proposal if proposal is None else proposal
        policy = self.policy_distribution(step.policy_logits.float())
        if candidates is None:
            candidates, slot_logits = proposal.draw(policy, generator=generator, legal=legal)
        else:
            dtype = torch.long if self.action_space.is_discrete else torch.float32
            candidates = candidates.to(device=step.policy_logits.device, dtype=dtype)
            slot_logits = proposal.prior_at(policy, candidates, legal=legal)
        B = step.policy_logits.shape[0]
        state = TensorDict({_NODE: step.state, _CANDIDATES: candidates}, batch_size=[B])
        return ModelStep(state, step.reward, slot_logits, step.value, step.discount)

    @torch.no_grad()
    def search_root(self, observation: torch.Tensor, *history: torch.Tensor) -> ModelStep:
        """The base's root (its policy head output as logits, no candidates yet: :meth:`sample_node`).

        ``history``: what a base that acts from history takes after the observation (UniZero's
        ``actions, valid`` of a window, from :class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory`)."""
        return self.base.search_root(observation, *history)

    @torch.no_grad()
    def search_step(self, state: TensorDictBase, action: torch.Tensor, generator: torch.Generator | None = None
                    ) -> ModelStep:
        """The base's step along the env actions ``action`` of the chosen slots, then ``K`` draws at the new node."""
        return self.sample_node(self.base.search_step(state.get(_NODE), action), generator)

    search_step.takes_generator = True  # the loop passes its generator: expansions draw reproducibly

    def fused_kernel_spec(self) -> FusedSpec | None:
        """The fused sampled search (kernel entry ``"sampled_ez"`` or ``"sampled_mlp"``: the base's step, the
        ``K`` draws of every new node and the tree in one C++ call), or ``None`` where the search runs the
        shared loop.

        It is offered for a box space whose base has a fused continuous step
        (``fused_continuous_weights``: ``EfficientZeroMLPModel`` or
        ``MuZeroMLPModel`` with ``action_dim=D`` and one hidden layer, float32
        on the CPU) and a proposal whose slot
        prior is uniform (``prior="uniform"``, or the paper's prior with
        ``temperature=1``: ``beta = pi``), without a widened mixture. The
        kernel draws every node's candidates from the search's generator in
        the torch path's order (``csrc/sampled_search.cpp``); the root's are
        drawn in Python as before (:func:`~torchrl_muzero.mcts.sampled.sampled_search`).

        Examples:
            >>> import torch
            >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
            >>> from torchrl_muzero.modules import EfficientZeroMLPModel
            >>> from torchrl_muzero.modules.sampled import SampledModel
            >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
            >>> base = EfficientZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8, action_dim=1)
            >>> space = BoxActionSpace(-2.0, 2.0, (1,))
            >>> SampledModel(base, space, SampledProposal(num_samples=4)).fused_kernel_spec().kernel
            'sampled_ez'
            >>> SampledModel(base, space, SampledProposal(4, temperature=0.5)).fused_kernel_spec() is None
            True
        """
        if self.action_space.is_discrete:
            return None
        proposal, cls = self.proposal, type(self)
        if proposal.num_widened or (proposal.prior == "paper" and proposal.temperature != 1.0):
            return None  # slot logits that are not all 0: the kernel's prior is uniform only
        if self.sigma is not None and not self.sigma > 0:
            return None  # the torch path raises the error
        if any(getattr(cls, name) is not getattr(SampledModel, name) for name in _FUSED_METHODS):
            return None
        weights = getattr(self.base, "fused_continuous_weights", None)
        fused = None if weights is None else weights()
        if fused is None or self.action_low.device.type != "cpu":
            return None
        box = [self.action_low.contiguous(), self.action_high.contiguous()]
        # sigma 0: the learned scale
        draws = (0.0 if self.sigma is None else float(self.sigma), MIN_SCALE, float(proposal.temperature),
                 PRE_TANH_BOUND)
        if len(fused) == 5:  # EfficientZero's: the value-prefix LSTM's eps and horizon too
            tensors, reward_eps, value_eps, ln_eps, horizon = fused
            return FusedSpec("sampled_ez", [*tensors, *box], ints=(horizon,),
                             floats=(reward_eps, value_eps, ln_eps, *draws), node_state=SAMPLED_EZ_NODE_STATE)
        tensors, reward_eps, value_eps = fused
        return FusedSpec("sampled_mlp", [*tensors, *box], floats=(reward_eps, value_eps, *draws),
                         node_state=SAMPLED_MLP_NODE_STATE)

    # -- what training sees: the base, along the env's actions ---------------------------------------
    def forward(self, *args, **kwargs):
        """The base's own forward (UniZero's training forward over a whole segment, ``UniZeroLoss._unroll``)."""
        return self.base(*args, **kwargs)

    def initial_inference(self, observation: torch.Tensor):
        """The base's ``initial_inference``: ``(latent, policy head output, value_logits)``."""
        return self.base.initial_inference(observation)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor):
        """The base's ``recurrent_inference`` along env actions (float ``[B, D]`` or indices ``[B]``)."""
        return self.base.recurrent_inference(latent, action)

    def check_observation(self, observation: torch.Tensor) -> torch.Size:
        return self.base.check_observation(observation)

    def __getattr__(self, name: str):
        # the variants' losses call their network's own methods (EfficientZero's value-prefix unroll):
        # whatever the wrapper does not define is the base's
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self._modules.get("base")
            if base is None:
                raise
            return getattr(base, name)
