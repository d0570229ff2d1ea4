"""Collector-side weight publishing and version mapping (PR 4701, bugs 1, 3-5).

:func:`publish_weights` is how a trainer hands weights to torchrl's
multi-process collectors without hitting the 0.14.1 bugs (private copies,
a bounded wait); :class:`PolicyVersionMap` maps the versions collected frames
carry back to learner ``train_iter``.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from tensordict import TensorDictBase
from torch import nn

from torchrl_muzero.bounded_call import call_within
from torchrl_muzero.torchrl_guards.weight_sync import (
    GuardedWeightSyncScheme,
    WeightPublishError,
    _weights_td,
    snapshot_weights,
)

__all__ = ["PolicyVersionMap", "publish_weights"]


# --------------------------------------------------------------------------- #
# Publishing and version mapping
# --------------------------------------------------------------------------- #
class PolicyVersionMap:
    """Map the policy versions carried by collected frames to learner ``train_iter``.

    Version ``0`` is the initial weights; each publish records
    ``{version: train_iter}`` (:func:`publish_weights` does it when given the
    map). Works with :class:`GuardedWeightSyncScheme` (versions are publish
    numbers, identical on every worker) and with a plain torchrl scheme
    (versions are each worker's count of applied updates, equal to the
    publish number as long as no publish failed).

    Args:
        initial_train_iter: the ``train_iter`` of the weights workers start with.

    Examples:
        >>> import torch
        >>> versions = PolicyVersionMap(initial_train_iter=0)
        >>> versions.record(1, train_iter=10)
        >>> versions.record(2, train_iter=25)
        >>> versions.train_iters(torch.tensor([0, 2, 1, 2]))
        tensor([ 0, 25, 10, 25])
    """

    def __init__(self, initial_train_iter: int = 0) -> None:
        self._map: dict[int, int] = {0: int(initial_train_iter)}
        self.latest_version = 0

    def record(self, version: int, train_iter: int) -> None:
        """Record that publish ``version`` carried the weights of ``train_iter``."""
        version, train_iter = int(version), int(train_iter)
        if version <= self.latest_version:
            raise ValueError(f"versions must increase: got {version} after {self.latest_version}.")
        if train_iter < self._map[self.latest_version]:
            raise ValueError(
                f"train_iter must not decrease: got {train_iter} after {self._map[self.latest_version]}."
            )
        self._map[version] = train_iter
        self.latest_version = version

    @property
    def latest_train_iter(self) -> int:
        """``train_iter`` of the latest published weights."""
        return self._map[self.latest_version]

    def train_iter(self, version: int) -> int:
        """``train_iter`` of the weights published as ``version``."""
        try:
            return self._map[int(version)]
        except KeyError:
            raise KeyError(
                f"policy version {int(version)} was never published (known: 0..{self.latest_version})."
            ) from None

    def train_iters(self, versions: torch.Tensor) -> torch.Tensor:
        """Element-wise :meth:`train_iter` of a tensor of versions (e.g. ``batch["policy_version"]``)."""
        versions = torch.as_tensor(versions)
        uniq, inverse = torch.unique(versions.long(), return_inverse=True)
        table = torch.tensor([self.train_iter(v) for v in uniq.tolist()], dtype=torch.int64)
        return table[inverse].to(versions.device)


def _policy_scheme(collector) -> Any:
    schemes = getattr(collector, "_weight_sync_schemes", None) or {}
    scheme = schemes.get("policy")
    if scheme is None:
        raise RuntimeError(
            f"{type(collector).__name__} has no weight sync scheme for 'policy'; build it with "
            "weight_sync_schemes={'policy': GuardedWeightSyncScheme(...)}."
        )
    return scheme


def publish_weights(
    collector,
    weights: nn.Module | TensorDictBase | Mapping,
    timeout_s: float = 60.0,
    *,
    train_iter: int | None = None,
    version_map: PolicyVersionMap | None = None,
    wait: bool = True,
) -> int:
    """Publish a private copy of ``weights`` to a multi-process collector's workers.

    Calls ``collector.update_policy_weights_()`` so that only a detached,
    private CPU copy of the weights is sent (never the trainer's live tensors
    or tensors that require grad), and waits at most ``timeout_s`` seconds.
    Call it between optimizer steps: the copy is taken during the call.

    With a :class:`GuardedWeightSyncScheme` the copy goes into the scheme's
    reused staging buffer, the wait is bounded inside the scheme and a failure
    names the worker. With any other scheme a :func:`snapshot_weights` copy is
    sent from a helper thread; if the call has not returned after
    ``timeout_s`` a :class:`WeightPublishError` is raised and the collector
    should be shut down (torchrl 0.14.1 cannot tell which worker is stuck).

    Args:
        collector: a ``MultiSyncCollector`` / ``MultiAsyncCollector``.
        weights: the trainer's model (or its weights).
        timeout_s: bound on the wait for the workers.
        train_iter / version_map: when both are given, the publish number is
            recorded in ``version_map`` as produced by ``train_iter`` (before
            sending, so frames from a worker that applied it before another
            worker failed still map).
        wait: ``False`` returns once the weights are queued (a
            :class:`GuardedWeightSyncScheme` only); the scheme's
            ``wait_applied()`` then waits for the workers. A later publish
            waits for the earlier one first.

    Returns:
        the policy version the workers now run.
    """
    if (train_iter is None) != (version_map is None):
        raise ValueError("pass train_iter and version_map together (or neither).")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}.")
    scheme = _policy_scheme(collector)
    if isinstance(scheme, GuardedWeightSyncScheme):
        source = _weights_td(weights)  # copied into the staging buffer by scheme.send
        version = scheme.next_version
        if version_map is not None:
            version_map.record(version, train_iter)
        scheme._call_timeout_s, scheme._call_wait = float(timeout_s), bool(wait)
        try:
            collector.update_policy_weights_(source)
        finally:
            scheme._call_timeout_s = scheme._call_wait = None
        return version
    if not wait:
        raise ValueError(f"publish_weights(wait=False) needs a GuardedWeightSyncScheme, not {type(scheme).__name__}.")

    snap = snapshot_weights(weights)

    # Plain torchrl scheme: bound the (possibly endless, bugs 3 and 4) wait.
    version = getattr(collector, "_guards_publish_count", 0) + 1
    if version_map is not None:
        version_map.record(version, train_iter)
    try:
        stuck = call_within(lambda: collector.update_policy_weights_(snap), timeout_s, "update_policy_weights_")
    except BaseException as err:  # noqa: BLE001 - the publish failed: one error type for the caller
        collector._guards_publish_count = version
        raise WeightPublishError(f"update_policy_weights_ failed: {err!r}") from err
    collector._guards_publish_count = version
    if stuck:
        raise WeightPublishError(
            f"update_policy_weights_ did not return within {timeout_s:.1f}s with "
            f"{type(scheme).__name__} (torchrl does not say which worker); shut the collector down. "
            "Use GuardedWeightSyncScheme to get per-worker errors.\n" + stuck.split("\n", 1)[-1]
        )
    return version
