"""The base class of every MuZero-family training loss: :class:`UnrolledModelLoss`.

All the variants (MuZero, EfficientZero, Gumbel, Stochastic, Sampled MuZero)
train the same way: the model is unrolled ``K`` steps from a root observation
along the actions that were actually taken, every unrolled position is compared
with targets the replay buffer built, the per-position terms are scaled,
weighted and reduced over the batch, and the root value error becomes the new
replay priority. They differ in what one unroll step carries (an LSTM state, an
afterstate), which terms they add (value prefix, chance codes) and how one term
is computed (KL instead of cross-entropy).

:meth:`UnrolledModelLoss.forward` is therefore a fixed pipeline of hook
methods, each documented with who overrides it::

    inputs   = self._read_inputs(tensordict)        # keys -> checked tensors (unrolled_inputs.py)
    unrolled = self._unroll(inputs)                 # calls _initial_carry / _dynamics_step
    terms    = self._step_terms(inputs, unrolled)   # name -> LossTerm [B, K+1] or [B, K]
    losses   = self._reduce_terms(terms, weight, K) # 1/K, IS weights, loss weights, reduction
    priority, logs = self._priorities(inputs, unrolled)

A variant adds a loss term by adding an entry to the dict :meth:`_step_terms`
returns (and its name to :meth:`term_names`, and a ``<name>_loss_weight``
attribute); the base applies the step scale, the importance weights, the loss
weight and the reduction to it the same way as to every other term.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torch.nn import functional as F
from torchrl.objectives.common import LossModule

from torchrl_muzero.modules.policy_distribution import policy_distribution
from torchrl_muzero.objectives.terms import (
    LossTerm,
    default_predictor,
    default_projector,
    latent_numel,
    scale_gradient,
    write_priority,
)
from torchrl_muzero.objectives.unrolled_inputs import UnrolledInputs

__all__ = ["UnrolledModelLoss"]


class UnrolledModelLoss(UnrolledInputs, LossModule):
    """Base class of the K-step unrolled model losses (MuZero and its variants).

    It owns what every variant shares: the value cross-entropy on the model's
    value support at positions ``0..K``, the policy term (cross-entropy or KL)
    at positions ``0..K``, the optional SimSiam consistency term at ``1..K``,
    the gradient scale of the latent at every dynamics step, the uniform step
    scale / importance weight / loss weight / batch reduction of every term,
    the priorities and the logging scalars. Subclasses supply the model's
    dynamics step (:meth:`_dynamics_step`), their own terms
    (:meth:`_step_terms`, :meth:`term_names`) and their own keys (a subclass
    of :class:`UnrolledModelLoss._AcceptedKeys`, ``_REQUIRED`` and
    ``_SCALAR_TARGETS``). See :class:`~torchrl_muzero.objectives.MuZeroLoss`
    for the full description of inputs and outputs.

    Args:
        model (nn.Module): the network; its parameters are registered in the loss.

    Keyword Args:
        value_loss_weight, policy_loss_weight, consistency_loss_weight (float):
            weights of the shared terms (consistency 0 turns it off).
        latent_grad_scale (float): gradient scale of the latent entering every
            dynamics step, in ``[0, 1]``.
        policy_loss (str): ``"cross_entropy"`` (``-sum(target * log pi)``) or
            ``"kl"`` (``KL(target || pi)``, as LightZero's Gumbel MuZero). Both
            have the same gradient; KL's value is the cross-entropy minus the
            target's entropy, so it reaches 0 at a perfect fit.
        projector, predictor, projection_dim, projection_hidden_dim,
            prediction_hidden_dim: the consistency term's networks (see
            :class:`~torchrl_muzero.objectives.MuZeroLoss`).
        reduction (str): ``"mean"``, ``"sum"`` or ``"none"`` over the batch.
        check_inputs (bool): check input values (finite targets, normalised
            policies, non-negative weights), which synchronises with the device.
        **loss_weights (float): the weights of the subclass's own terms, by
            their attribute names (e.g. ``reward_loss_weight``).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.objectives import UnrolledModelLoss, MuZeroLoss
        >>> loss = MuZeroLoss(MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8))
        >>> isinstance(loss, UnrolledModelLoss), loss.term_names()
        (True, ['value', 'reward', 'policy'])
    """

    @dataclass
    class _AcceptedKeys:
        """Maintains default values for all configurable tensordict keys.

        This class defines which tensordict keys can be set using
        ``.set_keys(key_name=key_value)`` and their default values. Variants
        subclass it to add their own targets.

        Attributes:
            observation (NestedKey): observations ``[B, K+1, *obs_shape]``.
                Defaults to ``"observation"``.
            action (NestedKey): actions ``[B, K+1]`` or one-hot
                ``[B, K+1, A]``. Defaults to ``"action"``.
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
        target_value: NestedKey = "target_value"
        target_policy: NestedKey = "target_policy"
        mask: NestedKey = "mask"
        policy_mask: NestedKey = "policy_mask"
        weight: NestedKey = "weight"
        priority: NestedKey = "priority"

    tensor_keys: _AcceptedKeys
    default_keys = _AcceptedKeys

    #: key names (fields of ``_AcceptedKeys``) that must be present, in ``in_keys`` order
    _REQUIRED: tuple[str, ...] = (
        "observation", "action", "target_value", "target_policy", "mask", "policy_mask",
    )
    #: ``(key name, first position used)`` of the scalar ``[B, K+1]`` targets:
    #: read, shape-checked and (with ``check_inputs``) checked finite where ``mask``
    _SCALAR_TARGETS: tuple[tuple[str, int], ...] = (("target_value", 0),)
    #: attributes the model must have, and how the error names such a model
    _MODEL_ATTRS: tuple[str, ...] = (
        "initial_inference", "value_support", "num_actions", "observation_shape",
    )
    _MODEL_NAME = "a MuZeroModel"

    def __init__(
        self,
        model: nn.Module,
        *,
        value_loss_weight: float,
        policy_loss_weight: float,
        consistency_loss_weight: float,
        latent_grad_scale: float = 0.5,
        policy_loss: str = "cross_entropy",
        projector: nn.Module | None = None,
        predictor: nn.Module | None = None,
        projection_dim: int = 256,
        projection_hidden_dim: int = 256,
        prediction_hidden_dim: int = 64,
        reduction: str = "mean",
        check_inputs: bool = True,
        **loss_weights: float,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        missing = [attr for attr in self._MODEL_ATTRS if not hasattr(model, attr)]
        if not isinstance(model, nn.Module) or missing:
            raise ValueError(
                f"{name} expects {self._MODEL_NAME} (an nn.Module with "
                f"{', '.join(self._MODEL_ATTRS[:-1])} and {self._MODEL_ATTRS[-1]}); "
                f"got {type(model).__name__}" + (f" lacking {missing}." if missing else ".")
            )
        weights = {
            "value_loss_weight": value_loss_weight,
            "policy_loss_weight": policy_loss_weight,
            "consistency_loss_weight": consistency_loss_weight,
            **loss_weights,
        }
        for key, value in weights.items():
            if not key.endswith("_loss_weight"):
                raise TypeError(f"{name} got an unexpected keyword argument {key!r}.")
            if not (float(value) >= 0.0 and float(value) < float("inf")):
                raise ValueError(f"{key} must be a finite number >= 0, got {value}.")
        if not 0.0 <= float(latent_grad_scale) <= 1.0:
            raise ValueError(f"latent_grad_scale must lie in [0, 1], got {latent_grad_scale}.")
        if policy_loss not in ("cross_entropy", "kl"):
            raise ValueError(f"policy_loss must be 'cross_entropy' or 'kl', got {policy_loss!r}.")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")
        for key, value in (
            ("projection_dim", projection_dim),
            ("projection_hidden_dim", projection_hidden_dim),
            ("prediction_hidden_dim", prediction_hidden_dim),
        ):
            if int(value) < 1:
                raise ValueError(f"{key} must be >= 1, got {value}.")

        self.model = model
        for key, value in weights.items():
            setattr(self, key, float(value))
        self.latent_grad_scale = float(latent_grad_scale)
        self.policy_loss = policy_loss
        self.reduction = reduction
        self.check_inputs = bool(check_inputs)

        if self.consistency_loss_weight > 0 or projector is not None or predictor is not None:
            if projector is None:
                projector = default_projector(
                    latent_numel(model), int(projection_hidden_dim), int(projection_dim)
                )
            if predictor is None:
                predictor = default_predictor(int(projection_dim), int(prediction_hidden_dim))
        self.projector = projector
        self.predictor = predictor
        self._in_keys = None

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

    def term_names(self) -> list[str]:
        """The names of the loss terms, in output order (``"loss_<name>"`` entries).

        Overridden by variants that add or replace terms; it must list exactly
        the keys :meth:`_step_terms` returns. The base lists ``value``,
        ``policy`` and, when on, ``consistency``.
        """
        names = ["value", "policy"]
        if self.consistency_loss_weight > 0:
            names.append("consistency")
        return names

    @property
    def out_keys(self):
        return [f"loss_{name}" for name in self.term_names()] + [
            "priority", "value_prediction", "value_error", "policy_entropy",
        ]

    @out_keys.setter
    def out_keys(self, value):
        raise AttributeError(f"{type(self).__name__}.out_keys is fixed by its configuration.")

    # -- the learner's update-count hooks -----------------------------------------------
    def set_train_iter(self, train_iter: int) -> None:
        """The learner's update count so far, given before every forward.

        The :class:`~torchrl_muzero.trainers.learner.Learner` calls it. A no-op here; overridden by losses with a schedule over updates
        (:class:`~torchrl_muzero.objectives.UniZeroLoss`: its policy label smoothing).
        """

    def after_update(self, train_iter: int) -> None:
        """The new update count, given by the learner right after each optimizer step.

        A no-op here; overridden by losses that keep state which follows the
        weights (:class:`~torchrl_muzero.objectives.UniZeroLoss`: the EMA step of
        its target encoder).
        """

    # -- hook 2: the unroll ------------------------------------------------------------
    def _unroll(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run the representation at position 0 and ``K`` dynamics steps along the actions.

        Why a hook: this is the loop every variant shares (gradient scale of
        the latent, stacking the predictions); what one step does is
        :meth:`_dynamics_step`, and what it carries besides the latent is
        :meth:`_initial_carry`, which is what variants override. A variant
        whose unroll is not a chain of latents (e.g. afterstates interleaved
        with states) overrides this one.

        Returns a dict with ``policy_logits`` ``[B, K+1, A]``, ``value_logits``
        ``[B, K+1, bins]``, ``latents`` (the list of the ``K`` unrolled latents
        ``[B, *latent_shape]``) and, stacked to ``[B, K, ...]``, every extra
        output of :meth:`_dynamics_step` under its name.
        """
        obs, action = inputs["observation"], inputs["action"]
        K1 = action.shape[1]
        latent, root_policy_logits, root_value_logits = self.model.initial_inference(obs[:, 0])
        carry = self._initial_carry(latent)
        policy_logits, value_logits, latents = [root_policy_logits], [root_value_logits], []
        extras: dict[str, list[torch.Tensor]] = {}
        for k in range(1, K1):
            latent = scale_gradient(latent, self.latent_grad_scale)
            latent, carry, p_logits, v_logits, step_extras = self._dynamics_step(
                latent, carry, action[:, k - 1], k
            )
            latents.append(latent)
            policy_logits.append(p_logits)
            value_logits.append(v_logits)
            for key, value in step_extras.items():
                extras.setdefault(key, []).append(value)
        unrolled = {
            "policy_logits": torch.stack(policy_logits, 1),
            "value_logits": torch.stack(value_logits, 1),
            "latents": latents,
        }
        unrolled.update({key: torch.stack(values, 1) for key, values in extras.items()})
        return unrolled

    def _initial_carry(self, root_latent: torch.Tensor) -> Any:
        """What the unroll carries besides the latent, at the root (``None`` here).

        Why a hook: recurrent dynamics carry a state through the unroll.
        EfficientZero returns the zero LSTM state; MuZero carries nothing.
        """
        return None

    def _dynamics_step(
        self, latent: torch.Tensor, carry: Any, action: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One unroll step into position ``k`` (``1..K``) along ``action [B]``.

        Why a hook: this is where the variants' models differ. Returns
        ``(next_latent, carry, policy_logits, value_logits, extras)``, where
        ``extras`` maps names to this step's extra predictions (MuZero:
        ``reward_logits``; EfficientZero: ``value_prefix_logits``), stacked by
        :meth:`_unroll` to ``[B, K, ...]``. Every subclass implements it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement _dynamics_step.")

    # -- hook 3: the per-step terms ------------------------------------------------------
    def _step_terms(self, inputs: dict[str, Any], unrolled: dict[str, Any]) -> dict[str, LossTerm]:
        """The per-sample, per-position loss terms, by name (see :meth:`term_names`).

        Why a hook: a variant adds a term by extending this dict (MuZero adds
        ``reward``, EfficientZero ``value_prefix``) or replaces one; the
        scaling and reduction stay in :meth:`_reduce_terms`. The base builds
        ``value`` ``[B, K+1]``, ``policy`` ``[B, K+1]`` and, when on,
        ``consistency`` ``[B, K]``.
        """
        mask, policy_mask = inputs["mask"], inputs["policy_mask"]
        value_logits, policy_logits = unrolled["value_logits"], unrolled["policy_logits"]
        dtype = value_logits.dtype
        # masked targets are replaced by zeros so that they cannot matter (even if NaN)
        target_value = torch.where(mask, inputs["target_value"].to(dtype), 0.0)
        target_policy = torch.where(
            policy_mask.unsqueeze(-1), inputs["target_policy"].to(dtype), 0.0
        )
        terms = {
            "value": LossTerm(self.model.value_support.cross_entropy(value_logits, target_value), mask),
            "policy": LossTerm(self._policy_term(inputs, policy_logits, target_policy), policy_mask),
        }
        if self.consistency_loss_weight > 0:
            terms["consistency"] = LossTerm(
                self._consistency(unrolled["latents"], inputs["observation"]), mask[:, 1:]
            )
        return terms

    def _policy_term(self, inputs: dict[str, Any], policy_logits: torch.Tensor,
                     target_policy: torch.Tensor) -> torch.Tensor:
        """``[B, K+1]`` policy loss of the unrolled ``policy_logits`` against ``target_policy`` (masked to 0).

        Why a hook: a target over the model's actions needs only the logits
        (:meth:`_policy_loss`, the default); the sampled family's target is over
        each root's stored candidate actions, which it reads from ``inputs``.
        """
        return self._policy_loss(policy_logits, target_policy)

    def _policy_loss(self, policy_logits: torch.Tensor, target_policy: torch.Tensor) -> torch.Tensor:
        """``[B, P, A]`` logits and targets -> ``[B, P]`` cross-entropy or KL (``policy_loss``)."""
        policy = policy_distribution(self.model, policy_logits)
        if self.policy_loss == "kl":  # CE - H(target): same gradient, 0 at a perfect fit
            return policy.kl_from(target_policy)
        return policy.cross_entropy(target_policy)

    def _consistency(self, latents: list[torch.Tensor], observation: torch.Tensor) -> torch.Tensor:
        """``-cos(predictor(projector(unrolled latent_k)), sg(projector(h(obs_k))))`` ``[B, K]``."""
        B, K = observation.shape[0], len(latents)
        unrolled = torch.stack(latents, 1).flatten(0, 1)  # [B*K, *latent_shape]
        online = self.predictor(self.projector(unrolled))
        with torch.no_grad():
            target_latent = self.model.initial_inference(observation[:, 1:].flatten(0, 1))[0]
            target = self.projector(target_latent)
        similarity = F.cosine_similarity(online, target.detach(), dim=-1, eps=1e-8)
        return -similarity.view(B, K)

    # -- hook 4: reduction -----------------------------------------------------------------
    def _reduce_terms(
        self, terms: dict[str, LossTerm], weight: torch.Tensor | None, num_unroll_steps: int
    ) -> dict[str, torch.Tensor]:
        """``"loss_<name>"`` of every term: step scale, IS weights, loss weight, reduction.

        Why a hook: the one place where the ``1 / K`` scale of the unrolled
        positions (MuZero scales the dynamics' gradient by ``1 / K``; scaling
        the loss gives the same gradient and the logged value is the one
        optimised), the importance weights and the batch reduction are
        applied, identically for every term. Override only to change that rule
        for all terms at once. A ``[B, K+1]`` term counts its root position 1
        and the others ``1 / K``; a ``[B, K]`` term (positions ``1..K``) is
        summed and divided by ``K``.
        """
        names = self.term_names()
        if list(terms) != names:
            raise RuntimeError(
                f"{type(self).__name__}: _step_terms returned {list(terms)}, term_names() lists {names}."
            )
        out = {}
        for name in names:
            term = terms[name]
            values = term.values
            B, P = values.shape
            K = num_unroll_steps
            mask = term.mask.to(values.dtype)
            if P == K + 1:
                step_scale = torch.full((P,), 1.0 / K, dtype=values.dtype, device=values.device)
                step_scale[0] = 1.0
                per_sample = (values * mask * step_scale).sum(1)
            elif P == K:
                per_sample = (values * mask).sum(1) / K
            else:
                raise RuntimeError(
                    f"{type(self).__name__}: term {name!r} has {P} positions; expected K+1 = {K + 1} or K = {K}."
                )
            out[f"loss_{name}"] = getattr(self, f"{name}_loss_weight") * self._reduce(per_sample, weight)
        return out

    def _reduce(self, per_sample: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is not None:
            per_sample = per_sample * weight.to(per_sample.dtype)
        if self.reduction == "mean":
            return per_sample.mean()
        if self.reduction == "sum":
            return per_sample.sum()
        return per_sample

    # -- hook 5: priorities and logs ------------------------------------------------------------
    def _priorities(
        self, inputs: dict[str, Any], unrolled: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """New replay priorities ``[B]`` (detached) and the logging scalars.

        Why a hook: the priority rule is the replay buffer's business and
        differs between papers (root value error here, as MuZero Reanalyze;
        EfficientZero uses the same). Returns ``(priority, logs)`` with the
        logs ``value_prediction`` (mean decoded root value), ``value_error``
        (mean priority) and ``policy_entropy`` (mean root policy entropy).
        """
        mask = inputs["mask"]
        with torch.no_grad():
            root_value_logits = unrolled["value_logits"][:, 0].detach()
            root_value = self.model.value_support.decode(root_value_logits)
            target = torch.where(mask[:, 0], inputs["target_value"][:, 0].to(root_value.dtype), 0.0)
            priority = torch.where(mask[:, 0], (root_value - target).abs(), 0.0)
            # the roots' slice of the whole [B, K+1] distribution: the log-softmax runs on the full tensor
            entropy = policy_distribution(self.model, unrolled["policy_logits"].detach())[:, 0].entropy()
        logs = {
            "value_prediction": root_value.mean(),
            "value_error": priority.mean(),
            "policy_entropy": entropy.mean(),
        }
        return priority, logs

    # -- the pipeline -----------------------------------------------------------------------
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
        unrolled = self._unroll(inputs)
        terms = self._step_terms(inputs, unrolled)
        out = self._reduce_terms(terms, inputs["weight"], inputs["action"].shape[1] - 1)
        priority, logs = self._priorities(inputs, unrolled)
        out["priority"] = priority
        out.update(logs)
        write_priority(tensordict, self.tensor_keys.priority, priority, type(self).__name__)
        return TensorDict(out, batch_size=[])
