"""Workarounds for torchrl 0.14.1 collector and weight-sync bugs (fixed upstream by torchrl PR 4701).

This module is the ONE place that knows about those bugs. Every guard below
names the bug it works around and says how to tell that it can be removed.
The regression tests live in ``test/test_torchrl_guards.py``; the naive-use
control tests there (``test_naive_live_tensors_tear``) are the canaries: once
they stop showing the bug on the installed torchrl, the matching guard can go.

Bugs worked around (torchrl 0.14.1, ``MultiProcessWeightSyncScheme``):

1. *Workers read the trainer's live tensors.* The sender queues the trainer's
   own parameters; pickling them through a torch.multiprocessing queue moves
   their storage to shared memory *in place*, and the worker binds the received
   tensors as its parameters. Every optimizer step is then visible to the
   workers without ``update_policy_weights_()`` and a policy forward can read
   two weight versions at once ("torn forward").
   Guard: :func:`snapshot_weights` (private, detached CPU copies in one
   shared buffer) and :class:`GuardedWeightSyncScheme` (sends only such
   private copies, through a staging buffer it owns and reuses; the worker
   copies them into its *own* parameters).
2. *Updates land in the middle of a policy call.* Even with private copies the
   worker applies an update from a background thread while its collector runs
   the policy. Guard: :class:`LockedPolicy` runs the policy under a lock that
   :class:`GuardedWeightSyncScheme` holds while it copies the weights in.
3. *A worker that fails to apply weights hangs the trainer.* The receiver
   thread logs the error and never acknowledges; ``send()`` waits for the
   acknowledgment with no timeout. Guard: the receiver sends an error
   acknowledgment, the sender waits with a deadline, watches the worker
   processes and raises :class:`WeightPublishError` naming the worker.
4. *Weights that require grad hang the trainer.* A clone of parameters that
   require grad is a non-leaf tensor that cannot be pickled; the queue's feeder
   thread fails silently, nothing reaches the worker and ``send()`` waits
   forever. Guard: :func:`snapshot_weights` detaches, and the scheme validates
   what it queues in the caller's thread.
5. *Policy versions are per-worker counters, labelled one step late.* With
   ``track_policy_version=True`` each worker's ``PolicyVersion`` transform
   counts the updates it applied and writes the count at env-step time, so the
   first frame after an update is labelled with the previous version (and a
   bare ``ParallelEnv`` in a worker refuses ``track_policy_version``).
   Guard: the scheme sends its publish number with the weights, sets the
   transform to it, and :class:`LockedPolicy` writes the version of the weights
   that actually produced each action under the lock;
   :class:`PolicyVersionMap` maps versions back to the learner's ``train_iter``.
6. *AsyncEnvPool*: ``Collector(AsyncEnvPool(...))`` crashes on its first
   batch, the shm exchange rejects keys added by outer transforms, shutdown
   can spin forever. No workaround: use ``ParallelEnv`` until
   :func:`asyncenvpool_is_fixed` returns ``True``.

Not from PR 4701, same module because it is the same kind of workaround:

7. *torchrl changes the caller's torch thread count.* ``ParallelEnv`` drops
   it by its number of workers when it starts them (lazily, at first use),
   any batched env's ``close()`` sets it to ``min(count when torchrl was
   imported, current + workers)`` (so it can *lower* a count raised after the
   import: ``SerialEnv(...).close()`` in a process that imported torchrl with
   1 thread leaves 1), and the multi-process collectors set it at start and
   shutdown. Guard: :func:`reclaim_torch_threads`, called by the trainers
   after building envs and before training.

Usage (trainer side)::

    from torchrl.collectors import MultiSyncCollector
    from torchrl.envs import GymEnv
    from torchrl_muzero.trainers.torchrl_guards import (
        GuardedWeightSyncScheme, PolicyVersionMap, publish_weights)

    scheme = GuardedWeightSyncScheme(initial_weights=model)   # snapshot now
    versions = PolicyVersionMap(initial_train_iter=train_iter)
    collector = MultiSyncCollector(
        [make_env] * 2, policy_factory=make_locked_mcts_policy,  # LockedPolicy(MCTSPolicy(...), weights_module=...)
        frames_per_batch=256, total_frames=-1,
        weight_sync_schemes={"policy": scheme}, track_policy_version=True)
    try:
        for batch in collector:
            produced_by = versions.train_iters(batch["policy_version"])
            ...  # train
            publish_weights(collector, model, train_iter=train_iter,
                            version_map=versions, timeout_s=60.0)
    finally:
        collector.shutdown()
"""
from __future__ import annotations

