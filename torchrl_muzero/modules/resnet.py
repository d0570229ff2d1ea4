"""MuZero networks for image observations (Atari): downsampling + residual blocks.

The layout follows the MuZero paper's Atari network (appendix "Network
Architecture"): a strided stem shrinks a 96x96 frame stack to a 6x6 latent
image, residual towers implement the representation, dynamics and prediction
functions, and small convolution + MLP heads read out policy, value and reward
over categorical supports. Sizes default to the small configuration commonly
used for Atari MuZero (64 channels, one residual block per tower).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from torchrl_muzero.modules.model import MuZeroModel, scale_latent

__all__ = ["MuZeroResNetModel"]


def _norm(channels: int, batch_norm: bool) -> nn.Module:
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


def _conv_block(in_channels: int, out_channels: int, stride: int, batch_norm: bool) -> nn.Sequential:
    """3x3 convolution (padding 1), normalization, ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=not batch_norm),
        _norm(out_channels, batch_norm),
        nn.ReLU(),
    )


class _ResidualBlock(nn.Module):
    """Two 3x3 convolutions with a skip connection (pre-addition normalization)."""

    def __init__(self, channels: int, batch_norm: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=not batch_norm)
        self.norm1 = _norm(channels, batch_norm)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=not batch_norm)
        self.norm2 = _norm(channels, batch_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + x)


def _tower(channels: int, num_blocks: int, batch_norm: bool) -> nn.Sequential:
    return nn.Sequential(*(_ResidualBlock(channels, batch_norm) for _ in range(num_blocks)))


def _head(
    channels: int,
    reduced_channels: int,
    spatial: int,
    hidden: Sequence[int],
    out_dim: int,
    batch_norm: bool,
) -> nn.Sequential:
    """1x1 convolution to ``reduced_channels``, flatten, MLP to ``out_dim``.

    The MLP has no batch normalization so that it also runs on a batch of one
    in training mode.
    """
    modules: list[nn.Module] = [
        nn.Conv2d(channels, reduced_channels, 1, bias=not batch_norm),
        _norm(reduced_channels, batch_norm),
        nn.ReLU(),
        nn.Flatten(1),
    ]
    dim = reduced_channels * spatial
    for width in hidden:
        modules += [nn.Linear(dim, width), nn.ReLU()]
        dim = width
    modules.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*modules)


def _halve(size: int) -> int:
    # output size of a 3x3 kernel with stride 2 and padding 1 (conv or pool)
    return (size - 1) // 2 + 1


def _stem(in_channels: int, channels: int, downsample: bool, downsample_blocks: Sequence[int],
          batch_norm: bool) -> nn.Module:
    """MuZero Atari's strided stem (four stride-2 stages) or one 3x3 conv keeping ``H, W``."""
    if not downsample:
        return _conv_block(in_channels, channels, 1, batch_norm)
    half = channels // 2
    return nn.Sequential(
        _conv_block(in_channels, half, 2, batch_norm),
        _tower(half, downsample_blocks[0], batch_norm),
        _conv_block(half, channels, 2, batch_norm),
        _tower(channels, downsample_blocks[1], batch_norm),
        nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
        _tower(channels, downsample_blocks[2], batch_norm),
        nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    )


def _check_resnet(name: str, observation_shape: Sequence[int], channels: int, num_blocks: int,
                  num_prediction_blocks: int, downsample: bool, downsample_blocks: Sequence[int]
                  ) -> tuple[tuple[int, ...], tuple[int, ...], torch.Size]:
    """The ResNet models' shared argument checks: ``(observation_shape, downsample_blocks, latent_shape)``."""
    observation_shape = tuple(int(s) for s in observation_shape)
    if len(observation_shape) != 3 or min(observation_shape) < 1:
        raise ValueError(f"{name} expects observation_shape (C, H, W) with positive sizes, got {observation_shape}.")
    if channels < 2 and downsample:
        raise ValueError(f"channels must be >= 2 with downsample=True, got {channels}.")
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}.")
    if num_blocks < 0 or num_prediction_blocks < 0:
        raise ValueError(
            f"num_blocks and num_prediction_blocks must be >= 0, got {num_blocks} and {num_prediction_blocks}."
        )
    downsample_blocks = tuple(int(n) for n in downsample_blocks)
    if len(downsample_blocks) != 3 or min(downsample_blocks) < 0:
        raise ValueError(f"downsample_blocks must be 3 non-negative counts, got {downsample_blocks}.")
    _, height, width = observation_shape
    if downsample:
        for _ in range(4):
            height, width = _halve(height), _halve(width)
    return observation_shape, downsample_blocks, torch.Size((int(channels), height, width))


