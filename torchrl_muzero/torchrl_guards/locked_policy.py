"""Worker-side policy lock for torchrl 0.14.1's weight sync (PR 4701, bugs 2 and 5 of the package docstring).

:class:`LockedPolicy` runs a collector worker's policy under the lock that
:class:`~torchrl_muzero.torchrl_guards.weight_sync.GuardedWeightSyncScheme`
holds while it copies published weights in, and writes the version of the
weights that produced each action. Regression tests:
``test/test_torchrl_guards.py`` (``test_guarded_publish_never_tears_a_forward``).
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn

__all__ = ["LockedPolicy", "find_locked_policy"]


def _copy_into(dest: TensorDictBase, src: TensorDictBase) -> None:
    """``dest <- src`` leaf by leaf in one fused call (same keys assumed)."""
    keys = list(dest.keys(True, True))
    with torch.no_grad():
        torch._foreach_copy_([dest.get(k) for k in keys], [src.get(k).detach() for k in keys])


def _key_mismatch(dest: TensorDictBase, weights: TensorDictBase) -> str | None:
    dest_keys = {k: v.shape for k, v in dest.items(True, True)}
    src_keys = {k: v.shape for k, v in weights.items(True, True)}
    missing = sorted(map(str, set(dest_keys) - set(src_keys)))
    unexpected = sorted(map(str, set(src_keys) - set(dest_keys)))
    shapes = sorted(
        f"{k}: policy {tuple(dest_keys[k])} vs weights {tuple(src_keys[k])}"
        for k in set(dest_keys) & set(src_keys)
        if dest_keys[k] != src_keys[k]
    )
    if not (missing or unexpected or shapes):
        return None
    parts = []
    if missing:
        parts.append(f"missing from the weights: {missing[:8]}")
    if unexpected:
        parts.append(f"not in the policy: {unexpected[:8]}")
    if shapes:
        parts.append(f"shape mismatch: {shapes[:8]}")
    return "; ".join(parts)



# --------------------------------------------------------------------------- #
# Worker-side policy lock (bugs 2 and 5)
# --------------------------------------------------------------------------- #
# Bug (PR 4701: "every later update is copied into those parameters while
# holding the collector's weight-update lock"): 0.14.1 has no such lock; the
# receiver thread writes the weights while the collector thread runs the
# policy. Remove when: torchrl's receiver copies updates under a lock the
# collector's policy call also holds (check torchrl/weight_update/_mp.py) AND
# the version written by the PolicyVersion transform is the one that produced
# the action (then MultiProcessWeightSyncScheme + a bare policy suffice).
class LockedPolicy(TensorDictModuleBase):
    """Run a policy under the lock its weight updates take.

    Build it in the collector worker (``policy_factory``) around the real
    policy. :class:`GuardedWeightSyncScheme` copies published weights into
    ``weights_target`` while holding the same lock, so no forward ever mixes
    two weight versions. Each forward also writes, under the lock, the
    version of the weights it used to ``version_key`` (int64, the input's
    batch shape): that is the exact provenance of the action, which
    :class:`PolicyVersionMap` maps back to a ``train_iter``.

    Args:
        policy: the policy (a ``TensorDictModuleBase``, e.g. ``MCTSPolicy``).
        weights_module: the submodule of ``policy`` the published weights are
            for (e.g. ``mcts_policy.model`` when the trainer publishes its
            ``MuZeroModel``). Defaults to ``policy`` itself.
        version_key: where to write the version; ``None`` writes nothing.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.torchrl_guards import LockedPolicy, snapshot_weights
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> policy = LockedPolicy(MCTSPolicy(model, MCTSConfig(num_simulations=2)), weights_module=model)
        >>> policy.load_published_weights(snapshot_weights(MuZeroMLPModel((4,), 2, 8, 8)), version=3)
        >>> policy(TensorDict({"observation": torch.randn(5, 4)}, [5]))["policy_version"]
        tensor([3, 3, 3, 3, 3])
    """

    def __init__(
        self,
        policy: TensorDictModuleBase,
        weights_module: nn.Module | None = None,
        version_key: NestedKey | None = "policy_version",
    ) -> None:
        super().__init__()
        if not isinstance(policy, nn.Module):
            raise TypeError(f"LockedPolicy wraps an nn.Module policy, got {type(policy).__name__}.")
        self.policy = policy
        if weights_module is None or weights_module is policy:
            self._weights_path = ""
        else:
            paths = [name for name, mod in policy.named_modules() if mod is weights_module]
            if not paths:
                raise ValueError("weights_module must be a submodule of policy.")
            self._weights_path = paths[0]
        self.version_key = version_key
        self.in_keys = list(getattr(policy, "in_keys", []))
        out_keys = list(getattr(policy, "out_keys", []))
        if version_key is not None and version_key not in out_keys:
            out_keys.append(version_key)
        self.out_keys = out_keys
        self._lock = threading.RLock()
        self._version = 0

    @property
    def weights_target(self) -> nn.Module:
        """The module published weights are copied into."""
        return self.policy.get_submodule(self._weights_path) if self._weights_path else self.policy

    @property
    def weights_version(self) -> int:
        """Version of the weights the policy currently runs (0: initial weights)."""
        return self._version

    def load_published_weights(self, weights: TensorDictBase, version: int) -> None:
        """Copy ``weights`` into ``weights_target`` under the lock and set the version.

        Raises ``KeyError`` (naming the keys) if the weights do not match the
        target's parameters and buffers; the policy is left unchanged then.
        """
        with self._lock:
            dest = TensorDict.from_module(self.weights_target)
            problem = _key_mismatch(dest, weights)
            if problem is not None:
                raise KeyError(f"published weights do not match the worker policy: {problem}")
            _copy_into(dest.data, weights)
            self._version = int(version)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        with self._lock:
            out = self.policy(tensordict)
            if out is None:
                out = tensordict
            if self.version_key is not None:
                out.set(
                    self.version_key,
                    torch.full(out.batch_size, self._version, dtype=torch.int64, device=out.device),
                )
        return out

    def __getstate__(self):
        state = dict(super().__getstate__())  # a copy: never drop the live object's lock
        state.pop("_lock", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._lock = threading.RLock()


def find_locked_policy(policy: Any) -> LockedPolicy:
    """The one :class:`LockedPolicy` in ``policy`` (itself or a submodule, e.g. under a wrapper).

    Raises ``TypeError`` if there is none or more than one: the weight updates
    must take the lock of the policy call that uses the weights.
    """
    found = [m for m in policy.modules() if isinstance(m, LockedPolicy)] if isinstance(policy, nn.Module) else []
    if len(found) != 1:
        raise TypeError(
            "GuardedWeightSyncScheme: the worker policy must be, or contain exactly one, LockedPolicy "
            f"(build it in policy_factory); {type(policy).__name__} contains {len(found)}. Without the "
            "lock a weight update can land in the middle of a policy call."
        )
    return found[0]
