"""UniZero's tokenizer: one observation -> ONE latent token of ``embed_dim``.

Vectors go through an MLP; frames through the MuZero ResNet representation
(:class:`~torchrl_muzero.modules.MuZeroResNetModel`'s downsampling stem and
residual tower, reused as it is) and a linear projection of the flattened
feature map. Both end with the latent normalisation (:mod:`.norm`) so the
token has the same scale as the transformer's predicted next latent.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from torchrl_muzero.modules.resnet import MuZeroResNetModel
from torchrl_muzero.modules.unizero.norm import make_latent_norm

__all__ = ["MLPEncoder", "ResNetEncoder"]


class MLPEncoder(nn.Module):
    """Flat observation -> ``embed_dim`` latent token (MLP, then SimNorm or LayerNorm).

    Args:
        observation_shape: shape of one observation, e.g. ``(4,)``.
        embed_dim: size of the latent token (the transformer's width).
        hidden_dim: width of the hidden layers.
        num_layers: hidden layers (ReLU).
        latent_norm: ``"simnorm"`` or ``"layernorm"``.
        simnorm_dim: group size of SimNorm.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import MLPEncoder
        >>> enc = MLPEncoder((4,), embed_dim=16, hidden_dim=32, simnorm_dim=8)
        >>> z = enc(torch.randn(3, 4))
        >>> z.shape, torch.allclose(z.view(3, 2, 8).sum(-1), torch.ones(3, 2))
        (torch.Size([3, 16]), True)
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        embed_dim: int = 64,
        hidden_dim: int = 128,
        num_layers: int = 1,
        latent_norm: str = "simnorm",
        simnorm_dim: int = 8,
    ) -> None:
        super().__init__()
        self.observation_shape = torch.Size(observation_shape)
        self.embed_dim = int(embed_dim)
        dim = int(self.observation_shape.numel())
        layers: list[nn.Module] = []
        for _ in range(num_layers):
            layers += [nn.Linear(dim, hidden_dim), nn.ReLU()]
            dim = hidden_dim
        layers.append(nn.Linear(dim, embed_dim))
        self.net = nn.Sequential(*layers)
        self.norm = make_latent_norm(latent_norm, embed_dim, simnorm_dim)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """``[N, *observation_shape]`` -> ``[N, embed_dim]``."""
        return self.norm(self.net(observation.flatten(1).float()))


class ResNetEncoder(nn.Module):
    """Frames -> ``embed_dim`` latent token: MuZero's ResNet representation, a projection, the norm.

    Args:
        observation_shape: ``(C, H, W)``.
        embed_dim: size of the latent token.
        channels / num_blocks / downsample / batch_norm / observation_scale:
            as in :class:`~torchrl_muzero.modules.MuZeroResNetModel`, whose
            ``representation_net`` is taken as it is (its min-max latent
            scaling is not applied: the latent norm plays that role here).
        latent_norm / simnorm_dim: the output normalisation.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.unizero import ResNetEncoder
        >>> enc = ResNetEncoder((3, 64, 64), embed_dim=32, channels=8)
        >>> enc(torch.rand(2, 3, 64, 64) * 255).shape
        torch.Size([2, 32])
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        embed_dim: int = 64,
        channels: int = 64,
        num_blocks: int = 1,
        downsample: bool = True,
        batch_norm: bool = True,
        observation_scale: float = 1.0 / 255.0,
        latent_norm: str = "simnorm",
        simnorm_dim: int = 8,
    ) -> None:
        super().__init__()
        self.observation_shape = torch.Size(observation_shape)
        self.embed_dim = int(embed_dim)
        self.observation_scale = float(observation_scale)
        # Build a MuZero ResNet only to take its representation tower: the same stem and
        # blocks as the MuZero models, without a second copy of that code.
        resnet = MuZeroResNetModel(
            observation_shape, 1, channels=channels, num_blocks=num_blocks, downsample=downsample,
            batch_norm=batch_norm, value_support_size=1, reward_support_size=1,
        )
        self.representation_net = resnet.representation_net
        self.feature_shape = resnet.latent_shape
        self.projection = nn.Linear(int(self.feature_shape.numel()), embed_dim)
        self.norm = make_latent_norm(latent_norm, embed_dim, simnorm_dim)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W]`` -> ``[N, embed_dim]``."""
        x = observation.float()
        if self.observation_scale != 1.0:
            x = x * self.observation_scale
        return self.norm(self.projection(self.representation_net(x).flatten(1)))