import functools
import os
import queue as queue_lib
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.weight_update import MultiProcessWeightSyncScheme

__all__ = [
    "GuardedWeightSyncScheme",
    "LockedPolicy",
    "PolicyVersionMap",
    "WeightPublishError",
    "asyncenvpool_is_fixed",
    "find_locked_policy",
    "publish_weights",
    "reclaim_torch_threads",
    "snapshot_weights",
]

_ACK_OK = "ok"
_ACK_ERROR = "error"
_RECEIVE = "receive"


class WeightPublishError(RuntimeError):
    """Publishing weights to collector workers failed or timed out."""


# --------------------------------------------------------------------------- #
# Snapshots (bugs 1 and 4)
# --------------------------------------------------------------------------- #
# Bug (PR 4701, "Give MultiProcessWeightSyncScheme workers their own copy of
# the weights"): 0.14.1 queues the trainer's live parameters, so workers alias
# them. Bug (PR 4701, "Stop weight-sync failures from hanging"): a clone of
# parameters that require grad cannot be pickled; the queue feeder thread
# fails silently and the trainer waits forever.
# Remove when: test_naive_live_tensors_tear reports 0 torn forwards with a
# plain MultiProcessWeightSyncScheme and publishing a requires-grad clone
# through collector.update_policy_weights_ returns on the installed torchrl.
def _weights_td(source: Any) -> TensorDictBase:
    if isinstance(source, LockedPolicy):
        source = source.weights_target
    if isinstance(source, nn.Module):
        return TensorDict.from_module(source)
    if isinstance(source, TensorDictBase):
        return source
    if isinstance(source, Mapping):
        td = TensorDict(dict(source), batch_size=[])
        if any(isinstance(k, str) and "." in k for k in td.keys()):
            td = td.unflatten_keys(".")
        return td
    raise TypeError(
        "snapshot_weights expects an nn.Module, a TensorDict of weights or a state dict, "
        f"got {type(source).__name__}."
    )


def snapshot_weights(source: nn.Module | TensorDictBase | Mapping[str, torch.Tensor]) -> TensorDictBase:
    """Return a private, detached CPU copy of ``source``'s weights.

    The copy shares nothing with ``source`` (never the trainer's live tensors),
    requires no grad, and lives in a single contiguous shared-memory buffer so
    it crosses process boundaries in one piece. Take it between optimizer
    steps: it is a consistent picture of the weights only if nothing writes
    them while it is taken.

    Args:
        source: an ``nn.Module`` (parameters and buffers, as
            ``TensorDict.from_module``; a :class:`LockedPolicy` gives the
            weights of its ``weights_target``), a TensorDict of weights or a
            state dict.

    Returns:
        a locked TensorDict with the same keys as ``TensorDict.from_module(source)``.
    """
    td = _weights_td(source)
    leaves = list(td.values(True, True))
    bad = [k for k, v in td.items(True, True) if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"snapshot_weights: entries {bad} are not tensors.")
    if not leaves:
        raise ValueError("snapshot_weights: no weights to snapshot (empty module or TensorDict).")
    with torch.no_grad():
        snap = td.detach()
        if any(v.device.type != "cpu" for v in leaves):
            snap = snap.to("cpu")
        # consolidate copies every leaf into one fresh (shared) storage: the
        # result is private even when ``snap`` still aliases ``source``.
        snap = snap.consolidate(share_memory=True)
    return snap.lock_()


