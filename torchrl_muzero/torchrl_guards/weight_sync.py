"""Weight-sync guards for torchrl 0.14.1's ``MultiProcessWeightSyncScheme`` (PR 4701, bugs 1-5).

See the package docstring (:mod:`torchrl_muzero.torchrl_guards`) for
each bug; the regression tests and the canary (``test_naive_live_tensors_tear``)
are in ``test/test_torchrl_guards.py``.
"""
from __future__ import annotations

import queue as queue_lib
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.weight_update import MultiProcessWeightSyncScheme

from torchrl_muzero.torchrl_guards.locked_policy import (
    LockedPolicy,
    _copy_into,
    find_locked_policy,
)

__all__ = ["GuardedWeightSyncScheme", "WeightPublishError", "snapshot_weights"]

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

    # ------------------------------------------------------------------ exit
    def __del__(self) -> None:
        # Bug 8: torchrl's ``__del__`` calls ``shutdown()``, which puts "stop" on every worker's
        # instruction queue. During interpreter shutdown that ``put`` starts the queue's feeder
        # thread, the new thread never runs, and the process hangs in ``Thread.start`` forever.
        # The owner calls ``shutdown()`` while the interpreter is alive; at exit there is nothing
        # left to tell (the workers were shut down with the collector).
        if sys.is_finalizing():
            return
        super().__del__()

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
