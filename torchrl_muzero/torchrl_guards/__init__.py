"""Workarounds for torchrl 0.14.1 collector, weight-sync and env-pool bugs (fixed upstream by torchrl PR 4701).

This package is the ONE place that knows about those bugs, one module per
guarded torchrl component:

=========================  ==========================================================
``weight_sync``            ``MultiProcessWeightSyncScheme``: :class:`GuardedWeightSyncScheme`,
                           :func:`snapshot_weights` (bugs 1-5)
``locked_policy``          the worker side of the weight sync: :class:`LockedPolicy` (bugs 2, 5)
``collectors``             publishing to torchrl's multi-process collectors:
                           :func:`publish_weights`, :class:`PolicyVersionMap` (bugs 1, 3-5)
``env_pools``              ``AsyncEnvPool``: :class:`GuardedAsyncEnvPool` (bugs 6a-6d)
``threads``                torch thread counts: :func:`reclaim_torch_threads` (7)
=========================  ==========================================================

Every guard names the bug it works around and says how to tell that it can
be removed. The regression tests live in ``test/test_torchrl_guards.py``
(weight sync) and ``test/test_torchrl_guards_env_pools.py`` (AsyncEnvPool);
the naive-use control tests there (``test_naive_live_tensors_tear``, the
``test_canary_*`` tests) are the canaries: once they stop showing the bug on
the installed torchrl, the matching guard can go.

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
6. *AsyncEnvPool* (``env_pools``): (a) ``Collector(AsyncEnvPool(...))``
   crashes on its first batch (``env_index`` written as a tensor); (b) the
   shm exchange rejects keys added by outer transforms and drops the rewards
   of the private ``_step``; (c) shutdown spins forever on a closed result
   queue; (d) not from PR 4701: ``is_closed`` reads ``True`` while its workers run, so
   ``Collector.shutdown`` leaves them running. Guard: :class:`GuardedAsyncEnvPool` (one mixin per bug);
   :func:`asyncenvpool_bugs` / :func:`asyncenvpool_is_fixed` tell when
   torchrl's own fix has landed.

Not from PR 4701, same module because it is the same kind of workaround:

7. *torchrl changes the caller's torch thread count.* ``ParallelEnv`` drops
   it by its number of workers when it starts them (lazily, at first use),
   any batched env's ``close()`` sets it to ``min(count when torchrl was
   imported, current + workers)`` (so it can *lower* a count raised after the
   import: ``SerialEnv(...).close()`` in a process that imported torchrl with
   1 thread leaves 1), and the multi-process collectors set it at start and
   shutdown. Guard: :func:`reclaim_torch_threads`, called by the trainers
   after building envs and before training.
8. *A scheme left to the interpreter's exit hangs the process.* Its
   ``__del__`` calls ``shutdown()``, whose ``put("stop")`` on the workers'
   instruction queues starts a feeder thread while the interpreter is
   finalizing; the thread never starts and ``Thread.start`` waits forever
   (the script printed its last line and never exits). Guard:
   :class:`GuardedWeightSyncScheme` skips that ``__del__`` at exit, and the
   async trainer shuts its scheme down explicitly after the collector.
   Canary: ``test_canary_scheme_left_to_exit_hangs_the_process``.

Usage (trainer side)::

    from torchrl.collectors import MultiSyncCollector
    from torchrl.envs import GymEnv
    from torchrl_muzero.torchrl_guards import (
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

from torchrl_muzero.torchrl_guards.collectors import PolicyVersionMap, publish_weights
from torchrl_muzero.torchrl_guards.env_pool_canary import asyncenvpool_bugs, asyncenvpool_is_fixed
from torchrl_muzero.torchrl_guards.env_pools import GuardedAsyncEnvPool, child_seeds
from torchrl_muzero.torchrl_guards.locked_policy import LockedPolicy, find_locked_policy
from torchrl_muzero.torchrl_guards.threads import reclaim_torch_threads
from torchrl_muzero.torchrl_guards.weight_sync import (
    GuardedWeightSyncScheme,
    WeightPublishError,
    snapshot_weights,
)

__all__ = [
    "GuardedAsyncEnvPool",
    "GuardedWeightSyncScheme",
    "LockedPolicy",
    "PolicyVersionMap",
    "WeightPublishError",
    "asyncenvpool_bugs",
    "asyncenvpool_is_fixed",
    "child_seeds",
    "find_locked_policy",
    "publish_weights",
    "reclaim_torch_threads",
    "snapshot_weights",
]
