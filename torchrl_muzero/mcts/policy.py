"""``MCTSPolicy``: model + search as a policy a torchrl collector runs."""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.envs.utils import ExplorationType, exploration_type

from torchrl_muzero.envs.action_spaces import ActionSpace, action_space_of, check_model_action_space
from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.loop import slot_actions_of, slot_candidates
from torchrl_muzero.mcts.search import backend_scope, search

__all__ = ["MCTSPolicy"]

_GREEDY = (ExplorationType.DETERMINISTIC, ExplorationType.MODE, ExplorationType.MEAN, ExplorationType.MEDIAN)


class MCTSPolicy(TensorDictModuleBase):
    """Choose actions by a batched MuZero search.

    Reads ``observation`` (and ``action_mask`` / ``to_play`` when the input
    holds them), runs one search per batch element and writes ``action`` in
    the encoding of ``action_spec`` (one-hot or index), ``search_policy``
    (the root visit distribution, the policy target) and ``root_value``.
    Runs without gradients, on the model's device (inputs are moved there and
    outputs back), and is reproducible from ``generator``.

    A model whose search slots are not its actions (its nodes carry their own
    candidates: it has a ``slot_actions`` map, :mod:`torchrl_muzero.mcts.loop`)
    gets the env action of the chosen root slot at ``action_key`` (any
    action space, a box included), the visits over its slots as
    ``search_policy``, and ``("root", "slot")`` (long, the chosen slot),
    ``("root", "candidates")`` ``[S, ...]`` (every root slot's action) and
    ``("root", "candidate_visits")`` ``[S]`` (float visit counts), for a
    :class:`~torchrl_muzero.data.GameBuffer` to store as ``extra_entries``
    (docs/compose_box_actions.py).

    Under ``torchrl.envs.utils.set_exploration_type(ExplorationType.DETERMINISTIC)``
    (or ``MODE``) the search adds no root noise and takes the most visited
    action: that is how evaluation runs.

    Args:
        model: a :class:`~torchrl_muzero.modules.MuZeroModel`.
        config: :class:`~torchrl_muzero.mcts.MCTSConfig`.
        action_spec: the env's action spec; a ``OneHot`` spec gets one-hot
            actions, a ``Categorical`` one action indices, both of the spec's
            dtype (:func:`~torchrl_muzero.envs.action_spaces.action_space_of`;
            a continuous spec is refused unless the model maps its slots to
            actions, ``slot_actions``). A model that declares
            ``model.action_space`` (the registry's builders set it) must have
            been built for this spec's space: a mismatch raises ``ValueError``
            in one line naming both.
            ``None``: the search's indices.
        generator: optional ``torch.Generator`` on the model's device.
        observation_key / action_key / action_mask_key / to_play_key: keys.
        search_fn: the search to run, with :func:`~torchrl_muzero.mcts.search`'s
            signature ``(model, observation, config, action_mask=, to_play=,
            add_noise=, generator=) -> SearchResult`` (default: MuZero's;
            for a :class:`~torchrl_muzero.modules.sampled.SampledModel`,
            :func:`~torchrl_muzero.mcts.sampled.sampled_search`).
            Each algorithm of :mod:`torchrl_muzero.algorithms` names its own,
            e.g. ``gumbel_search`` with a ``GumbelMCTSConfig``.
        memory: an :class:`~torchrl_muzero.mcts.acting_memory.ActingMemory`
            for policies that act from per-env history (``muzero_context``,
            ``muzero_rnn_full_obs``):
            the policy reads the memory's entries, searches from
            ``memory.root(...)`` (passed to ``search_fn`` as ``root=``) and
            writes the next memory at ``("next", key)``. The env must carry
            the entries: :func:`~torchrl_muzero.mcts.acting_memory.with_acting_memory`
            or a collector with ``auto_register_policy_transforms=True``.

    Examples:
        >>> import torch
        >>> from torchrl.collectors import Collector
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
        >>> env = GymEnv("CartPole-v1")
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16)
        >>> policy = MCTSPolicy(model, MCTSConfig(num_simulations=4), env.action_spec)
        >>> collector = Collector(env, policy, frames_per_batch=8, total_frames=8,
        ...                       auto_register_policy_transforms=False)
        >>> batch = next(iter(collector))
        >>> batch["search_policy"].shape, batch["action"].shape
        (torch.Size([8, 2]), torch.Size([8, 2]))
        >>> collector.shutdown()
    """

    def __init__(
        self,
        model,
        config: MCTSConfig | None = None,
        action_spec=None,
        generator: torch.Generator | None = None,
        observation_key: NestedKey = "observation",
        action_key: NestedKey = "action",
        action_mask_key: NestedKey = "action_mask",
        to_play_key: NestedKey = "to_play",
        search_fn: Callable | None = None,
        memory=None,
    ) -> None:
        super().__init__()
        self.model = model
        if search_fn is None and hasattr(model, "sample_node"):  # a sampled model: its nodes draw their actions
            from torchrl_muzero.mcts.sampled import sampled_search as search_fn
        self.search_fn = search_fn if search_fn is not None else search
        self.config = config if config is not None else MCTSConfig()
        self.action_spec = action_spec
        self.generator = generator
        self.observation_key = observation_key
        self.action_key = action_key
        self.action_mask_key = action_mask_key
        self.to_play_key = to_play_key
        self.in_keys = [observation_key]
        self.out_keys = [action_key, "search_policy", "root_value"]
        self.memory = memory.bind(model) if memory is not None else None
        if self.memory is not None:
            self.in_keys = [*self.in_keys, *self.memory.keys]
            self.out_keys = [*self.out_keys, *[("next", key) for key in self.memory.keys]]
        # how the env wants its actions (one-hot or index, its dtype); None: the search's indices as they are
        self.action_space = action_space_of(action_spec) if action_spec is not None else None
        # None: the search's slots are the model's (discrete) actions; else the map from root slots to env actions
        self.slot_actions = slot_actions_of(model)
        if self.slot_actions is not None:
            self.out_keys = [*self.out_keys, ("root", "slot"), ("root", "candidates"), ("root", "candidate_visits")]
        # the model's declared space (model.action_space) must be the env's; a model without one takes
        # model.num_actions discrete actions, unless its slots map to actions of their own (checked per step)
        if self.action_space is not None and (
                self.slot_actions is None or isinstance(getattr(model, "action_space", None), ActionSpace)):
            check_model_action_space(self.action_space, model)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        observation = tensordict.get(self.observation_key)
        model_device = next(self.model.parameters()).device
        out_device = observation.device
        obs_ndim = len(self.model.observation_shape)
        batch_shape = observation.shape[: observation.ndim - obs_ndim]
        self.model.check_observation(observation)
        observation = observation.reshape(-1, *self.model.observation_shape)

        action_mask = tensordict.get(self.action_mask_key, None)
        if action_mask is not None:
            action_mask = action_mask.reshape(-1, action_mask.shape[-1])  # a sampled model searches K slots of A actions
        to_play = tensordict.get(self.to_play_key, None)
        if to_play is not None:
            to_play = to_play.reshape(-1)

        memory = root = None
        if self.memory is not None:
            if to_play is not None:
                raise ValueError(f"{type(self.memory).__name__}: acting from per-env memory is for one-player "
                                 "envs; this input has a player to move (to_play).")
            self.memory.check(tensordict)
            memory = tensordict.select(*self.memory.keys).reshape(-1).to(model_device)

        greedy = exploration_type() in _GREEDY
        config = self.config
        if greedy and config.temperature != 0:
            config = dataclasses.replace(config, temperature=0.0)
        was_training = self.model.training
        self.model.eval()
        try:
            # backend_scope: with backend="torch" the memory's root (UniZero's window) stays out of the kernel too
            with torch.no_grad(), backend_scope(config):
                extra = {}
                if memory is not None:
                    root = extra["root"] = self.memory.root(self.model, observation.to(model_device), memory)
                result = self.search_fn(
                    self.model,
                    observation.to(model_device),
                    config,
                    action_mask=action_mask,
                    to_play=to_play,
                    add_noise=not greedy,
                    generator=self.generator,
                    **extra,
                )
                env_action = result.action
                if self.slot_actions is not None:  # result.action is a root slot: read its env action
                    S = result.visit_counts.shape[-1]
                    candidates = slot_candidates(self.slot_actions, result.tree.embeddings[:, 0], S)
                    slot = result.action
                    env_action = candidates[torch.arange(slot.shape[0], device=slot.device), slot]
                    if self.action_space is not None:
                        self.action_space.validate(env_action)
                if memory is not None:  # the history holds the env's action (a sampled search's is a slot)
                    next_memory = self.memory.advance(self.model, root, env_action, memory)
        finally:
            self.model.train(was_training)

        if self.slot_actions is not None:
            lead = tuple(batch_shape)
            tensordict.set(("root", "slot"), slot.to(out_device).reshape(lead))
            tensordict.set(("root", "candidates"), candidates.to(out_device).reshape(lead + candidates.shape[1:]))
            tensordict.set(("root", "candidate_visits"),
                           result.visit_counts.float().to(out_device).reshape(lead + (-1,)))
        action = env_action if self.action_space is None else self.action_space.encode(env_action)
        action = action.to(out_device)
        tensordict.set(self.action_key, action.reshape(tuple(batch_shape) + tuple(action.shape[1:])))
        tensordict.set(
            "search_policy", result.search_policy.to(out_device).reshape(tuple(batch_shape) + (-1,))
        )
        tensordict.set("root_value", result.root_value.to(out_device).reshape(tuple(batch_shape)))
        if memory is not None:
            next_memory = next_memory.to(out_device).reshape(tuple(batch_shape))
            for key in self.memory.keys:
                tensordict.set(("next", key), next_memory[key])
        return tensordict
