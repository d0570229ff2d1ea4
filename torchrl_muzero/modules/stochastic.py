"""Stochastic MuZero networks (Antonoglou et al., ICLR 2022).

The transition of MuZero is split in two: a deterministic *afterstate*
dynamics ``phi(s, a) -> as`` and a stochastic step ``g(as, c) -> (s', r)``
driven by a discrete *chance outcome* ``c`` out of ``C`` codes. Five learned
functions (plus MuZero's representation ``h``):

* prediction ``f(s) -> (policy logits [A], value logits)``,
* afterstate dynamics ``phi(s, a) -> as``,
* afterstate prediction ``psi(as) -> (sigma = chance logits [C], Q value logits)``,
* dynamics ``g(as, c one-hot) -> (s', reward logits)``,
* chance encoder ``e(o_t, o_{t+1}) -> c^e`` logits [C]; the code is
  ``c = onehot(argmax c^e) + (softmax(c^e) - sg(softmax(c^e)))``: one-hot in
  the forward pass, the softmax's gradient in the backward pass, so the
  world-model losses (reward, value, policy after ``g``) train the encoder.

Training API (flat batch ``[B]``): :meth:`~StochasticMuZeroModel.initial_inference`,
:meth:`~StochasticMuZeroModel.afterstate_inference`,
:meth:`~StochasticMuZeroModel.chance_inference`,
:meth:`~StochasticMuZeroModel.encode_chance`.

Search API: a node's state is a TensorDict ``{"latent", "is_chance"}`` with
batch ``[B]``; every node has ``A + C`` edge slots (decision slots first).
:meth:`~StochasticMuZeroModel.search_step` runs both kinds of step on the
whole batch and keeps one per row (``torch.where`` on the node type), as
mctx's ``stochastic_muzero_policy`` does. Afterstates and states share the
``"latent"`` entry, so they must have the same shape.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn import functional as F

from torchrl_muzero.modules.fused_spec import FusedSpec, StateLeaf
from torchrl_muzero.modules.mlp import _mlp, fused_kernel_tensors
from torchrl_muzero.modules.model import MuZeroModel, scale_latent
from torchrl_muzero.modules.step import ModelStep

__all__ = ["StochasticMuZeroModel", "StochasticMuZeroMLPModel", "straight_through_one_hot"]

# The node state the fused "stochastic" entry reads and writes: the latent (or afterstate) and the node kind.
_STOCHASTIC_STATE = (StateLeaf("latent", torch.float32, 3), StateLeaf("is_chance", torch.bool))


def straight_through_one_hot(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(code, probs)``: the one-hot of ``argmax logits`` with the softmax's gradient.

    ``probs = softmax(logits)``, ``code = onehot(argmax) + (probs - sg(probs))``; the
    bracket is exactly 0 in the forward pass, so ``code`` is an exact one-hot.
    Ties go to the lowest index.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.stochastic import straight_through_one_hot
        >>> logits = torch.tensor([[0.0, 2.0, 1.0]], requires_grad=True)
        >>> code, probs = straight_through_one_hot(logits)
        >>> code.detach()
        tensor([[0., 1., 0.]])
        >>> (code * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
        >>> bool(logits.grad.abs().sum() > 0)
        True
    """
    probs = torch.softmax(logits, -1)
    hard = F.one_hot(logits.argmax(-1), logits.shape[-1]).to(probs.dtype)
    return hard + (probs - probs.detach()), probs  # the bracket is exactly 0: an exact one-hot forward


