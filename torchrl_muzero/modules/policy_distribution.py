"""The model's policy output as a distribution: what the search, the buffer and the loss ask of it.

The search needs a node's prior over its slots, the sampled family needs
``k`` actions drawn from the policy, the loss needs the cross-entropy (or KL)
against a target policy and the priorities need the entropy. Those questions
go through :class:`PolicyDistribution`, so that a model whose policy is not a
softmax over a fixed action set (a continuous ``TanhNormal``, later) can
answer them too. :class:`CategoricalPolicy` is today's policy: the softmax of
``policy_logits [..., A]``.

Every categorical expression here is the one the search and the losses used
before the interface existed (``torch.softmax``, ``torch.log_softmax`` and the
same products and sums, in the same order), so that results do not change by
a single bit. ``torch.distributions.Categorical`` is deliberately not used
for the arithmetic: it normalises the logits with ``logsumexp``, which
rounds differently.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch

__all__ = ["CategoricalPolicy", "PolicyDistribution", "policy_distribution"]


class PolicyDistribution(ABC):
    """What the search, the replay buffer and the loss ask of a model's policy output.

    Batch dimensions ``[...]`` are those of the model output the distribution
    was built from (``[B]`` in the search, ``[B, K+1]`` in the loss).

    * :meth:`prior` -- ``[..., S]`` probabilities over a node's slots (the
      search's pUCT prior);
    * :meth:`log_prob` -- the log-probability of given actions;
    * :meth:`sample` -- ``k`` actions per batch entry, ``[..., k, *action_shape]``;
    * :meth:`entropy` -- ``[...]``;
    * :meth:`cross_entropy` / :meth:`kl_from` -- the loss's policy term
      against a target policy, ``[...]``;
    * :meth:`smooth_target` -- label smoothing of such a target.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.policy_distribution import CategoricalPolicy, PolicyDistribution
        >>> dist = CategoricalPolicy.from_logits(torch.zeros(2, 4))
        >>> isinstance(dist, PolicyDistribution)
        True
        >>> dist.prior()
        tensor([[0.2500, 0.2500, 0.2500, 0.2500],
                [0.2500, 0.2500, 0.2500, 0.2500]])
    """

    @property
    @abstractmethod
    def batch_shape(self) -> torch.Size:
        """The batch dimensions ``[...]``."""

    @abstractmethod
    def prior(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., S]`` probabilities over a node's slots (all actions when ``slots`` is ``None``)."""

    @abstractmethod
    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """The log-probability of ``actions`` (``[...]`` or ``[..., k]`` for a categorical)."""

    @abstractmethod
    def sample(
        self, k: int = 1, generator: torch.Generator | None = None, replacement: bool = True
    ) -> torch.Tensor:
        """``k`` actions per batch entry, ``[..., k, *action_shape]``."""

    @abstractmethod
    def entropy(self) -> torch.Tensor:
        """``[...]`` entropy of the policy."""

    @abstractmethod
    def cross_entropy(self, target: torch.Tensor) -> torch.Tensor:
        """``[...]`` cross-entropy ``-E_target[log pi]`` of the policy against ``target``."""

    @abstractmethod
    def kl_from(self, target: torch.Tensor) -> torch.Tensor:
        """``[...]`` ``KL(target || pi)``: the cross-entropy minus the target's entropy (same gradient)."""

    @abstractmethod
    def smooth_target(self, target: torch.Tensor, eps: float) -> torch.Tensor:
        """``target`` mixed with weight ``eps`` into the uniform policy (label smoothing)."""

    def cross_entropy_at(self, candidates: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``[...]`` ``-sum_k target_k * log pi(a_k)`` over stored candidates: the sampled family's policy loss.

        Args:
            candidates: ``[..., S, *action_shape]`` the actions of a node's ``S``
                slots (long ``[..., S]`` for a categorical, ``[..., S, D]`` for
                a box).
            target: ``[..., S]`` a distribution over the slots (e.g. the visit
                distribution), summing to 1.

        A slot whose target is 0 contributes exactly 0, even where
        ``log pi(a_k)`` is ``-inf`` (a padding slot, an illegal action), and
        passes no gradient: the product is masked with ``torch.where``, never
        ``0 * -inf``.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.policy_distribution import CategoricalPolicy
            >>> dist = CategoricalPolicy.from_logits(torch.tensor([[0.0, 0.0, -float("inf")]]))
            >>> dist.cross_entropy_at(torch.tensor([[0, 2]]), torch.tensor([[1.0, 0.0]]))   # log 2
            tensor([0.6931])
        """
        log_probs = self.log_prob(candidates)
        if log_probs.shape != target.shape:
            raise ValueError(
                f"{type(self).__name__}.cross_entropy_at: log-probs of the candidates {tuple(log_probs.shape)} "
                f"do not match target {tuple(target.shape)}."
            )
        # mask the log-prob (not only the product): 0 * -inf is NaN, in the value and in the gradient
        zero = target == 0
        log_probs = torch.where(zero, torch.zeros_like(log_probs), log_probs)
        return -(target * log_probs).sum(-1)

    def kl_at(self, candidates: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``[...]`` ``cross_entropy_at(candidates, target) - H(target)`` (``xlogy``: ``0 log 0 = 0``).

        Same gradient as :meth:`cross_entropy_at`; it is 0 when ``pi`` over the
        candidates, renormalised, equals the target and the candidates carry
        all of ``pi``'s mass.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.policy_distribution import CategoricalPolicy
            >>> dist = CategoricalPolicy.from_logits(torch.log(torch.tensor([[0.25, 0.75]])))
            >>> dist.kl_at(torch.tensor([[1, 0]]), torch.tensor([[0.75, 0.25]])).abs() < 1e-6
            tensor([True])
        """
        return self.cross_entropy_at(candidates, target) + torch.xlogy(target, target).sum(-1)


class CategoricalPolicy(PolicyDistribution):
    """A softmax policy over ``A`` discrete actions, from ``logits [..., A]``.

    Args:
        logits: ``[..., A]`` unnormalised log-probabilities.
        mask: optional bool ``[..., A]``, ``True`` where an action is legal;
            illegal logits become ``-inf`` (probability 0, never sampled).

    The log-probabilities are computed once (``torch.log_softmax`` of the
    whole tensor) and shared by :meth:`log_prob`, :meth:`entropy`,
    :meth:`cross_entropy` and :meth:`kl_from`; indexing a distribution
    (``dist[:, 0]``) slices them rather than recomputing them on the slice, so
    the numbers are exactly those of the expression on the full tensor.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.policy_distribution import CategoricalPolicy
        >>> logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
        >>> dist = CategoricalPolicy.from_logits(logits)
        >>> torch.equal(dist.prior(), torch.softmax(logits, -1))
        True
        >>> dist.log_prob(torch.tensor([2, 0])).exp()
        tensor([0.6652, 0.3333])
        >>> dist.entropy()
        tensor([0.8324, 1.0986])
        >>> legal = torch.tensor([[True, False, True], [True, True, False]])
        >>> masked = CategoricalPolicy.from_logits(logits, legal)
        >>> g = torch.Generator().manual_seed(0)
        >>> masked.sample(2, generator=g, replacement=False).sort(-1).values
        tensor([[0, 2],
                [0, 1]])
        >>> target = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]])
        >>> dist.cross_entropy(target)
        tensor([0.4076, 1.0986])
        >>> dist.kl_from(target)
        tensor([0.4076, 0.4055])
    """

    def __init__(
        self, logits: torch.Tensor, mask: torch.Tensor | None = None, *, _log_probs: torch.Tensor | None = None
    ) -> None:
        if logits.dim() < 1:
            raise ValueError(f"CategoricalPolicy needs logits [..., A], got shape {tuple(logits.shape)}.")
        if mask is not None:
            if mask.shape != logits.shape:
                raise ValueError(
                    f"CategoricalPolicy: mask {tuple(mask.shape)} does not match logits {tuple(logits.shape)}."
                )
            logits = logits.masked_fill(~mask.bool(), -math.inf)
        self.logits = logits
        self.mask = mask
        self._log_probs = _log_probs

    @classmethod
    def from_logits(cls, policy_logits: torch.Tensor, mask: torch.Tensor | None = None) -> CategoricalPolicy:
        """The policy of a model output ``policy_logits [..., A]`` (the models' default factory).

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.policy_distribution import CategoricalPolicy
            >>> CategoricalPolicy.from_logits(torch.zeros(5, 3)).batch_shape
            torch.Size([5])
        """
        return cls(policy_logits, mask)

    @property
    def batch_shape(self) -> torch.Size:
        return self.logits.shape[:-1]

    @property
    def num_actions(self) -> int:
        return self.logits.shape[-1]

    @property
    def log_probs(self) -> torch.Tensor:
        """``[..., A]`` ``torch.log_softmax(logits, -1)``, computed once."""
        if self._log_probs is None:
            self._log_probs = torch.log_softmax(self.logits, -1)
        return self._log_probs

    def __getitem__(self, index: Any) -> CategoricalPolicy:
        """The distribution of a slice of the batch dimensions (``dist[:, 0]``: the roots)."""
        index = index if isinstance(index, tuple) else (index,)
        index = index + (slice(None),)  # never index the action dimension
        mask = None if self.mask is None else self.mask[index]
        # the mask is already applied to the logits: pass the slice's log-probs, not the mask again
        out = CategoricalPolicy(self.logits[index], _log_probs=self.log_probs[index])
        out.mask = mask
        return out

    def prior(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.softmax(logits, -1)`` ``[..., A]``; with ``slots [..., S]`` (action indices),
        the softmax of those actions' logits, i.e. their probabilities renormalised over the slots."""
        if slots is None:
            return torch.softmax(self.logits, -1)
        return torch.softmax(self.logits.gather(-1, slots), -1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log pi(a)`` of indices ``actions [...]`` (one per batch entry) or ``[..., k]`` (``k`` each)."""
        actions = actions.long()
        if actions.dim() == self.logits.dim() - 1:
            return self.log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        if actions.dim() == self.logits.dim():
            return self.log_probs.gather(-1, actions)
        raise ValueError(
            f"CategoricalPolicy.log_prob: actions {tuple(actions.shape)} for batch shape {tuple(self.batch_shape)}."
        )

    def sample(
        self, k: int = 1, generator: torch.Generator | None = None, replacement: bool = True
    ) -> torch.Tensor:
        """``k`` action indices per batch entry, ``[..., k]`` (``torch.multinomial`` on :meth:`prior`).

        With ``replacement=False`` the ``k`` actions are distinct and all legal
        (the sampled family's ``K`` children); ``k`` may then not exceed the
        smallest number of legal actions of a row.
        """
        if k < 1:
            raise ValueError(f"CategoricalPolicy.sample: k must be >= 1, got {k}.")
        probs = self.prior().reshape(-1, self.num_actions)
        if not replacement:
            # multinomial would otherwise fill the missing draws with zero-probability actions
            legal = int((probs > 0).sum(-1).min()) if probs.numel() else k
            if k > legal:
                raise ValueError(
                    f"CategoricalPolicy.sample: {k} draws without replacement, but a row has only {legal} "
                    "action(s) of nonzero probability."
                )
        actions = torch.multinomial(probs, k, replacement=replacement, generator=generator)
        return actions.view(*self.batch_shape, k)

    def _weighted_log_probs(self, weights: torch.Tensor) -> torch.Tensor:
        # illegal actions have log-prob -inf and weight 0: 0 * -inf is NaN, so mask the product
        # (only when a mask was given: without one the expression stays the losses' historical one)
        product = weights * self.log_probs
        if self.mask is not None:
            product = torch.where(self.mask.bool(), product, 0.0)
        return product

    def entropy(self) -> torch.Tensor:
        """``-(pi * log pi).sum(-1)`` ``[...]`` with ``pi = exp(log_softmax(logits))``."""
        log_probs = self.log_probs
        return -self._weighted_log_probs(log_probs.exp()).sum(-1)

    def cross_entropy(self, target: torch.Tensor) -> torch.Tensor:
        """``-(target * log_softmax(logits)).sum(-1)`` ``[...]`` for target probabilities ``[..., A]``."""
        return -self._weighted_log_probs(target).sum(-1)

    def kl_from(self, target: torch.Tensor) -> torch.Tensor:
        """``cross_entropy(target) + (target * log target).sum(-1)`` (``xlogy``: ``0 log 0 = 0``)."""
        return self.cross_entropy(target) + torch.xlogy(target, target).sum(-1)

    def smooth_target(self, target: torch.Tensor, eps: float) -> torch.Tensor:
        """``(1 - eps) * target + eps / A``: the target mixed into the uniform policy over the ``A`` actions."""
        return (1.0 - eps) * target + eps / target.shape[-1]


def policy_distribution(
    model: Any, policy_logits: torch.Tensor, mask: torch.Tensor | None = None
) -> PolicyDistribution:
    """The distribution of a model's policy output, through the factory the model declares.

    A model declares it as a method ``policy_distribution(policy_logits,
    mask=None)`` (:class:`~torchrl_muzero.modules.MuZeroModel` and
    :class:`~torchrl_muzero.modules.unizero.UniZeroModel` return
    :meth:`CategoricalPolicy.from_logits`); a model without one gets the
    categorical default.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.policy_distribution import policy_distribution
        >>> type(policy_distribution(object(), torch.zeros(2, 3))).__name__
        'CategoricalPolicy'
    """
    factory = getattr(model, "policy_distribution", None)
    if factory is None:
        return CategoricalPolicy.from_logits(policy_logits, mask)
    return factory(policy_logits, mask)
