"""The MuZero training loss (MuZero paper, section 3 and appendix G).

The model is unrolled ``K`` steps from the root observation along the actions
that were actually taken; at every position the predicted value, reward and
policy are matched against the targets the replay buffer built. Optionally,
EfficientZero's self-supervised consistency loss ties the unrolled latents to
the representation of the real observations. The pipeline and the shared terms
live in :class:`~torchrl_muzero.objectives.unrolled.UnrolledModelLoss`; this
class adds the reward term and its key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict.utils import NestedKey
from torch import nn

from torchrl_muzero.objectives.terms import LossTerm, scale_gradient
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss

__all__ = ["MuZeroLoss", "scale_gradient"]


class MuZeroLoss(UnrolledModelLoss):
    """MuZero's K-step unrolled loss, with EfficientZero's optional consistency loss.

    The root latent is ``latent_0 = h(observation[:, 0])``; for ``k = 1..K`` the
    dynamics step from ``latent_{k-1}`` (its gradient scaled by
    ``latent_grad_scale``, 0.5 in MuZero) along ``action[:, k-1]``. At every
    position ``k`` the loss adds

    * the value cross-entropy against ``target_value[:, k]`` (categorical
      support of the model, where ``mask[:, k]``),
    * for ``k >= 1``, the reward cross-entropy against ``target_reward[:, k]``
      (the reward of the transition into position ``k``, where ``mask[:, k]``),
    * the policy cross-entropy ``-sum(target_policy * log_softmax(logits))``
      (where ``policy_mask[:, k]``), or with ``policy_loss="kl"`` the
      KL divergence ``KL(target_policy || softmax(logits))`` (same gradient),

    and the terms of positions ``k >= 1`` are multiplied by ``1 / K`` so the
    dynamics receive the same gradient whatever the unroll length (MuZero scales
    the gradient; scaling the loss gives the same gradient, and the logged value
    is the one that is optimised). Each sample's sum is multiplied by its
    importance-sampling weight (``weight``, default 1) and the batch is averaged.

    With ``consistency_loss_weight > 0`` (EfficientZero uses 2.0), the loss also
    owns a ``projector`` and a ``predictor`` and adds, for ``k = 1..K`` where
    ``mask[:, k]``, the negative cosine similarity between
    ``predictor(projector(unrolled latent_k))`` and
    ``projector(h(observation[:, k]))``, the latter computed without gradient
    (SimSiam stop-gradient). Being ``-cos``, this term lies in ``[-1, 1]`` and
    reaches ``-1`` at best. It is scaled by ``1 / K`` like the other unrolled
    terms.

    Args:
        model (MuZeroModel): the network; its ``initial_inference``,
            ``recurrent_inference``, ``value_support``, ``reward_support`` and
            ``num_actions`` are used. Its parameters are registered in the loss.

    Keyword Args:
        value_loss_weight (float): weight of the value loss. Defaults to 0.25
            (the MuZero Reanalyze setting).
        reward_loss_weight (float): weight of the reward loss. Defaults to 1.0.
        policy_loss_weight (float): weight of the policy loss. Defaults to 1.0.
        consistency_loss_weight (float): weight of the consistency loss;
            0 (default) turns it off.
        latent_grad_scale (float): gradient scale applied to the latent at the
            start of every dynamics step, in ``[0, 1]``. Defaults to 0.5.
        policy_loss (str): ``"cross_entropy"`` (default) or ``"kl"``
            (LightZero's Gumbel MuZero). KL's value is the cross-entropy minus
            the target policy's entropy; the gradient is the same.
        projector (nn.Module, optional): maps latents ``[N, *latent_shape]``
            to projections ``[N, D]``. Defaults to Flatten-Linear-LayerNorm-ReLU-
            Linear-LayerNorm built from the flattened latent size (found by
            running the representation once on a zero observation).
        predictor (nn.Module, optional): maps projections ``[N, D]`` to
            ``[N, D]``. Defaults to Linear-LayerNorm-ReLU-Linear.
        projection_dim (int): ``D`` of the default projector. Defaults to 256.
        projection_hidden_dim (int): hidden width of the default projector.
            Defaults to 256.
        prediction_hidden_dim (int): hidden width of the default predictor.
            Defaults to 64.
        reduction (str): ``"mean"`` (default) or ``"sum"`` over the batch, or
            ``"none"`` for per-sample losses of shape ``[B]``.
        check_inputs (bool): check the input values (finite targets,
            normalised target policies, non-negative weights). These checks
            synchronise with the device; shapes and keys are always checked.
            Defaults to ``True``.

    Input keys (configurable with :meth:`set_keys`; ``B`` samples, ``K`` unroll
    steps, ``A = model.num_actions``):

    * ``observation`` ``[B, K+1, *obs_shape]``: index 0 is the root; indices
      ``1..K`` are read only by the consistency loss.
    * ``action`` ``[B, K+1]`` integers, or one-hot ``[B, K+1, A]``: the action
      taken at each position (the last one is unused). Actions at unmasked
      positions past an episode's end must still be valid indices.
    * ``target_reward`` ``[B, K+1]`` (index 0 unused), ``target_value``
      ``[B, K+1]``, ``target_policy`` ``[B, K+1, A]`` (rows sum to 1 where
      ``policy_mask``). A trailing singleton dimension is accepted on the
      ``[B, K+1]`` entries.
    * ``mask`` ``[B, K+1]`` bool: value and reward targets exist at position k
      (also masks the consistency loss); ``policy_mask`` ``[B, K+1]`` bool: a
      policy target exists. Targets at masked positions are ignored, even NaN.
    * ``weight`` ``[B]`` (or ``[B, 1]``, or ``[B, K+1]`` of which column 0 is
      read), optional: importance-sampling weights.

    Output: a TensorDict holding ``"loss_value"``, ``"loss_reward"``,
    ``"loss_policy"`` (and ``"loss_consistency"`` when on), already weighted
    (sum the ``"loss_*"`` entries to train), ``"priority"`` ``[B]`` =
    ``|decoded root value - target_value[:, 0]|`` (detached; 0 where
    ``mask[:, 0]`` is false), and the logging scalars ``"value_prediction"``
    (mean decoded root value), ``"value_error"`` (mean priority) and
    ``"policy_entropy"`` (mean entropy of the predicted root policy). The
    priority is also written into the input tensordict under the ``priority``
    key: shape ``[B]`` if its batch size is ``[B]``, else broadcast over its
    batch shape (e.g. ``[B, K+1]``, every row constant).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.objectives import MuZeroLoss
        >>> B, K, A = 4, 3, 2
        >>> model = MuZeroMLPModel(observation_shape=(4,), num_actions=A,
        ...                        latent_dim=16, hidden_dim=32)
        >>> loss = MuZeroLoss(model, consistency_loss_weight=2.0,
        ...                   projection_dim=32, projection_hidden_dim=32,
        ...                   prediction_hidden_dim=16)
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K + 1, 4),
        ...     "action": torch.randint(A, (B, K + 1)),
        ...     "target_reward": torch.ones(B, K + 1),
        ...     "target_value": torch.randn(B, K + 1),
        ...     "target_policy": torch.softmax(torch.randn(B, K + 1, A), -1),
        ...     "mask": torch.ones(B, K + 1, dtype=torch.bool),
        ...     "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
        ... }, batch_size=[B, K + 1])
        >>> out = loss(batch)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_consistency', 'loss_policy', 'loss_reward', 'loss_value']
        >>> total = sum(v for k, v in out.items() if k.startswith("loss_"))
        >>> total.backward()
        >>> out["priority"].shape, batch["priority"].shape
        (torch.Size([4]), torch.Size([4, 4]))
        >>> model.representation_net[0].weight.grad is not None
        True
    """

    @dataclass
    class _AcceptedKeys(UnrolledModelLoss._AcceptedKeys):
        """Maintains default values for all configurable tensordict keys.

        This class defines which tensordict keys can be set using
        ``.set_keys(key_name=key_value)`` and their default values: those of
        :class:`UnrolledModelLoss._AcceptedKeys` (``observation``, ``action``,
        ``target_value``, ``target_policy``, ``mask``, ``policy_mask``,
        ``weight``, ``priority``) and

        Attributes:
            target_reward (NestedKey): reward targets ``[B, K+1]`` (index 0
                unused). Defaults to ``"target_reward"``.
        """

        target_reward: NestedKey = "target_reward"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys

    _REQUIRED = (
        "observation",
        "action",
        "target_reward",
        "target_value",
        "target_policy",
        "mask",
        "policy_mask",
    )
    _SCALAR_TARGETS = (("target_value", 0), ("target_reward", 1))
    _MODEL_ATTRS = (
        "initial_inference",
        "recurrent_inference",
        "value_support",
        "reward_support",
        "num_actions",
        "observation_shape",
    )

    def __init__(
        self,
        model: nn.Module,
        *,
        value_loss_weight: float = 0.25,
        reward_loss_weight: float = 1.0,
        policy_loss_weight: float = 1.0,
        consistency_loss_weight: float = 0.0,
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
        if getattr(model, "predicts_value_prefix", False):
            raise ValueError(
                f"MuZeroLoss: {type(model).__name__} predicts value prefixes, not rewards; "
                "train it with EfficientZeroLoss."
            )
        super().__init__(
            model,
            value_loss_weight=value_loss_weight,
            reward_loss_weight=reward_loss_weight,
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
        """``value``, ``reward``, ``policy`` and, when on, ``consistency``."""
        names = super().term_names()
        names.insert(1, "reward")
        return names

    def _dynamics_step(
        self, latent: torch.Tensor, carry: Any, action: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``model.recurrent_inference``; the reward logits go into the extras."""
        latent, reward_logits, policy_logits, value_logits = self.model.recurrent_inference(
            latent, action
        )
        return latent, carry, policy_logits, value_logits, {"reward_logits": reward_logits}

    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        """The base terms plus ``reward`` ``[B, K]``: CE of the reward into each unrolled position."""
        terms = super()._step_terms(inputs, unrolled)
        reward_logits = unrolled["reward_logits"]  # [B, K, bins]
        mask = inputs["mask"][:, 1:]
        target = torch.where(mask, inputs["target_reward"][:, 1:].to(reward_logits.dtype), 0.0)
        reward = LossTerm(self.model.reward_support.cross_entropy(reward_logits, target), mask)
        return {"value": terms.pop("value"), "reward": reward, **terms}
