"""MuZero w/ RNN networks (the UniZero paper's baseline; LightZero's ``muzero_rnn_full_obs``).

A GRU carries the history. The representation ``h(o) -> s`` is MuZero's; the
dynamics read the latent and the GRU state, ``(s, hidden, a) -> (s', hidden',
r)`` with ``hidden' = GRUCell([s, onehot(a)], hidden)``, ``s'`` a projection
of ``hidden'`` (min-max scaled like every latent) and the reward read from
``hidden'``; the prediction reads both, ``f(s, hidden) -> (policy, value)``.

The model only computes; who feeds which latent is the caller's choice. The
loss (:class:`~torchrl_muzero.objectives.rnn_full_obs.RNNFullObsLoss`) feeds
the real encoder's ``h(o_{t+k})`` back at every unroll step (teacher forcing),
the acting policy carries ``hidden`` per env
(:class:`~torchrl_muzero.mcts.acting_memory.RecurrentHiddenMemory`), and the
search, which has no future observations, feeds the predicted ``s'``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn import functional as F

from torchrl_muzero.modules.mlp import _mlp
from torchrl_muzero.modules.model import MuZeroModel, scale_latent
from torchrl_muzero.modules.resnet import MuZeroResNetModel, _norm
from torchrl_muzero.modules.step import ModelStep

__all__ = ["RNNFullObsModel", "RNNFullObsMLPModel", "RNNFullObsResNetModel"]

_NO_HIDDENLESS_STEP = (
    "{name}'s dynamics read a GRU state: use dynamics_hidden / recurrent_inference_hidden "
    "(RNNFullObsLoss) or search_root / search_step; {method} without a hidden state has no meaning for it."
)


def _zero_last(module: nn.Module) -> None:
    last = [m for m in module.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


class RNNFullObsModel(MuZeroModel):
    """The MuZero w/ RNN interface: a GRU state next to the latent, in the dynamics and the prediction.

    Subclasses implement :meth:`represent` (MuZero's) and :meth:`predict_hidden`
    ``(latent, hidden) -> (policy_logits, value_logits)``, and call
    :meth:`_build_recurrence` in their constructor (GRU, latent and reward heads).

    Training API: :meth:`encode` (the representation alone), :meth:`initial_hidden`
    (zeros ``[B, rnn_hidden_size]``), :meth:`dynamics_hidden` and
    :meth:`recurrent_inference_hidden`. :meth:`predict` (so
    :meth:`initial_inference`, the value bootstrap and reanalyze) is the
    prediction with a zero hidden state: a training root's.

    Search API: :meth:`search_root` ``(observation, hidden=None)`` and
    :meth:`search_step`, whose node state is a TensorDict ``[B]`` of
    ``latent`` and ``hidden``. MuZero's hidden-less steps (:meth:`dynamics`,
    :meth:`recurrent_inference`, ``model.recurrent``) raise
    ``NotImplementedError``: no MuZero code path can silently drop the state.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel, RNNFullObsModel
        >>> model = RNNFullObsMLPModel((4,), 2, latent_dim=8, hidden_dim=8, rnn_hidden_size=6)
        >>> isinstance(model, RNNFullObsModel), model.initial_hidden(3).shape
        (True, torch.Size([3, 6]))
    """

    #: read by variant builders and the acting memory
    carries_hidden = True

    def _build_recurrence(self, latent_shape: Sequence[int], rnn_hidden_size: int, head_hidden: int,
                          num_layers: int, zero_init_heads: bool) -> None:
        """The GRU over ``[flat latent, onehot(action)]``, the latent head and the reward head on ``hidden'``."""
        if int(rnn_hidden_size) < 1:
            raise ValueError(f"rnn_hidden_size must be >= 1, got {rnn_hidden_size}.")
        self.rnn_hidden_size = int(rnn_hidden_size)
        self.latent_shape = torch.Size(latent_shape)
        numel = int(self.latent_shape.numel())
        self.gru = nn.GRUCell(numel + self.num_actions, self.rnn_hidden_size)
        self.latent_head = nn.Linear(self.rnn_hidden_size, numel)  # s' from hidden'
        self.reward_head = _mlp(self.rnn_hidden_size, head_hidden, self.reward_support.num_bins, num_layers)
        if zero_init_heads:
            _zero_last(self.reward_head)

    # -- to implement -------------------------------------------------------------
    def predict_hidden(self, latent: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(latent [B, *latent_shape], hidden [B, H])`` -> ``(policy_logits, value_logits)``."""
        raise NotImplementedError

    # -- training API ---------------------------------------------------------------
    def initial_hidden(self, batch_size: int, device: torch.device | None = None,
                       dtype: torch.dtype | None = None) -> torch.Tensor:
        """The GRU state of an unroll's root and of a fresh episode: zeros ``[batch_size, rnn_hidden_size]``."""
        weight = self.gru.weight_hh
        return torch.zeros(int(batch_size), self.rnn_hidden_size, device=device or weight.device,
                           dtype=dtype or weight.dtype)

    def encode(self, observation: torch.Tensor) -> torch.Tensor:
        """The representation alone: ``observation [N, *obs_shape]`` -> latent ``[N, *latent_shape]``."""
        self.check_observation(observation)
        observation = observation.reshape(-1, *self.observation_shape)
        if not observation.is_floating_point():
            observation = observation.float()
        return self.represent(observation)

    def dynamics_hidden(self, latent: torch.Tensor, hidden: torch.Tensor,
                        action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(next_latent, next_hidden, reward_logits)`` without input checks."""
        next_hidden = self._gru_step(latent, hidden, action)
        next_latent = scale_latent(self.latent_head(next_hidden).view(latent.shape[0], *self.latent_shape))
        return next_latent, next_hidden, self.reward_head(next_hidden)

    def _gru_step(self, latent: torch.Tensor, hidden: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(action, self.num_actions).to(latent.dtype)
        return self.gru(torch.cat([latent.reshape(latent.shape[0], -1), one_hot], -1), hidden)

    def recurrent_inference_hidden(
        self, latent: torch.Tensor, hidden: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One model step from the latent it is given: ``-> (next_latent, next_hidden, reward_logits,
        policy_logits, value_logits)``, the prediction read from ``(next_latent, next_hidden)``."""
        B = latent.shape[0]
        self.check_latent(latent)
        self.check_action(action, B)
        if tuple(hidden.shape) != (B, self.rnn_hidden_size):
            raise ValueError(f"{type(self).__name__} expects a GRU state of shape [{B}, {self.rnn_hidden_size}], "
                             f"got {tuple(hidden.shape)}.")
        next_latent, next_hidden, reward_logits = self.dynamics_hidden(latent, hidden, action)
        policy_logits, value_logits = self.predict_hidden(next_latent, next_hidden)
        return next_latent, next_hidden, reward_logits, policy_logits, value_logits

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prediction with a zero GRU state (a training root's; the buffer's value bootstrap)."""
        return self.predict_hidden(latent, self.initial_hidden(latent.shape[0], latent.device, latent.dtype))

    def check_latent(self, latent: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``latent`` is ``[B, *latent_shape]``."""
        if latent.ndim != len(self.latent_shape) + 1 or latent.shape[1:] != self.latent_shape:
            raise ValueError(f"{type(self).__name__} expects latents of shape "
                             f"[batch, {', '.join(map(str, self.latent_shape))}], got {tuple(latent.shape)}.")

    # -- MuZero's hidden-less step does not apply -----------------------------------------
    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raises ``NotImplementedError``: use :meth:`dynamics_hidden`."""
        raise NotImplementedError(_NO_HIDDENLESS_STEP.format(name=type(self).__name__, method="dynamics"))

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor):
        """Raises ``NotImplementedError``: use :meth:`recurrent_inference_hidden`."""
        raise NotImplementedError(_NO_HIDDENLESS_STEP.format(name=type(self).__name__,
                                                             method="recurrent_inference"))

    def recurrent_inference_scalar(self, latent: torch.Tensor, action: torch.Tensor):
        """Raises ``NotImplementedError``: the search calls :meth:`search_step`."""
        raise NotImplementedError(_NO_HIDDENLESS_STEP.format(name=type(self).__name__,
                                                             method="recurrent_inference_scalar"))

    def fused_search_weights(self) -> None:
        """``None``: the fused C++ search only knows MuZero's MLP step."""
        return None

    # -- search API ----------------------------------------------------------------------
    @torch.no_grad()
    def search_root(self, observation: torch.Tensor, hidden: torch.Tensor | None = None) -> ModelStep:
        """The root ``(h(o), hidden)`` with its prediction; ``hidden`` ``[B, H]`` defaults to zeros
        (a training root's; the acting policy passes each env's carried state)."""
        latent = self.encode(observation)
        B = latent.shape[0]
        if hidden is None:
            hidden = self.initial_hidden(B, latent.device, latent.dtype)
        elif tuple(hidden.shape) != (B, self.rnn_hidden_size):
            raise ValueError(f"{type(self).__name__}.search_root expects hidden [{B}, {self.rnn_hidden_size}], "
                             f"got {tuple(hidden.shape)}.")
        policy_logits, value_logits = self.predict_hidden(latent, hidden.to(latent.dtype))
        value = self.value_support.decode(value_logits)
        state = TensorDict({"latent": latent, "hidden": hidden.to(latent.dtype)}, batch_size=[B])
        return ModelStep(state, torch.zeros_like(value), policy_logits, value)

    @torch.no_grad()
    def search_step(self, state: TensorDictBase, action: torch.Tensor) -> ModelStep:
        """The child of ``state`` along ``action [B]``: no observation there, so the predicted latent."""
        if not isinstance(state, TensorDictBase):
            raise TypeError(f"{type(self).__name__}.search_step expects the TensorDict state that "
                            f"search_root / search_step returned, got {type(state).__name__}.")
        next_latent, next_hidden, reward_logits = self.dynamics_hidden(state["latent"], state["hidden"], action)
        policy_logits, value_logits = self.predict_hidden(next_latent, next_hidden)
        reward, value = self.decode_reward_and_value(reward_logits, value_logits)
        child = TensorDict({"latent": next_latent, "hidden": next_hidden}, batch_size=state.batch_size)
        return ModelStep(child, reward, policy_logits, value)

    @torch.no_grad()
    def next_hidden(self, state: TensorDictBase, action: torch.Tensor) -> torch.Tensor:
        """The GRU state after ``action`` from ``state`` (the acting memory's step; no prediction run)."""
        return self._gru_step(state["latent"], state["hidden"], action)


class RNNFullObsMLPModel(RNNFullObsModel):
    """MuZero w/ RNN of small MLPs for flat observations (CartPole).

    Representation as :class:`~torchrl_muzero.modules.MuZeroMLPModel`'s (MLP,
    min-max scaled). Dynamics: ``GRUCell([s, onehot(a)], hidden)`` of
    ``rnn_hidden_size`` units, ``s' = scale(Linear(hidden'))``, reward logits
    from an MLP on ``hidden'``. Prediction: one ReLU layer on ``[s, hidden]``,
    then one layer to policy and value logits.

    Args:
        observation_shape, num_actions, latent_dim, hidden_dim,
            value_support_size, reward_support_size, num_layers,
            zero_init_heads: as :class:`~torchrl_muzero.modules.MuZeroMLPModel`.
        rnn_hidden_size: GRU units. Defaults to 64 (LightZero's Pong: 4096).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel
        >>> model = RNNFullObsMLPModel((4,), 2, latent_dim=8, hidden_dim=16, rnn_hidden_size=12)
        >>> root = model.search_root(torch.randn(3, 4))
        >>> sorted(root.state.keys()), root.state["hidden"].abs().sum().item()
        (['hidden', 'latent'], 0.0)
        >>> child = model.search_step(root.state, torch.tensor([0, 1, 1]))
        >>> child.state["hidden"].shape, child.reward.shape, child.policy_logits.shape
        (torch.Size([3, 12]), torch.Size([3]), torch.Size([3, 2]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        latent_dim: int = 64,
        hidden_dim: int = 64,
        value_support_size: int = 10,
        reward_support_size: int = 10,
        num_layers: int = 1,
        zero_init_heads: bool = True,
        rnn_hidden_size: int = 64,
    ) -> None:
        super().__init__(observation_shape, num_actions, value_support_size, reward_support_size)
        obs_dim = int(torch.Size(observation_shape).numel())
        self.latent_dim = int(latent_dim)
        self.representation_net = _mlp(obs_dim, hidden_dim, latent_dim, num_layers)
        self._build_recurrence((latent_dim,), rnn_hidden_size, hidden_dim, num_layers, zero_init_heads)
        self.prediction_trunk = nn.Sequential(nn.Linear(latent_dim + self.rnn_hidden_size, hidden_dim), nn.ReLU())
        self.prediction_head = nn.Linear(hidden_dim, self.num_actions + self.value_support.num_bins)
        if zero_init_heads:
            _zero_last(self.prediction_head)

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        return scale_latent(self.representation_net(observation.flatten(1)))

    def predict_hidden(self, latent: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.prediction_head(self.prediction_trunk(torch.cat([latent, hidden], -1)))
        return out[..., : self.num_actions], out[..., self.num_actions :]


class _HiddenHead(nn.Module):
    """A ResNet head that also reads the GRU state: 1x1 conv, flatten, ``++ hidden``, MLP."""

    def __init__(self, channels: int, reduced: int, spatial: int, hidden_size: int, widths: Sequence[int],
                 out_dim: int, batch_norm: bool) -> None:
        super().__init__()
        self.reduce = nn.Sequential(nn.Conv2d(channels, reduced, 1, bias=not batch_norm), _norm(reduced, batch_norm),
                                    nn.ReLU(), nn.Flatten(1))
        layers: list[nn.Module] = []
        dim = reduced * spatial + hidden_size
        for width in widths:
            layers += [nn.Linear(dim, int(width)), nn.ReLU()]
            dim = int(width)
        layers.append(nn.Linear(dim, out_dim))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.reduce(x), hidden], -1))


class RNNFullObsResNetModel(RNNFullObsModel, MuZeroResNetModel):
    """MuZero w/ RNN of residual towers for frames (Atari, ``model.kind=resnet``).

    :class:`~torchrl_muzero.modules.MuZeroResNetModel`'s representation and
    prediction trunk. Dynamics: a GRU of ``rnn_hidden_size`` units on the
    flattened latent and the one-hot action, ``s'`` a linear projection of
    ``hidden'`` reshaped to the latent's ``(C, H, W)`` and min-max scaled, the
    reward from an MLP on ``hidden'`` (``fc_reward_layers``). Prediction: the
    trunk's residual blocks on ``s``, then each head (value, policy) reduces the
    planes with a 1x1 convolution, flattens, appends ``hidden`` and runs its
    MLP. MuZero's convolutional dynamics tower and heads are not built.

    Args:
        observation_shape, num_actions, **kwargs: as
            :class:`~torchrl_muzero.modules.MuZeroResNetModel`.
        rnn_hidden_size: GRU units. Defaults to 64 (LightZero's Pong config: 4096).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.rnn_full_obs import RNNFullObsResNetModel
        >>> model = RNNFullObsResNetModel((3, 8, 8), 4, channels=8, downsample=False, batch_norm=False,
        ...                               value_support_size=5, reward_support_size=5, rnn_hidden_size=16)
        >>> root = model.search_root(torch.rand(2, 3, 8, 8))
        >>> root.state["latent"].shape, root.state["hidden"].shape
        (torch.Size([2, 8, 8, 8]), torch.Size([2, 16]))
        >>> child = model.search_step(root.state, torch.tensor([0, 3]))
        >>> child.state["latent"].shape, child.reward.shape, child.value.shape
        (torch.Size([2, 8, 8, 8]), torch.Size([2]), torch.Size([2]))
    """

    def __init__(self, observation_shape: Sequence[int], num_actions: int, rnn_hidden_size: int = 64,
                 **kwargs) -> None:
        super().__init__(observation_shape, num_actions, **kwargs)
        # MuZero's convolutional dynamics and hidden-less heads: replaced below
        for name in ("dynamics_conv", "dynamics_norm", "dynamics_net", "reward_head", "value_head", "policy_head"):
            delattr(self, name)
        batch_norm = bool(kwargs.get("batch_norm", True))
        zero_init = bool(kwargs.get("zero_init_heads", True))
        reward_widths = tuple(kwargs.get("fc_reward_layers", (32,)))
        self._build_recurrence(self.latent_shape, rnn_hidden_size, int(reward_widths[0]) if reward_widths else 32,
                               max(len(reward_widths), 1), zero_init)
        spatial = self.latent_shape[1] * self.latent_shape[2]
        self.value_head = _HiddenHead(self.channels, int(kwargs.get("reduced_channels_value", 16)), spatial,
                                      self.rnn_hidden_size, tuple(kwargs.get("fc_value_layers", (32,))),
                                      self.value_support.num_bins, batch_norm)
        self.policy_head = _HiddenHead(self.channels, int(kwargs.get("reduced_channels_policy", 16)), spatial,
                                       self.rnn_hidden_size, tuple(kwargs.get("fc_policy_layers", (32,))),
                                       self.num_actions, batch_norm)
        if zero_init:
            _zero_last(self.value_head)
            _zero_last(self.policy_head)

    def predict_hidden(self, latent: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.prediction_trunk(latent)
        return self.policy_head(x, hidden), self.value_head(x, hidden)
