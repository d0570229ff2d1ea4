"""EfficientZero's off-policy correction: shorter n-step horizons for older data.

An n-step return ``r_t + g r_{t+1} + ... + g^n v(t+n)`` sums rewards earned
by the policy that *collected* the data; the older that policy, the more
those rewards differ from what the current policy would earn. EfficientZero
(Ye et al., 2021, "off-policy correction") therefore bootstraps older samples
sooner, from a value that is itself fresh (the target model's, i.e. value
reanalyze). Its code takes the age of a sample from its position in the
buffer; here the age is counted in policy versions:

``age = max(current_version - policy_version(root), 0)``

``l = clip(n - floor(age / correction_age_scale), 1, n)``

so the horizon starts at ``n`` for fresh data and loses one step every
``correction_age_scale`` versions, never below one reward. Every unroll
position of a sample uses its root's horizon (EfficientZero does the same).
Rows without a policy version (stored as -1) count as fresh. LightZero's
EfficientZero has the correction commented out; the buffer's default is off.
"""
from __future__ import annotations

import torch

from torchrl_muzero.data.targets import ValueTargetPlan

__all__ = ["corrected_td_steps", "shorten_horizon"]


def corrected_td_steps(
    policy_version: torch.Tensor, current_version: int, td_steps: int, correction_age_scale: float
) -> torch.Tensor:
    """Per-sample horizons ``l`` ``[B]`` (long) from the roots' ``policy_version`` ``[B]``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.off_policy_correction import corrected_td_steps
        >>> # n = 5, one step shorter every 10 versions; -1: unknown version, fresh
        >>> corrected_td_steps(torch.tensor([100, 95, 90, 61, 0, -1]), 100, 5, 10.0).tolist()
        [5, 5, 4, 2, 1, 5]
    """
    if not correction_age_scale > 0:
        raise ValueError(f"correction_age_scale must be > 0, got {correction_age_scale!r}.")
    version = policy_version.long()
    age = torch.where(version >= 0, (int(current_version) - version).clamp_min(0), torch.zeros_like(version))
    shorter = torch.floor(age.double() / float(correction_age_scale)).long()
    return (td_steps - shorter).clamp(1, td_steps)


def shorten_horizon(plan: ValueTargetPlan, terminal: torch.Tensor, horizon: torch.Tensor) -> ValueTargetPlan:
    """``plan`` with each sample's n-step returns ending after at most ``horizon[b]`` rewards.

    ``terminal`` ``[B, K + n + 1]`` is the window's terminal flags (as given to
    :func:`~torchrl_muzero.data.plan_value_targets`): a return that now ends
    before the episode's terminal bootstraps there instead. The targets follow
    from :func:`~torchrl_muzero.data.value_targets` with the buffer's ``n``
    unchanged (it only sizes the reward windows).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import plan_value_targets, value_targets
        >>> from torchrl_muzero.data.off_policy_correction import shorten_horizon
        >>> exists = torch.ones(2, 4, dtype=torch.bool); terminal = torch.zeros_like(exists)
        >>> plan = plan_value_targets(exists, terminal, num_unroll_steps=0, td_steps=3)
        >>> short = shorten_horizon(plan, terminal, torch.tensor([3, 1]))
        >>> short.end.tolist()
        [[3], [1]]
        >>> # rewards 1, 1, 1, bootstrap value 10, discount 1: 1 + 1 + 1 + 10 and 1 + 10
        >>> value_targets(torch.ones(2, 4), short, torch.full((2, 1), 10.0), 1.0, 3).tolist()
        [[13.0], [11.0]]
    """
    k = torch.arange(plan.end.shape[1], device=plan.end.device)
    end = torch.minimum(plan.end, k.unsqueeze(0) + horizon.to(plan.end.device).unsqueeze(1))
    end = torch.where(plan.inside, end, plan.end)
    bootstrap = plan.inside & ~terminal.gather(1, end)
    return ValueTargetPlan(end, bootstrap, plan.inside, plan.absorbing)
