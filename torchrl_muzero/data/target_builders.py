"""Target builders: what a variant adds to the MuZero targets of a sampled batch.

The MuZero variants share one replay store (:class:`~torchrl_muzero.data.GameBuffer`)
and differ in what their losses read. :meth:`GameBuffer.sample
<torchrl_muzero.data.GameBuffer.sample>` always builds the MuZero targets
(:data:`MUZERO_SAMPLE_KEYS`); each :class:`TargetBuilder` given as
``GameBuffer(..., target_builders=[...])`` then adds its own entries to that
batch, in order, in place. A builder declares the keys it adds
(:attr:`TargetBuilder.out_keys`) so the buffer can refuse two builders
writing the same key and list every key a sample holds
(:attr:`GameBuffer.sample_keys <torchrl_muzero.data.GameBuffer.sample_keys>`)
before anything is sampled.

A builder sees the batch (``[B, K+1]``, targets on the CPU; it is moved to the
buffer's ``device`` afterwards) and a :class:`TargetContext`: the few
quantities of the sampled windows that are not in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from tensordict import TensorDict

from torchrl_muzero.data.targets import ValueTargetPlan

__all__ = ["MUZERO_SAMPLE_KEYS", "TargetBuilder", "TargetContext", "ValuePrefixTargets", "check_target_builders"]

#: the entries of every sample (see :meth:`GameBuffer.sample <torchrl_muzero.data.GameBuffer.sample>`)
MUZERO_SAMPLE_KEYS: tuple[str, ...] = (
    "observation",
    "observation_mask",
    "action",
    "target_reward",
    "target_value",
    "target_policy",
    "mask",
    "policy_mask",
    "weight",
    "index",
    "stamp",
    "policy_version",
)


@dataclass(frozen=True)
class TargetContext:
    """What a :class:`TargetBuilder` may need beyond the batch itself.

    Attributes:
        num_unroll_steps: ``K``.
        td_steps: ``n`` (the buffer's, before any off-policy correction).
        discount: ``gamma``.
        two_player: rewards are the mover's and values alternate perspective.
        rewards: ``[B, K + n + 1]`` the stored reward of the transition
            leaving each position of the sampled window (0 where no step is
            stored: after a terminal, past a truncation or the newest step).
        plan: the :class:`~torchrl_muzero.data.ValueTargetPlan` of the value
            targets (with the off-policy correction's shorter horizons when
            it is on). ``plan.inside | plan.absorbing`` is the batch's
            ``"mask"``; the batch's ``"policy_mask"`` marks stored steps.
        entries: ``[B, K+1]`` the buffer's declared replay entries
            (``extra_entries``, :mod:`~torchrl_muzero.data.replay_entries`)
            at the sampled positions, as the batch holds them (after a
            ``reanalyze_entries`` hook); ``None`` when none are declared.
            To read, not to change.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import TargetContext, plan_value_targets
        >>> exists = torch.ones(1, 4, dtype=torch.bool)
        >>> plan = plan_value_targets(exists, torch.zeros_like(exists), num_unroll_steps=1, td_steps=2)
        >>> ctx = TargetContext(1, 2, 0.997, False, torch.ones(1, 4), plan)
        >>> ctx.rewards.shape
        torch.Size([1, 4])
        >>> ctx.entries is None  # no declared replay entries
        True
    """

    num_unroll_steps: int
    td_steps: int
    discount: float
    two_player: bool
    rewards: torch.Tensor
    plan: ValueTargetPlan
    entries: TensorDict | None = None


class TargetBuilder:
    """Adds entries to a sampled batch; subclasses set :attr:`out_keys` and :meth:`build`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.data import TargetBuilder
        >>> class ReturnToGo(TargetBuilder):
        ...     '''Undiscounted sum of the unrolled rewards still to come.'''
        ...     out_keys = ("reward_to_go",)
        ...     def build(self, batch, context):
        ...         r = batch["target_reward"]
        ...         batch["reward_to_go"] = r.flip(1).cumsum(1).flip(1) - r
        >>> batch = TensorDict({"target_reward": torch.tensor([[0.0, 1.0, 2.0]])}, [1, 3])
        >>> ReturnToGo().build(batch, None)
        >>> batch["reward_to_go"].tolist()
        [[3.0, 2.0, 0.0]]
    """

    #: the batch entries :meth:`build` adds (each ``[B, K+1, ...]``)
    out_keys: tuple[str, ...] = ()

    def build(self, batch: TensorDict, context: TargetContext) -> None:
        """Add :attr:`out_keys` to ``batch`` (``[B, K+1]``) in place."""
        raise NotImplementedError(f"{type(self).__name__} must implement build(batch, context).")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(out_keys={tuple(self.out_keys)})"


class ValuePrefixTargets(TargetBuilder):
    """EfficientZero's value-prefix targets ``"target_value_prefix"`` ``[B, K+1]``.

    EfficientZero's dynamics predicts, with an LSTM over the unroll, the sum
    of the rewards since the LSTM's hidden state was last reset instead of
    each reward; the hidden state is reset every ``lstm_horizon_len`` (``H``)
    unroll steps. The target at position ``k >= 1`` is

    ``prefix_k = sum_{j=s(k)}^{k} target_reward[:, j]``, ``s(k) = floor((k - 1) / H) * H + 1``,

    so the sums restart at positions ``1, H + 1, 2H + 1, ...``; position 0
    (the root, no reward predicted) is 0. As in LightZero the prefix is
    *undiscounted* (the horizon is short and the discount close to 1), and
    the search recovers each step's reward by subtracting consecutive
    prefixes (``r_k = prefix_k - prefix_{k-1}``, or ``prefix_k`` right after
    a reset). The prefix is defined where the batch's ``"mask"`` is True;
    after a terminal the rewards are 0 so it stays flat (LightZero also holds
    the last prefix past the end of the stored data, where ``"mask"`` is
    False and the loss ignores it).

    Args:
        lstm_horizon_len (int): ``H``, the LSTM reset period in unroll steps.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.data import ValuePrefixTargets
        >>> K = 5
        >>> batch = TensorDict({"target_reward": torch.tensor([[0.0] + [1.0] * K])}, [1, K + 1])
        >>> ValuePrefixTargets(lstm_horizon_len=2).build(batch, None)
        >>> batch["target_value_prefix"].tolist()
        [[0.0, 1.0, 2.0, 1.0, 2.0, 1.0]]
    """

    out_keys = ("target_value_prefix",)

    def __init__(self, lstm_horizon_len: int) -> None:
        if not isinstance(lstm_horizon_len, int) or isinstance(lstm_horizon_len, bool) or lstm_horizon_len < 1:
            raise ValueError(f"lstm_horizon_len must be an integer >= 1, got {lstm_horizon_len!r}.")
        self.lstm_horizon_len = lstm_horizon_len

    def prefix_matrix(self, num_positions: int) -> torch.Tensor:
        """``M`` ``[K+1, K+1]`` with ``prefix = target_reward @ M.T``: ``M[k, j] = 1`` for ``s(k) <= j <= k``."""
        k = torch.arange(num_positions)
        start = (k - 1).div(self.lstm_horizon_len, rounding_mode="floor") * self.lstm_horizon_len + 1
        j = k.unsqueeze(0)
        m = (j >= start.unsqueeze(1)) & (j <= k.unsqueeze(1))
        m[0] = False  # the root has no reward to predict
        return m

    def build(self, batch: TensorDict, context: TargetContext | None) -> None:
        """Add ``"target_value_prefix"`` from the batch's ``"target_reward"``."""
        reward = batch["target_reward"]
        m = self.prefix_matrix(reward.shape[-1]).to(device=reward.device, dtype=reward.dtype)
        batch["target_value_prefix"] = reward @ m.T

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lstm_horizon_len={self.lstm_horizon_len})"


def check_target_builders(builders: Iterable[TargetBuilder] | None) -> list[TargetBuilder]:
    """The builders as a list; ``ValueError`` if two write the same key or one a MuZero key."""
    builders = [] if builders is None else list(builders)
    seen: dict[str, str] = {key: "the MuZero targets" for key in MUZERO_SAMPLE_KEYS}
    for builder in builders:
        if not isinstance(builder, TargetBuilder):
            raise TypeError(f"target_builders must be TargetBuilder instances, got {type(builder).__name__}.")
        keys: Sequence[str] = tuple(builder.out_keys)
        if not keys:
            raise ValueError(f"{builder!r} declares no out_keys.")
        for key in keys:
            if key in seen:
                raise ValueError(f"{builder!r} writes {key!r}, which {seen[key]} already write.")
            seen[key] = repr(builder)
    return builders
