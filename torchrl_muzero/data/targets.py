"""MuZero's n-step value and reward targets along sampled trajectory windows.

The buffer walks each sampled root ``t`` forward ``J = K + n + 1`` positions
(``K`` unroll steps, ``n`` TD steps) and hands these functions plain
``[B, J]`` tensors:

* ``exists[:, j]``: the observation at ``t + j`` is stored (a prefix of True);
  the last existing position is ``last``;
* ``terminal[:, j]``: ``t + j`` is the terminal observation of an episode that
  *terminated* (nothing follows: positions after it are absorbing, with zero
  reward and value); a chain that stops anywhere else (truncation, end of the
  stored data) has an unknown future;
* ``rewards[:, j]``: the reward of the transition ``t + j -> t + j + 1``.

For an unroll position ``k`` the value target is

``z_k = sum_{i=k}^{e-1} g^(i-k) r_i + g^(e-k) v(t+e)``, ``e = min(k + n, last)``,

where the bootstrap ``v`` is dropped at a terminal observation and
``g = discount`` (``-discount`` in two-player zero-sum games, where rewards
are the mover's and values are the view of the player to move: each ply
flips the sign). Truncation and the end of stored data shorten the horizon
and bootstrap from the last stored observation.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["ValueTargetPlan", "plan_value_targets", "value_targets", "reward_targets"]


class ValueTargetPlan(NamedTuple):
    """Where each unroll position's n-step return ends.

    Attributes:
        end: ``[B, K+1]`` long, the position ``e`` of the bootstrap.
        bootstrap: ``[B, K+1]`` bool, whether ``v(t + e)`` enters the target
            (False past the stored data, at a terminal observation).
        inside: ``[B, K+1]`` bool, position ``k`` is stored (``k <= last``).
        absorbing: ``[B, K+1]`` bool, position ``k`` lies after a terminal
            observation (targets are exactly 0 there).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import plan_value_targets
        >>> # K = 2, n = 1: the root's episode terminates one step later
        >>> exists = torch.tensor([[True, True, False, False]])
        >>> terminal = torch.tensor([[False, True, False, False]])
        >>> plan = plan_value_targets(exists, terminal, num_unroll_steps=2, td_steps=1)
        >>> plan.inside.tolist(), plan.absorbing.tolist()
        ([[True, True, False]], [[False, False, True]])
    """

    end: torch.Tensor
    bootstrap: torch.Tensor
    inside: torch.Tensor
    absorbing: torch.Tensor


def _check(exists: torch.Tensor, terminal: torch.Tensor, num_unroll_steps: int, td_steps: int) -> None:
    if num_unroll_steps < 0 or td_steps < 1:
        raise ValueError(f"need num_unroll_steps >= 0 and td_steps >= 1, got {num_unroll_steps}, {td_steps}.")
    j = num_unroll_steps + td_steps + 1
    if exists.ndim != 2 or exists.shape[1] != j or terminal.shape != exists.shape:
        raise ValueError(
            f"exists / terminal must be [B, K + n + 1 = {j}], got {tuple(exists.shape)} and {tuple(terminal.shape)}."
        )
    if exists.numel() and not bool(exists[:, 0].all()):
        raise ValueError("the root position (column 0 of exists) must exist.")


def plan_value_targets(
    exists: torch.Tensor, terminal: torch.Tensor, num_unroll_steps: int, td_steps: int
) -> ValueTargetPlan:
    """Find the bootstrap position of every unroll position (see the module doc).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.targets import plan_value_targets
        >>> # K = 1, n = 2: positions 0..3; the episode terminates at position 2
        >>> exists = torch.tensor([[True, True, True, False]])
        >>> terminal = torch.tensor([[False, False, True, False]])
        >>> plan = plan_value_targets(exists, terminal, num_unroll_steps=1, td_steps=2)
        >>> plan.end.tolist(), plan.bootstrap.tolist()
        ([[2, 2]], [[False, False]])
    """
    _check(exists, terminal, num_unroll_steps, td_steps)
    B, J = exists.shape
    K = num_unroll_steps
    device = exists.device
    last = exists.long().sum(1) - 1  # exists is a prefix
    k = torch.arange(K + 1, device=device)
    inside = k.unsqueeze(0) <= last.unsqueeze(1)
    end = torch.minimum(k.unsqueeze(0) + td_steps, last.unsqueeze(1))
    end = torch.where(inside, end, last.unsqueeze(1))
    end_terminal = terminal.gather(1, end)
    bootstrap = inside & ~end_terminal
    ends_terminal = terminal.gather(1, last.unsqueeze(1))  # [B, 1]
    absorbing = ~inside & ends_terminal
    return ValueTargetPlan(end, bootstrap, inside, absorbing)


def value_targets(
    rewards: torch.Tensor,
    plan: ValueTargetPlan,
    bootstrap_values: torch.Tensor,
    discount: float,
    td_steps: int,
    two_player: bool = False,
) -> torch.Tensor:
    """n-step value targets ``[B, K+1]`` (0 wherever ``plan.inside`` is False).

    Args:
        rewards: ``[B, K + n + 1]`` reward of the transition leaving each position.
        plan: from :func:`plan_value_targets`.
        bootstrap_values: ``[B, K+1]``, ``v(t + plan.end[:, k])`` from the point
            of view of the player to move there (ignored where
            ``plan.bootstrap`` is False; may hold anything there, even NaN).
        discount: ``gamma``.
        td_steps: ``n``.
        two_player: rewards and values alternate perspective every ply.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.targets import plan_value_targets, value_targets
        >>> exists = torch.ones(1, 4, dtype=torch.bool)
        >>> terminal = torch.zeros(1, 4, dtype=torch.bool)
        >>> plan = plan_value_targets(exists, terminal, num_unroll_steps=1, td_steps=2)
        >>> rewards = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
        >>> # z_0 = 1 + 0.5 * 2 + 0.25 * v(2);  z_1 = 2 + 0.5 * 3 + 0.25 * v(3)
        >>> value_targets(rewards, plan, torch.tensor([[4.0, 8.0]]), discount=0.5, td_steps=2).tolist()
        [[3.0, 5.5]]
    """
    B, K1 = plan.end.shape
    J = rewards.shape[1]
    if rewards.ndim != 2 or J != K1 + td_steps or rewards.shape[0] != B:
        raise ValueError(f"rewards must be [B={B}, K + n + 1 = {K1 + td_steps}], got {tuple(rewards.shape)}.")
    if bootstrap_values.shape != plan.end.shape:
        raise ValueError(f"bootstrap_values must be [B, K+1] = {tuple(plan.end.shape)}, got {tuple(bootstrap_values.shape)}.")
    g = -float(discount) if two_player else float(discount)
    dtype = torch.float64
    device = rewards.device
    k = torch.arange(K1, device=device)
    i = torch.arange(td_steps, device=device)
    # windows[b, k, i] = rewards[b, k + i]
    windows = rewards.to(dtype).unfold(1, td_steps, 1)[:, :K1]
    in_horizon = (k.view(1, K1, 1) + i.view(1, 1, td_steps)) < plan.end.unsqueeze(-1)
    in_horizon &= plan.inside.unsqueeze(-1)
    powers = g ** i.to(dtype)
    returns = torch.where(in_horizon, windows * powers, torch.zeros((), dtype=dtype, device=device)).sum(-1)
    steps = (plan.end - k.unsqueeze(0)).clamp_min(0).to(dtype)
    boot = torch.where(
        plan.bootstrap,
        torch.full_like(steps, g).pow(steps) * bootstrap_values.to(dtype),
        torch.zeros((), dtype=dtype, device=device),
    )
    out = torch.where(plan.inside, returns + boot, torch.zeros((), dtype=dtype, device=device))
    return out.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def reward_targets(rewards: torch.Tensor, plan: ValueTargetPlan) -> torch.Tensor:
    """Reward targets ``[B, K+1]``: the reward of the transition into position ``k``.

    Index 0 is 0; positions after a terminal observation (absorbing) and
    positions past the stored data are 0.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.targets import plan_value_targets, reward_targets
        >>> exists = torch.tensor([[True, True, False, False]])
        >>> terminal = torch.tensor([[False, True, False, False]])
        >>> plan = plan_value_targets(exists, terminal, num_unroll_steps=2, td_steps=1)
        >>> reward_targets(torch.tensor([[5.0, 0.0, 0.0, 0.0]]), plan).tolist()
        [[0.0, 5.0, 0.0]]
    """
    B, K1 = plan.inside.shape
    out = torch.zeros(B, K1, dtype=rewards.dtype if rewards.is_floating_point() else torch.float32, device=rewards.device)
    if K1 > 1:
        out[:, 1:] = torch.where(plan.inside[:, 1:], rewards[:, : K1 - 1].to(out.dtype), torch.zeros((), dtype=out.dtype, device=out.device))
    return out
