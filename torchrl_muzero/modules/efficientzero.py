"""EfficientZero networks (Ye et al. 2021, arXiv 2111.00210): the value-prefix LSTM.

EfficientZero replaces MuZero's per-step reward head by a *value prefix*: the
dynamics' next latent goes through an LSTM whose state ``(h, c)`` is carried
along the unroll (training) and along every search path, and whose output head
predicts, on the reward support, the sum of the rewards since the LSTM was last
reset. The state is reset to zeros every ``lstm_horizon_len`` steps (``H``),
counting from the root, in training and in search alike, so a prefix never sums
more than ``H`` rewards.

The search turns prefixes back into edge rewards: the reward into a node is its
prefix minus its parent's, or its own prefix when the parent is a reset node
(whose prefix counts from 0). A node at depth ``d`` with ``d % H == 0`` is a
reset node (LightZero's ``is_reset``, ``mcts_ctree.py`` with
``search_lens % lstm_horizon_len == 0``): the edge reward into it is computed
first, then its LSTM state and stored prefix are zeroed.

Rewards inside one horizon are summed undiscounted (as LightZero's targets do),
while the search discounts the extracted edge rewards with its own ``gamma``:
the two agree when ``gamma`` is 1 within a horizon, and differ by
``O((1 - gamma) * H)`` otherwise, which EfficientZero accepts.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl_muzero.modules.fused_spec import FusedSpec, StateLeaf
from torchrl_muzero.modules.mlp import MuZeroMLPModel, fused_kernel_tensors
from torchrl_muzero.modules.model import MuZeroModel, scale_latent
from torchrl_muzero.modules.resnet import MuZeroResNetModel, _norm
from torchrl_muzero.modules.step import ModelStep

__all__ = ["EfficientZeroModel", "EfficientZeroMLPModel", "EfficientZeroResNetModel"]

LSTMState = tuple[torch.Tensor, torch.Tensor]

#: The node state of an EfficientZero tree as the fused ``"ez"`` entry reads it, in its order
#: (``mcts._cpp.EZ_STATE_KEYS``): the latent ``[B, N, L]``, the LSTM state, the stored prefix, the
#: steps since the last reset.
EZ_NODE_STATE = (StateLeaf("latent", torch.float32, 3), StateLeaf("lstm_h", torch.float32),
                 StateLeaf("lstm_c", torch.float32), StateLeaf("value_prefix", torch.float32),
                 StateLeaf("steps", torch.int64))

_NO_REWARD = (
    "{name} predicts value prefixes, not rewards: train it with "
    "recurrent_inference_prefix (EfficientZeroLoss) and search it with "
    "search_root / search_step; {method} has no meaning for it."
)


class EfficientZeroModel(MuZeroModel):
    """The EfficientZero interface over a MuZero network with a value-prefix LSTM.

    Subclasses implement :meth:`represent` and :meth:`predict` as in MuZero,
    plus :meth:`transition` (the dynamics without a reward) and
    :meth:`value_prefix_features` (what the LSTM reads from the next latent),
    and call :meth:`_build_value_prefix` in their constructor.

    Training API:

    * :meth:`initial_lstm_state` ``(B) -> (h, c)`` zeros ``[B, lstm_hidden_size]``;
    * :meth:`recurrent_inference_prefix` ``(latent, lstm_state, action) ->
      (next_latent, lstm_state, value_prefix_logits, policy_logits,
      value_logits)``; the caller resets the state every ``lstm_horizon_len``
      steps (:meth:`reset_lstm_state`).

    Search API (the only calls the search makes):

    * :meth:`search_root` ``(observation) -> ModelStep`` whose state is a
      TensorDict of batch ``[B]`` with ``latent``, ``lstm_h``, ``lstm_c``,
      ``value_prefix`` ``[B]`` (0 at the root) and ``steps`` ``[B]`` (steps
      since the last reset, 0 at the root);
    * :meth:`search_step` ``(state, action) -> ModelStep`` with the edge
      reward extracted from the prefixes and the reset applied.

    MuZero's reward calls (:meth:`recurrent_inference`,
    :meth:`recurrent_inference_scalar`, :meth:`dynamics`, ``model.recurrent``)
    raise ``NotImplementedError``, so no MuZero code path can read a value
    prefix as a reward; ``MuZeroLoss`` refuses these models.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import EfficientZeroMLPModel, EfficientZeroModel
        >>> model = EfficientZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8,
        ...                               lstm_hidden_size=8, lstm_horizon_len=2)
        >>> isinstance(model, EfficientZeroModel), model.predicts_value_prefix
        (True, True)
        >>> state = model.initial_lstm_state(3)
        >>> state[0].shape, bool(state[0].abs().sum() == 0)
        (torch.Size([3, 8]), True)
    """

    #: read by ``MuZeroLoss`` (which refuses such a model) and by variant builders
    predicts_value_prefix = True

    def _build_value_prefix(
        self,
        in_features: int,
        lstm_hidden_size: int,
        lstm_horizon_len: int,
        head_hidden: Sequence[int],
        zero_init_heads: bool,
    ) -> None:
        """Create the LSTM and its value-prefix head (LayerNorm, ReLU, MLP to the reward bins)."""
        if int(lstm_hidden_size) < 1:
            raise ValueError(f"lstm_hidden_size must be >= 1, got {lstm_hidden_size}.")
        if int(lstm_horizon_len) < 1:
            raise ValueError(f"lstm_horizon_len must be >= 1, got {lstm_horizon_len}.")
        self.lstm_hidden_size = int(lstm_hidden_size)
        self.lstm_horizon_len = int(lstm_horizon_len)
        self.value_prefix_lstm = nn.LSTMCell(int(in_features), self.lstm_hidden_size)
        layers: list[nn.Module] = [nn.LayerNorm(self.lstm_hidden_size), nn.ReLU()]
        dim = self.lstm_hidden_size
        for width in head_hidden:
            layers += [nn.Linear(dim, int(width)), nn.ReLU()]
            dim = int(width)
        layers.append(nn.Linear(dim, self.reward_support.num_bins))
        self.value_prefix_head = nn.Sequential(*layers)
        if zero_init_heads:
            nn.init.zeros_(self.value_prefix_head[-1].weight)
            nn.init.zeros_(self.value_prefix_head[-1].bias)

    # -- to implement -------------------------------------------------------------
    def transition(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The dynamics' next latent ``[B, *latent_shape]`` (no reward)."""
        raise NotImplementedError

    def value_prefix_features(self, next_latent: torch.Tensor) -> torch.Tensor:
        """What the LSTM reads from the next latent: ``[B, in_features]``."""
        raise NotImplementedError

    def check_latent(self, latent: torch.Tensor) -> None:
        """Raise ``ValueError`` if ``latent`` is not ``[B, *latent_shape]`` (no check here)."""

    # -- training API ---------------------------------------------------------------
    def initial_lstm_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> LSTMState:
        """Zero LSTM state ``(h, c)``, each ``[batch_size, lstm_hidden_size]``."""
        weight = self.value_prefix_lstm.weight_hh
        shape = (int(batch_size), self.lstm_hidden_size)
        h = torch.zeros(shape, device=device or weight.device, dtype=dtype or weight.dtype)
        return h, torch.zeros_like(h)

    def reset_lstm_state(self, lstm_state: LSTMState, reset: torch.Tensor | None = None) -> LSTMState:
        """Zero the rows of ``(h, c)`` where ``reset [B]`` (bool) is true; all rows if ``None``."""
        h, c = lstm_state
        if reset is None:
            return torch.zeros_like(h), torch.zeros_like(c)
        keep = ~reset.unsqueeze(-1)
        return torch.where(keep, h, 0.0), torch.where(keep, c, 0.0)

    def dynamics_prefix(
        self, latent: torch.Tensor, lstm_state: LSTMState, action: torch.Tensor
    ) -> tuple[torch.Tensor, LSTMState, torch.Tensor]:
        """``(next_latent, (h, c), value_prefix_logits)`` without input checks."""
        next_latent = self.transition(latent, action)
        h, c = self.value_prefix_lstm(self.value_prefix_features(next_latent), lstm_state)
        return next_latent, (h, c), self.value_prefix_head(h)

    def recurrent_inference_prefix(
        self, latent: torch.Tensor, lstm_state: LSTMState, action: torch.Tensor
    ) -> tuple[torch.Tensor, LSTMState, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One unroll step: ``(latent [B, ...], (h, c) [B, lstm_hidden_size] each, action [B])``
        -> ``(next_latent, (h, c), value_prefix_logits, policy_logits, value_logits)``.

        The value prefix is the sum of the rewards since the state was last
        zeroed; the caller resets ``(h, c)`` after every ``lstm_horizon_len``-th step.
        """
        B = latent.shape[0]
        self.check_latent(latent)
        self.check_action(action, B)
        h, c = lstm_state
        expected = (B, self.lstm_hidden_size)
        if tuple(h.shape) != expected or tuple(c.shape) != expected:
            raise ValueError(
                f"{type(self).__name__} expects an LSTM state (h, c) of shapes [{B}, "
                f"{self.lstm_hidden_size}] each, got {tuple(h.shape)} and {tuple(c.shape)}."
            )
        next_latent, lstm_state, prefix_logits = self.dynamics_prefix(latent, (h, c), action)
        policy_logits, value_logits = self.predict(next_latent)
        return next_latent, lstm_state, prefix_logits, policy_logits, value_logits

    # -- MuZero's reward API does not apply ---------------------------------------------
    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raises ``NotImplementedError``: there is no per-step reward (see :meth:`dynamics_prefix`)."""
        raise NotImplementedError(_NO_REWARD.format(name=type(self).__name__, method="dynamics"))

    def recurrent_inference(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raises ``NotImplementedError``: use :meth:`recurrent_inference_prefix`."""
        raise NotImplementedError(
            _NO_REWARD.format(name=type(self).__name__, method="recurrent_inference")
        )

    def recurrent_inference_scalar(
        self, latent: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raises ``NotImplementedError``: the search calls :meth:`search_step`."""
        raise NotImplementedError(
            _NO_REWARD.format(name=type(self).__name__, method="recurrent_inference_scalar")
        )

    def fused_search_weights(self) -> None:
        """``None``: MuZero's fused C++ search reads a reward head (the MLP model has
        :meth:`EfficientZeroMLPModel.fused_value_prefix_weights` for its own fused search)."""
        return None

    def fused_kernel_spec(self) -> FusedSpec | None:
        """``None``: the kernel's ``"mlp"`` entry reads a reward head, not a value-prefix LSTM (this comes
        before ``MuZeroMLPModel`` in the MRO; :meth:`EfficientZeroMLPModel.fused_kernel_spec` is ``"ez"``)."""
        return None

    # -- search API ----------------------------------------------------------------------
    @torch.no_grad()
    def search_root(self, observation: torch.Tensor) -> ModelStep:
        """The root: prefix 0, LSTM state zeros, 0 steps since the last reset, reward 0."""
        latent, policy_logits, value_logits = self.initial_inference(observation)
        value = self.value_support.decode(value_logits)
        B = latent.shape[0]
        h, c = self.initial_lstm_state(B, latent.device, latent.dtype)
        state = TensorDict(
            {
                "latent": latent,
                "lstm_h": h,
                "lstm_c": c,
                "value_prefix": torch.zeros(B, dtype=value.dtype, device=value.device),
                "steps": torch.zeros(B, dtype=torch.long, device=latent.device),
            },
            batch_size=[B],
        )
        return ModelStep(state, torch.zeros_like(value), policy_logits, value)

    @torch.no_grad()
    def search_step(self, state: TensorDictBase, action: torch.Tensor) -> ModelStep:
        """The child of ``state`` along ``action [B]``, with its edge reward.

        ``reward = child prefix - parent's stored prefix``; a reset parent
        stores 0, so its children's rewards are their own prefixes. When the
        child is ``lstm_horizon_len`` steps from the last reset, its LSTM state,
        stored prefix and step count are zeroed after its reward is taken.
        """
        if not isinstance(state, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}.search_step expects the TensorDict state that "
                f"search_root / search_step returned, got {type(state).__name__}."
            )
        next_latent, (h, c), prefix_logits = self.dynamics_prefix(
            state["latent"], (state["lstm_h"], state["lstm_c"]), action
        )
        policy_logits, value_logits = self.predict(next_latent)
        prefix, value = self.decode_reward_and_value(prefix_logits, value_logits)
        reward = prefix - state["value_prefix"]
        steps = state["steps"] + 1
        reset = steps >= self.lstm_horizon_len
        h, c = self.reset_lstm_state((h, c), reset)
        child = TensorDict(
            {
                "latent": next_latent,
                "lstm_h": h,
                "lstm_c": c,
                "value_prefix": torch.where(reset, 0.0, prefix),
                "steps": torch.where(reset, 0, steps),
            },
            batch_size=state.batch_size,
        )
        return ModelStep(child, reward, policy_logits, value)


class EfficientZeroMLPModel(EfficientZeroModel, MuZeroMLPModel):
    """EfficientZero model of small MLPs for flat observations (CartPole).

    :class:`~torchrl_muzero.modules.MuZeroMLPModel`'s representation, dynamics
    trunk and prediction, with the reward head replaced by the value-prefix
    LSTM: the next latent feeds an ``nn.LSTMCell`` of ``lstm_hidden_size``
    units, whose ``h`` goes through LayerNorm, ReLU and an MLP
    (``num_layers`` hidden layers of ``hidden_dim``) to the reward support's
    logits. See :class:`EfficientZeroModel` for the training and search API.

    Args:
        observation_shape, num_actions, latent_dim, hidden_dim,
            value_support_size, reward_support_size, num_layers,
            zero_init_heads: as :class:`~torchrl_muzero.modules.MuZeroMLPModel`.
            The reward support holds value prefixes, i.e. up to
            ``lstm_horizon_len`` rewards.
        lstm_hidden_size: LSTM units. Defaults to 64 (LightZero CartPole: 128).
        lstm_horizon_len: the LSTM state is reset every this many steps from
            the root, in training and search. Defaults to 5.
        action_dim: ``None`` (discrete) or ``D`` (continuous actions ``[B, D]``):
            as :class:`~torchrl_muzero.modules.MuZeroMLPModel`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import EfficientZeroMLPModel
        >>> model = EfficientZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16,
        ...                               lstm_hidden_size=8, lstm_horizon_len=2)
        >>> latent, policy_logits, value_logits = model.initial_inference(torch.randn(3, 4))
        >>> lstm = model.initial_lstm_state(3)
        >>> latent, lstm, prefix_logits, policy_logits, value_logits = (
        ...     model.recurrent_inference_prefix(latent, lstm, torch.tensor([0, 1, 1])))
        >>> prefix_logits.shape, lstm[0].shape
        (torch.Size([3, 21]), torch.Size([3, 8]))
        >>> root = model.search_root(torch.randn(3, 4))
        >>> sorted(root.state.keys())
        ['latent', 'lstm_c', 'lstm_h', 'steps', 'value_prefix']
        >>> child = model.search_step(root.state, torch.tensor([0, 1, 0]))
        >>> grandchild = model.search_step(child.state, torch.tensor([1, 1, 0]))
        >>> grandchild.state["steps"], bool(grandchild.state["lstm_h"].abs().sum() == 0)
        (tensor([0, 0, 0]), True)
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        latent_dim: int = 64,
        hidden_dim: int = 64,
        value_support_size: int = 10,
        reward_support_size: int = 10,
        num_layers: int = 1,
        zero_init_heads: bool = True,
        lstm_hidden_size: int = 64,
        lstm_horizon_len: int = 5,
        action_dim: int | None = None,
    ) -> None:
        super().__init__(
            observation_shape, num_actions, latent_dim=latent_dim, hidden_dim=hidden_dim,
            value_support_size=value_support_size, reward_support_size=reward_support_size,
            num_layers=num_layers, zero_init_heads=zero_init_heads, action_dim=action_dim,
        )
        del self.reward_head
        self._build_value_prefix(
            latent_dim, lstm_hidden_size, lstm_horizon_len, [hidden_dim] * num_layers, zero_init_heads
        )

    def transition(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        action_input = self.encode_action(action, latent.dtype)  # one-hot, or continuous actions as they are
        return scale_latent(self.dynamics_net(torch.cat([latent, action_input], -1)))

    def value_prefix_features(self, next_latent: torch.Tensor) -> torch.Tensor:
        return next_latent

    def fused_value_prefix_weights(self) -> tuple[list[torch.Tensor], float, float, float, int] | None:
        """What the C++ fused EfficientZero search needs to run this model, or ``None`` when it cannot.

        The fused search (``ez_search``, ``torchrl_muzero/csrc/ez_net.h``)
        runs every simulation of a CPU search in one C++ call with its own
        loops for :meth:`search_step`'s arithmetic (dynamics, LSTM cell,
        LayerNorm value-prefix head, prediction, the reset every
        ``lstm_horizon_len`` steps). It knows one hidden layer per network
        (``num_layers == 1``) in float32 on the CPU; a subclass that overrides
        any part of the step is not this model any more, so it gets ``None``
        and the search calls it per simulation. (:meth:`fused_search_weights`
        stays ``None``: MuZero's fused kernel reads a reward head.)

        Returns ``(tensors, reward_epsilon, value_epsilon, layer_norm_eps,
        lstm_horizon_len)`` with ``tensors`` in the kernel's order: dynamics
        (W1 ``[H, L + A]``, b1, W2, b2), LSTM (``weight_ih``, ``weight_hh``,
        ``bias_ih``, ``bias_hh``), LayerNorm (weight, bias), value-prefix MLP
        (W1, b1, W2, b2), prediction trunk (W, b), joint policy+value head
        (W, b), reward bins, value bins.

        Examples:
            >>> from torchrl_muzero.modules import EfficientZeroMLPModel
            >>> model = EfficientZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8)
            >>> tensors, reward_eps, value_eps, ln_eps, horizon = model.fused_value_prefix_weights()
            >>> len(tensors), horizon
            (20, 5)
            >>> EfficientZeroMLPModel((4,), 2, num_layers=2).fused_value_prefix_weights() is None
            True
        """
        if self.action_dim is not None:  # the kernel looks actions up as one-hot columns
            return None
        return self._value_prefix_kernel_weights()

    def fused_continuous_weights(self) -> tuple[list[torch.Tensor], float, float, float, int] | None:
        """:meth:`fused_value_prefix_weights` for a model of continuous actions (``action_dim`` set), else ``None``.

        The same tensors and conditions; the dynamics' first weight is ``[H, L + D]``
        (the ``D`` action inputs after the latent). The sampled search's fused
        kernel (``SampledModel.fused_kernel_spec``, ``csrc/sampled_search.cpp``)
        runs this step along its candidates' float actions.

        Examples:
            >>> from torchrl_muzero.modules import EfficientZeroMLPModel
            >>> box = EfficientZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8, action_dim=1)
            >>> box.fused_value_prefix_weights() is None, len(box.fused_continuous_weights()[0])
            (True, 20)
            >>> EfficientZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8).fused_continuous_weights() is None
            True
        """
        if self.action_dim is None:
            return None
        return self._value_prefix_kernel_weights()

    def _value_prefix_kernel_weights(self) -> tuple[list[torch.Tensor], float, float, float, int] | None:
        # the checks and tensors both fused entries share: one hidden layer, torch's own modules, float32 CPU
        cls, base = type(self), EfficientZeroMLPModel
        overridden = any(
            getattr(cls, name) is not getattr(owner, name)
            for owner, name in (
                (EfficientZeroModel, "search_step"), (EfficientZeroModel, "dynamics_prefix"),
                (base, "transition"), (base, "value_prefix_features"), (MuZeroMLPModel, "predict"),
                (MuZeroModel, "decode_reward_and_value"), (EfficientZeroModel, "reset_lstm_state"),
            )
        )
        head, lstm = self.value_prefix_head, self.value_prefix_lstm
        if (
            overridden
            or type(lstm) is not nn.LSTMCell
            or lstm.bias_ih is None
            or len(self.dynamics_net) != 3
            or len(head) != 5
            or type(head[0]) is not nn.LayerNorm
            or head[0].weight is None
            or head[0].bias is None
            or tuple(head[0].normalized_shape) != (self.lstm_hidden_size,)
        ):
            return None
        first, _, last = self.dynamics_net
        ln, _, v1, _, v2 = head
        p1 = self.prediction_trunk[0]
        tensors = [
            first.weight, first.bias, last.weight, last.bias,
            lstm.weight_ih, lstm.weight_hh, lstm.bias_ih, lstm.bias_hh,
            ln.weight, ln.bias, v1.weight, v1.bias, v2.weight, v2.bias,
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
            float(ln.eps),
            self.lstm_horizon_len,
        )

    def fused_kernel_spec(self) -> FusedSpec | None:
        """The fused EfficientZero search (kernel entry ``"ez"``) on :meth:`fused_value_prefix_weights`, or ``None``.

        The node state is :meth:`search_root`'s TensorDict (:data:`EZ_NODE_STATE`).
        Built on :meth:`fused_value_prefix_weights`, so setting that to
        ``lambda: None`` on an instance keeps the search out of the fused kernel.

        Examples:
            >>> from torchrl_muzero.modules import EfficientZeroMLPModel
            >>> model = EfficientZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8, lstm_hidden_size=8)
            >>> spec = model.fused_kernel_spec()
            >>> spec.kernel, spec.ints, [leaf.key for leaf in spec.node_state]
            ('ez', (5,), ['latent', 'lstm_h', 'lstm_c', 'value_prefix', 'steps'])
        """
        fused = self.fused_value_prefix_weights()
        if fused is None:
            return None
        tensors, reward_eps, value_eps, ln_eps, horizon = fused
        return FusedSpec("ez", tensors, ints=(horizon,), floats=(reward_eps, value_eps, ln_eps),
                         node_state=EZ_NODE_STATE)


class EfficientZeroResNetModel(EfficientZeroModel, MuZeroResNetModel):
    """EfficientZero model of residual towers for image observations (Atari).

    :class:`~torchrl_muzero.modules.MuZeroResNetModel`'s representation,
    dynamics tower and prediction; the reward head is replaced by: 1x1
    convolution to ``reduced_channels_reward`` planes (normalization, ReLU),
    flatten, ``nn.LSTMCell`` of ``lstm_hidden_size`` units, LayerNorm, ReLU,
    MLP with ``fc_reward_layers`` hidden widths to the reward support's
    logits. See :class:`EfficientZeroModel` for the training and search API.

    Args:
        observation_shape, num_actions, **kwargs: as
            :class:`~torchrl_muzero.modules.MuZeroResNetModel`.
        lstm_hidden_size: LSTM units. Defaults to 512 (LightZero Atari).
        lstm_horizon_len: reset period of the LSTM state. Defaults to 5.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules import EfficientZeroResNetModel
        >>> model = EfficientZeroResNetModel((3, 8, 8), 4, channels=8, downsample=False,
        ...                                  value_support_size=5, reward_support_size=5,
        ...                                  lstm_hidden_size=16, batch_norm=False)
        >>> root = model.search_root(torch.rand(2, 3, 8, 8))
        >>> root.state["latent"].shape, root.state["lstm_h"].shape
        (torch.Size([2, 8, 8, 8]), torch.Size([2, 16]))
        >>> child = model.search_step(root.state, torch.tensor([0, 3]))
        >>> child.reward.shape, child.policy_logits.shape
        (torch.Size([2]), torch.Size([2, 4]))
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        lstm_hidden_size: int = 512,
        lstm_horizon_len: int = 5,
        **kwargs,
    ) -> None:
        super().__init__(observation_shape, num_actions, **kwargs)
        del self.reward_head
        reduced = int(kwargs.get("reduced_channels_reward", 16))
        batch_norm = bool(kwargs.get("batch_norm", True))
        self.value_prefix_conv = nn.Sequential(
            nn.Conv2d(self.channels, reduced, 1, bias=not batch_norm),
            _norm(reduced, batch_norm),
            nn.ReLU(),
            nn.Flatten(1),
        )
        spatial = self.latent_shape[1] * self.latent_shape[2]
        self._build_value_prefix(
            reduced * spatial, lstm_hidden_size, lstm_horizon_len,
            tuple(kwargs.get("fc_reward_layers", (32,))), bool(kwargs.get("zero_init_heads", True)),
        )

    def transition(self, latent: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = latent.shape
        plane = (action.to(latent.dtype) / self.num_actions).view(batch, 1, 1, 1)
        x = torch.cat([latent, plane.expand(batch, 1, height, width)], dim=1)
        x = torch.relu(self.dynamics_norm(self.dynamics_conv(x)) + latent)
        return scale_latent(self.dynamics_net(x))

    def value_prefix_features(self, next_latent: torch.Tensor) -> torch.Tensor:
        return self.value_prefix_conv(next_latent)

    def check_latent(self, latent: torch.Tensor) -> None:
        if latent.ndim != 4 or latent.shape[1:] != self.latent_shape:
            raise ValueError(
                f"{type(self).__name__} expects latents of shape "
                f"[batch, {', '.join(map(str, self.latent_shape))}], got {tuple(latent.shape)}."
            )
