"""MuZero networks for vector observations (classic control)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from torchrl_muzero.modules.fused_spec import FusedSpec, StateLeaf
from torchrl_muzero.modules.model import MuZeroModel, scale_latent

__all__ = ["MuZeroMLPModel"]

# MuZero's node state: the plain latent tree [B, N, L] (the kernel writes each new node's latent)
_LATENT_STATE = (StateLeaf(None, torch.float32, 3),)


def _mlp(in_dim: int, hidden: int, out_dim: int, layers: int = 1) -> nn.Sequential:
    modules: list[nn.Module] = []
    dim = in_dim
    for _ in range(layers):
        modules += [nn.Linear(dim, hidden), nn.ReLU()]
        dim = hidden
    modules.append(nn.Linear(dim, out_dim))
    return nn.Sequential(*modules)


def fused_kernel_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """``tensors`` as the fused C++ searches take them (detached, contiguous), or ``None`` unless all are
    float32 CPU tensors (the kernels' only layout); shared by every model's ``fused_*_weights``."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    return [t.detach().contiguous() for t in tensors]


class MuZeroMLPModel(MuZeroModel):
    """MuZero model of small MLPs for flat observations.

    Args:
        observation_shape: shape of one observation, e.g. ``(4,)`` for CartPole.
        num_actions: number of discrete actions.
        latent_dim: size of the latent state.
        hidden_dim: width of the hidden layers.
        value_support_size / reward_support_size: half-widths of the
            categorical supports (``2 * size + 1`` bins).
        num_layers: hidden layers per network.
        zero_init_heads: start value, reward and policy heads at zero output
            (uniform policy, zero value), which steadies early training.
        action_dim: ``None`` (default): discrete actions, indices ``[B]``
            that the dynamics one-hot encode. An integer ``D``: continuous
            actions, float vectors ``[B, D]`` the dynamics take as they are
            (a sampled model's box actions, :class:`~torchrl_muzero.modules.SampledModel`);
            ``num_actions`` is then only the width of the policy head
            (``2 * D``: a tanh-normal's location and scale).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel(observation_shape=(4,), num_actions=2,
        ...                        latent_dim=32, hidden_dim=32,
        ...                        value_support_size=10, reward_support_size=10)
        >>> td = TensorDict({"observation": torch.randn(8, 4)}, [8])
        >>> td = model.initial(td)
        >>> td["latent"].shape, td["policy_logits"].shape, td["state_value"].shape
        (torch.Size([8, 32]), torch.Size([8, 2]), torch.Size([8]))
        >>> td["action"] = torch.randint(2, (8,))
        >>> td = model.recurrent(td)
        >>> td["next_latent"].shape, td["reward"].shape
        (torch.Size([8, 32]), torch.Size([8]))
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
        action_dim: int | None = None,
    ) -> None:
        super().__init__(observation_shape, num_actions, value_support_size, reward_support_size)
        if action_dim is not None and (isinstance(action_dim, bool) or not isinstance(action_dim, int)
                                       or action_dim < 1):
            raise ValueError(f"action_dim must be None (discrete actions) or an integer >= 1, got {action_dim!r}.")
        obs_dim = int(torch.Size(observation_shape).numel())
        self.latent_dim = latent_dim
        self.action_dim = action_dim
        self.representation_net = _mlp(obs_dim, hidden_dim, latent_dim, num_layers)
        action_width = num_actions if action_dim is None else action_dim
        self.dynamics_net = _mlp(latent_dim + action_width, hidden_dim, latent_dim, num_layers)
        self.reward_head = _mlp(latent_dim, hidden_dim, self.reward_support.num_bins, num_layers)
        self.prediction_trunk = nn.Sequential(nn.Linear(latent_dim, hidden_dim), nn.ReLU())
        # policy and value share one output layer: one matmul instead of two per search step
        self.prediction_head = nn.Linear(hidden_dim, num_actions + self.value_support.num_bins)
        if zero_init_heads:
            for layer in (self.reward_head[-1], self.prediction_head):
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)

    def represent(self, observation: torch.Tensor) -> torch.Tensor:
        return scale_latent(self.representation_net(observation.flatten(1)))

    def encode_action(self, action: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dynamics' action input ``[B, width]``: the one-hot of indices ``[B]``, or (``action_dim``
        set) the continuous actions ``[B, D]`` themselves."""
        if self.action_dim is None:
            return F.one_hot(action, self.num_actions).to(dtype)
        return action.to(dtype).reshape(action.shape[0], self.action_dim)

    def check_action(self, action: torch.Tensor, batch_size: int) -> None:
        """Discrete: as :meth:`MuZeroModel.check_action`; continuous (``action_dim``): float ``[B, D]``."""
        if self.action_dim is None:
            return super().check_action(action, batch_size)
        if action.shape != (batch_size, self.action_dim) or not action.dtype.is_floating_point:
            raise ValueError(
                f"{type(self).__name__} expects float actions of shape [{batch_size}, {self.action_dim}] "
                f"(one per latent), got {tuple(action.shape)} of dtype {action.dtype}."
            )

    def dynamics(self, latent: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action_input = self.encode_action(action, latent.dtype)
        next_latent = scale_latent(self.dynamics_net(torch.cat([latent, action_input], -1)))
        return next_latent, self.reward_head(next_latent)

    @torch.no_grad()
    def recurrent_inference_scalar(self, latent, action):
        """The search's step with the fewest aten calls (~30 instead of ~60).

        Same numbers as the generic path (tested): the action's one-hot
        concatenation becomes a column lookup of the first dynamics layer, and
        layers are called through ``F.linear`` to skip module-call overhead.
        Falls back to the generic path for deeper networks.
        """
        if len(self.dynamics_net) != 3 or len(self.reward_head) != 3 or self.action_dim is not None:
            return super().recurrent_inference_scalar(latent, action)
        first, _, last = self.dynamics_net
        w_latent = first.weight[:, : self.latent_dim]
        w_action = first.weight[:, self.latent_dim :]
        hidden = F.linear(latent, w_latent, first.bias) + w_action.t()[action]
        next_latent = scale_latent(F.linear(torch.relu(hidden), last.weight, last.bias))
        r1, _, r2 = self.reward_head
        reward_logits = F.linear(torch.relu(F.linear(next_latent, r1.weight, r1.bias)), r2.weight, r2.bias)
        p1 = self.prediction_trunk[0]
        out = F.linear(torch.relu(F.linear(next_latent, p1.weight, p1.bias)),
                       self.prediction_head.weight, self.prediction_head.bias)
        policy_logits, value_logits = out[:, : self.num_actions], out[:, self.num_actions :]
        reward, value = self.decode_reward_and_value(reward_logits, value_logits)
        return next_latent, reward, policy_logits, value

    def predict(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.prediction_head(self.prediction_trunk(latent))
        return out[..., : self.num_actions], out[..., self.num_actions :]

    def fused_search_weights(self) -> tuple[list[torch.Tensor], float, float] | None:
        """What the C++ fused search needs to run this model, or ``None`` when it cannot.

        The fused search (``mlp_search`` in ``torchrl_muzero/csrc/tree_ops.cpp``)
        runs every simulation of a CPU search in one C++ call with its own loops
        for :meth:`recurrent_inference_scalar`'s arithmetic; it only knows one
        hidden layer per network (``num_layers == 1``) in float32 on the CPU.
        A subclass that overrides the search step is not this model any more,
        so it gets ``None`` and the search calls it per simulation.

        Returns ``(tensors, reward_epsilon, value_epsilon)`` with ``tensors``
        in the kernel's order: dynamics (W1 ``[H, L + A]``, b1, W2, b2), reward
        head (W1, b1, W2, b2), prediction trunk (W, b), joint policy+value head
        (W, b), reward bins, value bins.
        """
        cls = type(self)
        if (
            cls.recurrent_inference_scalar is not MuZeroMLPModel.recurrent_inference_scalar
            or self.action_dim is not None  # the kernel looks actions up as one-hot columns
        ):
            return None
        return self._kernel_weights()

    def fused_continuous_weights(self) -> tuple[list[torch.Tensor], float, float] | None:
        """:meth:`fused_search_weights` for a model of continuous actions (``action_dim`` set), else ``None``.

        The same tensors; the dynamics' first weight is ``[H, L + D]`` (the
        ``D`` action inputs after the latent). The sampled search's fused kernel
        (``SampledModel.fused_kernel_spec``, ``csrc/sampled_search.cpp``) runs
        this step (:meth:`dynamics` on the concatenated input, :meth:`predict`,
        the decodes) along its candidates' float actions; a subclass that
        overrides any of them gets ``None``.

        Examples:
            >>> from torchrl_muzero.modules import MuZeroMLPModel
            >>> box = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1)
            >>> box.fused_search_weights() is None, len(box.fused_continuous_weights()[0])
            (True, 14)
        """
        cls = type(self)
        if self.action_dim is None or any(
            getattr(cls, name) is not getattr(owner, name)
            for owner, name in (
                (MuZeroModel, "search_step"), (MuZeroMLPModel, "recurrent_inference_scalar"),
                (MuZeroMLPModel, "dynamics"), (MuZeroMLPModel, "encode_action"), (MuZeroMLPModel, "predict"),
            )
        ):
            return None
        return self._kernel_weights()

    def _kernel_weights(self) -> tuple[list[torch.Tensor], float, float] | None:
        # the checks and tensors both fused entries share: one hidden layer, the decodes, float32 CPU
        if (
            type(self).decode_reward_and_value is not MuZeroModel.decode_reward_and_value
            or len(self.dynamics_net) != 3
            or len(self.reward_head) != 3
        ):
            return None
        first, _, last = self.dynamics_net
        r1, _, r2 = self.reward_head
        p1 = self.prediction_trunk[0]
        tensors = [
            first.weight, first.bias, last.weight, last.bias,
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
        """The fused MuZero search (kernel entry ``"mlp"``) on :meth:`fused_search_weights`, or ``None``.

        The node state is the flat float32 latent tree ``[B, N, latent_dim]``.
        Built on :meth:`fused_search_weights`, so setting that to ``lambda: None``
        on an instance keeps the search out of the fused kernel.

        Examples:
            >>> from torchrl_muzero.modules import MuZeroMLPModel
            >>> MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8).fused_kernel_spec().kernel
            'mlp'
            >>> MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8, num_layers=2).fused_kernel_spec() is None
            True
        """
        fused = self.fused_search_weights()
        if fused is None:
            return None
        tensors, reward_eps, value_eps = fused
        return FusedSpec("mlp", tensors, floats=(reward_eps, value_eps), node_state=_LATENT_STATE)
