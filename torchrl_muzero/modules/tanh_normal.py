"""A tanh-squashed Gaussian policy over a box ``[low, high]^D``: a continuous sampled model's policy head.

The sampled MuZero family (Hubert et al. 2021) searches over ``K`` actions
drawn from the policy at each node, and its loss is the cross-entropy of the
visit distribution against ``log pi`` of those stored actions
(:meth:`~torchrl_muzero.modules.policy_distribution.PolicyDistribution.cross_entropy_at`).
So the continuous policy must draw actions reproducibly (an explicit
generator), give the log-density of a stored action exactly as the search saw
it, and estimate its entropy (no closed form: Monte-Carlo).

The env action is ``a = low + (tanh(u) + 1) / 2 * (high - low)`` with
``u ~ N(loc, scale)`` per dimension, and

``log pi(a) = sum_d [log N(u_d; loc_d, scale_d) - log(1 - tanh(u_d)^2) - log((high_d - low_d) / 2)]``

summed over the ``D`` dimensions in log space. (LightZero's sampled
EfficientZero tree subtracts ``log sum_d (1 - tanh^2)``, a sum inside the log:
wrong for ``D > 1``.)
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from torchrl_muzero.modules.policy_distribution import PolicyDistribution

__all__ = ["MIN_SCALE", "PRE_TANH_BOUND", "SQUASHED_BOUND", "TanhNormalPolicy"]

#: ``|tanh(u)|`` never exceeds this: a stored action stays strictly inside ``[low, high]``
#: (by ``(high - low) * 5e-4``), so ``atanh`` of it is finite when the learner recomputes ``log pi``.
SQUASHED_BOUND: float = 1.0 - 1e-3
#: ``c = atanh(1 - 1e-3)`` (about 3.8): samples clamp the pre-tanh ``u`` to ``[-c, c]`` and
#: :meth:`TanhNormalPolicy.log_prob` clamps ``y = tanh(u)`` to ``[-tanh(c), tanh(c)]``: the same bound.
PRE_TANH_BOUND: float = math.atanh(SQUASHED_BOUND)
#: The floor :meth:`TanhNormalPolicy.from_params` adds to a learned scale (``softplus(raw) + MIN_SCALE``).
MIN_SCALE: float = 1e-3

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _log_one_minus_tanh_sq(u: torch.Tensor) -> torch.Tensor:
    # log(1 - tanh(u)^2) without forming 1 - tanh^2, which rounds to 0 for |u| > ~9 in float32
    return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))


class TanhNormalPolicy(PolicyDistribution):
    """A diagonal Gaussian squashed by ``tanh`` into the box ``[low, high]^D``.

    Args:
        loc: ``[..., D]`` mean of the pre-tanh Gaussian (unbounded).
        scale: ``[..., D]`` its standard deviation (``> 0``).
        low, high: the box bounds, floats or tensors broadcastable to ``[D]``,
            ``high > low``.

    Batch dimensions ``[...]`` are those of ``loc`` without the last one.
    :meth:`sample` and :meth:`rsample` draw ``[..., k, D]`` env actions,
    :meth:`log_prob` takes ``[..., D]`` or ``[..., k, D]``. There is no prior
    over a fixed action set (:meth:`prior` raises): the search's slots are
    drawn with :class:`~torchrl_muzero.modules.sampled_proposal.SampledProposal`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
        >>> dist = TanhNormalPolicy(torch.zeros(2, 1), torch.ones(2, 1), low=-2.0, high=2.0)
        >>> dist
        TanhNormalPolicy(batch_shape=[2], D=1, low=[-2.0], high=[2.0])
        >>> g = torch.Generator().manual_seed(0)
        >>> actions = dist.sample(3, generator=g)
        >>> actions.shape, bool((actions.abs() < 2.0).all())
        (torch.Size([2, 3, 1]), True)
        >>> dist.log_prob(torch.zeros(2, 1))   # log N(0; 0, 1) - log 2
        tensor([-1.6121, -1.6121])
        >>> dist.mode()
        tensor([[0.],
                [0.]])
    """

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
    ) -> None:
        if loc.dim() < 1:
            raise ValueError(f"TanhNormalPolicy needs loc [..., D], got shape {tuple(loc.shape)}.")
        if scale.shape != loc.shape:
            raise ValueError(f"TanhNormalPolicy: scale {tuple(scale.shape)} does not match loc {tuple(loc.shape)}.")
        dim = loc.shape[-1]
        low_t = torch.as_tensor(low, dtype=loc.dtype, device=loc.device)
        high_t = torch.as_tensor(high, dtype=loc.dtype, device=loc.device)
        try:
            low_t, high_t = low_t.broadcast_to((dim,)), high_t.broadcast_to((dim,))
        except RuntimeError:
            raise ValueError(
                f"TanhNormalPolicy: low {tuple(low_t.shape)} / high {tuple(high_t.shape)} "
                f"do not broadcast to [D={dim}]."
            ) from None
        if not bool((high_t > low_t).all()):
            raise ValueError(f"TanhNormalPolicy: needs high > low in every dimension, got low={low}, high={high}.")
        self.loc = loc
        self.scale = scale
        self.low = low_t
        self.high = high_t

    @classmethod
    def from_params(
        cls,
        params: torch.Tensor,
        low: float | torch.Tensor,
        high: float | torch.Tensor,
        sigma: float | None = None,
        min_scale: float = MIN_SCALE,
    ) -> TanhNormalPolicy:
        """The policy of a model head's output ``params [..., 2D]``.

        ``loc = params[..., :D]`` (unbounded: the tanh bounds the action).
        With ``sigma=None`` the scale is learned: ``scale = softplus(params[..., D:]) + min_scale``
        (``min_scale`` keeps the density finite when the head drives the softplus to 0).
        With a float ``sigma`` the scale is fixed at ``sigma`` and ``params[..., D:]`` is ignored
        (LightZero's fixed-sigma head uses 0.3).

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
            >>> params = torch.tensor([[0.5, -0.5, 0.0, 0.0]])
            >>> TanhNormalPolicy.from_params(params, -1.0, 1.0).scale
            tensor([[0.6941, 0.6941]])
            >>> TanhNormalPolicy.from_params(params, -1.0, 1.0, sigma=0.3).scale
            tensor([[0.3000, 0.3000]])
        """
        if params.dim() < 1 or params.shape[-1] % 2 != 0 or params.shape[-1] == 0:
            raise ValueError(f"TanhNormalPolicy.from_params needs params [..., 2D], got shape {tuple(params.shape)}.")
        dim = params.shape[-1] // 2
        loc = params[..., :dim]
        if sigma is None:
            scale = F.softplus(params[..., dim:]) + min_scale
        else:
            if not sigma > 0:
                raise ValueError(f"TanhNormalPolicy.from_params: sigma must be > 0 or None, got {sigma}.")
            scale = torch.full_like(loc, float(sigma))
        return cls(loc, scale, low, high)

    # -- shapes ------------------------------------------------------------------------------------
    @property
    def batch_shape(self) -> torch.Size:
        return self.loc.shape[:-1]

    @property
    def event_shape(self) -> torch.Size:
        """``[D]``: one env action."""
        return self.loc.shape[-1:]

    @property
    def action_dim(self) -> int:
        return self.loc.shape[-1]

    def __getitem__(self, index: Any) -> TanhNormalPolicy:
        """The distribution of a slice of the batch dimensions (``dist[:, 0]``: the roots)."""
        index = index if isinstance(index, tuple) else (index,)
        index = index + (slice(None),)  # never index the action dimension
        return TanhNormalPolicy(self.loc[index], self.scale[index], self.low, self.high)

    def __repr__(self) -> str:
        return (
            f"TanhNormalPolicy(batch_shape={list(self.batch_shape)}, D={self.action_dim}, "
            f"low={self.low.tolist()}, high={self.high.tolist()})"
        )

    def with_scale(self, factor: float | torch.Tensor) -> TanhNormalPolicy:
        """The same policy with ``scale * factor`` (a temperature, or EfficientZero V2's widened proposal).

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
            >>> TanhNormalPolicy(torch.zeros(1), torch.ones(1), -1.0, 1.0).with_scale(3.0).scale
            tensor([3.])
        """
        if isinstance(factor, (int, float)) and not factor > 0:
            raise ValueError(f"TanhNormalPolicy.with_scale: factor must be > 0, got {factor}.")
        return TanhNormalPolicy(self.loc, self.scale * factor, self.low, self.high)

    # -- the squashing -----------------------------------------------------------------------------
    def _squash(self, u: torch.Tensor) -> torch.Tensor:
        return self.low + (torch.tanh(u) + 1.0) / 2.0 * (self.high - self.low)

    def _log_prob_pre_tanh(self, u: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        # per dimension in log space, then the sum over the D dims (never the log of a sum)
        z = (u - loc) / scale
        log_normal = -0.5 * z * z - torch.log(scale) - _HALF_LOG_2PI
        log_det = _log_one_minus_tanh_sq(u) + torch.log((self.high - self.low) / 2.0)
        return (log_normal - log_det).sum(-1)

    def _pre_tanh_draws(self, k: int, generator: torch.Generator | None) -> torch.Tensor:
        if k < 1:
            raise ValueError(f"TanhNormalPolicy: k must be >= 1, got {k}.")
        noise = torch.randn(
            *self.batch_shape, k, self.action_dim, generator=generator, dtype=self.loc.dtype, device=self.loc.device
        )
        u = self.loc.unsqueeze(-2) + self.scale.unsqueeze(-2) * noise
        # the clamp keeps every action strictly inside the box: its log_prob stays finite
        return u.clamp(-PRE_TANH_BOUND, PRE_TANH_BOUND)

    # -- the PolicyDistribution interface ----------------------------------------------------------
    def sample(
        self, k: int = 1, generator: torch.Generator | None = None, replacement: bool = True
    ) -> torch.Tensor:
        """``k`` i.i.d. env actions per batch entry, ``[..., k, D]``, without gradient.

        ``replacement`` is accepted for the interface and ignored: continuous
        draws are i.i.d. (two equal draws have probability 0).
        """
        with torch.no_grad():
            return self._squash(self._pre_tanh_draws(k, generator))

    def rsample(self, k: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
        """Like :meth:`sample`, reparameterised (``loc + scale * eps``): differentiable w.r.t. loc and scale.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
            >>> loc = torch.zeros(1, requires_grad=True)
            >>> dist = TanhNormalPolicy(loc, torch.ones(1), -1.0, 1.0)
            >>> dist.rsample(4, generator=torch.Generator().manual_seed(0)).sum().backward()
            >>> bool(loc.grad > 0)
            True
        """
        return self._squash(self._pre_tanh_draws(k, generator))

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log pi(a)``: env actions ``[..., D]`` give ``[...]``, ``[..., k, D]`` give ``[..., k]``.

        The action maps back to ``y = tanh(u)`` in ``(-1, 1)``, clamped to
        ``|y| <= SQUASHED_BOUND`` (the sampling clamp, so a stored sample's
        log-prob is finite and the same wherever it is recomputed), then
        ``u = atanh(y)``.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
            >>> dist = TanhNormalPolicy(torch.zeros(3, 2), torch.ones(3, 2), -1.0, 1.0)
            >>> dist.log_prob(torch.zeros(3, 5, 2)).shape
            torch.Size([3, 5])
            >>> dist.log_prob(torch.ones(3, 2)).isfinite().all()   # on the bound: clamped, finite
            tensor(True)
        """
        actions = torch.as_tensor(actions, dtype=self.loc.dtype, device=self.loc.device)
        batch_dims = len(self.batch_shape)
        if actions.dim() == batch_dims + 1:
            loc, scale = self.loc, self.scale
        elif actions.dim() == batch_dims + 2:
            loc, scale = self.loc.unsqueeze(-2), self.scale.unsqueeze(-2)
        else:
            raise ValueError(
                f"TanhNormalPolicy.log_prob: actions {tuple(actions.shape)} for batch shape "
                f"{tuple(self.batch_shape)} and D={self.action_dim} (want [..., D] or [..., k, D])."
            )
        if actions.shape[-1] != self.action_dim:
            raise ValueError(
                f"TanhNormalPolicy.log_prob: actions have {actions.shape[-1]} dims, want {self.action_dim}."
            )
        bound = math.tanh(PRE_TANH_BOUND)  # == SQUASHED_BOUND up to rounding: the sampling clamp's image
        y = (2.0 * (actions - self.low) / (self.high - self.low) - 1.0).clamp(-bound, bound)
        return self._log_prob_pre_tanh(torch.atanh(y), loc, scale)

    def entropy(self, num_samples: int = 64, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[...]`` Monte-Carlo entropy ``-mean_k log pi(a_k)`` over ``num_samples`` reparameterised draws.

        Differentiable w.r.t. loc and scale (the loss's entropy bonus); the
        squashed Gaussian has no closed-form entropy.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
            >>> dist = TanhNormalPolicy(torch.zeros(2, 1), torch.full((2, 1), 0.1), -1.0, 1.0)
            >>> h = dist.entropy(4096, generator=torch.Generator().manual_seed(0))
            >>> h.shape, bool(((h + 0.894).abs() < 0.03).all())   # log(0.1 sqrt(2 pi e)) - E[u^2]
            (torch.Size([2]), True)
        """
        u = self._pre_tanh_draws(num_samples, generator)
        return -self._log_prob_pre_tanh(u, self.loc.unsqueeze(-2), self.scale.unsqueeze(-2)).mean(-1)

    def mode(self) -> torch.Tensor:
        """``[..., D]`` the deterministic action ``low + (tanh(loc) + 1) / 2 * (high - low)``."""
        return self._squash(self.loc)

    def prior(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError(
            "TanhNormalPolicy has no prior over a fixed action set: draw the slots with SampledProposal.draw."
        )

    def cross_entropy(self, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "TanhNormalPolicy.cross_entropy needs the candidates: use cross_entropy_at(candidates, target)."
        )

    def kl_from(self, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("TanhNormalPolicy.kl_from needs the candidates: use kl_at(candidates, target).")

    def smooth_target(self, target: torch.Tensor, eps: float) -> torch.Tensor:
        """``(1 - eps) * target + eps / S``: a target over ``S`` stored candidates mixed into uniform over them."""
        return (1.0 - eps) * target + eps / target.shape[-1]
