"""EfficientZero's training loss (Ye et al. 2021; LightZero ``lzero/policy/efficientzero.py``).

MuZero's unrolled loss with two changes: the reward term is replaced by the
value-prefix cross-entropy (the model's LSTM state is carried along the unroll
and reset to zeros every ``model.lstm_horizon_len`` steps), and the SimSiam
consistency term is on by default (weight 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict.utils import NestedKey
from torch import nn

from torchrl_muzero.objectives.terms import LossTerm
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss

__all__ = ["EfficientZeroLoss"]


class EfficientZeroLoss(UnrolledModelLoss):
    """EfficientZero's K-step unrolled loss: value, value prefix, policy, consistency.

    The root latent is ``h(observation[:, 0])`` and the LSTM state starts at
    zeros; for ``k = 1..K`` the model steps with
    ``model.recurrent_inference_prefix(latent_{k-1}, lstm_state, action[:, k-1])``
    (the latent's gradient scaled by ``latent_grad_scale``), and after every
    step ``k`` with ``k % model.lstm_horizon_len == 0`` the LSTM state is reset
    to zeros, as in the search (one ``H``, the model's). Per position:

    * value cross-entropy against ``target_value[:, k]`` (``k = 0..K``, where ``mask``),
    * for ``k >= 1``, value-prefix cross-entropy (reward support) against
      ``target_value_prefix[:, k]``, the undiscounted sum of the rewards since
      the last reset (the buffer's ``ValuePrefixTargets``: for all-ones
      rewards ``[_, 1, 2, ..., H, 1, 2, ...]``), where ``mask``,
    * policy cross-entropy (or KL with ``policy_loss="kl"``) where ``policy_mask``,
    * for ``k >= 1``, the SimSiam consistency ``-cos(pred(proj(latent_k)),
      sg(proj(h(observation[:, k]))))`` where ``mask``: the target branch runs
      under ``torch.no_grad``.

    Scaling (root 1, unrolled positions ``1 / K``), importance weights,
    reduction, priority and logs are those of
    :class:`~torchrl_muzero.objectives.MuZeroLoss`.

    Args:
        model (EfficientZeroModel): e.g.
            :class:`~torchrl_muzero.modules.EfficientZeroMLPModel`.

    Keyword Args:
        value_loss_weight (float): defaults to 0.25 (LightZero).
        value_prefix_loss_weight (float): defaults to 1.0 (LightZero's
            ``reward_loss_weight``).
        reward_loss_weight (float, optional): another name for
            ``value_prefix_loss_weight`` (the ``loss.*`` config key shared with
            MuZero); give one or the other.
        policy_loss_weight (float): defaults to 1.0.
        consistency_loss_weight (float): defaults to 2.0 (LightZero's ``ssl_loss_weight``).
        latent_grad_scale, policy_loss, projector, predictor, projection_dim,
            projection_hidden_dim, prediction_hidden_dim, reduction,
            check_inputs: as :class:`~torchrl_muzero.objectives.MuZeroLoss`.

    Input keys: those of :class:`~torchrl_muzero.objectives.MuZeroLoss` with
    ``target_value_prefix`` ``[B, K+1]`` (index 0 unused) instead of
    ``target_reward``. Output: ``"loss_value"``, ``"loss_value_prefix"``,
    ``"loss_policy"``, ``"loss_consistency"`` (when its weight is > 0),
    ``"priority"`` and the logging scalars.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules import EfficientZeroMLPModel
        >>> from torchrl_muzero.objectives import EfficientZeroLoss
        >>> B, K, A = 4, 3, 2
        >>> model = EfficientZeroMLPModel((4,), A, latent_dim=16, hidden_dim=16,
        ...                               lstm_hidden_size=8, lstm_horizon_len=2)
        >>> loss = EfficientZeroLoss(model, projection_dim=16, projection_hidden_dim=16,
        ...                          prediction_hidden_dim=8)
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K + 1, 4),
        ...     "action": torch.randint(A, (B, K + 1)),
        ...     "target_value_prefix": torch.tensor([0.0, 1.0, 2.0, 1.0]).expand(B, K + 1),
        ...     "target_value": torch.randn(B, K + 1),
        ...     "target_policy": torch.softmax(torch.randn(B, K + 1, A), -1),
        ...     "mask": torch.ones(B, K + 1, dtype=torch.bool),
        ...     "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
        ... }, batch_size=[B, K + 1])
        >>> out = loss(batch)
        >>> [k for k in out.keys() if k.startswith("loss_")]
        ['loss_value', 'loss_value_prefix', 'loss_policy', 'loss_consistency']
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        >>> model.value_prefix_lstm.weight_ih.grad is not None
        True
    """

    @dataclass
    class _AcceptedKeys(UnrolledModelLoss._AcceptedKeys):
        """Maintains default values for all configurable tensordict keys.

        Those of :class:`UnrolledModelLoss._AcceptedKeys` (``observation``,
        ``action``, ``target_value``, ``target_policy``, ``mask``,
        ``policy_mask``, ``weight``, ``priority``) and

        Attributes:
            target_value_prefix (NestedKey): value-prefix targets ``[B, K+1]``
                (index 0 unused). Defaults to ``"target_value_prefix"``.
        """

        target_value_prefix: NestedKey = "target_value_prefix"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys

    _REQUIRED = (
        "observation",
        "action",
        "target_value_prefix",
        "target_value",
        "target_policy",
        "mask",
        "policy_mask",
    )
    _SCALAR_TARGETS = (("target_value", 0), ("target_value_prefix", 1))
    _MODEL_ATTRS = (
        "initial_inference",
        "recurrent_inference_prefix",
        "initial_lstm_state",
        "lstm_horizon_len",
        "value_support",
        "reward_support",
        "num_actions",
        "observation_shape",
    )
    _MODEL_NAME = "an EfficientZero model (e.g. EfficientZeroMLPModel)"

    def __init__(
        self,
        model: nn.Module,
        *,
        value_loss_weight: float = 0.25,
        value_prefix_loss_weight: float | None = None,
        reward_loss_weight: float | None = None,
        policy_loss_weight: float = 1.0,
        consistency_loss_weight: float = 2.0,
        latent_grad_scale: float = 0.5,
        policy_loss: str = "cross_entropy",
        projector: nn.Module | None = None,
        predictor: nn.Module | None = None,
        projection_dim: int = 256,
        projection_hidden_dim: int = 256,
        prediction_hidden_dim: int = 64,
        reduction: str = "mean",
        check_inputs: bool = True,
    ) -> None:
        if value_prefix_loss_weight is not None and reward_loss_weight is not None:
            raise ValueError(
                "EfficientZeroLoss: give value_prefix_loss_weight or its alias "
                "reward_loss_weight, not both."
            )
        weight = value_prefix_loss_weight if value_prefix_loss_weight is not None else reward_loss_weight
        super().__init__(
            model,
            value_loss_weight=value_loss_weight,
            value_prefix_loss_weight=1.0 if weight is None else weight,
            policy_loss_weight=policy_loss_weight,
            consistency_loss_weight=consistency_loss_weight,
            latent_grad_scale=latent_grad_scale,
            policy_loss=policy_loss,
            projector=projector,
            predictor=predictor,
            projection_dim=projection_dim,
            projection_hidden_dim=projection_hidden_dim,
            prediction_hidden_dim=prediction_hidden_dim,
            reduction=reduction,
            check_inputs=check_inputs,
        )

    def term_names(self) -> list[str]:
        """``value``, ``value_prefix``, ``policy`` and, when on, ``consistency``."""
        names = super().term_names()
        names.insert(1, "value_prefix")
        return names

    def _initial_carry(self, root_latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The zero LSTM state ``(h, c)`` of the root."""
        return self.model.initial_lstm_state(root_latent.shape[0], root_latent.device, root_latent.dtype)

    def _dynamics_step(
        self, latent: torch.Tensor, carry: Any, action: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``model.recurrent_inference_prefix``; the state is zeroed after step ``k % H == 0``."""
        model = self.model
        latent, carry, prefix_logits, policy_logits, value_logits = model.recurrent_inference_prefix(
            latent, carry, action
        )
        if k % model.lstm_horizon_len == 0:
            carry = tuple(torch.zeros_like(t) for t in carry)
        return latent, carry, policy_logits, value_logits, {"value_prefix_logits": prefix_logits}

    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        """The base terms plus ``value_prefix`` ``[B, K]`` (CE on the reward support)."""
        terms = super()._step_terms(inputs, unrolled)
        prefix_logits = unrolled["value_prefix_logits"]  # [B, K, bins]
        mask = inputs["mask"][:, 1:]
        target = torch.where(mask, inputs["target_value_prefix"][:, 1:].to(prefix_logits.dtype), 0.0)
        prefix = LossTerm(self.model.reward_support.cross_entropy(prefix_logits, target), mask)
        return {"value": terms.pop("value"), "value_prefix": prefix, **terms}