def _layout(td: TensorDictBase) -> dict:
    return {k: (v.shape, v.dtype) for k, v in td.items(True, True)}


def _copy_into(dest: TensorDictBase, src: TensorDictBase) -> None:
    """``dest <- src`` leaf by leaf in one fused call (same keys assumed)."""
    keys = list(dest.keys(True, True))
    with torch.no_grad():
        torch._foreach_copy_([dest.get(k) for k in keys], [src.get(k).detach() for k in keys])


def _validate_sendable(weights: TensorDictBase) -> None:
    # Done in the caller's thread: the queue's feeder thread swallows pickling
    # errors (bug 4), so anything that could fail there must fail here.
    for key, value in weights.items(True, True):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"weight {key!r} is a {type(value).__name__}, not a tensor.")
        if value.requires_grad:
            raise ValueError(f"weight {key!r} requires grad; publish a snapshot_weights() copy.")
        if value.device.type != "cpu":
            raise ValueError(f"weight {key!r} is on {value.device}; snapshots must be on CPU.")


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


# --------------------------------------------------------------------------- #
# The guarded scheme (bugs 1-5)
# --------------------------------------------------------------------------- #
def _mp_context():
    # Mirrors torchrl._utils._get_mp_ctx, which the collectors use: a queue made
    # in another context cannot be passed to their (spawned) workers.
    try:
        from torchrl._utils import _get_mp_ctx

        return _get_mp_ctx()
    except ImportError:  # pragma: no cover - private helper moved
        import torch.multiprocessing as mp

        return mp.get_context(mp.get_start_method(allow_none=True) or "spawn")


