"""``AsyncEnvPool`` guards for torchrl 0.14.1 (bugs 6a-6d of the package docstring; 6a-6c fixed upstream by PR 4701).

torchrl's :class:`~torchrl.envs.AsyncEnvPool` steps each env in its own
thread or process and, with ``exchange="shm"``, moves observations through
shared-memory slots instead of pickling them. On 0.14.1 four bugs keep it
from being used under a collector:

* **6a, env_index.** ``step``, ``_step`` and ``step_and_maybe_reset`` write
  ``"env_index"`` into their input as ``torch.arange``, while ``reset`` and
  the registered ``NonTensor`` spec use a ``NonTensorStack``. A ``Collector``
  keeps that input as its carrier and stacks it into a rollout buffer built
  from the spec, so ``Collector(AsyncEnvPool(...))`` fails on its first batch
  (``AttributeError: 'Tensor' object has no attribute 'batch_size'``) with
  every backend. Guard: :class:`EnvIndexGuard`.
* **6b, shm exchange.** ``write_input`` raises ``KeyError`` on every input
  entry outside the child schema (``"step_count"`` / ``"episode_reward"`` of
  outer transforms, ``("collector", "traj_ids")`` of a collector); the worker
  publishes the output of the private ``_step`` (reward, next observation,
  done flags) into the *root* of its result slot, which has no reward entry,
  so ``TransformedEnv(pool)`` cannot step; and a partial reset (the
  ``"_reset"`` mask an outer ``TransformedEnv`` sends when some envs are
  done) reaches no child: the pool resets *every* env, and an ALE/gym child
  refuses the mask (``Partial resets are not handled at this level``).
  Guards: :class:`ShmExchangeGuard` (extra keys stay in the parent and are
  merged back into the public results; ``_step`` goes through the worker's
  public ``step``, whose result slot has a ``"next"`` entry with the reward)
  and :class:`PartialResetGuard` (only the masked envs are reset).
* **6c, shutdown spin.** ``ProcessorAsyncEnvPool._drain_result_queues``
  treats every ``OSError`` from ``get_nowait`` as "item consumed, keep
  draining", but a queue whose pipe is closed raises it on every call: the
  loop never ends (seen when the garbage collector finalizes a pool's queues
  before its ``__del__`` runs). Guard: :class:`ShutdownGuard`.
* **6d, is_closed.** The pool never sets ``is_closed = False``: it reads
  closed while its workers run, so ``Collector.shutdown`` (and any
  ``if not env.is_closed: env.close()``) skips it and its worker processes
  outlive the collector (the interpreter's exit then waits for them).
  Guard: :class:`ClosedStateGuard`.

:class:`GuardedAsyncEnvPool` is torchrl's pool with every guard, for both
backends. The canary that says when a guard can go,
:func:`~torchrl_muzero.torchrl_guards.env_pool_canary.asyncenvpool_bugs`,
lives in ``env_pool_canary.py``.
Regression tests: ``test/test_torchrl_guards_env_pools.py``.
"""
from __future__ import annotations

import queue as queue_lib
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDictBase
from tensordict.utils import expand_as_right
from torchrl.envs import AsyncEnvPool
from torchrl.envs.async_envs import ProcessorAsyncEnvPool, ThreadingAsyncEnvPool, _AsyncEnvMeta

__all__ = [
    "ASYNCENVPOOL_BUGS",
    "ClosedStateGuard",
    "EnvIndexGuard",
    "GuardedAsyncEnvPool",
    "PartialResetGuard",
    "ShmExchangeGuard",
    "ShutdownGuard",
    "child_seeds",
]

#: The probed bugs, by the name :func:`asyncenvpool_bugs` reports them under.
ASYNCENVPOOL_BUGS = (
    "env_index",  # 6a
    "shm_outer_keys",  # 6b: extra input keys
    "shm_private_step_reward",  # 6b: rewards of the private _step
    "partial_reset",  # 6b: "_reset" masks (any exchange)
    "shutdown_closed_queue",  # 6c
    "is_closed",  # 6d
)


