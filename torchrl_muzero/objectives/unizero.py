"""UniZero's training loss (arXiv 2406.10667): one causal forward over the sampled segment.

A sample of the replay buffer holds ``K + 1`` observations ``o_0 .. o_K`` and
the actions ``a_0 .. a_K`` taken there. The loss encodes all of them, runs the
world model's training forward over ``[z_0, a_0, ..., z_K, a_K]`` (teacher
forcing: every latent token is the encoder's latent of the real observation,
not a predicted one) and compares

* at latent token ``z_k``: the policy with ``target_policy[k]``
  (``policy_mask``) and the value with ``target_value[k]`` (``mask``), both
  cross-entropies (the value on the model's categorical support);
* at action token ``a_k`` (``k < K``): the reward with ``target_reward[k + 1]``
  (``mask[k + 1]``) and the predicted next latent with
  ``sg(target_encoder(o_{k + 1}))`` (``observation_mask[k + 1]`` and
  ``policy_mask[k]``: the step was stored and the next observation exists).

The target encoder is an exponential moving average of the online encoder,
``target <- (1 - theta) * target + theta * online`` after every optimizer
step (:meth:`UniZeroLoss.after_update`, which the learner calls), so the
latent term cannot be solved by collapsing both sides at once.

Total: ``latent_w * L_latent + reward_w * L_reward + policy_w * (L_policy -
entropy_w * H(pi)) + value_w * L_value`` with LightZero's weights 10 / 1 / 1 /
0.5 as defaults. LightZero hard-codes these in its world model and ignores
its config's weights; here they are constructor arguments and used. Each term
is averaged over its valid positions of a sample (LightZero averages over the
valid tokens; the world model's ``gamma = 1`` weights positions equally),
times the sample's importance weight, then averaged over the batch.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torch.nn import functional as F

from torchrl_muzero.modules.policy_distribution import policy_distribution
from torchrl_muzero.objectives.terms import LossTerm
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss

__all__ = ["UniZeroLoss"]

_LATENT_LOSSES = ("mse", "cos_sim", "group_kl")


class UniZeroLoss(UnrolledModelLoss):
    """UniZero's loss over a sampled ``[B, K + 1]`` segment (module docstring).

    Built on :class:`UnrolledModelLoss` for the input contract, checks and
    priorities (``|decoded root value - target_value[0]|``); the unroll is one
    transformer forward and the reduction averages over valid positions.

    Args:
        model: a :class:`~torchrl_muzero.modules.unizero.UniZeroModel`.

    Keyword Args:
        latent_loss_weight, reward_loss_weight, policy_loss_weight,
            value_loss_weight (float): LightZero's 10 / 1 / 1 / 0.5.
        policy_entropy_weight (float): the entropy bonus ``-w * H(pi)`` inside
            the policy term (logged as ``loss_entropy``), 5e-3.
        target_update_theta (float): the EMA rate of the target encoder, in
            ``(0, 1]`` (LightZero 0.05; 1 copies the online encoder).
        latent_loss (str): ``"mse"`` (default, the paper's), ``"cos_sim"``
            (``1 - cos``) or ``"group_kl"``: with SimNorm latents each group of
            ``simnorm_dim`` features is a distribution, and the term is
            ``KL(target || prediction)`` summed over a group, averaged over the
            groups (LightZero's choice with SimNorm). Its gradient does not
            shrink with the simplex's small entries as the MSE's does: on
            CartPole sizes the MSE term was ~1e-4 of a total of ~0.3.
        policy_ls_eps_start, policy_ls_eps_end (float): policy label smoothing
            ``target <- (1 - eps) * target + eps / A``, decayed linearly from
            start to end over ``policy_ls_eps_decay_steps`` train iterations
            (:meth:`set_train_iter`); ``start = 0`` turns it off.
        reduction (str): ``"mean"``, ``"sum"`` or ``"none"`` over the batch.
        check_inputs (bool): value checks of the targets (device syncs).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> from torchrl_muzero.objectives.unizero import UniZeroLoss
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5,
        ...                      value_support_size=5, reward_support_size=5)
        >>> loss = UniZeroLoss(model)
        >>> B, K1 = 3, 4
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K1, 4), "observation_mask": torch.ones(B, K1, dtype=torch.bool),
        ...     "action": torch.randint(2, (B, K1)), "target_reward": torch.ones(B, K1),
        ...     "target_value": torch.zeros(B, K1), "target_policy": torch.full((B, K1, 2), 0.5),
        ...     "mask": torch.ones(B, K1, dtype=torch.bool), "policy_mask": torch.ones(B, K1, dtype=torch.bool),
        ... }, [B, K1])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_entropy', 'loss_latent', 'loss_policy', 'loss_reward', 'loss_value']
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        >>> loss.after_update(1)  # the EMA step of the target encoder, after the optimizer step
        >>> any(p.requires_grad for p in loss.target_encoder.parameters())
        False
    """

    @dataclass
    class _AcceptedKeys(UnrolledModelLoss._AcceptedKeys):
        """The keys of :class:`UnrolledModelLoss` plus UniZero's.

        Attributes:
            target_reward (NestedKey): reward targets ``[B, K+1]`` (``[k]`` is
                the reward of the transition into ``k``). Defaults to
                ``"target_reward"``.
            observation_mask (NestedKey): bool ``[B, K+1]``, column ``k``
                holds a real observation. Defaults to ``"observation_mask"``.
        """

        target_reward: NestedKey = "target_reward"
        observation_mask: NestedKey = "observation_mask"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys
    _REQUIRED = UnrolledModelLoss._REQUIRED + ("target_reward", "observation_mask")
    _SCALAR_TARGETS = (("target_value", 0), ("target_reward", 1))
    _MODEL_ATTRS = ("encode", "initial_inference", "value_support", "reward_support", "num_actions",
                    "observation_shape", "encoder")
    _MODEL_NAME = "a UniZeroModel"

    def __init__(
        self,
        model: nn.Module,
        *,
        latent_loss_weight: float = 10.0,
        reward_loss_weight: float = 1.0,
        policy_loss_weight: float = 1.0,
        value_loss_weight: float = 0.5,
        policy_entropy_weight: float = 5e-3,
        target_update_theta: float = 0.05,
        latent_loss: str = "mse",
        policy_ls_eps_start: float = 0.0,
        policy_ls_eps_end: float = 0.0,
        policy_ls_eps_decay_steps: int = 50_000,
        reduction: str = "mean",
        check_inputs: bool = True,
    ) -> None:
        super().__init__(
            model, value_loss_weight=value_loss_weight, policy_loss_weight=policy_loss_weight,
            consistency_loss_weight=0.0, reduction=reduction, check_inputs=check_inputs,
            latent_loss_weight=latent_loss_weight, reward_loss_weight=reward_loss_weight,
        )
        if not (0.0 < float(target_update_theta) <= 1.0):
            raise ValueError(f"target_update_theta must lie in (0, 1], got {target_update_theta}.")
        if not (float(policy_entropy_weight) >= 0.0):
            raise ValueError(f"policy_entropy_weight must be >= 0, got {policy_entropy_weight}.")
        if latent_loss not in _LATENT_LOSSES:
            raise ValueError(f"latent_loss must be one of {_LATENT_LOSSES}, got {latent_loss!r}.")
        self.simnorm_dim = getattr(getattr(model, "latent_norm", None), "simnorm_dim", None)
        if latent_loss == "group_kl" and self.simnorm_dim is None:
            raise ValueError("latent_loss='group_kl' needs a model with SimNorm latents (latent_norm='simnorm').")
        for key, value in (("policy_ls_eps_start", policy_ls_eps_start), ("policy_ls_eps_end", policy_ls_eps_end)):
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"{key} must lie in [0, 1), got {value}.")
        if int(policy_ls_eps_decay_steps) < 1:
            raise ValueError(f"policy_ls_eps_decay_steps must be >= 1, got {policy_ls_eps_decay_steps}.")
        self.policy_entropy_weight = float(policy_entropy_weight)
        self.target_update_theta = float(target_update_theta)
        self.latent_loss = latent_loss
        self.policy_ls_eps_start = float(policy_ls_eps_start)
        self.policy_ls_eps_end = float(policy_ls_eps_end)
        self.policy_ls_eps_decay_steps = int(policy_ls_eps_decay_steps)
        # the EMA target: a frozen copy of the online encoder (registered, so checkpoints keep it)
        self.target_encoder = copy.deepcopy(model.encoder)
        for p in self.target_encoder.parameters():
            p.requires_grad_(False)
        self.train_iter = 0

    # -- train_iter hooks (the learner calls them; docs/variants.md) ---------------------
    def set_train_iter(self, train_iter: int) -> None:
        """The learner's update count, given before every forward: drives the label-smoothing schedule."""
        self.train_iter = int(train_iter)

    @property
    def policy_ls_eps(self) -> float:
        """The label smoothing of the current ``train_iter`` (linear from start to end, then constant)."""
        if self.policy_ls_eps_start <= 0.0:
            return 0.0
        frac = min(1.0, self.train_iter / self.policy_ls_eps_decay_steps)
        return self.policy_ls_eps_start + frac * (self.policy_ls_eps_end - self.policy_ls_eps_start)

    @torch.no_grad()
    def after_update(self, train_iter: int) -> None:
        """After an optimizer step: ``target <- (1 - theta) * target + theta * online`` (the EMA)."""
        self.train_iter = int(train_iter)
        theta = self.target_update_theta
        for target, online in zip(self.target_encoder.parameters(), self.model.encoder.parameters()):
            target.lerp_(online.detach(), theta)
        for target, online in zip(self.target_encoder.buffers(), self.model.encoder.buffers()):
            target.copy_(online)  # running statistics (none in the default encoders) follow exactly

    # -- the pipeline's hooks --------------------------------------------------------------
    def term_names(self) -> list[str]:
        return ["latent", "reward", "policy", "entropy", "value"]

    def _read_inputs(self, tensordict: TensorDictBase) -> dict[str, Any]:
        inputs = super()._read_inputs(tensordict)
        B, K1 = inputs["mask"].shape  # (the actions may be a box's floats [B, K+1, D])
        obs_mask = self._per_position(tensordict, "observation_mask", B, K1)
        inputs["observation_mask"] = obs_mask if obs_mask.dtype == torch.bool else obs_mask != 0
        return inputs

    def _unroll(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Encode ``o_0 .. o_K`` and run one causal forward over ``[z_0, a_0, ..., z_K, a_K]``."""
        obs = inputs["observation"]
        latents = self.model.encode(obs)
        out = self.model(latents, inputs["action"])
        with torch.no_grad():  # sg(target encoder): the target side gets no gradient
            target_latent = self.target_encoder(obs[:, 1:].flatten(0, 1)).view(*obs.shape[:1], -1, latents.shape[-1])
        return {
            "policy_logits": out["policy_logits"], "value_logits": out["value_logits"],
            "reward_logits": out["reward_logits"][:, :-1], "next_latent": out["next_latent"][:, :-1],
            "target_latent": target_latent,
        }

    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        mask, policy_mask = inputs["mask"], inputs["policy_mask"]
        value_logits, policy_logits = unrolled["value_logits"], unrolled["policy_logits"]
        dtype = value_logits.dtype
        # masked targets become zeros first so that they cannot matter (even when NaN)
        target_value = torch.where(mask, inputs["target_value"].to(dtype), 0.0)
        target_reward = torch.where(mask[:, 1:], inputs["target_reward"][:, 1:].to(dtype), 0.0)
        target_policy = torch.where(policy_mask.unsqueeze(-1), inputs["target_policy"].to(dtype), 0.0)
        policy_values, entropy = self._policy_and_entropy(inputs, policy_logits, target_policy)
        latent_mask = inputs["observation_mask"][:, 1:] & policy_mask[:, :-1]
        predicted, target = unrolled["next_latent"], unrolled["target_latent"].to(dtype)
        target = torch.where(latent_mask.unsqueeze(-1), target, 0.0)
        if self.latent_loss == "mse":
            latent = F.mse_loss(predicted, target, reduction="none").mean(-1)
        elif self.latent_loss == "group_kl":
            # masked rows: target 0 gives 0 * log(...) = 0 through xlogy
            groups = (*predicted.shape[:-1], -1, self.simnorm_dim)
            p_target, p_pred = target.reshape(groups), predicted.reshape(groups)
            kl = torch.special.xlogy(p_target, p_target) - p_target * torch.log(p_pred.clamp_min(1e-12))
            latent = kl.sum(-1).mean(-1)
        else:
            latent = 1.0 - F.cosine_similarity(predicted, target, dim=-1, eps=1e-8)
        return {
            "latent": LossTerm(latent, latent_mask),
            "reward": LossTerm(self.model.reward_support.cross_entropy(unrolled["reward_logits"], target_reward),
                               mask[:, 1:]),
            "policy": LossTerm(policy_values, policy_mask),
            "entropy": LossTerm(-entropy, policy_mask),
            "value": LossTerm(self.model.value_support.cross_entropy(value_logits, target_value), mask),
        }

    def _policy_and_entropy(self, inputs: dict[str, Any], policy_logits: torch.Tensor,
                            target_policy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cross-entropy [B, K+1], entropy [B, K+1])`` of the policy against the (smoothed) target.

        Why a hook: sampled UniZero's target is over each position's stored
        candidates, not the model's actions
        (:class:`~torchrl_muzero.objectives.sampled.SampledUniZeroLoss`).
        """
        policy = policy_distribution(self.model, policy_logits)
        eps = self.policy_ls_eps
        if eps > 0:
            target_policy = policy.smooth_target(target_policy, eps)
        # the entropy before the cross-entropy, as before the interface: autograd then sums the
        # log-probs' gradients in the same order, so the update stays bit for bit the same
        entropy = policy.entropy()
        return policy.cross_entropy(target_policy), entropy

    def _reduce_terms(
        self, terms: dict[str, LossTerm], weight: torch.Tensor | None, num_unroll_steps: int
    ) -> dict[str, torch.Tensor]:
        """Each term: mean over the sample's positions of ``values * mask``, IS weight, batch reduction, weight.

        The denominator is the term's number of positions (``K + 1`` or ``K``)
        rather than the count of valid ones, so a position missing its target
        lowers that sample's term instead of reweighting the others.
        """
        out = {}
        for name, term in terms.items():
            per_sample = (term.values * term.mask.to(term.values.dtype)).mean(1)
            if name == "entropy":  # the bonus rides on the policy term, as in LightZero
                scale = self.policy_loss_weight * self.policy_entropy_weight
            else:
                scale = getattr(self, f"{name}_loss_weight")
            out[f"loss_{name}"] = scale * self._reduce(per_sample, weight)
        return out
