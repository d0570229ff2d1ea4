"""UniZero's acting memory: the last ``context_length`` raw observations and actions of each env.

A UniZero root sees its env's recent history: the search starts from
``model.search_root(window, actions, valid)``, a causal forward over the last
``context_length`` steps ``[z, a]`` and the current latent. That window lives
in the rollout TensorDict like every :class:`~torchrl_muzero.mcts.acting_memory.ActingMemory`
(zeros and a count of 0 at reset, written by the env's primer), never on the
model.

Why raw observations, not latents or keys/values: the policy's weights change
between steps (the async trainer publishes new weights while envs are in the
middle of episodes). A latent, or a KV cache, computed with the old weights
would mix two networks inside one forward. Keeping the raw observations means
the window is encoded with the current weights at every step, so the root is
always exactly the current network's function of the history. LightZero keeps
a per-env KV cache keyed by a hash of the float latent instead, and clears it
every ``kv_cache_clear_interval`` env steps; here there is no persistent cache
to clear. The cost is one encoder pass over ``context_length + 1``
observations per env step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, Unbounded

from torchrl_muzero.mcts.acting_memory import ActingMemory
from torchrl_muzero.modules.step import ModelStep

__all__ = ["HistoryWindowMemory"]


@dataclass
class _WindowRoot(ModelStep):
    """A root that also carries the env's shifted observation window (the search reads only the base fields)."""

    next_observations: torch.Tensor | None = None
    next_actions: torch.Tensor | None = None
    next_count: torch.Tensor | None = None