def _index_stack(indices: list[int], like: TensorDictBase) -> NonTensorStack:
    """``"env_index"`` as the pool's spec declares it: a NonTensorStack shaped like ``like``."""
    stack = NonTensorStack(*indices)
    while stack.batch_dims < like.batch_dims:
        stack = expand_as_right(stack, like)
    return stack


# --------------------------------------------------------------------------- #
# 6a: env_index written as a tensor
# --------------------------------------------------------------------------- #
# Remove when: asyncenvpool_bugs()["env_index"] is True (torchrl writes
# env_index as a NonTensorStack in step, _step and step_and_maybe_reset).
class EnvIndexGuard:
    """Write ``"env_index"`` as a ``NonTensorStack`` on every step (torchrl PR 4701, bug 6a).

    torchrl 0.14.1 writes it as ``torch.arange`` into the caller's
    tensordict, which a ``Collector`` then stacks into a buffer laid out from
    the pool's ``NonTensor`` spec: the first batch crashes. A mixin for
    torchrl's ``AsyncEnvPool`` subclasses (see :class:`GuardedAsyncEnvPool`).

    Examples:
        >>> issubclass(GuardedAsyncEnvPool.Threading, EnvIndexGuard)
        True
    """

    def _mark_env_index(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict.set(self._env_idx_key, _index_stack(list(range(tensordict.shape[0])), tensordict))
        return tensordict

    def _require_idle(self, in_flight: int) -> None:
        if in_flight > 0:
            raise RuntimeError("Some envs are still processing a step.")

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._require_idle(self._current_step)
        self.async_step_send(self._mark_env_index(tensordict))
        return self.async_step_recv(min_get=self.num_envs)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._require_idle(self._current_step)
        self._async_private_step_send(self._mark_env_index(tensordict))
        out = self._async_private_step_recv(min_get=self.num_envs)
        out.pop(self._env_idx_key)  # a private _step output never carries its input's keys
        return out

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        self._require_idle(self._current_step_reset)
        self.async_step_and_maybe_reset_send(self._mark_env_index(tensordict))
        return self.async_step_and_maybe_reset_recv(min_get=self.num_envs)


# --------------------------------------------------------------------------- #
# 6b: partial resets
# --------------------------------------------------------------------------- #
# Remove when: asyncenvpool_bugs()["partial_reset"] is True (a pool under
# a TransformedEnv resets only the envs its "_reset" mask names).
class PartialResetGuard:
    """Reset only the envs an outer ``"_reset"`` mask names (torchrl PR 4701, bug 6b, "partial-reset masks").

    When some envs of a ``TransformedEnv(pool)`` are done, torchrl asks the
    pool's private ``_reset`` for a partial reset with a ``"_reset"`` mask.
    torchrl 0.14.1's pool sends the reset to *every* env (the shm exchange
    has no slot for the mask; with the queue exchange an ALE/gym child raises
    on it), so envs in the middle of an episode would restart. The guard
    resets the masked envs only and fills the other rows from the input
    (torchrl keeps the input's values there anyway).

    Examples:
        >>> issubclass(GuardedAsyncEnvPool.Processes, PartialResetGuard)
        True
    """

    def _pool_reset_mask(self, tensordict: TensorDictBase | None) -> torch.Tensor | None:
        if tensordict is None:
            return None
        masks = [tensordict.get(key, None) for key in self.reset_keys]
        masks = [m for m in masks if m is not None]
        if not masks:
            return None
        n = tensordict.shape[0]
        mask = torch.zeros(n, dtype=torch.bool, device=masks[0].device)
        for m in masks:
            mask |= m.reshape(n, -1).any(-1)
        return mask.cpu()

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = self._pool_reset_mask(tensordict)
        if tensordict is not None and mask is not None:
            # children always get a full reset: none of them handles the mask
            tensordict = tensordict.exclude(*self.reset_keys)
        if mask is None or bool(mask.all()):
            return super()._reset(tensordict, **kwargs)
        idx = mask.nonzero().squeeze(-1).tolist()
        if not idx:  # nothing to reset: the input already holds every env's state
            return tensordict.exclude(self._env_idx_key).clone()
        if self._current_step > 0 or self._current_reset > 0:
            raise RuntimeError("Some envs are still processing a step.")
        sub = tensordict[torch.tensor(idx)].exclude(self._env_idx_key)
        sub.set(self._env_idx_key, _index_stack(idx, sub))
        self._async_private_reset_send(sub)
        fresh = self._async_private_reset_recv(min_get=len(idx))  # sorted by env index
        fresh.pop(self._env_idx_key, None)
        # one fresh row repeated as a placeholder, then the real rows in place
        out = fresh[:1].expand(tensordict.shape[0], *fresh.shape[1:]).clone()
        out[torch.tensor(idx)] = fresh
        keep = ~mask
        for key in fresh.keys(True, True):
            old = tensordict.get(key, None)
            if isinstance(old, torch.Tensor) and old.shape == out.get(key).shape:
                out.get(key)[keep] = old[keep].to(out.get(key).dtype)
        out.set(self._env_idx_key, _index_stack(list(range(out.shape[0])), out))
        return out


# --------------------------------------------------------------------------- #
# 6b: the shared-memory exchange
# --------------------------------------------------------------------------- #
# Remove when: asyncenvpool_bugs()["shm_outer_keys"] and
# asyncenvpool_bugs()["shm_private_step_reward"] are True.
class ShmExchangeGuard:
    """Keep the shm exchange to the child schema and route ``_step`` through a slot with rewards (PR 4701, bug 6b).

    With ``exchange="shm"``, torchrl 0.14.1 raises ``KeyError`` on any input
    key outside the children's schema (outer transforms' ``"step_count"``,
    ``"episode_reward"``, a collector's ``("collector", "traj_ids")``), and its
    workers publish the private ``_step`` output into the root of the result
    slot, which has no ``"reward"``. The guard sends only the schema's keys,
    merges the others back into the results of the public ``step``,
    ``step_and_maybe_reset`` and ``reset`` (what the queue exchange and
    ``SerialEnv`` return; the private ``_step`` / ``_reset`` drop them, as
    their outputs never carry their inputs), and runs ``_step`` as the
    worker's public ``step``, returning its ``"next"`` entry. A no-op with the
    queue exchange.

    Examples:
        >>> issubclass(GuardedAsyncEnvPool.Processes, ShmExchangeGuard)
        True
    """

    def _schema_keys(self) -> set | None:
        exchange = getattr(self, "_slot_exchange", None)
        return None if exchange is None else exchange._input_keys

    def _extra_keys(self, tensordict: TensorDictBase | None) -> TensorDictBase | None:
        schema = self._schema_keys()
        if schema is None or tensordict is None:
            return None
        skip = {self._env_idx_key, *self.reset_keys}
        keys = [
            key
            for key in tensordict.keys(True, True)
            if key not in schema and key not in skip and not (isinstance(key, tuple) and key[0] == "next")
        ]
        return tensordict.select(*keys) if keys else None

    def _prepare_worker_data(self, env_index: int, tensordict: TensorDictBase, *, record_action: bool):
        schema = self._schema_keys()
        if schema is not None:
            tensordict = tensordict.select(*[k for k in tensordict.keys(True, True) if k in schema])
        return super()._prepare_worker_data(env_index, tensordict, record_action=record_action)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        extras = self._extra_keys(tensordict)
        out = super().step(tensordict)
        return out if extras is None else out.update(extras)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        extras = self._extra_keys(tensordict)
        out, out_next = super().step_and_maybe_reset(tensordict)
        if extras is not None:
            out.update(extras)
            out_next.update(extras.clone())  # step_mdp keeps the other root keys too
        return out, out_next

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        extras = self._extra_keys(tensordict)
        out = super().reset(tensordict, **kwargs)
        return out if extras is None else out.update(extras)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._schema_keys() is None:
            return super()._step(tensordict)
        # the worker's "step" publishes into the whole slot, whose "next" entry
        # holds exactly the private _step's schema (reward included)
        return self.step(tensordict).get("next")


# --------------------------------------------------------------------------- #
# 6c: shutdown spins on a closed result queue
# --------------------------------------------------------------------------- #
# Remove when: asyncenvpool_bugs()["shutdown_closed_queue"] is True.
def _still_readable(result_queue: Any) -> bool:
    reader = getattr(result_queue, "_reader", None)
    if reader is None or getattr(reader, "closed", False):
        return False
    try:
        reader.poll(0)
    except (OSError, ValueError, EOFError):
        return False
    return True


class ShutdownGuard:
    """Stop draining a result queue whose pipe is closed (torchrl PR 4701, bug 6c).

    ``ProcessorAsyncEnvPool.shutdown`` drains the result queues so workers can
    exit; torchrl 0.14.1 retries after every ``OSError``, and a closed queue
    raises one on every call, so shutdown (and ``__del__``) never returns.
    After a failed ``get`` the guard checks that the queue can still be polled
    and moves on to the next queue if it cannot.

    Examples:
        >>> issubclass(GuardedAsyncEnvPool.Processes, ShutdownGuard)
        True
    """

    def _drain_result_queues(self) -> None:
        queues = [getattr(self, name, None) for name in ("step_queue", "reset_queue", "step_reset_queue")]
        for name in ("_per_env_step_queues", "_per_env_reset_queues", "_per_env_step_reset_queues"):
            queues.extend(getattr(self, name, None) or ())
        for result_queue in queues:
            if result_queue is None:
                continue
            while True:
                try:
                    result_queue.get_nowait()
                except queue_lib.Empty:
                    break
                except ValueError:  # Queue.close() was called: nothing more to read
                    break
                except (EOFError, OSError):
                    # an item whose tensors cannot be rebuilt was consumed: keep
                    # draining, unless the pipe itself is gone
                    if not _still_readable(result_queue):
                        break


# --------------------------------------------------------------------------- #
# 6d: is_closed stays True while the workers run
# --------------------------------------------------------------------------- #
# Remove when: asyncenvpool_bugs()["is_closed"] is True.
class ClosedStateGuard:
    """Say ``is_closed = False`` from the workers' start to their shutdown (torchrl 0.14.1, bug 6d).

    torchrl's pool keeps ``EnvBase``'s initial ``is_closed = True``, so
    ``Collector.shutdown`` (which closes only an env that is not closed)
    leaves the workers running.

    Examples:
        >>> import functools
        >>> from torchrl.envs import GymEnv
        >>> pool = GuardedAsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")], backend="threading")
        >>> pool.is_closed
        False
        >>> pool.close(); pool.is_closed
        True
    """

    def _setup(self):
        out = super()._setup()
        self.is_closed = False
        return out

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self.is_closed = True


# --------------------------------------------------------------------------- #
# The guarded pool
# --------------------------------------------------------------------------- #
class _GuardedAsyncEnvMeta(_AsyncEnvMeta):
    # torchrl's metaclass picks the backend's subclass only for AsyncEnvPool
    # itself; do the same for the guarded pool.
    def __call__(cls, *args, **kwargs):
        if cls is GuardedAsyncEnvPool:
            backend = kwargs.get("backend", "threading")
            target = {"threading": cls.Threading, "multiprocessing": cls.Processes}.get(backend)
            if target is None:
                raise ValueError(
                    f"GuardedAsyncEnvPool: backend must be 'threading' or 'multiprocessing', got {backend!r}."
                )
            return target(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class GuardedAsyncEnvPool(AsyncEnvPool, metaclass=_GuardedAsyncEnvMeta):
    """torchrl's ``AsyncEnvPool`` with its torchrl 0.14.1 bugs guarded (bugs 6a-6d).

    Takes ``AsyncEnvPool``'s arguments and returns
    ``GuardedAsyncEnvPool.Threading`` (``backend="threading"``:
    :class:`EnvIndexGuard`, :class:`PartialResetGuard`,
    :class:`ClosedStateGuard`) or ``GuardedAsyncEnvPool.Processes``
    (``backend="multiprocessing"``: those plus :class:`ShmExchangeGuard` and
    :class:`ShutdownGuard`), both
    subclasses of torchrl's own pool classes. Works under torchrl's
    ``Collector`` and inside a ``TransformedEnv`` with either exchange.

    Examples:
        >>> from functools import partial
        >>> from torchrl.collectors import Collector
        >>> from torchrl.envs import GymEnv, RewardSum, TransformedEnv
        >>> env = TransformedEnv(GuardedAsyncEnvPool([partial(GymEnv, "CartPole-v1")] * 2), RewardSum())
        >>> collector = Collector(env, policy=None, frames_per_batch=8, total_frames=8)
        >>> batch = next(iter(collector))
        >>> batch.shape, ("next", "reward") in batch.keys(True), "episode_reward" in batch.keys()
        (torch.Size([2, 4]), True, True)
        >>> collector.shutdown()  # closes the env too
    """

    Threading: type
    Processes: type


# Module-level names that match the class names: the multiprocessing backend
# pickles its worker target (a classmethod) by reference to the class.
class GuardedThreadingAsyncEnvPool(
    ClosedStateGuard, PartialResetGuard, EnvIndexGuard, GuardedAsyncEnvPool, ThreadingAsyncEnvPool
):
    """``GuardedAsyncEnvPool(..., backend="threading")``: torchrl's threading pool with 6a, 6b (reset masks), 6d guarded."""

    def _set_seed(self, seed: int | None) -> None:
        # torchrl 0.14.1's pools do not seed (NotImplementedError); the
        # threads' envs are local, so chain the seeds the way SerialEnv does
        for env in self.envs:
            seed = env.set_seed(seed)


class GuardedProcessorAsyncEnvPool(
    ClosedStateGuard, ShutdownGuard, ShmExchangeGuard, PartialResetGuard, EnvIndexGuard, GuardedAsyncEnvPool,
    ProcessorAsyncEnvPool,
):
    """``GuardedAsyncEnvPool(..., backend="multiprocessing")``: torchrl's process pool with bugs 6a-6d guarded.

    Its envs live in worker processes that torchrl gives no seeding message:
    seed them in their factories (as ``make_atari_env(..., pool="async",
    seed=...)`` does); :meth:`set_seed` raises.
    """

    def _set_seed(self, seed: int | None) -> None:
        raise NotImplementedError(
            "GuardedAsyncEnvPool(backend='multiprocessing') cannot seed envs that already run in worker "
            "processes; seed them in their factories (see child_seeds)."
        )


GuardedAsyncEnvPool.Threading = GuardedThreadingAsyncEnvPool
GuardedAsyncEnvPool.Processes = GuardedProcessorAsyncEnvPool


def child_seeds(seed: int | None, num_envs: int) -> list[int | None]:
    """The seeds ``SerialEnv(num_envs, ...).set_seed(seed)`` gives its envs (each env's ``set_seed`` returns the next).

    Seeding a pool's factories with these makes it reproduce a ``SerialEnv``
    of the same factories seeded with ``seed``.

    Examples:
        >>> child_seeds(None, 2)
        [None, None]
        >>> seeds = child_seeds(0, 3); seeds[0], len(set(seeds))
        (0, 3)
    """
    from torchrl._utils import seed_generator

    seeds: list[int | None] = []
    for _ in range(num_envs):
        seeds.append(seed)
        if seed is not None:
            seed = seed_generator(seed)
    return seeds


# --------------------------------------------------------------------------- #
# Canaries: has torchrl's own fix landed?
# --------------------------------------------------------------------------- #
