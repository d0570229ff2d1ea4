"""Hook 1 of :class:`~torchrl_muzero.objectives.unrolled.UnrolledModelLoss`: reading and checking its inputs.

:class:`UnrolledInputs` is the loss's contract with the replay buffer: which entries it reads,
their shapes, and (with ``check_inputs``) their values. Its own module because it is its own
concept; the loss class mixes it in, and variants override these hooks on the loss as before
(the sampled family's continuous actions, the stochastic family's chance codes).
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from torchrl_muzero.envs.action_spaces import read_action_index

__all__ = ["UnrolledInputs"]


class UnrolledInputs:
    """The input hooks of :class:`~torchrl_muzero.objectives.unrolled.UnrolledModelLoss` (a mixin).

    It reads ``self.tensor_keys``, ``self.model``, ``self._REQUIRED``,
    ``self._SCALAR_TARGETS``, ``self.check_inputs`` and
    ``self.consistency_loss_weight``, which the loss defines.

    Examples:
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.objectives import MuZeroLoss
        >>> loss = MuZeroLoss(MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8))
        >>> isinstance(loss, UnrolledInputs), "weight" in loss.in_keys
        (True, True)
    """

    def _read_inputs(self, tensordict: TensorDictBase) -> dict[str, Any]:
        """Read every input entry, check its shape, return plain tensors by key name.

        Why a hook: the entries and their shapes are the loss's contract with
        the replay buffer, and variants add entries. Most variants only list
        theirs in ``_REQUIRED`` and ``_SCALAR_TARGETS`` (read as ``[B, K+1]``
        and value-checked from the given position on); a variant with a
        differently shaped entry (chance codes, sampled actions) overrides this,
        calls ``super()._read_inputs`` and adds its own.

        Returns a dict with ``observation``, ``action`` (``[B, K+1]`` long),
        ``target_policy``, bool ``mask`` / ``policy_mask``, ``weight``
        (``[B]`` or ``None``) and every ``_SCALAR_TARGETS`` name.
        """
        keys, name = self.tensor_keys, type(self).__name__
        missing = [
            f"{key}={getattr(keys, key)!r}"
            for key in self._REQUIRED
            if tensordict.get(getattr(keys, key), None) is None
        ]
        if missing:
            raise ValueError(
                f"{name}: the input tensordict lacks the entries {missing} "
                f"(use set_keys to rename); it has {sorted(map(str, tensordict.keys(True, True)))}."
            )
        model = self.model
        obs = tensordict.get(keys.observation)
        batch_shape = model.check_observation(obs)
        if len(batch_shape) != 2:
            raise ValueError(
                f"{name}: '{keys.observation}' must be [B, K+1, "
                f"{', '.join(map(str, model.observation_shape))}], got {tuple(obs.shape)}."
            )
        B, K1 = batch_shape
        if K1 < 2:
            raise ValueError(
                f"{name} needs at least one unroll step (K+1 >= 2 positions), got K+1 = {K1}."
            )
        A = model.num_actions
        action = self._read_action(tensordict, B, K1)

        target_policy = tensordict.get(keys.target_policy)
        if target_policy.shape != (B, K1, A):
            raise ValueError(
                f"{name}: '{keys.target_policy}' must have shape [B, K+1, num_actions] = "
                f"[{B}, {K1}, {A}], got {tuple(target_policy.shape)}"
                + (
                    f" (last dimension {target_policy.shape[-1]} != model.num_actions = {A})."
                    if target_policy.ndim == 3 and target_policy.shape[:2] == (B, K1)
                    else "."
                )
            )
        mask = self._per_position(tensordict, "mask", B, K1)
        policy_mask = self._per_position(tensordict, "policy_mask", B, K1)
        mask = mask if mask.dtype == torch.bool else mask != 0
        policy_mask = policy_mask if policy_mask.dtype == torch.bool else policy_mask != 0

        weight = tensordict.get(keys.weight, None)
        if weight is not None:
            if weight.shape in ((B, 1), (B, K1)):
                weight = weight[:, 0]
            if weight.shape != (B,):
                raise ValueError(
                    f"{name}: '{keys.weight}' must have shape [B] = [{B}] (or [B, 1] / "
                    f"[B, K+1]), got {tuple(weight.shape)}."
                )

        inputs = dict(observation=obs, action=action)
        for target, _ in self._SCALAR_TARGETS:
            inputs[target] = self._per_position(tensordict, target, B, K1)
        inputs.update(target_policy=target_policy, mask=mask, policy_mask=policy_mask, weight=weight)
        if self.check_inputs:
            self._check_values(inputs)
        return inputs

    def _read_action(self, tensordict: TensorDictBase, B: int, K1: int) -> torch.Tensor:
        """The actions the unroll follows: ``[B, K+1]`` long indices here.

        Why a hook: the dynamics take the env's actions, and only a variant
        knows their form. The base reads discrete actions (one-hot
        ``[B, K+1, A]``, or integer ``[B, K+1(, 1)]``); the sampled family
        reads continuous actions ``[B, K+1, D]`` as they are
        (:class:`~torchrl_muzero.objectives.sampled.SampledPolicyLoss`).
        """
        keys, name, A = self.tensor_keys, type(self).__name__, self.model.num_actions
        # one-hot [B, K1, A] (with A == 1: float / bool ones) or integer [B, K1, 1] -> [B, K1]
        action = read_action_index(tensordict.get(keys.action), A, (B, K1), single="by_dtype", squeeze_floats=False)
        if action.shape != (B, K1) or action.dtype.is_floating_point or action.dtype == torch.bool:
            raise ValueError(
                f"{name}: '{keys.action}' must be integer indices [B, K+1] = [{B}, {K1}] "
                f"or one-hot [{B}, {K1}, {A}], got shape {tuple(action.shape)} of dtype {action.dtype}."
            )
        return action

    def _per_position(self, tensordict: TensorDictBase, key: str, B: int, K1: int) -> torch.Tensor:
        """The ``[B, K+1]`` entry of key name ``key`` (a trailing singleton is dropped)."""
        value = tensordict.get(getattr(self.tensor_keys, key))
        if value.shape == (B, K1, 1):
            value = value.squeeze(-1)
        if value.shape != (B, K1):
            raise ValueError(
                f"{type(self).__name__}: '{getattr(self.tensor_keys, key)}' must have shape "
                f"[B, K+1] = [{B}, {K1}] (from the observation), got {tuple(value.shape)}."
            )
        return value

    def _check_values(self, inputs: dict[str, Any]) -> None:
        """Finite targets where they count, normalised policies, weights >= 0."""
        keys, name = self.tensor_keys, type(self).__name__
        mask, policy_mask = inputs["mask"], inputs["policy_mask"]
        checks = [
            (target, inputs[target][:, start:][mask[:, start:]])
            for target, start in self._SCALAR_TARGETS
        ]
        policies = inputs["target_policy"][policy_mask]
        checks.append(("target_policy", policies))
        for key, valid in checks:
            if not bool(torch.isfinite(valid).all()):
                raise ValueError(
                    f"{name}: '{getattr(keys, key)}' holds NaN or infinite values at "
                    f"unmasked positions ({int((~torch.isfinite(valid)).sum())} entries)."
                )
        if policies.numel():
            if bool((policies < 0).any()):
                raise ValueError(
                    f"{name}: '{keys.target_policy}' has negative probabilities at "
                    "unmasked positions."
                )
            sums = policies.sum(-1)
            if not bool(((sums - 1).abs() <= 1e-3).all()):
                raise ValueError(
                    f"{name}: '{keys.target_policy}' rows must sum to 1 where "
                    f"'{keys.policy_mask}' is true; found sums in "
                    f"[{float(sums.min()):.4g}, {float(sums.max()):.4g}]."
                )
        weight = inputs["weight"]
        if weight is not None and not bool((torch.isfinite(weight) & (weight >= 0)).all()):
            raise ValueError(f"{name}: '{keys.weight}' must be finite and >= 0.")
        obs = inputs["observation"]
        if obs.is_floating_point():
            used = obs if self.consistency_loss_weight > 0 else obs[:, 0]
            if not bool(torch.isfinite(used).all()):
                raise ValueError(f"{name}: '{keys.observation}' holds NaN or infinite values.")
