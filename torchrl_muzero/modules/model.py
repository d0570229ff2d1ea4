"""The MuZero model interface shared by every network.

A model is three learned functions (MuZero paper, section 3):

* representation ``h``: observation -> latent state,
* dynamics ``g``: (latent, action) -> (next latent, reward),
* prediction ``f``: latent -> (policy logits, value).

Subclasses implement :meth:`represent`, :meth:`dynamics` and :meth:`predict`
on plain tensors. This base class adds the two inference steps the search and
the loss call, the scalar decoding of the categorical heads, input checks with
readable errors, and the TensorDict views :attr:`initial` and
:attr:`recurrent` that torchrl pipelines compose.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from torchrl_muzero.envs.action_spaces import read_action_index
from torchrl_muzero.modules.fused_spec import FusedSpec
from torchrl_muzero.modules.policy_distribution import CategoricalPolicy, PolicyDistribution
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.support import CategoricalSupport, inverse_signed_hyperbolic

__all__ = ["MuZeroModel", "scale_latent"]


def scale_latent(latent: torch.Tensor, start_dim: int = 1) -> torch.Tensor:
    """Min-max scale each sample's latent to ``[0, 1]`` (MuZero appendix G).

    Keeps the dynamics' inputs on the same scale as the representation's
    outputs however many steps are unrolled.
    """
    flat = latent.flatten(start_dim)
    low, high = torch.aminmax(flat, dim=-1, keepdim=True)
    scaled = (flat - low) / (high - low).clamp_min(1e-5)
    return scaled.view_as(latent)


class _InitialStep(nn.Module):
    def __init__(self, model: "MuZeroModel") -> None:
        super().__init__()
        self._model = [model]  # a list so the model is not registered twice

    def forward(self, observation):
        model = self._model[0]
        latent, policy_logits, value_logits = model.initial_inference(observation)
        return latent, policy_logits, value_logits, model.value_support.decode(value_logits)


class _RecurrentStep(nn.Module):
    def __init__(self, model: "MuZeroModel") -> None:
        super().__init__()
        self._model = [model]

    def forward(self, latent, action):
        model = self._model[0]
        # one-hot [B, A] (torchrl's OneHot spec) or [*, 1] indices -> [B]; recurrent_inference checks the rest
        action = read_action_index(action, model.num_actions, latent.shape[:1], single="one_hot",
                                   squeeze_any_lead=True)
        next_latent, reward_logits, policy_logits, value_logits = model.recurrent_inference(
            latent, action
        )
        return (
            next_latent,
            reward_logits,
            model.reward_support.decode(reward_logits),
            policy_logits,
            value_logits,
            model.value_support.decode(value_logits),
        )


class MuZeroModel(nn.Module):
    """Base class of MuZero networks.

    Args:
        observation_shape: shape of one observation (without batch dims).
        num_actions: size of the discrete action space.
        value_support_size: half-width of the value support (601 bins for 300).
        reward_support_size: half-width of the reward support.

    Subclasses implement :meth:`represent`, :meth:`dynamics` (returning the
    next latent and reward logits) and :meth:`predict` (policy and value
    logits) for a flat batch dimension.

    The TensorDict views:

    * ``model.initial`` reads ``"observation"`` and writes ``"latent"``,
      ``"policy_logits"``, ``"value_logits"`` and ``"state_value"``;
    * ``model.recurrent`` reads ``"latent"`` and ``"action"`` (index or
      one-hot) and writes ``"next_latent"``, ``"reward_logits"``,
      ``"reward"``, ``"policy_logits"``, ``"value_logits"``, ``"state_value"``.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> from torchrl_muzero.modules import MuZeroModel, scale_latent
        >>> class Tiny(MuZeroModel):
        ...     def __init__(self):
        ...         super().__init__((3,), num_actions=2, value_support_size=5, reward_support_size=5)
        ...         self.h = nn.Linear(3, 8)
        ...         self.g = nn.Linear(8 + 1, 8)
        ...         self.r = nn.Linear(8, self.reward_support.num_bins)
        ...         self.f = nn.Linear(8, 2 + self.value_support.num_bins)
        ...     def represent(self, obs):
        ...         return scale_latent(self.h(obs))
        ...     def dynamics(self, latent, action):
        ...         nxt = scale_latent(self.g(torch.cat([latent, action[:, None].float()], -1)))
        ...         return nxt, self.r(nxt)
        ...     def predict(self, latent):
        ...         out = self.f(latent)
        ...         return out[:, :2], out[:, 2:]
        >>> model = Tiny()
        >>> latent, policy_logits, value_logits = model.initial_inference(torch.randn(5, 3))
        >>> latent.shape, policy_logits.shape, value_logits.shape
        (torch.Size([5, 8]), torch.Size([5, 2]), torch.Size([5, 11]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        value_support_size: int,
        reward_support_size: int,
    ) -> None:
        super().__init__()
        self.observation_shape = torch.Size(observation_shape)
        self.num_actions = int(num_actions)
        if self.num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}.")
        self.value_support = CategoricalSupport(value_support_size)
        self.reward_support = CategoricalSupport(reward_support_size)
        self.initial = TensorDictModule(
            _InitialStep(self),
            in_keys=["observation"],
            out_keys=["latent", "policy_logits", "value_logits", "state_value"],
        )
        self.recurrent = TensorDictModule(
            _RecurrentStep(self),
            in_keys=["latent", "action"],
            out_keys=[
                "next_latent",
                "reward_logits",
                "reward",
                "policy_logits",
                "value_logits",
                "state_value",
            ],
        )

    # -- to implement -------------------------------------------------------
    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    # -- inference steps ----------------------------------------------------
    def initial_inference(
        self, observation: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``observation [*B, *obs_shape]`` -> ``(latent, policy_logits, value_logits)``."""
        batch_shape = self.check_observation(observation)
        observation = observation.reshape(-1, *self.observation_shape)
        if not observation.is_floating_point():
            observation = observation.float()
        latent = self.represent(observation)
        policy_logits, value_logits = self.predict(latent)
        return (
            latent.reshape(*batch_shape, *latent.shape[1:]),
            policy_logits.reshape(*batch_shape, -1),
            value_logits.reshape(*batch_shape, -1),
        )

    def recurrent_inference(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(latent [B, ...], action [B] long)`` -> ``(next_latent, reward_logits, policy_logits, value_logits)``."""
        self.check_action(action, latent.shape[0])
        next_latent, reward_logits = self.dynamics(latent, action)
        policy_logits, value_logits = self.predict(next_latent)
        return next_latent, reward_logits, policy_logits, value_logits

    @torch.no_grad()
    def recurrent_inference_scalar(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The search's step: like :meth:`recurrent_inference` with decoded reward and value.

        No input checks: the search only passes actions it produced itself.
        Returns ``(next_latent, reward [B], policy_logits [B, A], value [B])``.
        """
        next_latent, reward_logits = self.dynamics(latent, action)
        policy_logits, value_logits = self.predict(next_latent)
        reward, value = self.decode_reward_and_value(reward_logits, value_logits)
        return next_latent, reward, policy_logits, value

    # -- the search's view (torchrl_muzero.modules.step) -------------------------
    @torch.no_grad()
    def search_root(self, observation: torch.Tensor) -> ModelStep:
        """The root of a search: ``observation [B, *obs_shape]`` -> :class:`ModelStep` (reward 0).

        Variants whose node state is more than the latent (an LSTM state, a
        node type) override this and :meth:`search_step` together.
        """
        latent, policy_logits, value_logits = self.initial_inference(observation)
        value = self.value_support.decode(value_logits)
        return ModelStep(latent, torch.zeros_like(value), policy_logits, value)

    @torch.no_grad()
    def search_step(self, state, action: torch.Tensor) -> ModelStep:
        """One interior step of the search: the new node below ``(state [B, ...], action [B])``."""
        next_latent, reward, policy_logits, value = self.recurrent_inference_scalar(state, action)
        return ModelStep(next_latent, reward, policy_logits, value)

    def policy_distribution(
        self, policy_logits: torch.Tensor, mask: torch.Tensor | None = None
    ) -> PolicyDistribution:
        """The distribution of this model's ``policy_logits [..., A]`` (the factory the search and the loss use).

        :meth:`CategoricalPolicy.from_logits` here; a model whose policy
        output is not a softmax over the actions overrides it.
        """
        return CategoricalPolicy.from_logits(policy_logits, mask)

    def fused_kernel_spec(self) -> FusedSpec | None:
        """The one fused C++ search (network included) this model offers, or ``None``: then the search
        calls :meth:`search_step` per simulation (:mod:`torchrl_muzero.modules.fused_spec`).

        ``None`` here; the models the kernel mirrors (``MuZeroMLPModel``,
        ``EfficientZeroMLPModel``, ``StochasticMuZeroMLPModel`` with one
        hidden layer) override it, and so may a user's model that matches one
        of the kernel's entries.
        """
        return None

    def decode_reward_and_value(
        self, reward_logits: torch.Tensor, value_logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode both heads with one shared ``h^{-1}`` call when the supports allow it."""
        if self.reward_support.epsilon != self.value_support.epsilon:
            return self.reward_support.decode_fast(reward_logits), self.value_support.decode_fast(value_logits)
        both = torch.stack(
            [self.reward_support.expectation(reward_logits), self.value_support.expectation(value_logits)]
        )
        both = inverse_signed_hyperbolic(both, self.value_support.epsilon)
        return both[0], both[1]

    # -- checks -------------------------------------------------------------
    def check_observation(self, observation: torch.Tensor) -> torch.Size:
        """Return the batch shape of ``observation``; raise ``ValueError`` if its shape is wrong."""
        n = len(self.observation_shape)
        if (
            not isinstance(observation, torch.Tensor)
            or observation.ndim < n
            or observation.shape[observation.ndim - n :] != self.observation_shape
        ):
            shape = tuple(observation.shape) if isinstance(observation, torch.Tensor) else type(observation)
            raise ValueError(
                f"{type(self).__name__} expects observations of shape "
                f"[*batch, {', '.join(map(str, self.observation_shape))}], got {shape}."
            )
        return observation.shape[: observation.ndim - n]

    def check_action(self, action: torch.Tensor, batch_size: int) -> None:
        """Raise ``ValueError`` unless ``action`` is ``[batch_size]`` integers in ``[0, num_actions)``."""
        if action.shape != (batch_size,) or action.dtype.is_floating_point:
            raise ValueError(
                f"{type(self).__name__} expects integer actions of shape [{batch_size}] "
                f"(one per latent), got {tuple(action.shape)} of dtype {action.dtype}."
            )
        if action.numel() and (int(action.min()) < 0 or int(action.max()) >= self.num_actions):
            raise ValueError(
                f"actions must lie in [0, {self.num_actions}), got values in "
                f"[{int(action.min())}, {int(action.max())}]."
            )
