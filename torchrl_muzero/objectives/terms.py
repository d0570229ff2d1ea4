"""Pieces shared by the unrolled losses: the gradient scale, one loss term, SimSiam heads."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

__all__ = [
    "LossTerm", "default_predictor", "default_projector", "latent_numel", "scale_gradient", "write_priority",
]


def scale_gradient(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the backward gradient by ``scale``.

    ``scale_gradient(x, s) = x * s + x.detach() * (1 - s)`` (MuZero appendix G).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.objectives import scale_gradient
        >>> x = torch.ones(3, requires_grad=True)
        >>> y = scale_gradient(x, 0.5)
        >>> torch.equal(y, x)
        True
        >>> y.sum().backward()
        >>> x.grad
        tensor([0.5000, 0.5000, 0.5000])
    """
    if scale == 1.0:
        return tensor
    return tensor * scale + tensor.detach() * (1.0 - scale)


@dataclass
class LossTerm:
    """One per-step loss term: per-sample, per-position values and where they count.

    Attributes:
        values: ``[B, K+1]`` (positions ``0..K``) or ``[B, K]`` (positions
            ``1..K``, the unrolled ones) unweighted per-position losses.
            Values at masked positions must be finite (replace their targets
            by zeros before computing them): they are multiplied by 0.
        mask: bool ``[B, K+1]`` or ``[B, K]`` like ``values``: the positions
            that have a target.

    :meth:`UnrolledModelLoss._reduce_terms` turns a term into one scalar (or
    ``[B]`` with ``reduction="none"``): masked sum over the positions with the
    root counting 1 and each unrolled position ``1 / K``, times the sample's
    importance weight, reduced over the batch, times ``<name>_loss_weight``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.objectives import LossTerm
        >>> term = LossTerm(torch.ones(2, 3), torch.tensor([[True, True, False], [True, False, False]]))
        >>> term.values.shape == term.mask.shape
        True
    """

    values: torch.Tensor
    mask: torch.Tensor


def default_projector(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Module:
    """The consistency term's projector: Flatten-Linear-LayerNorm-ReLU-Linear-LayerNorm."""
    # LayerNorm rather than SimSiam's BatchNorm: it behaves the same in train and
    # eval mode and does not fail on a batch of one.
    return nn.Sequential(
        nn.Flatten(1),
        nn.Linear(in_dim, hidden_dim),
        nn.LayerNorm(hidden_dim),
        nn.ReLU(),
        nn.Linear(hidden_dim, out_dim),
        nn.LayerNorm(out_dim),
    )


def default_predictor(dim: int, hidden_dim: int) -> nn.Module:
    """The consistency term's predictor: Linear-LayerNorm-ReLU-Linear."""
    return nn.Sequential(
        nn.Linear(dim, hidden_dim),
        nn.LayerNorm(hidden_dim),
        nn.ReLU(),
        nn.Linear(hidden_dim, dim),
    )


def latent_numel(model: nn.Module) -> int:
    """Size of one flattened latent of ``model``, found by one representation pass.

    The model's train / eval modes are restored afterwards (no batch-norm
    statistics update, no batch-of-one failure).
    """
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            latent = model.initial_inference(torch.zeros(1, *model.observation_shape, device=device))[0]
    finally:
        for module, mode in modes.items():
            module.training = mode
    return int(latent[0].numel())


def write_priority(tensordict: TensorDictBase, key: NestedKey, priority: torch.Tensor, name: str) -> None:
    """Write ``priority [B]`` under ``key``: ``[B]`` for a batch size ``[B]`` (or ``[]``),
    else broadcast over the tensordict's batch shape (e.g. ``[B, K+1]``, rows constant)."""
    batch_size = tensordict.batch_size
    B = priority.shape[0]
    if len(batch_size) == 0:
        tensordict.set(key, priority)
        return
    if batch_size[0] != B:
        raise ValueError(
            f"{name}: cannot write priorities [{B}] into a tensordict of batch size {tuple(batch_size)}."
        )
    value = priority.reshape(B, *([1] * (len(batch_size) - 1))).expand(batch_size)
    tensordict.set(key, value.contiguous())
