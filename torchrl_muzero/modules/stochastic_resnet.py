"""Stochastic MuZero for image observations (Atari): the five functions as residual towers.

Built from :mod:`torchrl_muzero.modules.resnet`'s blocks (3x3 conv blocks,
residual blocks, towers and the 1x1-conv + MLP heads). Afterstates and states
are latent images of the same shape ``(channels, H', W')``, as the search's
shared ``"latent"`` entry requires
(:class:`~torchrl_muzero.modules.StochasticMuZeroModel`).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from torchrl_muzero.modules.model import scale_latent
from torchrl_muzero.modules.resnet import _check_resnet, _conv_block, _head, _norm, _stem, _tower
from torchrl_muzero.modules.stochastic import StochasticMuZeroModel

__all__ = ["StochasticMuZeroResNetModel"]


class _PlaneDynamics(nn.Module):
    """``(latent planes ++ extra planes) -> 3x3 conv -> norm -> + latent -> ReLU -> tower -> min-max``.

    MuZero ResNet's dynamics trunk, with ``extra`` input planes (1 action
    plane for ``phi``, ``C`` one-hot code planes for ``g``).
    """

    def __init__(self, channels: int, extra: int, num_blocks: int, batch_norm: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels + extra, channels, 3, padding=1, bias=not batch_norm)
        self.norm = _norm(channels, batch_norm)
        self.tower = _tower(channels, num_blocks, batch_norm)

    def forward(self, latent: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
        x = torch.cat([latent, planes.to(latent.dtype)], dim=1)
        x = torch.relu(self.norm(self.conv(x)) + latent)
        return scale_latent(self.tower(x))


class StochasticMuZeroResNetModel(StochasticMuZeroModel):
    """Stochastic MuZero of residual convolution towers for image observations (Atari).

    * representation ``h``: :class:`~torchrl_muzero.modules.MuZeroResNetModel`'s
      (``observation * observation_scale``, strided stem when ``downsample``,
      ``num_blocks`` residual blocks, per-sample min-max scaling);
    * prediction ``f``: MuZero's (``num_prediction_blocks`` blocks, policy and
      value heads);
    * afterstate dynamics ``phi``: latent ++ an action plane filled with
      ``action / num_actions``, 3x3 conv added to the latent, ``num_blocks``
      blocks, min-max scaling -> afterstate planes of the latent's shape;
    * afterstate prediction ``psi``: ``num_prediction_blocks`` blocks, then a
      chance head (``C`` logits ``sigma``) and a Q head (value support logits);
    * dynamics ``g``: afterstate ++ the code as ``C`` constant planes (one-hot),
      3x3 conv added to the afterstate, ``num_blocks`` blocks, min-max scaling
      -> next latent; the reward head reads the next latent;
    * chance encoder ``e``: ``(o_t, o_{t+1})`` scaled and stacked along the
      channels (``2 * C_obs`` planes), the representation's stem layout
      (without its residual blocks when ``downsample``: two stride-2 3x3 conv
      blocks, two stride-2 average pools; one 3x3 conv block otherwise), then
      a head (1x1 conv to ``reduced_channels_chance`` planes, flatten, MLP of
      ``fc_chance_layers``) to ``C`` logits; the base class's
      :meth:`~StochasticMuZeroModel.encode_chance` turns them into a
      straight-through one-hot code.

    Args:
        observation_shape: ``(C_obs, H, W)``, e.g. ``(4, 96, 96)``.
        num_actions: ``A``.
        chance_space_size: ``C``, the number of chance codes.
        channels / num_blocks / num_prediction_blocks / downsample /
            downsample_blocks / reduced_channels_* / fc_*_layers /
            value_support_size / reward_support_size / observation_scale /
            batch_norm: as :class:`~torchrl_muzero.modules.MuZeroResNetModel`
            (the ``value`` settings also shape the Q head, the ``policy``
            ones the chance head ``sigma``).
        reduced_channels_chance / fc_chance_layers: the chance encoder's head.
        zero_init_heads: zero the last layer of the reward, value, Q and
            policy heads. The chance heads (``sigma`` and the encoder) are not
            zeroed: a zero encoder picks code 0 for every input.
        discount: the search discount of the chance-to-decision edges when a
            search does not pass its own.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import StochasticMuZeroResNetModel
        >>> model = StochasticMuZeroResNetModel((4, 96, 96), num_actions=6, chance_space_size=4,
        ...                                     channels=8, value_support_size=5, reward_support_size=5)
        >>> model.latent_shape
        torch.Size([8, 6, 6])
        >>> frames = torch.randint(0, 256, (2, 4, 96, 96), dtype=torch.uint8)
        >>> latent, policy_logits, value_logits = model.initial_inference(frames)
        >>> afterstate, chance_logits, q_logits = model.afterstate_inference(latent, torch.tensor([0, 5]))
        >>> afterstate.shape, chance_logits.shape, q_logits.shape
        (torch.Size([2, 8, 6, 6]), torch.Size([2, 4]), torch.Size([2, 11]))
        >>> code, probs = model.encode_chance(frames, torch.randint(0, 256, (2, 4, 96, 96), dtype=torch.uint8))
        >>> code.detach().sum(-1)
        tensor([1., 1.])
        >>> next_latent, reward_logits, policy_logits, value_logits = model.chance_inference(afterstate, code)
        >>> next_latent.shape, reward_logits.shape, policy_logits.shape
        (torch.Size([2, 8, 6, 6]), torch.Size([2, 11]), torch.Size([2, 6]))
        >>> _ = model.eval()
        >>> root = model.search_root(frames)
        >>> root.policy_logits.shape, root.state["latent"].shape
        (torch.Size([2, 10]), torch.Size([2, 8, 6, 6]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        chance_space_size: int = 32,
        channels: int = 64,
        num_blocks: int = 1,
        num_prediction_blocks: int = 1,
        downsample: bool = True,
        downsample_blocks: Sequence[int] = (1, 1, 1),
        reduced_channels_reward: int = 16,
        reduced_channels_value: int = 16,
        reduced_channels_policy: int = 16,
        reduced_channels_chance: int = 16,
        fc_reward_layers: Sequence[int] = (32,),
        fc_value_layers: Sequence[int] = (32,),
        fc_policy_layers: Sequence[int] = (32,),
        fc_chance_layers: Sequence[int] = (32,),
        value_support_size: int = 300,
        reward_support_size: int = 300,
        observation_scale: float = 1.0 / 255.0,
        batch_norm: bool = True,
        zero_init_heads: bool = True,
        discount: float = 0.997,
    ) -> None:
        observation_shape, downsample_blocks, latent_shape = _check_resnet(
            type(self).__name__, observation_shape, channels, num_blocks, num_prediction_blocks, downsample,
            downsample_blocks)
        super().__init__(
            observation_shape, num_actions, value_support_size, reward_support_size, chance_space_size, discount
        )
        A, C = self.num_actions, self.chance_space_size
        self.channels = int(channels)
        self.downsample = bool(downsample)
        self.observation_scale = float(observation_scale)

        in_channels = observation_shape[0]
        self.latent_shape = latent_shape
        spatial = latent_shape[1] * latent_shape[2]
        value_bins, reward_bins = self.value_support.num_bins, self.reward_support.num_bins

        # h and f: MuZero's
        self.representation_net = nn.Sequential(
            _stem(in_channels, channels, downsample, downsample_blocks, batch_norm),
            _tower(channels, num_blocks, batch_norm),
        )
        self.prediction_trunk = _tower(channels, num_prediction_blocks, batch_norm)
        self.value_head = _head(channels, reduced_channels_value, spatial, fc_value_layers, value_bins, batch_norm)
        self.policy_head = _head(channels, reduced_channels_policy, spatial, fc_policy_layers, A, batch_norm)
        # phi and psi
        self.afterstate_net = _PlaneDynamics(channels, 1, num_blocks, batch_norm)
        self.afterstate_trunk = _tower(channels, num_prediction_blocks, batch_norm)
        self.chance_head = _head(channels, reduced_channels_policy, spatial, fc_policy_layers, C, batch_norm)
        self.afterstate_value_head = _head(
            channels, reduced_channels_value, spatial, fc_value_layers, value_bins, batch_norm
        )
        # g
        self.dynamics_net = _PlaneDynamics(channels, C, num_blocks, batch_norm)
        self.reward_head = _head(channels, reduced_channels_reward, spatial, fc_reward_layers, reward_bins, batch_norm)
        # e: the stem's layout without its residual blocks, then a head to C logits
        self.chance_encoder = nn.Sequential(
            _stem(2 * in_channels, channels, downsample, (0, 0, 0), batch_norm),
            _head(channels, reduced_channels_chance, spatial, fc_chance_layers, C, batch_norm),
        )
        if zero_init_heads:
            for head in (self.reward_head, self.value_head, self.policy_head, self.afterstate_value_head):
                nn.init.zeros_(head[-1].weight)
                nn.init.zeros_(head[-1].bias)

    # -- the five functions ---------------------------------------------------
    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        if self.observation_scale != 1.0:
            observation = observation * self.observation_scale
        return scale_latent(self.representation_net(observation))

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.prediction_trunk(latent)
        return self.policy_head(x), self.value_head(x)

    def afterstate_dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = latent.shape
        plane = (action.to(latent.dtype) / self.num_actions).view(batch, 1, 1, 1)
        return self.afterstate_net(latent, plane.expand(batch, 1, height, width))

    def afterstate_prediction(self, afterstate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.afterstate_trunk(afterstate)
        return self.chance_head(x), self.afterstate_value_head(x)

    def chance_dynamics(self, afterstate: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, _, height, width = afterstate.shape
        planes = code.to(afterstate.dtype)[:, :, None, None].expand(batch, self.chance_space_size, height, width)
        next_latent = self.dynamics_net(afterstate, planes)
        return next_latent, self.reward_head(next_latent)

    def chance_encoder_logits(self, observation: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
        x = torch.cat([observation, next_observation], dim=1)
        if self.observation_scale != 1.0:
            x = x * self.observation_scale
        return self.chance_encoder(x)

    # -- checks ---------------------------------------------------------------
    def check_latent(self, latent: torch.Tensor, what: str = "latents") -> None:
        """Raise ``ValueError`` unless ``latent`` is ``[B, *latent_shape]``."""
        if latent.ndim != 4 or latent.shape[1:] != self.latent_shape:
            raise ValueError(
                f"{type(self).__name__} expects {what} of shape "
                f"[batch, {', '.join(map(str, self.latent_shape))}], got {tuple(latent.shape)}."
            )

    def afterstate_inference(self, latent: torch.Tensor, action: torch.Tensor):
        """As :meth:`StochasticMuZeroModel.afterstate_inference`, also checking ``latent [B, *latent_shape]``."""
        self.check_latent(latent)
        return super().afterstate_inference(latent, action)

    def chance_inference(self, afterstate: torch.Tensor, code: torch.Tensor):
        """As :meth:`StochasticMuZeroModel.chance_inference`, also checking ``afterstate [B, *latent_shape]``."""
        self.check_latent(afterstate, "afterstates")
        return super().chance_inference(afterstate, code)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor):
        """As :meth:`MuZeroModel.recurrent_inference` (``phi``, then ``g`` with ``argmax sigma``), checking the latent."""
        self.check_latent(latent)
        return super().recurrent_inference(latent, action)

    def extra_repr(self) -> str:
        return (
            f"observation_shape={tuple(self.observation_shape)}, num_actions={self.num_actions}, "
            f"chance_space_size={self.chance_space_size}, latent_shape={tuple(self.latent_shape)}, "
            f"observation_scale={self.observation_scale:g}"
        )