class MuZeroResNetModel(MuZeroModel):
    """MuZero model of residual convolution towers for image observations.

    Representation: ``observation * observation_scale`` -> (optional)
    downsampling stem -> ``num_blocks`` residual blocks -> per-sample min-max
    scaling to ``[0, 1]``.

    Stem (``downsample=True``, MuZero Atari): 3x3 conv stride 2 to
    ``channels // 2`` planes, ``downsample_blocks[0]`` residual blocks, 3x3
    conv stride 2 to ``channels`` planes, ``downsample_blocks[1]`` blocks, 3x3
    average pool stride 2, ``downsample_blocks[2]`` blocks, 3x3 average pool
    stride 2. Each stride-2 stage maps a side ``n`` to ``ceil(n / 2)``:
    96x96 -> 6x6, 84x84 -> 6x6, 64x64 -> 4x4. With ``downsample=False``
    (small boards) a single 3x3 convolution maps the observation to
    ``channels`` planes and keeps ``H, W``. :attr:`latent_shape` holds the
    resulting ``(channels, H', W')``.

    Dynamics: the latent is concatenated with an action plane filled with
    ``action / num_actions`` (as in MuZero Atari), a 3x3 convolution maps it
    back to ``channels`` planes and is added to the incoming latent (skip
    connection), then ``num_blocks`` residual blocks and min-max scaling give
    the next latent. The reward head reads the next latent: 1x1 conv to
    ``reduced_channels_reward`` planes, flatten, MLP with ``fc_reward_layers``
    hidden widths -> ``2 * reward_support_size + 1`` logits.

    Prediction: ``num_prediction_blocks`` residual blocks, then a value head
    and a policy head built like the reward head, giving
    ``2 * value_support_size + 1`` value logits and ``num_actions`` policy
    logits.

    Args:
        observation_shape: ``(C, H, W)`` of one observation, e.g.
            ``(4, 96, 96)`` for 4 stacked grayscale frames or ``(12, 96, 96)``
            for 4 stacked RGB frames.
        num_actions: number of discrete actions.
        channels: planes of the latent state (and of the residual towers).
        num_blocks: residual blocks of the representation and of the dynamics.
        num_prediction_blocks: residual blocks of the prediction trunk.
        downsample: use the strided stem (Atari); ``False`` for small boards.
        downsample_blocks: residual blocks at the stem's three resolutions.
        reduced_channels_reward / reduced_channels_value /
            reduced_channels_policy: planes of each head's 1x1 convolution.
        fc_reward_layers / fc_value_layers / fc_policy_layers: hidden widths
            of each head's MLP.
        value_support_size / reward_support_size: half-widths of the
            categorical supports (300 -> 601 bins, as in MuZero Atari).
        observation_scale: factor applied to every observation in
            :meth:`represent`, whatever its dtype (the base class casts
            integer observations to float first). The default ``1 / 255``
            maps raw pixel values (``uint8`` or float in ``[0, 255]``) to
            ``[0, 1]``; pass ``1.0`` for observations that are already
            normalized.
        batch_norm: use batch normalization after every convolution. The
            convolutional layers normalize over ``H x W`` too, so training
            mode also works on a batch of one; in ``eval()`` mode the running
            statistics are used and each sample's output is independent of
            the rest of the batch (the search calls the model one sample at
            a time).
        zero_init_heads: zero the last layer of the reward, value and policy
            heads so they start at uniform policy and zero value/reward.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules import MuZeroResNetModel
        >>> model = MuZeroResNetModel(observation_shape=(4, 96, 96), num_actions=6,
        ...                           channels=16, value_support_size=10,
        ...                           reward_support_size=10)
        >>> model.latent_shape
        torch.Size([16, 6, 6])
        >>> frames = torch.randint(0, 256, (2, 4, 96, 96), dtype=torch.uint8)
        >>> td = model.initial(TensorDict({"observation": frames}, [2]))
        >>> td["latent"].shape, td["policy_logits"].shape, td["value_logits"].shape
        (torch.Size([2, 16, 6, 6]), torch.Size([2, 6]), torch.Size([2, 21]))
        >>> td["action"] = torch.tensor([0, 5])
        >>> td = model.recurrent(td)
        >>> td["next_latent"].shape, td["reward"].shape, td["state_value"].shape
        (torch.Size([2, 16, 6, 6]), torch.Size([2]), torch.Size([2]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        channels: int = 64,
        num_blocks: int = 1,
        num_prediction_blocks: int = 1,
        downsample: bool = True,
        downsample_blocks: Sequence[int] = (1, 1, 1),
        reduced_channels_reward: int = 16,
        reduced_channels_value: int = 16,
        reduced_channels_policy: int = 16,
        fc_reward_layers: Sequence[int] = (32,),
        fc_value_layers: Sequence[int] = (32,),
        fc_policy_layers: Sequence[int] = (32,),
        value_support_size: int = 300,
        reward_support_size: int = 300,
        observation_scale: float = 1.0 / 255.0,
        batch_norm: bool = True,
        zero_init_heads: bool = True,
    ) -> None:
        observation_shape, downsample_blocks, latent_shape = _check_resnet(
            type(self).__name__, observation_shape, channels, num_blocks, num_prediction_blocks, downsample,
            downsample_blocks)
        super().__init__(observation_shape, num_actions, value_support_size, reward_support_size)
        self.channels = int(channels)
        self.downsample = bool(downsample)
        self.observation_scale = float(observation_scale)
        self.latent_shape = latent_shape
        spatial = latent_shape[1] * latent_shape[2]
        stem = _stem(observation_shape[0], channels, downsample, downsample_blocks, batch_norm)

        self.representation_net = nn.Sequential(stem, _tower(channels, num_blocks, batch_norm))

        # dynamics: (latent ++ action plane) -> conv -> + latent -> tower
        self.dynamics_conv = nn.Conv2d(channels + 1, channels, 3, padding=1, bias=not batch_norm)
        self.dynamics_norm = _norm(channels, batch_norm)
        self.dynamics_net = _tower(channels, num_blocks, batch_norm)
        self.reward_head = _head(
            channels, reduced_channels_reward, spatial, fc_reward_layers,
            self.reward_support.num_bins, batch_norm,
        )

        self.prediction_trunk = _tower(channels, num_prediction_blocks, batch_norm)
        self.value_head = _head(
            channels, reduced_channels_value, spatial, fc_value_layers,
            self.value_support.num_bins, batch_norm,
        )
        self.policy_head = _head(
            channels, reduced_channels_policy, spatial, fc_policy_layers,
            num_actions, batch_norm,
        )
        if zero_init_heads:
            for head in (self.reward_head, self.value_head, self.policy_head):
                nn.init.zeros_(head[-1].weight)
                nn.init.zeros_(head[-1].bias)

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        if self.observation_scale != 1.0:
            observation = observation * self.observation_scale
        return scale_latent(self.representation_net(observation))

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, _, height, width = latent.shape
        plane = (action.to(latent.dtype) / self.num_actions).view(batch, 1, 1, 1)
        x = torch.cat([latent, plane.expand(batch, 1, height, width)], dim=1)
        x = torch.relu(self.dynamics_norm(self.dynamics_conv(x)) + latent)
        next_latent = scale_latent(self.dynamics_net(x))
        return next_latent, self.reward_head(next_latent)

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.prediction_trunk(latent)
        return self.policy_head(x), self.value_head(x)

    def recurrent_inference(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like :meth:`MuZeroModel.recurrent_inference`, also checking ``latent [B, *latent_shape]``."""
        if latent.ndim != 4 or latent.shape[1:] != self.latent_shape:
            raise ValueError(
                f"MuZeroResNetModel expects latents of shape "
                f"[batch, {', '.join(map(str, self.latent_shape))}], got {tuple(latent.shape)}."
            )
        return super().recurrent_inference(latent, action)

    def extra_repr(self) -> str:
        return (
            f"observation_shape={tuple(self.observation_shape)}, num_actions={self.num_actions}, "
            f"latent_shape={tuple(self.latent_shape)}, observation_scale={self.observation_scale:g}"
        )