class HistoryWindowMemory(ActingMemory):
    """Per env: the last ``context_length`` observations and actions before now, and how many are real.

    Entries (per env): ``"history_observation" [L, *obs]`` (oldest first),
    ``"history_action"`` (the action taken after each: indices ``[L]``
    int64, or ``[L, D]`` float32 for a model of box actions, one whose
    ``action_dim`` is ``D``: sampled UniZero) and
    ``"history_count"`` (real steps, ``0 .. L``; the real ones are the last
    ``count``). After a reset all are zero: the root sees the current
    observation alone. :meth:`root` encodes the window with the current
    weights (module docstring: why raw observations); :meth:`advance` shifts
    in the current observation and the action taken. The search never writes
    the memory.

    Args:
        context_length: ``L >= 1``, at most the model's ``context_length``.
        observation_dtype: dtype of the stored observations (the env's; e.g.
            ``torch.uint8`` for frames).

    Examples:
        >>> import torch
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
        >>> from torchrl_muzero.mcts.acting_memory import with_acting_memory
        >>> from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=6,
        ...                      value_support_size=5, reward_support_size=5)
        >>> policy = MCTSPolicy(model, MCTSConfig(num_simulations=4, backend="torch"), memory=HistoryWindowMemory(2))
        >>> env = with_acting_memory(GymEnv("CartPole-v1"), policy)
        >>> td = policy(env.reset())
        >>> int(td["history_count"]), int(td["next", "history_count"])  # empty after the reset; one step next
        (0, 1)
        >>> torch.equal(td["next", "history_observation"][-1], td["observation"])
        True
    """

    def __init__(self, context_length: int, observation_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < 1:
            raise ValueError(f"context_length must be an integer >= 1, got {context_length!r} "
                             "(0: act without memory, from the current observation).")
        self.context_length = context_length
        self.observation_dtype = observation_dtype

    @property
    def keys(self) -> list[str]:
        return ["history_observation", "history_action", "history_count"]

    def _check_model(self, model) -> None:
        if not hasattr(model, "context_length") or self.context_length > model.context_length:
            raise ValueError(
                f"HistoryWindowMemory(context_length={self.context_length}) needs a model whose search_root takes "
                f"a window of that many steps; {type(model).__name__} has context_length="
                f"{getattr(model, 'context_length', None)}."
            )

    def spec(self, model) -> Composite:
        self._check_model(model)
        L = self.context_length
        action_dim = getattr(model, "action_dim", None)  # a box model's float actions [D]
        action = (Unbounded(shape=(L,), dtype=torch.int64) if action_dim is None
                  else Unbounded(shape=(L, action_dim), dtype=torch.float32))
        return Composite(
            history_observation=Unbounded(shape=(L, *model.observation_shape), dtype=self.observation_dtype),
            history_action=action,
            history_count=Unbounded(shape=(), dtype=torch.int64),
        )

    def _window(self, model, observation: torch.Tensor, memory: TensorDictBase):
        """``(window [B, L + 1, *obs], actions [B, L], valid [B, L + 1], count [B])`` of the root."""
        L = self.context_length
        past = memory["history_observation"].to(observation.dtype)
        window = torch.cat([past, observation[:, None]], 1)  # [B, L + 1, *obs], now last
        count = memory["history_count"].clamp(0, L)
        steps = torch.arange(L + 1, device=count.device)
        valid = steps[None] >= (L - count)[:, None]  # the last count steps and now
        actions = memory["history_action"]  # zeros where not valid
        if not actions.dtype.is_floating_point:
            actions = actions.long().clamp(0, _env_num_actions(model) - 1)
        return window, actions, valid, count

    def root(self, model, observation: torch.Tensor, memory: TensorDictBase) -> ModelStep:
        L = self.context_length
        window, actions, valid, count = self._window(model, observation, memory)
        root = model.search_root(window, actions, valid)
        return _WindowRoot(root.state, root.reward, root.policy_logits, root.value, root.discount,
                           next_observations=window[:, 1:].to(self.observation_dtype),
                           next_actions=memory["history_action"], next_count=(count + 1).clamp(max=L))

    def root_value(self, model, observation: torch.Tensor, memory: TensorDictBase) -> torch.Tensor:
        """:meth:`root`'s value without its node state (the model's ``root_value`` where it has one:
        UniZero then skips the window's K/V cache, which only a search reads)."""
        value_of = getattr(model, "root_value", None)
        if value_of is None:
            return self.root(model, observation, memory).value
        window, actions, valid, _ = self._window(model, observation, memory)
        return value_of(window, actions, valid)

    def memory_from_steps(self, observations: torch.Tensor, actions: torch.Tensor, count: torch.Tensor) -> TensorDict:
        """The memory an env carries after ``count [M]`` real steps of its episode, rebuilt from stored steps.

        ``observations [M, L, *obs]`` and ``actions [M, L(, D)]`` are oldest first,
        the real ones the last ``count`` of each row (the replay buffer's
        history windows, :mod:`torchrl_muzero.data.root_history`). The other
        entries are zeroed, as the primer's zeros are when they shift out, so
        :meth:`root` sees exactly what it sees while acting.
        """
        L = self.context_length
        M = count.shape[0]
        if observations.shape[:2] != (M, L) or actions.shape[:2] != (M, L) or actions.dim() > 3:
            raise ValueError(f"memory_from_steps expects observations [M, {L}, *obs] and actions [M, {L}(, D)] for "
                             f"count [M = {M}], got {tuple(observations.shape)} and {tuple(actions.shape)}.")
        count = count.long().clamp(0, L)
        real = torch.arange(L, device=count.device)[None] >= (L - count)[:, None]  # the last count steps
        shape = (M, L) + (1,) * (observations.dim() - 2)
        obs = torch.where(real.reshape(shape), observations, torch.zeros((), dtype=observations.dtype))
        return TensorDict({"history_observation": obs.to(self.observation_dtype),
                           "history_action": _zero_unreal(actions, real),
                           "history_count": count}, batch_size=[M])

    def advance(self, model, root: ModelStep, action: torch.Tensor, memory: TensorDictBase) -> TensorDictBase:
        if not isinstance(root, _WindowRoot):
            raise TypeError("HistoryWindowMemory.advance expects the root its own root() returned.")
        past = root.next_actions
        taken = action.reshape(past.shape[0], 1, *past.shape[2:]).to(past.dtype)  # an index, or floats [D]
        actions = torch.cat([past[:, 1:], taken], 1)
        return TensorDict({"history_observation": root.next_observations, "history_action": actions,
                           "history_count": root.next_count}, batch_size=[action.shape[0]])


def _env_num_actions(model) -> int:
    """The env's discrete actions: a sampled model searches ``K`` slots (its ``num_actions``) of its space's."""
    space = getattr(model, "action_space", None)
    if space is not None and getattr(space, "is_discrete", False):
        return int(space.num_actions)
    return int(model.num_actions)


def _zero_unreal(actions: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Stored ``actions [M, L(, D)]`` where ``real [M, L]``, zeros elsewhere: int64 indices or float32 actions."""
    if actions.dtype.is_floating_point:
        return torch.where(real[..., None], actions.float(), 0.0)
    return torch.where(real, actions.long(), 0)
