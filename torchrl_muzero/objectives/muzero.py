"""The MuZero training loss (MuZero paper, section 3 and appendix G).

The model is unrolled ``K`` steps from the root observation along the actions
that were actually taken; at every position the predicted value, reward and
policy are matched against the targets the replay buffer built. Optionally,
EfficientZero's self-supervised consistency loss ties the unrolled latents to
the representation of the real observations.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torch.nn import functional as F
from torchrl.objectives.common import LossModule

__all__ = ["MuZeroLoss", "scale_gradient"]


def scale_gradient(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the backward gradient by ``scale``.

    ``scale_gradient(x, s) = x * s + x.detach() * (1 - s)`` (MuZero appendix G).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.objectives import scale_gradient
        >>> x = torch.ones(3, requires_grad=True)
        >>> y = scale_gradient(x, 0.5)
        >>> torch.equal(y, x)
        True
        >>> y.sum().backward()
        >>> x.grad
        tensor([0.5000, 0.5000, 0.5000])
    """
    if scale == 1.0:
        return tensor
    return tensor * scale + tensor.detach() * (1.0 - scale)


def _default_projector(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Module:
    # LayerNorm rather than SimSiam's BatchNorm: it behaves the same in train and
    # eval mode and does not fail on a batch of one.
    return nn.Sequential(
        nn.Flatten(1),
        nn.Linear(in_dim, hidden_dim),
        nn.LayerNorm(hidden_dim),
        nn.ReLU(),
        nn.Linear(hidden_dim, out_dim),
        nn.LayerNorm(out_dim),
    )


def _default_predictor(dim: int, hidden_dim: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(dim, hidden_dim),
        nn.LayerNorm(hidden_dim),
        nn.ReLU(),
        nn.Linear(hidden_dim, dim),
    )


class MuZeroLoss(LossModule):
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
      (where ``policy_mask[:, k]``),

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
    class _AcceptedKeys:
        """Maintains default values for all configurable tensordict keys.

        This class defines which tensordict keys can be set using
        ``.set_keys(key_name=key_value)`` and their default values.

        Attributes:
            observation (NestedKey): observations ``[B, K+1, *obs_shape]``.
                Defaults to ``"observation"``.
            action (NestedKey): actions ``[B, K+1]`` or one-hot
                ``[B, K+1, A]``. Defaults to ``"action"``.
            target_reward (NestedKey): reward targets ``[B, K+1]``.
                Defaults to ``"target_reward"``.
            target_value (NestedKey): value targets ``[B, K+1]``.
                Defaults to ``"target_value"``.
            target_policy (NestedKey): policy targets ``[B, K+1, A]``.
                Defaults to ``"target_policy"``.
            mask (NestedKey): value / reward validity ``[B, K+1]``.
                Defaults to ``"mask"``.
            policy_mask (NestedKey): policy validity ``[B, K+1]``.
                Defaults to ``"policy_mask"``.
            weight (NestedKey): optional importance-sampling weights ``[B]``.
                Defaults to ``"weight"``.
            priority (NestedKey): where the new priorities are written in the
                input tensordict. Defaults to ``"priority"``.
        """

        observation: NestedKey = "observation"
        action: NestedKey = "action"
        target_reward: NestedKey = "target_reward"
        target_value: NestedKey = "target_value"
        target_policy: NestedKey = "target_policy"
        mask: NestedKey = "mask"
        policy_mask: NestedKey = "policy_mask"
        weight: NestedKey = "weight"
        priority: NestedKey = "priority"

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

    def __init__(
        self,
        model: nn.Module,
        *,
        value_loss_weight: float = 0.25,
        reward_loss_weight: float = 1.0,
        policy_loss_weight: float = 1.0,
        consistency_loss_weight: float = 0.0,
        latent_grad_scale: float = 0.5,
        projector: nn.Module | None = None,
        predictor: nn.Module | None = None,
        projection_dim: int = 256,
        projection_hidden_dim: int = 256,
        prediction_hidden_dim: int = 64,
        reduction: str = "mean",
        check_inputs: bool = True,
    ) -> None:
        super().__init__()
        missing = [
            name
            for name in (
                "initial_inference",
                "recurrent_inference",
                "value_support",
                "reward_support",
                "num_actions",
                "observation_shape",
            )
            if not hasattr(model, name)
        ]
        if not isinstance(model, nn.Module) or missing:
            raise ValueError(
                "MuZeroLoss expects a MuZeroModel (an nn.Module with initial_inference, "
                "recurrent_inference, value_support, reward_support, num_actions and "
                f"observation_shape); got {type(model).__name__}"
                + (f" lacking {missing}." if missing else ".")
            )
        for name, value in (
            ("value_loss_weight", value_loss_weight),
            ("reward_loss_weight", reward_loss_weight),
            ("policy_loss_weight", policy_loss_weight),
            ("consistency_loss_weight", consistency_loss_weight),
        ):
            if not (float(value) >= 0.0 and float(value) < float("inf")):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}.")
        if not 0.0 <= float(latent_grad_scale) <= 1.0:
            raise ValueError(f"latent_grad_scale must lie in [0, 1], got {latent_grad_scale}.")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        for name, value in (
            ("projection_dim", projection_dim),
            ("projection_hidden_dim", projection_hidden_dim),
            ("prediction_hidden_dim", prediction_hidden_dim),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")

        self.model = model
        self.value_loss_weight = float(value_loss_weight)
        self.reward_loss_weight = float(reward_loss_weight)
        self.policy_loss_weight = float(policy_loss_weight)
        self.consistency_loss_weight = float(consistency_loss_weight)
        self.latent_grad_scale = float(latent_grad_scale)
        self.reduction = reduction
        self.check_inputs = bool(check_inputs)

        if self.consistency_loss_weight > 0 or projector is not None or predictor is not None:
            if projector is None:
                projector = _default_projector(
                    self._latent_numel(model), int(projection_hidden_dim), int(projection_dim)
                )
            if predictor is None:
                predictor = _default_predictor(int(projection_dim), int(prediction_hidden_dim))
        self.projector = projector
        self.predictor = predictor
        self._in_keys = None

    @staticmethod
    def _latent_numel(model: nn.Module) -> int:
        """Size of one flattened latent, found by one representation pass."""
        device = next(itertools.chain(model.parameters(), model.buffers())).device
        modes = {module: module.training for module in model.modules()}
        model.eval()  # no batch-norm statistics update, no batch-of-one failure
        try:
            with torch.no_grad():
                latent = model.initial_inference(
                    torch.zeros(1, *model.observation_shape, device=device)
                )[0]
        finally:
            for module, mode in modes.items():
                module.training = mode
        return int(latent[0].numel())

    # -- keys ------------------------------------------------------------------
    def _forward_value_estimator_keys(self, **kwargs) -> None:
        self._set_in_keys()

    def _set_in_keys(self) -> None:
        keys = self.tensor_keys
        self._in_keys = [getattr(keys, name) for name in self._REQUIRED] + [keys.weight]

    @property
    def in_keys(self):
        if self._in_keys is None:
            self._set_in_keys()
        return self._in_keys

    @in_keys.setter
    def in_keys(self, value):
        self._in_keys = list(value)

    @property
    def out_keys(self):
        keys = ["loss_value", "loss_reward", "loss_policy"]
        if self.consistency_loss_weight > 0:
            keys.append("loss_consistency")
        return keys + ["priority", "value_prediction", "value_error", "policy_entropy"]

    @out_keys.setter
    def out_keys(self, value):
        raise AttributeError("MuZeroLoss.out_keys is fixed by its configuration.")

    # -- input reading -----------------------------------------------------------
    def _read_inputs(self, tensordict: TensorDictBase) -> dict:
        keys = self.tensor_keys
        missing = [
            f"{name}={getattr(keys, name)!r}"
            for name in self._REQUIRED
            if tensordict.get(getattr(keys, name), None) is None
        ]
        if missing:
            raise ValueError(
                f"MuZeroLoss: the input tensordict lacks the entries {missing} "
                f"(use set_keys to rename); it has {sorted(map(str, tensordict.keys(True, True)))}."
            )
        model = self.model
        obs = tensordict.get(keys.observation)
        batch_shape = model.check_observation(obs)
        if len(batch_shape) != 2:
            raise ValueError(
                f"MuZeroLoss: '{keys.observation}' must be [B, K+1, "
                f"{', '.join(map(str, model.observation_shape))}], got {tuple(obs.shape)}."
            )
        B, K1 = batch_shape
        if K1 < 2:
            raise ValueError(
                f"MuZeroLoss needs at least one unroll step (K+1 >= 2 positions), got K+1 = {K1}."
            )
        A = model.num_actions

        def per_position(name: str) -> torch.Tensor:
            value = tensordict.get(getattr(keys, name))
            if value.shape == (B, K1, 1):
                value = value.squeeze(-1)
            if value.shape != (B, K1):
                raise ValueError(
                    f"MuZeroLoss: '{getattr(keys, name)}' must have shape [B, K+1] = "
                    f"[{B}, {K1}] (from the observation), got {tuple(value.shape)}."
                )
            return value

        action = tensordict.get(keys.action)
        if action.ndim == 3 and action.shape[:2] == (B, K1) and action.shape[-1] == A and (
            action.dtype.is_floating_point or action.dtype == torch.bool or A > 1
        ):
            action = action.argmax(-1)  # one-hot
        elif action.shape == (B, K1, 1) and not action.dtype.is_floating_point:
            action = action.squeeze(-1)
        if action.shape != (B, K1) or action.dtype.is_floating_point or action.dtype == torch.bool:
            raise ValueError(
                f"MuZeroLoss: '{keys.action}' must be integer indices [B, K+1] = [{B}, {K1}] "
                f"or one-hot [{B}, {K1}, {A}], got shape {tuple(action.shape)} of dtype {action.dtype}."
            )

        target_policy = tensordict.get(keys.target_policy)
        if target_policy.shape != (B, K1, A):
            raise ValueError(
                f"MuZeroLoss: '{keys.target_policy}' must have shape [B, K+1, num_actions] = "
                f"[{B}, {K1}, {A}], got {tuple(target_policy.shape)}"
                + (
                    f" (last dimension {target_policy.shape[-1]} != model.num_actions = {A})."
                    if target_policy.ndim == 3 and target_policy.shape[:2] == (B, K1)
                    else "."
                )
            )
        mask = per_position("mask")
        policy_mask = per_position("policy_mask")
        mask = mask if mask.dtype == torch.bool else mask != 0
        policy_mask = policy_mask if policy_mask.dtype == torch.bool else policy_mask != 0

        weight = tensordict.get(keys.weight, None)
        if weight is not None:
            if weight.shape in ((B, 1), (B, K1)):
                weight = weight[:, 0]
            if weight.shape != (B,):
                raise ValueError(
                    f"MuZeroLoss: '{keys.weight}' must have shape [B] = [{B}] (or [B, 1] / "
                    f"[B, K+1]), got {tuple(weight.shape)}."
                )

        inputs = dict(
            observation=obs,
            action=action,
            target_reward=per_position("target_reward"),
            target_value=per_position("target_value"),
            target_policy=target_policy,
            mask=mask,
            policy_mask=policy_mask,
            weight=weight,
        )
        if self.check_inputs:
            self._check_values(inputs)
        return inputs

    def _check_values(self, inputs: dict) -> None:
        keys = self.tensor_keys
        mask, policy_mask = inputs["mask"], inputs["policy_mask"]
        checks = (
            ("target_value", inputs["target_value"][mask]),
            ("target_reward", inputs["target_reward"][:, 1:][mask[:, 1:]]),
            ("target_policy", inputs["target_policy"][policy_mask]),
        )
        for name, valid in checks:
            if not bool(torch.isfinite(valid).all()):
                raise ValueError(
                    f"MuZeroLoss: '{getattr(keys, name)}' holds NaN or infinite values at "
                    f"unmasked positions ({int((~torch.isfinite(valid)).sum())} entries)."
                )
        policies = checks[2][1]
        if policies.numel():
            if bool((policies < 0).any()):
                raise ValueError(
                    f"MuZeroLoss: '{keys.target_policy}' has negative probabilities at "
                    "unmasked positions."
                )
            sums = policies.sum(-1)
            if not bool(((sums - 1).abs() <= 1e-3).all()):
                raise ValueError(
                    f"MuZeroLoss: '{keys.target_policy}' rows must sum to 1 where "
                    f"'{keys.policy_mask}' is true; found sums in "
                    f"[{float(sums.min()):.4g}, {float(sums.max()):.4g}]."
                )
        weight = inputs["weight"]
        if weight is not None and not bool((torch.isfinite(weight) & (weight >= 0)).all()):
            raise ValueError(
                f"MuZeroLoss: '{keys.weight}' must be finite and >= 0."
            )
        obs = inputs["observation"]
        if obs.is_floating_point():
            used = obs if self.consistency_loss_weight > 0 else obs[:, 0]
            if not bool(torch.isfinite(used).all()):
                raise ValueError(f"MuZeroLoss: '{keys.observation}' holds NaN or infinite values.")

    # -- loss ------------------------------------------------------------------
    def _reduce(self, per_sample: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is not None:
            per_sample = per_sample * weight.to(per_sample.dtype)
        if self.reduction == "mean":
            return per_sample.mean()
        if self.reduction == "sum":
            return per_sample.sum()
        return per_sample

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """Unroll the model on a sampled batch and return the loss terms.

        Args:
            tensordict (TensorDictBase): the batch (see the class docstring for
                its entries). The priority is written into it.

        Returns:
            A TensorDict of ``"loss_*"`` scalars, ``"priority"`` and logging
            scalars.
        """
        inputs = self._read_inputs(tensordict)
        model = self.model
        obs, action = inputs["observation"], inputs["action"]
        mask, policy_mask, weight = inputs["mask"], inputs["policy_mask"], inputs["weight"]
        B, K1 = mask.shape
        K = K1 - 1

        latent, root_policy_logits, root_value_logits = model.initial_inference(obs[:, 0])
        policy_logits, value_logits, reward_logits, latents = (
            [root_policy_logits],
            [root_value_logits],
            [],
            [],
        )
        for k in range(1, K1):
            latent = scale_gradient(latent, self.latent_grad_scale)
            latent, r_logits, p_logits, v_logits = model.recurrent_inference(
                latent, action[:, k - 1]
            )
            latents.append(latent)
            reward_logits.append(r_logits)
            policy_logits.append(p_logits)
            value_logits.append(v_logits)
        policy_logits = torch.stack(policy_logits, 1)  # [B, K+1, A]
        value_logits = torch.stack(value_logits, 1)  # [B, K+1, bins]
        reward_logits = torch.stack(reward_logits, 1)  # [B, K, bins]
        dtype = value_logits.dtype

        # root position counts fully, unrolled positions 1/K each
        step_scale = torch.full((K1,), 1.0 / K, dtype=dtype, device=value_logits.device)
        step_scale[0] = 1.0
        mask_f = mask.to(dtype)
        policy_mask_f = policy_mask.to(dtype)

        # masked targets are replaced by zeros so that they cannot matter (even if NaN)
        target_value = torch.where(mask, inputs["target_value"].to(dtype), 0.0)
        target_reward = torch.where(mask[:, 1:], inputs["target_reward"][:, 1:].to(dtype), 0.0)
        target_policy = torch.where(
            policy_mask.unsqueeze(-1), inputs["target_policy"].to(dtype), 0.0
        )

        value_ce = model.value_support.cross_entropy(value_logits, target_value)
        value_per_sample = (value_ce * mask_f * step_scale).sum(1)
        reward_ce = model.reward_support.cross_entropy(reward_logits, target_reward)
        reward_per_sample = (reward_ce * mask_f[:, 1:]).sum(1) / K
        log_policy = torch.log_softmax(policy_logits, -1)
        policy_ce = -(target_policy * log_policy).sum(-1)
        policy_per_sample = (policy_ce * policy_mask_f * step_scale).sum(1)

        out = {
            "loss_value": self.value_loss_weight * self._reduce(value_per_sample, weight),
            "loss_reward": self.reward_loss_weight * self._reduce(reward_per_sample, weight),
            "loss_policy": self.policy_loss_weight * self._reduce(policy_per_sample, weight),
        }

        if self.consistency_loss_weight > 0:
            unrolled = torch.stack(latents, 1).flatten(0, 1)  # [B*K, *latent_shape]
            online = self.predictor(self.projector(unrolled))
            with torch.no_grad():
                target_latent = model.initial_inference(obs[:, 1:].flatten(0, 1))[0]
                target = self.projector(target_latent)
            similarity = F.cosine_similarity(online, target.detach(), dim=-1, eps=1e-8)
            consistency = (-similarity.view(B, K) * mask_f[:, 1:]).sum(1) / K
            out["loss_consistency"] = self.consistency_loss_weight * self._reduce(
                consistency, weight
            )

        with torch.no_grad():
            root_value = model.value_support.decode(root_value_logits.detach())
            priority = torch.where(
                mask[:, 0], (root_value - target_value[:, 0]).abs(), 0.0
            )
            root_log_policy = log_policy[:, 0].detach()
            entropy = -(root_log_policy.exp() * root_log_policy).sum(-1)
        out["priority"] = priority
        out["value_prediction"] = root_value.mean()
        out["value_error"] = priority.mean()
        out["policy_entropy"] = entropy.mean()

        self._write_priority(tensordict, priority)
        return TensorDict(out, batch_size=[])

    def _write_priority(self, tensordict: TensorDictBase, priority: torch.Tensor) -> None:
        batch_size = tensordict.batch_size
        B = priority.shape[0]
        if len(batch_size) == 0:
            return tensordict.set(self.tensor_keys.priority, priority)
        if batch_size[0] != B:
            raise ValueError(
                f"MuZeroLoss: cannot write priorities [{B}] into a tensordict of batch "
                f"size {tuple(batch_size)}."
            )
        value = priority.reshape(B, *([1] * (len(batch_size) - 1))).expand(batch_size)
        tensordict.set(self.tensor_keys.priority, value.contiguous())