class GuardedWeightSyncScheme(MultiProcessWeightSyncScheme):
    """``MultiProcessWeightSyncScheme`` that cannot alias, tear or hang.

    Drop-in for ``weight_sync_schemes={"policy": ...}`` of torchrl's
    ``MultiSyncCollector`` / ``MultiAsyncCollector`` (one scheme per collector).

    * Sends only private copies (the initial sync included): each publish
      copies the weights into a shared-memory staging buffer the scheme owns
      (one contiguous block, detached, CPU) and reuses while every worker
      acknowledges; workers copy it into their own parameters.
    * Workers must run a :class:`LockedPolicy`, possibly under wrappers
      (built by ``policy_factory``): updates are copied in under its lock and
      set its version.
    * ``send()`` numbers each publish (1, 2, ...; the initial weights are 0),
      waits for every targeted worker at most ``timeout_s`` seconds, notices
      dead workers, and raises :class:`WeightPublishError` naming the worker
      that failed or did not answer. A worker that failed to apply an update
      keeps its previous weights and accepts later updates. With
      ``publish_weights(..., wait=False)`` it returns once the weights are
      queued and :meth:`wait_applied` does that wait later (the next publish
      does it first).
    * With ``track_policy_version=True`` each worker's ``PolicyVersion``
      transform is set to the publish number.

    Args:
        initial_weights: the weights workers start from (module, TensorDict or
            state dict; snapshotted now). Needed with ``policy_factory`` and no
            ``policy``: torchrl would otherwise send the weights of a fresh
            ``policy_factory()`` built in the trainer process. ``None``: the
            collector's ``policy`` is snapshotted at start-up.
        timeout_s: how long ``send()`` waits for the workers' acknowledgments.

    Examples:
        >>> from torchrl.collectors import MultiAsyncCollector  # doctest: +SKIP
        >>> scheme = GuardedWeightSyncScheme(initial_weights=model, timeout_s=30)  # doctest: +SKIP
        >>> collector = MultiAsyncCollector([make_env] * 2, policy_factory=make_locked_policy,
        ...                                 frames_per_batch=256, total_frames=-1,
        ...                                 weight_sync_schemes={"policy": scheme})  # doctest: +SKIP
        >>> publish_weights(collector, model, timeout_s=30)  # doctest: +SKIP
        1
    """

    def __init__(
        self,
        initial_weights: nn.Module | TensorDictBase | Mapping | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(strategy="tensordict", sync=True)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}.")
        self.timeout_s = float(timeout_s)
        self._initial_weights = snapshot_weights(initial_weights) if initial_weights is not None else None
        self._seq = 0  # last publish number handed out
        self._acked_version = 0  # last publish every targeted worker applied
        self._staging: TensorDictBase | None = None  # private shared-memory copy sent to workers
        self._last_received: TensorDictBase | None = None  # worker side, see _background_receive_loop
        self._pending: tuple[int, list[int]] | None = None  # (publish number, workers) not yet acknowledged

    # ------------------------------------------------------------------ state
    def __getstate__(self):
        state = super().__getstate__()
        state["_initial_weights"] = None  # sent through the init queue, not pickled with the scheme
        state["_staging"] = None
        state["_pending"] = None
        return state

    @property
    def version(self) -> int:
        """Publish number of the last update all targeted workers applied (0: initial)."""
        return self._acked_version

    @property
    def next_version(self) -> int:
        """Publish number the next ``send()`` will carry."""
        return self._seq + 1

    # ----------------------------------------------------------- sender side
    def init_on_sender(self, *args, ctx: Any = None, **kwargs):  # noqa: D102
        if ctx is None:
            ctx = _mp_context()
        return super().init_on_sender(*args, ctx=ctx, **kwargs)

    def _get_params_map(
        self,
        context: Any = None,
        model_id: str | None = None,
        weights: TensorDictBase | None = None,
        model: nn.Module | None = None,
        params_map: dict[int, TensorDictBase] | None = None,
        devices: list[torch.device] | None = None,
        device_map_fn: Callable | None = None,
        num_workers: int | None = None,
    ):
        if isinstance(model, LockedPolicy):
            model = model.weights_target
        if context is not None and weights is None and model is None and params_map is None:
            source = self._initial_weights
            if source is None:
                source = getattr(context, "policy", None)
                if source is None:
                    raise RuntimeError(
                        "GuardedWeightSyncScheme: the collector has no `policy` to take the initial "
                        "weights from; pass GuardedWeightSyncScheme(initial_weights=model)."
                    )
            devices = [torch.device("cpu") if d is None else torch.device(d) for d in context.policy_device]
            weights = _weights_td(source)
            context = None
            num_workers = None
        result = super()._get_params_map(
            context=context,
            model_id=model_id if context is not None else None,
            weights=weights,
            model=model,
            params_map=params_map,
            devices=devices,
            device_map_fn=device_map_fn,
            num_workers=num_workers,
        )
        # The parent maps live tensors (views of the trainer's parameters):
        # replace each distinct entry by a private copy (bug 1).
        copies: dict[int, TensorDictBase] = {}
        out = {}
        for idx, td in result.items():
            if id(td) not in copies:
                device = next(iter(td.values(True, True))).device
                snap = snapshot_weights(td)
                copies[id(td)] = snap if device.type == "cpu" else snap.to(device)
            out[idx] = copies[id(td)]
        return out

    def _setup_connection_and_weights_on_sender_impl(self, *, worker_idx=None, weights=None) -> None:
        super()._setup_connection_and_weights_on_sender_impl(worker_idx=worker_idx, weights=weights)
        self._initial_weights = None  # sent: do not hold a second copy for the collector's lifetime

    def send(self, weights: Any = None, worker_ids: int | list[int] | None = None) -> None:
        """Publish ``weights`` to the workers and wait (bounded) until they applied them."""
        if not self.initialized_on_sender:
            raise RuntimeError(
                "GuardedWeightSyncScheme.send: not initialized on the sender (start the collector first)."
            )
        if not self.synchronized_on_sender:
            raise RuntimeError(
                "GuardedWeightSyncScheme.send: initial weights not sent yet (start the collector first)."
            )
        if weights is None:
            # update_policy_weights_() without weights: the collector's policy, if it has one
            context = self.context
            weights = getattr(context, "policy", None) if context is not None else None
            if weights is None:
                raise ValueError(
                    "GuardedWeightSyncScheme: no weights to send (the collector was built with "
                    "policy_factory only); call publish_weights(collector, model) or "
                    "collector.update_policy_weights_(model)."
                )
        if isinstance(weights, dict) and weights and all(isinstance(k, int) for k in weights):
            raise NotImplementedError("GuardedWeightSyncScheme does not support per-worker weights.")
        timeout_s = getattr(self, "_call_timeout_s", None) or self.timeout_s

        if worker_ids is None:
            targets = sorted(self._instruction_queues)
        elif isinstance(worker_ids, int):
            targets = [worker_ids]
        else:
            targets = list(worker_ids)
        unknown = [w for w in targets if w not in self._instruction_queues]
        if unknown:
            raise ValueError(f"GuardedWeightSyncScheme.send: unknown worker(s) {unknown}.")

        wait = getattr(self, "_call_wait", None)
        # the staging buffer is reused: every worker must have applied the previous publish first
        self.wait_applied(timeout_s)
        staging = self._stage(weights)
        self._seq += 1
        seq = self._seq
        for w in targets:
            self.sender_transports[w].weight_queue.put(((self._model_id, (seq, staging)), "update_weights"))
        for w in targets:
            self._instruction_queues[w].put((_RECEIVE, seq))
        self._pending = (seq, targets)
        if wait is None or wait:
            self.wait_applied(timeout_s)

    def wait_applied(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) until every targeted worker applied the last publish; no-op if it did.

        ``send()`` waits by itself unless the publish was made with
        ``publish_weights(..., wait=False)``: then the caller overlaps the
        workers' copy (which waits for their current policy call to end) with
        its own work and calls this before it needs the guarantee, e.g.
        before the next optimizer step when it bounds the policy lag. Raises
        :class:`WeightPublishError` naming a worker that failed, died or did
        not answer within ``timeout_s``.
        """
        if self._pending is None:
            return
        seq, targets = self._pending
        self._pending = None
        try:
            self._wait_for_guarded_acks(seq, targets, timeout_s or self.timeout_s)
        except WeightPublishError:
            # a worker that has not answered may still read the staging buffer
            # later: never write that buffer again
            self._staging = None
            raise
        self._acked_version = seq

    @property
    def pending_version(self) -> int | None:
        """Publish number sent but not yet acknowledged by every worker (``None``: none)."""
        return None if self._pending is None else self._pending[0]

    def _stage(self, weights: Any) -> TensorDictBase:
        """Copy ``weights`` into the scheme's private staging buffer (bugs 1 and 4).

        The buffer is one shared-memory block owned by the scheme: never the
        trainer's tensors, never requiring grad. Workers read it only between
        ``send()`` queuing it and their acknowledgment, and ``send()`` writes
        it only after every worker acknowledged the previous publish, so it
        is reused instead of paying for a fresh shared-memory block (and its
        page faults, in the trainer and in every worker) on each publish.
        """
        src = _weights_td(weights)
        staging = self._staging
        if staging is None or _layout(staging) != _layout(src):
            staging = snapshot_weights(src)
        else:
            _copy_into(staging, src)
        _validate_sendable(staging)
        self._staging = staging
        return staging

    def _worker_process(self, worker_idx: int):
        context = self.context
        procs = getattr(context, "procs", None) if context is not None else None
        if procs and worker_idx < len(procs):
            return procs[worker_idx]
        return None

    def _wait_for_guarded_acks(self, seq: int, targets: Sequence[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(targets)
        errors: list[str] = []
        while pending:
            for w in list(pending):
                try:
                    ack = self._ack_queues[w].get(timeout=0.02)
                except queue_lib.Empty:
                    proc = self._worker_process(w)
                    if proc is not None and not proc.is_alive():
                        errors.append(
                            f"worker {w} died (exit code {proc.exitcode}) before applying weights version {seq}"
                        )
                        pending.remove(w)
                    continue
                if not isinstance(ack, tuple) or len(ack) < 2 or ack[1] != seq:
                    continue  # a late answer to an earlier, timed-out publish
                pending.remove(w)
                if ack[0] != _ACK_OK:
                    detail = ack[2] if len(ack) > 2 else "unknown error"
                    errors.append(f"worker {w} failed to apply weights version {seq}: {detail}")
            if pending and time.monotonic() > deadline:
                errors.append(
                    f"worker(s) {pending} did not acknowledge weights version {seq} within "
                    f"{timeout_s:.1f}s (timeout_s); the collector may be stuck, shut it down"
                )
                break
        if errors:
            raise WeightPublishError("Publishing policy weights failed: " + "; ".join(errors) + ".")

    # --------------------------------------------------------- receiver side
    def _target_policy(self) -> LockedPolicy:
        return find_locked_policy(self.model)

    def _apply_received(self, weights: TensorDictBase, version: int) -> None:
        self._target_policy().load_published_weights(weights, version)
        context = self.context
        tracker = getattr(context, "policy_version_tracker", None) if context is not None else None
        if tracker is not None and getattr(tracker, "version_type", None) in (int, "int"):
            tracker.version = int(version)

    def _setup_connection_and_weights_on_receiver_impl(self, *, worker_idx: int | None = None) -> None:
        if worker_idx is None:
            worker_idx = self.worker_idx
        if self._receiver_transport is None:
            raise RuntimeError("GuardedWeightSyncScheme: receiver transport not set.")
        weights = self._receiver_transport.setup_connection_and_weights_on_receiver(worker_idx=worker_idx)
        # copied into the worker's own parameters: the shared buffer is dropped
        self._apply_received(weights, 0)
        del weights
        self._start_background_receiver()

    def _next_instruction(self):
        q = self._receiver_instruction_queue
        while self._stop_event is not None and not self._stop_event.is_set():
            try:
                return q.get(timeout=0.1)
            except queue_lib.Empty:
                continue
            except (OSError, ValueError, EOFError):
                return "stop"  # queue closed: the collector is shutting down
        return "stop"

    def _receive_update(self, seq: int) -> TensorDictBase:
        deadline = time.monotonic() + max(self.timeout_s, 1.0)
        q = self._receiver_transport.weight_queue
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"weights version {seq} did not arrive")
            data_in, msg = q.get(timeout=remaining)
            if msg != "update_weights":
                continue
            _model_id, payload = data_in
            if isinstance(payload, tuple) and len(payload) == 2 and payload[0] == seq:
                return payload[1]
            # an older publish whose instruction was already answered: drop it

    def _background_receive_loop(self) -> None:
        while True:
            instruction = self._next_instruction()
            if instruction == "stop" or instruction is None:
                break
            if not (isinstance(instruction, tuple) and instruction[0] == _RECEIVE):
                continue
            seq = instruction[1]
            try:
                weights = self._receive_update(seq)
                # Keep a reference: while the trainer's staging buffer stays
                # mapped here, torch's storage cache reuses the mapping for the
                # next publish instead of mapping (and faulting in) it again.
                # The policy never reads it outside _apply_received.
                self._last_received = weights
                self._apply_received(weights, seq)
                ack = (_ACK_OK, seq)
            except Exception as err:  # reported to the trainer, which raises
                ack = (_ACK_ERROR, seq, f"{type(err).__name__}: {err}")
            try:
                self._receiver_ack_queue.put(ack)
            except (OSError, ValueError):
                break


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
    error: list[BaseException] = []

    def run():
        try:
            collector.update_policy_weights_(snap)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            error.append(err)

    thread = threading.Thread(target=run, name="publish_weights", daemon=True)
    thread.start()
    thread.join(timeout_s)
    collector._guards_publish_count = version
    if thread.is_alive():
        raise WeightPublishError(
            f"update_policy_weights_ did not return within {timeout_s:.1f}s with "
            f"{type(scheme).__name__} (torchrl does not say which worker); shut the collector down. "
            "Use GuardedWeightSyncScheme to get per-worker errors."
        )
    if error:
        raise WeightPublishError(f"update_policy_weights_ failed: {error[0]!r}") from error[0]
    return version


# --------------------------------------------------------------------------- #
# AsyncEnvPool probe (bug 6)
# --------------------------------------------------------------------------- #
# Bugs (PR 4701): Collector(AsyncEnvPool(...)) crashes on its first batch
# (env_index written as a tensor, stacked as a NonTensorStack); the shm
# exchange raises KeyError on keys added by outer transforms / the collector;
# ProcessorAsyncEnvPool shutdown can spin on a closed result queue.
# Remove (use AsyncEnvPool for Atari) when: asyncenvpool_is_fixed() is True.
def _asyncenvpool_probe() -> None:  # runs in a throw-away child process
    from functools import partial

    from torchrl.collectors import Collector
    from torchrl.envs import AsyncEnvPool, GymEnv, StepCounter, TransformedEnv

    make = partial(GymEnv, "CartPole-v1")
    cases = (
        # (backend, exchange, outer transform): first-batch crash, then shm keys
        ("threading", None, False),
        ("multiprocessing", None, False),
        ("multiprocessing", "shm", True),
    )
    for backend, exchange, transformed in cases:
        kwargs = {"backend": backend}
        if exchange is not None:
            kwargs["exchange"] = exchange
        env = AsyncEnvPool([make, make], **kwargs)
        if transformed:
            env = TransformedEnv(env, StepCounter())
        collector = Collector(env, policy=None, frames_per_batch=8, total_frames=16)
        try:
            frames = sum(batch.numel() for batch in collector)
        finally:
            collector.shutdown()
            env.close()
        if frames < 16:
            raise RuntimeError(f"AsyncEnvPool({backend}) collected {frames} of 16 frames")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


@functools.lru_cache(maxsize=None)
def asyncenvpool_is_fixed(timeout_s: float = 120.0) -> bool:
    """Whether ``Collector(AsyncEnvPool(...))`` works on the installed torchrl.

    Runs 16-frame CartPole collections through ``AsyncEnvPool`` (threading
    and multiprocessing backends, then the shm exchange under an outer
    ``StepCounter`` transform) in a separate process group, killed with all its
    children after ``timeout_s``. ``False`` on any failure or timeout. The
    result is cached per process.
    """
    code = "from torchrl_muzero.trainers.torchrl_guards import _asyncenvpool_probe; _asyncenvpool_probe()"
    env = dict(os.environ)
    env.setdefault("RL_WARNINGS", "False")
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    finally:
        # the group may still hold grandchildren (env workers) even after a clean exit
        _kill_group(proc)
    return proc.returncode == 0


# --------------------------------------------------------------------------- #
# torch thread count (7, not a PR 4701 bug)
# --------------------------------------------------------------------------- #
# Remove when: torchrl's batched envs and collectors leave the calling
# process's torch.get_num_threads() as they found it (check
# BatchedEnvBase.close and ParallelEnv._start_workers in torchrl/envs/batched_envs.py).
def reclaim_torch_threads(count: int) -> int:
    """Set this process's torch thread count back to ``count`` if torchrl changed it; return it.

    Examples:
        >>> import torch
        >>> before = torch.get_num_threads()
        >>> torch.set_num_threads(1)   # e.g. a batched env's close() did this
        >>> reclaim_torch_threads(before) == before == torch.get_num_threads()
        True
    """
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