class StochasticMuZeroModel(MuZeroModel):
    """Base class of Stochastic MuZero networks: the training and search steps over five functions.

    Subclasses implement :meth:`represent`, :meth:`predict` (as in MuZero),
    :meth:`afterstate_dynamics`, :meth:`afterstate_prediction`,
    :meth:`chance_dynamics` and :meth:`chance_encoder_logits` for a flat
    batch dimension.

    Args:
        observation_shape / num_actions / value_support_size /
            reward_support_size: as :class:`MuZeroModel`.
        chance_space_size: ``C``, the number of chance codes.
        discount: the discount of the chance-to-decision edges in a search
            when :meth:`search_step` is not given one.

    :meth:`dynamics` (MuZero's interface, used by ``model.recurrent``) takes
    the most likely code ``argmax sigma``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
        >>> model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
        >>> root = model.search_root(torch.randn(2, 4))
        >>> root.policy_logits[0, 2:]          # the chance slots of a decision node
        tensor([-inf, -inf, -inf])
        >>> chance = model.search_step(root.state, torch.tensor([0, 1]))
        >>> chance.state["is_chance"], chance.reward, chance.discount
        (tensor([True, True]), tensor([0., 0.]), tensor([1., 1.]))
        >>> decision = model.search_step(chance.state, torch.tensor([2, 4]))  # codes 0 and 2
        >>> decision.state["is_chance"], decision.discount
        (tensor([False, False]), tensor([0.9970, 0.9970]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        value_support_size: int,
        reward_support_size: int,
        chance_space_size: int,
        discount: float = 0.997,
    ) -> None:
        super().__init__(observation_shape, num_actions, value_support_size, reward_support_size)
        self.chance_space_size = int(chance_space_size)
        if self.chance_space_size < 1:
            raise ValueError(f"chance_space_size must be >= 1, got {chance_space_size}.")
        if not 0.0 <= float(discount) <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}.")
        self.discount = float(discount)

    # -- to implement -------------------------------------------------------
    def afterstate_dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``phi``: ``(latent [B, ...], action [B] long) -> afterstate [B, ...]``."""
        raise NotImplementedError

    def afterstate_prediction(self, afterstate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``psi``: ``afterstate -> (chance logits [B, C], Q value logits [B, bins])``."""
        raise NotImplementedError

    def chance_dynamics(self, afterstate: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``g``: ``(afterstate, code [B, C] float) -> (next latent, reward logits)``."""
        raise NotImplementedError

    def chance_encoder_logits(self, observation: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
        """``e``: ``(o_t, o_{t+1})`` each ``[B, *obs_shape]`` -> ``c^e`` logits ``[B, C]``."""
        raise NotImplementedError

    # -- training steps -----------------------------------------------------
    def afterstate_inference(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(latent [B, ...], action [B] long)`` -> ``(afterstate, chance_logits [B, C], q_logits)``."""
        self.check_action(action, latent.shape[0])
        afterstate = self.afterstate_dynamics(latent, action)
        chance_logits, q_logits = self.afterstate_prediction(afterstate)
        return afterstate, chance_logits, q_logits

    def chance_inference(
        self, afterstate: torch.Tensor, code: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(afterstate, code [B, C])`` -> ``(next_latent, reward_logits, policy_logits, value_logits)``.

        ``code`` is a one-hot (or straight-through) float vector; its
        gradient reaches whatever produced it.
        """
        C = self.chance_space_size
        if code.shape != (afterstate.shape[0], C) or not code.is_floating_point():
            raise ValueError(
                f"{type(self).__name__}.chance_inference expects float codes of shape "
                f"[{afterstate.shape[0]}, {C}] (chance_space_size), got {tuple(code.shape)} of dtype {code.dtype}."
            )
        next_latent, reward_logits = self.chance_dynamics(afterstate, code)
        policy_logits, value_logits = self.predict(next_latent)
        return next_latent, reward_logits, policy_logits, value_logits

    def encode_chance(
        self, observation: torch.Tensor, next_observation: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(o_t, o_{t+1})`` each ``[B, *obs_shape]`` -> ``(code [B, C], probs [B, C])``.

        ``code`` is the straight-through one-hot of the encoder's argmax
        (:func:`straight_through_one_hot`), ``probs = softmax(c^e)``.
        """
        for name, obs in (("observation", observation), ("next_observation", next_observation)):
            if self.check_observation(obs) != observation.shape[:1] or obs.ndim != len(self.observation_shape) + 1:
                raise ValueError(
                    f"{type(self).__name__}.encode_chance expects {name} of shape "
                    f"[B, {', '.join(map(str, self.observation_shape))}] with the same B, "
                    f"got {tuple(obs.shape)} and {tuple(observation.shape)}."
                )
        if not observation.is_floating_point():
            observation = observation.float()
        if not next_observation.is_floating_point():
            next_observation = next_observation.float()
        return straight_through_one_hot(self.chance_encoder_logits(observation, next_observation))

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MuZero's interface: ``phi`` then ``g`` with the most likely code ``argmax sigma``."""
        afterstate = self.afterstate_dynamics(latent, action)
        chance_logits, _ = self.afterstate_prediction(afterstate)
        code = F.one_hot(chance_logits.argmax(-1), self.chance_space_size).to(afterstate.dtype)
        return self.chance_dynamics(afterstate, code)

    # -- the search's view --------------------------------------------------
    def decode_value(self, value_logits: torch.Tensor) -> torch.Tensor:
        """Scalar value (or afterstate value Q) of value logits, as the search reads it."""
        return self.value_support.decode_fast(value_logits)

    @torch.no_grad()
    def search_root(self, observation: torch.Tensor) -> ModelStep:
        """The root (a decision node): ``observation [B, *obs_shape]`` -> :class:`ModelStep`.

        Its logits ``[B, A + C]`` are ``-inf`` on the ``C`` chance slots.
        """
        latent, policy_logits, value_logits = self.initial_inference(observation)
        B = latent.shape[0]
        value = self.decode_value(value_logits)
        pad = policy_logits.new_full((B, self.chance_space_size), -float("inf"))
        state = TensorDict(
            {"latent": latent, "is_chance": torch.zeros(B, dtype=torch.bool, device=latent.device)}, [B]
        )
        return ModelStep(state, torch.zeros_like(value), torch.cat([policy_logits, pad], -1), value)

    @torch.no_grad()
    def search_step(self, state: TensorDictBase, action: torch.Tensor, discount: float | None = None) -> ModelStep:
        """The node below ``(state, action)`` for every row: a chance node below a decision node and back.

        ``action [B]`` is a slot in ``[0, A + C)``: ``a < A`` from a decision
        node (-> chance node: reward 0, discount 1, prior logits ``sigma``
        padded with ``-inf`` on the ``A`` decision slots, value ``Q(as)``),
        ``A + c`` from a chance node (-> decision node: the dynamics' reward,
        ``discount`` (default ``self.discount``), policy logits padded with
        ``-inf`` on the ``C`` slots, value ``v``). Both branches run on the
        whole batch; ``torch.where`` keeps one per row.
        """
        A, C = self.num_actions, self.chance_space_size
        latent, is_chance = state["latent"], state["is_chance"]
        gamma = self.discount if discount is None else float(discount)
        is_decision = ~is_chance

        # decision node -> chance node
        afterstate = self.afterstate_dynamics(latent, action.clamp(0, A - 1))
        chance_logits, q_logits = self.afterstate_prediction(afterstate)
        q = self.decode_value(q_logits)
        # chance node -> decision node
        code = F.one_hot((action - A).clamp(0, C - 1), C).to(latent.dtype)
        next_latent, reward_logits = self.chance_dynamics(latent, code)
        policy_logits, value_logits = self.predict(next_latent)
        reward, value = self.decode_reward_and_value(reward_logits, value_logits)

        B = latent.shape[0]
        rows = is_decision.view(B, *([1] * (latent.ndim - 1)))
        new_latent = torch.where(rows, afterstate, next_latent)
        minus_inf_a = chance_logits.new_full((B, A), -float("inf"))
        minus_inf_c = policy_logits.new_full((B, C), -float("inf"))
        logits = torch.where(
            is_decision[:, None],
            torch.cat([minus_inf_a, chance_logits], -1),
            torch.cat([policy_logits, minus_inf_c], -1),
        )
        out_value = torch.where(is_decision, q, value)
        out_reward = torch.where(is_decision, torch.zeros_like(reward), reward)
        edge_discount = torch.where(is_decision, 1.0, gamma).to(out_value.dtype)
        new_state = TensorDict({"latent": new_latent, "is_chance": is_decision}, [B])
        return ModelStep(new_state, out_reward, logits, out_value, edge_discount)


class StochasticMuZeroMLPModel(StochasticMuZeroModel):
    """Stochastic MuZero of small MLPs for flat observations.

    Args:
        observation_shape: shape of one observation, e.g. ``(4,)``.
        num_actions: ``A``.
        chance_space_size: ``C``, the number of chance codes.
        latent_dim: size of the latent state and of the afterstate.
        hidden_dim: width of the hidden layers.
        value_support_size / reward_support_size: half-widths of the
            categorical supports.
        num_layers: hidden layers per network.
        zero_init_heads: start the value, Q, reward and policy heads at zero
            output (uniform policy, zero values). The chance heads (sigma and
            the encoder) are not zeroed: with a zero encoder every code is the
            first one and the encoder's gradient is symmetric.
        discount: the search discount of the chance-to-decision edges when a
            search does not pass its own.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
        >>> model = StochasticMuZeroMLPModel((4,), num_actions=2, chance_space_size=3,
        ...                                  latent_dim=16, hidden_dim=16)
        >>> obs = torch.randn(5, 4)
        >>> latent, policy_logits, value_logits = model.initial_inference(obs)
        >>> afterstate, chance_logits, q_logits = model.afterstate_inference(latent, torch.randint(2, (5,)))
        >>> code, probs = model.encode_chance(obs, torch.randn(5, 4))
        >>> code.shape, code.detach().sum(-1)
        (torch.Size([5, 3]), tensor([1., 1., 1., 1., 1.]))
        >>> next_latent, reward_logits, policy_logits, value_logits = model.chance_inference(afterstate, code)
        >>> next_latent.shape, chance_logits.shape, reward_logits.shape
        (torch.Size([5, 16]), torch.Size([5, 3]), torch.Size([5, 21]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        chance_space_size: int = 2,
        latent_dim: int = 64,
        hidden_dim: int = 64,
        value_support_size: int = 10,
        reward_support_size: int = 10,
        num_layers: int = 1,
        zero_init_heads: bool = True,
        discount: float = 0.997,
    ) -> None:
        super().__init__(
            observation_shape, num_actions, value_support_size, reward_support_size, chance_space_size, discount
        )
        obs_dim = int(torch.Size(observation_shape).numel())
        A, C = self.num_actions, self.chance_space_size
        self.latent_dim = int(latent_dim)
        self.representation_net = _mlp(obs_dim, hidden_dim, latent_dim, num_layers)
        self.prediction_trunk = nn.Sequential(nn.Linear(latent_dim, hidden_dim), nn.ReLU())
        self.prediction_head = nn.Linear(hidden_dim, A + self.value_support.num_bins)
        self.afterstate_net = _mlp(latent_dim + A, hidden_dim, latent_dim, num_layers)
        self.afterstate_trunk = nn.Sequential(nn.Linear(latent_dim, hidden_dim), nn.ReLU())
        self.chance_head = nn.Linear(hidden_dim, C)
        self.afterstate_value_head = nn.Linear(hidden_dim, self.value_support.num_bins)
        self.dynamics_net = _mlp(latent_dim + C, hidden_dim, latent_dim, num_layers)
        self.reward_head = _mlp(latent_dim, hidden_dim, self.reward_support.num_bins, num_layers)
        self.chance_encoder = _mlp(2 * obs_dim, hidden_dim, C, num_layers)
        if zero_init_heads:
            for layer in (self.reward_head[-1], self.prediction_head, self.afterstate_value_head):
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        return scale_latent(self.representation_net(observation.flatten(1)))

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.prediction_head(self.prediction_trunk(latent))
        return out[..., : self.num_actions], out[..., self.num_actions :]

    def afterstate_dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        action_one_hot = F.one_hot(action, self.num_actions).to(latent.dtype)
        return scale_latent(self.afterstate_net(torch.cat([latent, action_one_hot], -1)))

    def afterstate_prediction(self, afterstate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.afterstate_trunk(afterstate)
        return self.chance_head(hidden), self.afterstate_value_head(hidden)

    def chance_dynamics(self, afterstate: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        next_latent = scale_latent(self.dynamics_net(torch.cat([afterstate, code.to(afterstate.dtype)], -1)))
        return next_latent, self.reward_head(next_latent)

    def chance_encoder_logits(self, observation: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
        return self.chance_encoder(torch.cat([observation.flatten(1), next_observation.flatten(1)], -1))

    def fused_search_weights(self) -> tuple[list[torch.Tensor], float, float] | None:
        """What the C++ fused Stochastic MuZero search needs to run this model, or ``None`` when it cannot.

        The fused search (``stochastic_search`` in
        ``torchrl_muzero/csrc/stochastic_search.cpp``) runs every simulation
        of a CPU search in one C++ call, with its own loops for
        :meth:`search_step`'s arithmetic; it only knows one hidden layer per
        network (``num_layers == 1``) in float32 on the CPU. A subclass that
        overrides a step of the search is not this model any more, so it gets
        ``None`` and the search calls it per simulation.

        Returns ``(tensors, reward_epsilon, value_epsilon)`` with the 24
        ``tensors`` in the kernel's order: afterstate dynamics (W1 ``[H, L +
        A]``, b1, W2, b2), afterstate trunk (W, b), chance head (W, b),
        afterstate value head (W, b), dynamics (W1 ``[H, L + C]``, b1, W2,
        b2), reward head (W1, b1, W2, b2), prediction trunk (W, b), joint
        policy+value head (W, b), reward bins, value bins.

        Examples:
            >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
            >>> model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
            >>> len(model.fused_search_weights()[0])
            24
            >>> StochasticMuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8, num_layers=2).fused_search_weights()
        """
        cls = type(self)
        base = StochasticMuZeroMLPModel
        overridden = [
            name
            for name in ("search_step", "afterstate_dynamics", "afterstate_prediction", "chance_dynamics", "predict",
                         "decode_value", "decode_reward_and_value")
            if getattr(cls, name) is not getattr(base, name)
        ]
        if overridden or any(len(net) != 3 for net in (self.afterstate_net, self.dynamics_net, self.reward_head)):
            return None
        a1, _, a2 = self.afterstate_net
        d1, _, d2 = self.dynamics_net
        r1, _, r2 = self.reward_head
        t1, p1 = self.afterstate_trunk[0], self.prediction_trunk[0]
        tensors = [
            a1.weight, a1.bias, a2.weight, a2.bias,
            t1.weight, t1.bias, self.chance_head.weight, self.chance_head.bias,
            self.afterstate_value_head.weight, self.afterstate_value_head.bias,
            d1.weight, d1.bias, d2.weight, d2.bias,
            r1.weight, r1.bias, r2.weight, r2.bias,
            p1.weight, p1.bias, self.prediction_head.weight, self.prediction_head.bias,
            self.reward_support.bins, self.value_support.bins,
        ]
        kernel_tensors = fused_kernel_tensors(tensors)
        if kernel_tensors is None:
            return None
        return (
            kernel_tensors,
            self.reward_support.epsilon,
            self.value_support.epsilon,
        )

    def fused_kernel_spec(self) -> FusedSpec | None:
        """The fused Stochastic MuZero search (kernel entry ``"stochastic"``) on :meth:`fused_search_weights`,
        or ``None``.

        The node state is :meth:`search_root`'s: a float32 ``"latent"``
        ``[B, N, L]`` and the bool node kind ``"is_chance"``. Built on
        :meth:`fused_search_weights`, so setting that to ``lambda: None`` on an
        instance keeps the search out of the fused kernel.

        Examples:
            >>> from torchrl_muzero.modules import StochasticMuZeroMLPModel
            >>> model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
            >>> spec = model.fused_kernel_spec()
            >>> spec.kernel, [leaf.key for leaf in spec.node_state]
            ('stochastic', ['latent', 'is_chance'])
        """
        fused = self.fused_search_weights()
        if fused is None:
            return None
        tensors, reward_eps, value_eps = fused
        return FusedSpec("stochastic", tensors, floats=(reward_eps, value_eps), node_state=_STOCHASTIC_STATE)
