"""Stochastic MuZero's training loss (Antonoglou et al., ICLR 2022).

MuZero's unrolled loss where every dynamics step goes through an afterstate
and a chance code: for ``k = 0..K-1``

* ``as_k = phi(s_k, a_k)``, ``(sigma_k, Q_k) = psi(as_k)``,
* ``c_k`` = the chance encoder's straight-through one-hot code of
  ``(o_{t+k}, o_{t+k+1})`` (the batch needs the future observations: the
  replay buffer's ``with_future_observations=True``),
* ``(s_{k+1}, r_{k+1}) = g(as_k, c_k)``, ``(pi_{k+1}, v_{k+1}) = f(s_{k+1})``.

Terms: MuZero's value / reward / policy (and optional consistency), plus

* ``afterstate_value``: ``CE(Q_k, target_value[:, k])`` where ``mask[:, k]``
  (weight 0.25 like the value),
* ``chance``: ``CE(sigma_k, sg(c_k))`` where both observations exist (weight 1),
* ``commitment``: ``||sg(c_k) - softmax(c^e_k)||^2`` there too (``beta``, weight 1).

The paper (section 4.1, "Model training", and its appendix pseudocode's
``StochasticMuZeroLearner.learn``): ``Q_k`` is trained towards ``z_{t+k}``,
``sigma_k`` towards ``c_{t+k+1} = onehot(argmax e(o_{<=t+k+1}))``, plus "a
VQ-VAE commitment cost" keeping ``c^e`` close to the code (its equation 7
did not survive the text extraction read here; the pseudocode omits it):
``L = L_MuZero + sum_k [l_Q(z_{t+k}, Q_k) + l_sigma(c_{t+k+1}, sigma_k) +
beta ||c_{t+k+1} - c^e_{t+k+1}||^2]``. The encoder here reads the pair
``(o_{t+k}, o_{t+k+1})`` (LightZero's input) rather than the whole history.

The encoder gets its gradient from two places: the commitment term, and the
world-model terms (reward, value, policy after ``g``) through the
straight-through code ``c = onehot + softmax(c^e) - sg(softmax(c^e))``. The
commitment term compares ``softmax(c^e)`` with the *stopped* code: written
with the straight-through code on both sides (LightZero's
``mse(x, onehot_st(x))``) its gradient is identically zero.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from torchrl_muzero.objectives.muzero import MuZeroLoss
from torchrl_muzero.objectives.terms import LossTerm

__all__ = ["StochasticMuZeroLoss"]


class StochasticMuZeroLoss(MuZeroLoss):
    """Stochastic MuZero's K-step unrolled loss: MuZero's terms plus afterstate value, chance and commitment.

    Args:
        model (StochasticMuZeroModel): e.g.
            :class:`~torchrl_muzero.modules.StochasticMuZeroMLPModel`; its
            ``initial_inference``, ``afterstate_inference``,
            ``chance_inference`` and ``encode_chance`` are used.

    Keyword Args:
        value_loss_weight (float): defaults to 0.25.
        reward_loss_weight, policy_loss_weight (float): default to 1.0.
        afterstate_value_loss_weight (float): weight of ``CE(Q_k, z_{t+k})``.
            Defaults to 0.25.
        chance_loss_weight (float): weight of ``CE(sigma_k, sg(c_k))``.
            Defaults to 1.0.
        commitment_loss_weight (float): ``beta`` of the commitment term.
            Defaults to 1.0. Caveat (measured on a toy, see
            test/test_stochastic_muzero.py's hidden-coin test): on from the
            first step, even at 0.01, it drives every sample to one code
            before the world-model terms have shaped the codes (the
            majority code's logit grows through the shared weights), and a
            saturated softmax then passes no gradient; at 0 the codes find
            the chance outcome, and switched on after they have it is
            harmless. A trainer may set ``loss.commitment_loss_weight``
            after a warm-up.
        **muzero_kwargs: every other keyword of
            :class:`~torchrl_muzero.objectives.MuZeroLoss`, with its defaults
            (``consistency_loss_weight``, ``latent_grad_scale``: applied to the
            latent entering every afterstate step, ``policy_loss``, ``projector``,
            ``predictor``, ``projection_dim``, ``projection_hidden_dim``,
            ``prediction_hidden_dim``, ``reduction``, ``check_inputs``).

    Input keys: those of :class:`~torchrl_muzero.objectives.MuZeroLoss`
    (``observation`` must hold the future observations ``[B, K+1, ...]``) and
    ``observation_mask`` ``[B, K+1]`` bool (column ``k`` holds an
    observation). The chance and commitment terms of step ``k`` count where
    ``observation_mask[:, k] & observation_mask[:, k+1]``; the afterstate
    value where ``mask[:, k]``. All added terms are ``[B, K]`` terms (scaled
    ``1 / K`` like the reward).

    Output: ``"loss_value"``, ``"loss_reward"``, ``"loss_policy"``,
    (``"loss_consistency"``), ``"loss_afterstate_value"``, ``"loss_chance"``,
    ``"loss_commitment"``, ``"priority"``, MuZero's logging scalars and
    ``"chance_entropy"`` (mean entropy of ``sigma`` over the valid steps),
    ``"code_usage"`` (fraction of the ``C`` codes the encoder picked in the batch).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
        >>> from torchrl_muzero.objectives import StochasticMuZeroLoss
        >>> B, K, A = 4, 3, 2
        >>> model = StochasticMuZeroMLPModel((4,), A, chance_space_size=3, latent_dim=16, hidden_dim=16)
        >>> loss = StochasticMuZeroLoss(model)
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
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_afterstate_value', 'loss_chance', 'loss_commitment', 'loss_policy', 'loss_reward', 'loss_value']
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        >>> model.chance_encoder[0].weight.grad.abs().sum() > 0
        tensor(True)
    """

    @dataclass
    class _AcceptedKeys(MuZeroLoss._AcceptedKeys):
        """Maintains default values for all configurable tensordict keys.

        Those of :class:`~torchrl_muzero.objectives.MuZeroLoss` and

        Attributes:
            observation_mask (NestedKey): ``[B, K+1]`` bool, column ``k``
                holds an observation (the chance encoder reads columns
                ``k`` and ``k + 1``). Defaults to ``"observation_mask"``.
        """

        observation_mask: NestedKey = "observation_mask"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys

    _REQUIRED = MuZeroLoss._REQUIRED + ("observation_mask",)
    _MODEL_ATTRS = (
        "initial_inference", "afterstate_inference", "chance_inference", "encode_chance",
        "chance_space_size", "value_support", "reward_support", "num_actions", "observation_shape",
    )
    _MODEL_NAME = "a StochasticMuZeroModel"
    _ADDED_TERMS = ("afterstate_value", "chance", "commitment")

    def __init__(
        self,
        model: nn.Module,
        *,
        afterstate_value_loss_weight: float = 0.25,
        chance_loss_weight: float = 1.0,
        commitment_loss_weight: float = 1.0,
        **muzero_kwargs: Any,
    ) -> None:
        # MuZero's settings (weights, consistency, reduction, ...) with MuZero's defaults, in one place: MuZeroLoss
        super().__init__(model, **muzero_kwargs)
        for key, value in (
            ("afterstate_value_loss_weight", afterstate_value_loss_weight),
            ("chance_loss_weight", chance_loss_weight),
            ("commitment_loss_weight", commitment_loss_weight),
        ):
            if not (float(value) >= 0.0 and float(value) < float("inf")):
                raise ValueError(f"{key} must be a finite number >= 0, got {value}.")
            setattr(self, key, float(value))
        self._chance_codes = None

    def term_names(self) -> list[str]:
        """MuZero's terms, then ``afterstate_value``, ``chance`` and ``commitment``."""
        return super().term_names() + list(self._ADDED_TERMS)

    @property
    def out_keys(self):
        return super().out_keys + ["chance_entropy", "code_usage"]

    @out_keys.setter
    def out_keys(self, value):
        raise AttributeError(f"{type(self).__name__}.out_keys is fixed by its configuration.")

    # -- inputs -----------------------------------------------------------------
    def _read_inputs(self, tensordict: TensorDictBase) -> dict[str, Any]:
        """MuZero's inputs plus ``observation_mask`` ``[B, K+1]`` bool (checked against ``mask``)."""
        inputs = super()._read_inputs(tensordict)
        B, K1 = inputs["action"].shape
        obs_mask = self._per_position(tensordict, "observation_mask", B, K1)
        obs_mask = obs_mask if obs_mask.dtype == torch.bool else obs_mask != 0
        inputs["observation_mask"] = obs_mask
        if self.check_inputs:
            keys, name = self.tensor_keys, type(self).__name__
            if bool(inputs["mask"][:, 1:].any()) and not bool(obs_mask[:, 1:].any()):
                raise ValueError(
                    f"{name}: '{keys.observation_mask}' has no observation past column 0 while "
                    f"'{keys.mask}' has targets there: the chance encoder needs the future observations "
                    "(GameBuffer(with_future_observations=True))."
                )
            obs = inputs["observation"]
            if obs.is_floating_point() and not bool(torch.isfinite(obs[obs_mask]).all()):
                raise ValueError(
                    f"{name}: '{keys.observation}' holds NaN or infinite values where "
                    f"'{keys.observation_mask}' is true."
                )
        return inputs

    # -- unroll -----------------------------------------------------------------
    def _unroll(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Encode the ``K`` chance codes in one batch, then the base unroll carrying them.

        Adds ``code`` / ``code_probs`` ``[B, K, C]`` (straight-through code and
        ``softmax(c^e)``) and ``chance_valid`` ``[B, K]`` to the base's outputs.
        """
        obs, obs_mask = inputs["observation"], inputs["observation_mask"]
        B, K1 = obs_mask.shape
        if not bool(obs_mask.all()):  # missing observations become zeros: no NaN can reach a gradient
            obs = torch.where(obs_mask.view(B, K1, *([1] * (obs.ndim - 2))), obs, obs.new_zeros(()))
        code, probs = self.model.encode_chance(obs[:, :-1].flatten(0, 1), obs[:, 1:].flatten(0, 1))
        code, probs = code.view(B, K1 - 1, -1), probs.view(B, K1 - 1, -1)
        self._chance_codes = code  # the carry of the base's unroll (_initial_carry)
        try:
            unrolled = super()._unroll(inputs)
        finally:
            self._chance_codes = None
        unrolled.update(code=code, code_probs=probs, chance_valid=obs_mask[:, :-1] & obs_mask[:, 1:])
        return unrolled

    def _initial_carry(self, root_latent: torch.Tensor) -> torch.Tensor:
        """The chance codes ``[B, K, C]`` of the whole unroll (step ``k`` reads column ``k - 1``)."""
        return self._chance_codes

    def _dynamics_step(
        self, latent: torch.Tensor, carry: torch.Tensor, action: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``phi`` + ``psi`` along ``action``, then ``g`` with the code of ``(o_{k-1}, o_k)`` and ``f``."""
        afterstate, chance_logits, q_logits = self.model.afterstate_inference(latent, action)
        latent, reward_logits, policy_logits, value_logits = self.model.chance_inference(
            afterstate, carry[:, k - 1]
        )
        extras = {"reward_logits": reward_logits, "q_logits": q_logits, "chance_logits": chance_logits}
        return latent, carry, policy_logits, value_logits, extras

    # -- terms ------------------------------------------------------------------
    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        """MuZero's terms plus ``afterstate_value``, ``chance`` and ``commitment``, all ``[B, K]``."""
        terms = super()._step_terms(inputs, unrolled)
        q_logits = unrolled["q_logits"]  # [B, K, bins], the afterstates of positions 0..K-1
        value_mask = inputs["mask"][:, :-1]
        target = torch.where(value_mask, inputs["target_value"][:, :-1].to(q_logits.dtype), 0.0)
        terms["afterstate_value"] = LossTerm(self.model.value_support.cross_entropy(q_logits, target), value_mask)
        valid = unrolled["chance_valid"]
        hard = unrolled["code"].detach()  # sg(c): the one-hot of the encoder's argmax
        log_sigma = torch.log_softmax(unrolled["chance_logits"], -1)
        terms["chance"] = LossTerm(-(hard * log_sigma).sum(-1), valid)
        terms["commitment"] = LossTerm((hard - unrolled["code_probs"]).pow(2).sum(-1), valid)
        return terms

    # -- logs -------------------------------------------------------------------
    def _priorities(
        self, inputs: dict[str, Any], unrolled: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """MuZero's priorities and logs, plus ``chance_entropy`` and ``code_usage``."""
        priority, logs = super()._priorities(inputs, unrolled)
        with torch.no_grad():
            valid = unrolled["chance_valid"]
            log_sigma = torch.log_softmax(unrolled["chance_logits"].detach(), -1)
            entropy = -(log_sigma.exp() * log_sigma).sum(-1)
            count = valid.sum().clamp_min(1)
            logs["chance_entropy"] = (entropy * valid).sum() / count
            used = (unrolled["code"].detach() * valid[..., None]).sum((0, 1)) > 0
            logs["code_usage"] = used.float().mean()
        return priority, logs
