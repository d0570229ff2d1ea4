"""UniZero's action tokens: discrete indices through a table, or float (box) actions through a linear map.

:class:`~torchrl_muzero.modules.unizero.UniZeroModel` takes ``action_dim``
as :class:`~torchrl_muzero.modules.MuZeroMLPModel` does: ``None`` for
discrete actions (indices ``[...]``, int64, ``-1`` where a node state's slot
is unused) and ``D`` for a box (floats ``[..., D]``, zeros where unused).
A discrete token is ``nn.Embedding(num_actions, E)[a]``; a continuous one is
``nn.Linear(D, E)(a)``, LightZero's sampled UniZero's action embedding (a
table cannot index a float). These helpers keep the model's token, packing
and check code one path for both kinds; the discrete path is the same ops as
before ``action_dim`` existed (the golden tests pin it).

Examples:
    >>> import torch
    >>> from torchrl_muzero.modules.unizero import UniZeroModel
    >>> from torchrl_muzero.modules.unizero.actions import action_shape, no_actions
    >>> model = UniZeroModel((3,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5, action_dim=1)
    >>> type(model.action_embedding).__name__, action_shape(model)
    ('Linear', (1,))
    >>> no_actions(model, (2, 3), torch.device("cpu")).shape     # zeros: an unused float action
    torch.Size([2, 3, 1])
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["action_embedding", "action_shape", "check_action_dim", "check_actions", "no_actions", "pack_actions"]


def check_action_dim(action_dim: int | None) -> None:
    """Refuse an ``action_dim`` that is neither ``None`` nor an integer ``>= 1``."""
    if action_dim is not None and (isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1):
        raise ValueError(f"action_dim must be None (discrete actions) or an integer >= 1, got {action_dim!r}.")


def action_embedding(num_actions: int, action_dim: int | None, embed_dim: int) -> nn.Module:
    """The action token's module: a table over ``num_actions`` indices, or a linear map of ``D`` floats."""
    if action_dim is None:
        return nn.Embedding(num_actions, embed_dim)
    return nn.Linear(action_dim, embed_dim)


def action_shape(model) -> tuple[int, ...]:
    """The shape of one action: ``()`` (an index) or ``(D,)``."""
    return () if model.action_dim is None else (model.action_dim,)


def no_actions(model, lead: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Unused action slots ``[*lead(, D)]``: ``-1`` indices, or float zeros (never read: causality)."""
    if model.action_dim is None:
        return torch.full(lead, -1, dtype=torch.long, device=device)
    return torch.zeros((*lead, model.action_dim), device=device)


def check_actions(model, actions: torch.Tensor, lead: tuple[int, ...], name: str) -> None:
    """A continuous model's ``actions`` must be floats ``[*lead, D]`` (a discrete one's are read as indices)."""
    if model.action_dim is None:
        return
    if tuple(actions.shape) != (*lead, model.action_dim) or not actions.dtype.is_floating_point:
        raise ValueError(f"{type(model).__name__} (action_dim={model.action_dim}) expects float {name} "
                         f"{[*lead, model.action_dim]}, got {tuple(actions.shape)} of dtype {actions.dtype}.")


def pack_actions(model, actions: torch.Tensor, src: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``actions [B, K(, D)]`` gathered at ``src [B, K]`` along the steps, unused (``~keep``) where not kept."""
    if model.action_dim is None:
        return torch.where(keep, actions.long().gather(1, src), -1)
    packed = actions.gather(1, src[..., None].expand(*src.shape, model.action_dim))
    return torch.where(keep[..., None], packed, 0.0)
