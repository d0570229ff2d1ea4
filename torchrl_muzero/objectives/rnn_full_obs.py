"""MuZero w/ RNN's training loss: teacher forcing with the real observations (LightZero's ``muzero_rnn_full_obs``).

MuZero's terms (value, reward, policy, SimSiam consistency) on a different
unroll: the GRU state starts at zeros at the root and is carried along the
``K`` steps, but the latent fed on at step ``k + 1`` is the encoded real
observation ``h(o_{t+k+1})`` (with gradient) wherever it exists, not the
dynamics' prediction. The predicted latent is trained only by the consistency
term (and fed on where no observation exists), so the policy and value heads
always read a latent grounded in an observation, as at acting time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from torchrl_muzero.objectives.muzero import MuZeroLoss
from torchrl_muzero.objectives.terms import scale_gradient

__all__ = ["RNNFullObsLoss"]


class RNNFullObsLoss(MuZeroLoss):
    """MuZero's K-step loss with teacher forcing, for a model with a GRU state (``RNNFullObsModel``).

    With ``s_0 = h(o_0)`` and ``hidden_0 = 0``, for ``k = 1..K``::

        s_hat_k, hidden_k, r_k = g(sg_scale(s_{k-1}), hidden_{k-1}, a_{k-1})
        s_k = h(o_k) if observation_mask[:, k] else s_hat_k
        pi_k, v_k = f(s_k, hidden_k)

    (``sg_scale``: the gradient scale ``latent_grad_scale``). The value,
    reward and policy terms are :class:`~torchrl_muzero.objectives.MuZeroLoss`'s
    on ``(pi_k, v_k, r_k)``; the consistency term compares the *predicted*
    ``s_hat_k`` with ``sg(h(o_k))`` (SimSiam, LightZero's weight 2): it is the
    only gradient into the latent head where observations exist. All ``K + 1``
    observations are encoded in one batch.

    Args / Keyword Args: as :class:`~torchrl_muzero.objectives.MuZeroLoss`.

    Input keys: :class:`~torchrl_muzero.objectives.MuZeroLoss`'s, plus
    ``observation_mask`` ``[B, K+1]`` bool (column ``k`` holds the real
    observation ``o_{t+k}``: the replay buffer's
    ``with_future_observations=True``). ``observation[:, 1:]`` is read by the
    unroll itself, not only by the consistency term.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel
        >>> from torchrl_muzero.objectives.rnn_full_obs import RNNFullObsLoss
        >>> B, K, A = 4, 3, 2
        >>> model = RNNFullObsMLPModel((4,), A, latent_dim=8, hidden_dim=16, rnn_hidden_size=8)
        >>> loss = RNNFullObsLoss(model, consistency_loss_weight=2.0, projection_dim=8,
        ...                       projection_hidden_dim=8, prediction_hidden_dim=8)
        >>> batch = TensorDict({
        ...     "observation": torch.randn(B, K + 1, 4),
        ...     "observation_mask": torch.ones(B, K + 1, dtype=torch.bool),
        ...     "action": torch.randint(A, (B, K + 1)),
        ...     "target_reward": torch.ones(B, K + 1),
        ...     "target_value": torch.randn(B, K + 1),
        ...     "target_policy": torch.softmax(torch.randn(B, K + 1, A), -1),
        ...     "mask": torch.ones(B, K + 1, dtype=torch.bool),
        ...     "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
        ... }, batch_size=[B, K + 1])
        >>> out = loss(batch)
        >>> [k for k in out.keys() if k.startswith("loss_")]
        ['loss_value', 'loss_reward', 'loss_policy', 'loss_consistency']
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        >>> model.gru.weight_ih.grad is not None and model.latent_head.weight.grad is not None
        True
    """

    @dataclass
    class _AcceptedKeys(MuZeroLoss._AcceptedKeys):
        """Maintains default values for all configurable tensordict keys.

        Those of :class:`~torchrl_muzero.objectives.MuZeroLoss` and

        Attributes:
            observation_mask (NestedKey): ``[B, K+1]`` bool, column ``k`` holds
                a real observation. Defaults to ``"observation_mask"``.
        """

        observation_mask: NestedKey = "observation_mask"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys

    _REQUIRED = MuZeroLoss._REQUIRED + ("observation_mask",)
    _MODEL_ATTRS = (
        "encode",
        "initial_hidden",
        "dynamics_hidden",
        "predict_hidden",
        "value_support",
        "reward_support",
        "num_actions",
        "observation_shape",
    )
    _MODEL_NAME = "a model with a GRU state (RNNFullObsMLPModel / RNNFullObsResNetModel)"

    def _read_inputs(self, tensordict: TensorDictBase) -> dict[str, Any]:
        """MuZero's inputs plus ``observation_mask`` ``[B, K+1]`` bool."""
        inputs = super()._read_inputs(tensordict)
        B, K1 = inputs["action"].shape
        obs_mask = self._per_position(tensordict, "observation_mask", B, K1)
        obs_mask = obs_mask if obs_mask.dtype == torch.bool else obs_mask != 0
        inputs["observation_mask"] = obs_mask
        if self.check_inputs:
            keys, name = self.tensor_keys, type(self).__name__
            if not bool(obs_mask[:, 0].all()):
                raise ValueError(f"{name}: '{keys.observation_mask}' must be true in column 0 (the root).")
            if bool(inputs["mask"][:, 1:].any()) and not bool(obs_mask[:, 1:].any()):
                # without them the unroll would silently become MuZero's: say so instead
                raise ValueError(
                    f"{name}: '{keys.observation_mask}' has no observation past column 0 while "
                    f"'{keys.mask}' has targets there: teacher forcing needs the future observations "
                    "(GameBuffer(with_future_observations=True))."
                )
            obs = inputs["observation"]
            if obs.is_floating_point() and not bool(torch.isfinite(obs[obs_mask]).all()):
                raise ValueError(f"{name}: '{keys.observation}' holds NaN or infinite values where "
                                 f"'{keys.observation_mask}' is true.")
        return inputs

    def _unroll(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The teacher-forced unroll; ``latents`` are the *predicted* ones (the consistency term's input).

        Returns the base's ``policy_logits`` ``[B, K+1, A]``, ``value_logits``
        ``[B, K+1, bins]``, ``latents`` (list of ``K`` predicted latents) and
        ``reward_logits`` ``[B, K, bins]``.
        """
        model = self.model
        obs, obs_mask, action = inputs["observation"], inputs["observation_mask"], inputs["action"]
        B, K1 = action.shape
        # only real observations are encoded: missing ones (zeros) neither reach a head nor batch-norm statistics
        encoded = model.encode(obs[obs_mask])
        real = encoded.new_zeros(B, K1, *encoded.shape[1:])
        real[obs_mask] = encoded
        latent = real[:, 0]
        hidden = model.initial_hidden(B, latent.device, latent.dtype)
        root_policy, root_value = model.predict_hidden(latent, hidden)
        policy_logits, value_logits, predicted, reward_logits = [root_policy], [root_value], [], []
        for k in range(1, K1):
            latent_in = scale_gradient(latent, self.latent_grad_scale)
            predicted_latent, hidden, r_logits = model.dynamics_hidden(latent_in, hidden, action[:, k - 1])
            have = obs_mask[:, k].view(B, *([1] * (latent.ndim - 1)))
            latent = torch.where(have, real[:, k], predicted_latent)
            p_logits, v_logits = model.predict_hidden(latent, hidden)
            predicted.append(predicted_latent)
            policy_logits.append(p_logits)
            value_logits.append(v_logits)
            reward_logits.append(r_logits)
        return {
            "policy_logits": torch.stack(policy_logits, 1),
            "value_logits": torch.stack(value_logits, 1),
            "latents": predicted,
            "reward_logits": torch.stack(reward_logits, 1),
        }
