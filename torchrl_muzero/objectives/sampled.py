"""The sampled family's losses: the policy learns from the visits over each root's sampled candidates.

Sampled MuZero (Hubert et al. 2021) searches ``K`` actions drawn at each node,
so its policy target is a distribution over those ``K`` candidates, not over
the action space. :class:`SampledPolicyLoss` is the part every sampled loss
shares, written as hooks of
:class:`~torchrl_muzero.objectives.unrolled.UnrolledModelLoss`:

* the unroll follows the env's actions as they are (continuous ``[B, K+1, D]``
  or discrete indices; :meth:`_read_action`);
* the policy term is ``-sum_k target_k log pi(a_k)`` over the stored
  candidates ``a_k`` of each position (``policy_loss="kl"``: minus the
  target's entropy, same gradient; :meth:`_policy_term`), with ``log pi`` the
  same function the search's proposal uses, so learner and tree agree;
* an entropy bonus ``-H(pi)`` (Monte-Carlo for the tanh-squashed Gaussian)
  weighted by ``policy_entropy_loss_weight`` (LightZero: 5e-3 sampled
  EfficientZero, 5e-2 sampled UniZero on Pendulum).

:class:`SampledMuZeroLoss`, :class:`SampledEfficientZeroLoss` and
:class:`SampledUniZeroLoss` put it in front of MuZero's, EfficientZero's and
UniZero's losses; the value, reward / value-prefix, consistency and latent
terms are theirs unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from torchrl_muzero.modules.policy_distribution import policy_distribution
from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
from torchrl_muzero.objectives.efficientzero import EfficientZeroLoss
from torchrl_muzero.objectives.muzero import MuZeroLoss
from torchrl_muzero.objectives.terms import LossTerm
from torchrl_muzero.objectives.unizero import UniZeroLoss

__all__ = ["SampledEfficientZeroLoss", "SampledMuZeroLoss", "SampledPolicyLoss", "SampledUniZeroLoss"]


class SampledPolicyLoss:
    """The sampled family's policy and action handling, in front of an unrolled loss (a mixin).

    Keys (``set_keys``): ``candidates`` (default ``("root", "candidates")``):
    the root candidates of every position ``[B, K+1, S, *action]``, the slots
    ``target_policy [B, K+1, S]`` is over. ``policy_entropy_loss_weight``
    (keyword, default 0) weights the ``policy_entropy`` term ``-H(pi)`` ``[B, K+1]``.

    A loss of the family is the mixin in front of an unrolled loss, its
    ``_AcceptedKeys`` extended with ``candidates`` and its ``__init__`` calling
    ``_init_sampled`` first (:class:`SampledMuZeroLoss` is the whole recipe).

    Examples:
        >>> from torchrl_muzero.objectives.sampled import SampledMuZeroLoss, SampledPolicyLoss
        >>> issubclass(SampledMuZeroLoss, SampledPolicyLoss)
        True
        >>> SampledMuZeroLoss._AcceptedKeys().candidates
        ('root', 'candidates')
    """

    def _init_sampled(self, policy_entropy_loss_weight: float) -> None:
        if not (float(policy_entropy_loss_weight) >= 0.0 and float(policy_entropy_loss_weight) < float("inf")):
            raise ValueError(f"policy_entropy_loss_weight must be a finite number >= 0, got "
                             f"{policy_entropy_loss_weight}.")
        self.policy_entropy_loss_weight = float(policy_entropy_loss_weight)
        self.entropy_samples = 16  # Monte-Carlo draws per position for a continuous policy's entropy

    # -- keys and names -------------------------------------------------------------------------------
    def _set_in_keys(self) -> None:
        super()._set_in_keys()
        self._in_keys.append(self.tensor_keys.candidates)

    def term_names(self) -> list[str]:
        names = super().term_names()
        if self.policy_entropy_loss_weight > 0:
            names.append("policy_entropy")
        return names

    # -- hooks ------------------------------------------------------------------------------------------
    def _read_action(self, tensordict: TensorDictBase, B: int, K1: int) -> torch.Tensor:
        space, name = self.model.action_space, type(self).__name__
        action = tensordict.get(self.tensor_keys.action)
        if space.is_discrete:
            action = action.reshape(B, K1, -1)
            if action.shape[-1] != 1 or action.dtype.is_floating_point:
                raise ValueError(f"{name}: '{self.tensor_keys.action}' must be integer indices [B, K+1] = "
                                 f"[{B}, {K1}], got {tuple(action.shape)} of dtype {action.dtype}.")
            return action[..., 0].long()
        D = int(space.shape[0])
        if tuple(action.shape) != (B, K1, D) or not action.dtype.is_floating_point:
            raise ValueError(f"{name}: '{self.tensor_keys.action}' must be the env's float actions [B, K+1, D] = "
                             f"[{B}, {K1}, {D}], got {tuple(action.shape)} of dtype {action.dtype}.")
        return action

    def _read_inputs(self, tensordict: TensorDictBase) -> dict[str, Any]:
        inputs = super()._read_inputs(tensordict)
        B, K1 = inputs["mask"].shape
        S = self.model.num_actions
        candidates = tensordict.get(self.tensor_keys.candidates, None)
        want = (B, K1, S, *self.model.action_space.shape) if not self.model.action_space.is_discrete else (B, K1, S)
        if candidates is None or tuple(candidates.shape) != want:
            got = "nothing" if candidates is None else str(tuple(candidates.shape))
            raise ValueError(f"{type(self).__name__}: '{self.tensor_keys.candidates}' must hold each position's "
                             f"root candidates {list(want)}, got {got}.")
        inputs["candidates"] = candidates
        return inputs

    def _policy_term(self, inputs: dict[str, Any], policy_logits: torch.Tensor,
                     target_policy: torch.Tensor) -> torch.Tensor:
        policy = policy_distribution(self.model, policy_logits)
        candidates = inputs["candidates"]
        if self.policy_loss == "kl":
            return policy.kl_at(candidates, target_policy)
        return policy.cross_entropy_at(candidates, target_policy)

    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        terms = super()._step_terms(inputs, unrolled)
        if self.policy_entropy_loss_weight > 0:
            policy = policy_distribution(self.model, unrolled["policy_logits"])
            entropy = _entropy(policy, self.entropy_samples)
            terms["policy_entropy"] = LossTerm(-entropy, inputs["policy_mask"])  # a bonus: minimise -H
        return terms


def _entropy(policy, num_samples: int) -> torch.Tensor:
    if isinstance(policy, TanhNormalPolicy):  # no closed form: a Monte-Carlo estimate
        return policy.entropy(num_samples=num_samples)
    return policy.entropy()  # a categorical's is exact


class SampledMuZeroLoss(SampledPolicyLoss, MuZeroLoss):
    """Sampled MuZero's loss: :class:`~torchrl_muzero.objectives.MuZeroLoss` with the policy learnt over
    each root's sampled candidates (:class:`SampledPolicyLoss`).

    Args:
        model: a :class:`~torchrl_muzero.modules.sampled.SampledModel`.
        policy_entropy_loss_weight: the entropy bonus' weight (default 5e-3).
        **kwargs: :class:`~torchrl_muzero.objectives.MuZeroLoss`'s.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.modules.sampled import SampledModel
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> from torchrl_muzero.objectives.sampled import SampledMuZeroLoss
        >>> base = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1)
        >>> model = SampledModel(base, BoxActionSpace(-2.0, 2.0, (1,)), SampledProposal(num_samples=4))
        >>> loss = SampledMuZeroLoss(model)
        >>> B, K1, S = 5, 3, 4
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K1, 3), "action": torch.rand(B, K1, 1) * 4 - 2,
        ...     "target_value": torch.zeros(B, K1), "target_reward": torch.zeros(B, K1),
        ...     "target_policy": torch.full((B, K1, S), 1 / S), "mask": torch.ones(B, K1, dtype=torch.bool),
        ...     "policy_mask": torch.ones(B, K1, dtype=torch.bool),
        ...     ("root", "candidates"): torch.rand(B, K1, S, 1) * 4 - 2}, [B])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_policy', 'loss_policy_entropy', 'loss_reward', 'loss_value']
    """

    @dataclass
    class _AcceptedKeys(MuZeroLoss._AcceptedKeys):
        candidates: NestedKey = ("root", "candidates")

    def __init__(self, model, *, policy_entropy_loss_weight: float = 5e-3, **kwargs) -> None:
        self._init_sampled(policy_entropy_loss_weight)
        super().__init__(model, **kwargs)


class SampledEfficientZeroLoss(SampledPolicyLoss, EfficientZeroLoss):
    """Sampled EfficientZero's loss: :class:`~torchrl_muzero.objectives.EfficientZeroLoss` (value prefix,
    consistency) with the policy learnt over each root's sampled candidates (:class:`SampledPolicyLoss`).

    Args:
        model: a :class:`~torchrl_muzero.modules.sampled.SampledModel` over an EfficientZero network.
        policy_entropy_loss_weight: the entropy bonus' weight (default 5e-3, LightZero's).
        **kwargs: :class:`~torchrl_muzero.objectives.EfficientZeroLoss`'s.

    Examples:
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> from torchrl_muzero.modules import EfficientZeroMLPModel
        >>> from torchrl_muzero.modules.sampled import SampledModel
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> from torchrl_muzero.objectives.sampled import SampledEfficientZeroLoss
        >>> base = EfficientZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8, action_dim=1)
        >>> model = SampledModel(base, BoxActionSpace(-2.0, 2.0, (1,)), SampledProposal(num_samples=4))
        >>> SampledEfficientZeroLoss(model).term_names()
        ['value', 'value_prefix', 'policy', 'consistency', 'policy_entropy']
    """

    @dataclass
    class _AcceptedKeys(EfficientZeroLoss._AcceptedKeys):
        candidates: NestedKey = ("root", "candidates")

    def __init__(self, model, *, policy_entropy_loss_weight: float = 5e-3, **kwargs) -> None:
        self._init_sampled(policy_entropy_loss_weight)
        super().__init__(model, **kwargs)


class SampledUniZeroLoss(SampledPolicyLoss, UniZeroLoss):
    """Sampled UniZero's loss: :class:`~torchrl_muzero.objectives.unizero.UniZeroLoss` (one causal forward
    over the segment, latent / reward / value terms, EMA target encoder) with the policy learnt over each
    position's stored root candidates (:class:`SampledPolicyLoss`).

    The unroll's action tokens are the env's actions as they are (a box's
    floats ``[B, K+1, D]`` through the model's linear action embedding,
    discrete indices through its table). UniZero's two policy extras, over
    ``K`` candidates instead of ``A`` actions:

    * label smoothing (``policy_ls_eps_*``) mixes the visit target into the
      uniform distribution over the ``K`` slots, ``(1 - eps) * target + eps / K``
      (the slots are the target's support; a discrete node's padded slots
      repeat a legal action, which then gets their share too). Off by default.
    * the entropy bonus is UniZero's own term (``loss_entropy``, weight
      ``policy_loss_weight * policy_entropy_weight``), over the whole policy:
      exact for a categorical, a Monte-Carlo estimate (16 draws) for the
      tanh-squashed Gaussian. The mixin's separate ``policy_entropy`` term is
      off, so the bonus is counted once.

    Args:
        model: a :class:`~torchrl_muzero.modules.sampled.SampledModel` over a
            :class:`~torchrl_muzero.modules.unizero.UniZeroModel` (``action_dim=D``
            and a ``2 * D`` policy head for a box).
        policy_loss: ``"cross_entropy"`` (default) or ``"kl"`` (same gradient).
        **kwargs: :class:`~torchrl_muzero.objectives.unizero.UniZeroLoss`'s.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> from torchrl_muzero.modules.sampled import SampledModel
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> from torchrl_muzero.objectives.sampled import SampledUniZeroLoss
        >>> base = UniZeroModel((3,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5,
        ...                     value_support_size=5, reward_support_size=5, action_dim=1)
        >>> model = SampledModel(base, BoxActionSpace(-2.0, 2.0, (1,)), SampledProposal(num_samples=4))
        >>> loss = SampledUniZeroLoss(model)
        >>> B, K1, S = 5, 3, 4
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K1, 3), "observation_mask": torch.ones(B, K1, dtype=torch.bool),
        ...     "action": torch.rand(B, K1, 1) * 4 - 2, "target_value": torch.zeros(B, K1),
        ...     "target_reward": torch.zeros(B, K1), "target_policy": torch.full((B, K1, S), 1 / S),
        ...     "mask": torch.ones(B, K1, dtype=torch.bool), "policy_mask": torch.ones(B, K1, dtype=torch.bool),
        ...     ("root", "candidates"): torch.rand(B, K1, S, 1) * 4 - 2}, [B])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_entropy', 'loss_latent', 'loss_policy', 'loss_reward', 'loss_value']
    """

    @dataclass
    class _AcceptedKeys(UniZeroLoss._AcceptedKeys):
        candidates: NestedKey = ("root", "candidates")

    def __init__(self, model, *, policy_loss: str = "cross_entropy", **kwargs) -> None:
        self._init_sampled(0.0)  # the bonus is UniZero's own entropy term (docstring)
        super().__init__(model, **kwargs)
        if policy_loss not in ("cross_entropy", "kl"):
            raise ValueError(f"policy_loss must be 'cross_entropy' or 'kl', got {policy_loss!r}.")
        self.policy_loss = policy_loss  # UniZeroLoss does not take it: its categorical term is a cross-entropy

    def _policy_and_entropy(self, inputs: dict[str, Any], policy_logits: torch.Tensor,
                            target_policy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.policy_ls_eps
        if eps > 0:  # uniform over the K slots the target is over (docstring)
            target_policy = (1.0 - eps) * target_policy + eps / target_policy.shape[-1]
        entropy = _entropy(policy_distribution(self.model, policy_logits), self.entropy_samples)
        return self._policy_term(inputs, policy_logits, target_policy), entropy
