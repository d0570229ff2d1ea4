"""The asynchronous pipeline: collection and evaluation overlap learning.

Same training semantics as :class:`~torchrl_muzero.trainers.SyncTrainer`
(LightZero's async segment pipeline, see docs/architecture.md): the driver process owns
the buffer, the learner and every priority update; collector workers
(one ``MCTSPolicy`` each) and evaluators only receive immutable weight
snapshots and return data. Where they run (local processes, Ray actors) is
the trainer's :class:`~torchrl_muzero.trainers.worker_backend.WorkerBackend`
(``local_backend.py``, ``ray_backend.py``), picked from
``async_pipeline.backend`` by :func:`~torchrl_muzero.trainers.backends.make_backend`
unless one is given.

Event loop of the driver::

    take finished collections (blocking only when there is nothing to train)
      -> buffer.extend, one train budget (frames * replay_ratio) per batch
    train a chunk of at most max_train_chunk_steps updates
      -> each update on the cores the working actors leave free (cpu_budget.py)
      -> after each update, publish weights when train_iter advanced by
         weight_sync_interval, or when the next update would put the
         collectors past max_policy_lag (publish_due); the workers'
         acknowledgment is awaited just before the next optimizer step, so
         the wait overlaps that update's sampling and backward pass
    take evaluation results -> checkpoint of exactly the evaluated version
    hand the newest snapshot to an idle evaluator
"""
from __future__ import annotations

import math
import time
from collections import deque

import torch
from tensordict import TensorDictBase

from torchrl_muzero.trainers.backends import make_backend
from torchrl_muzero.trainers.base import TrainerBase
from torchrl_muzero.trainers.builders import temperature_at
from torchrl_muzero.trainers.cpu_budget import LearnerThreads
from torchrl_muzero.trainers.evaluator import WorkerDied
from torchrl_muzero.trainers.sync import episode_returns
from torchrl_muzero.torchrl_guards import PolicyVersionMap, reclaim_torch_threads
from torchrl_muzero.trainers.worker_backend import LEARNER_ITER, PACE_IDLE, TEMPERATURE, WorkerBackend

__all__ = ["AsyncTrainer", "publish_due"]


def publish_due(train_iter: int, published_iter: int, weight_sync_interval: int, max_policy_lag: int) -> bool:
    """Whether the driver publishes the learner's weights now (checked after every update).

    The seed's two knobs: ``weight_sync_interval`` is the train_iter gap at
    which a snapshot is published; ``max_policy_lag`` the lag collectors may
    have, and reaching it forces a publish before the gap reaches the
    interval, so that the next update does not put the collectors past it:
    ``0`` publishes whenever the learner moved (no lag tolerated), ``-1``
    turns the bound off (the interval alone decides), ``N`` keeps the
    collectors at most ``N`` updates behind. The data can still show a lag of
    1 with ``max_policy_lag=0``: frames searched while the publish of the
    update just made travels to the workers (collection never waits for the
    learner).

    Examples:
        >>> from torchrl_muzero.trainers.async_pipeline import publish_due
        >>> publish_due(5, 4, weight_sync_interval=10, max_policy_lag=0)
        True
        >>> publish_due(5, 4, weight_sync_interval=10, max_policy_lag=-1), publish_due(14, 4, 10, -1)
        (False, True)
        >>> publish_due(6, 4, 10, 3), publish_due(7, 4, 10, 3)
        (False, True)
    """
    gap = train_iter - published_iter
    if gap <= 0:
        return False
    return gap >= weight_sync_interval or 0 <= max_policy_lag <= gap


class AsyncTrainer(TrainerBase):
    """MuZero with collection and evaluation in their own processes.

    Knobs (``cfg.async_pipeline``, LightZero's names and meanings):
    ``num_collector_actors`` collector workers, ``num_evaluator_actors``
    evaluators with at most ``max_eval_inflight`` evaluations at once,
    ``max_train_chunk_steps`` updates between polls, ``weight_sync_interval``
    and ``max_policy_lag`` for publishing, ``max_train_budget_queue_size``
    for backpressure (inactive during the cold start), ``eval_at_start``,
    ``poll_interval_s`` and ``shutdown_timeout_s``. Policy lag per frame is
    logged; it is at most ``min(weight_sync_interval, max(max_policy_lag, 1))``
    (``weight_sync_interval`` with ``max_policy_lag=-1``): the update in
    flight while a publish travels is the 1 that even ``max_policy_lag=0``
    shows (see :func:`publish_due`).

    Where the actors run is the ``backend`` it is given, a
    :class:`~torchrl_muzero.trainers.worker_backend.WorkerBackend` that builds,
    feeds and stops the collectors and evaluators; ``None`` (the default) takes
    the one ``async_pipeline.backend`` names
    (:func:`~torchrl_muzero.trainers.backends.make_backend`): ``local``
    (:class:`~torchrl_muzero.trainers.local_backend.LocalBackend`: torchrl's
    ``MultiAsyncCollector``, or ``MultiSyncCollector`` with
    ``collector=multi_sync``: one batch of every worker at once) or ``ray``
    (:class:`~torchrl_muzero.trainers.ray_backend.RayBackend`: the same event
    loop with collectors and evaluators as Ray actors, docs/multi-node.md;
    ``collector=multi_sync`` there: rounds of one collect per actor).

    Examples:
        >>> from torchrl_muzero.trainers import AsyncTrainer
        >>> trainer = AsyncTrainer({"train": {"total_env_steps": 2048}})  # doctest: +SKIP
        >>> summary = trainer.run()  # doctest: +SKIP
    """

    def __init__(self, cfg=None, backend: WorkerBackend | None = None) -> None:
        super().__init__(cfg)
        if backend is None:  # the run's config (a resumed run's saved one included) names it
            backend = make_backend(self.cfg)
        #: where the collectors and evaluators run (worker_backend.py); one backend per trainer
        self.backend = backend

    def acting_device(self) -> torch.device:
        """The collectors' device (``async_pipeline.collector_num_gpus``), not the learner's."""
        return torch.device("cuda" if self.cfg.async_pipeline.collector_num_gpus > 0 else "cpu")

    def _loop(self) -> None:
        self._init_driver_state()
        self.stop_signals.check()  # a stop that came before any worker exists starts none
        try:
            self.backend.start(self)
        except Exception as err:
            if self.stop_signals.received is None:
                raise
            # a SIGTERM to the whole job (systemd, Slurm, `kill -TERM -<pgid>`) also ends the workers still
            # starting, which torchrl reports as a failed start: the run ends as the signal asks, not on a traceback
            first = (str(err).split(". ")[0].splitlines() or [type(err).__name__])[0]  # torchrl's run to a page
            raise WorkerDied(f"the workers did not start: {first}") from err
        self._run_event_loop()

    def _init_driver_state(self) -> None:
        """What the event loop keeps, whichever backend runs the actors."""
        self.versions = PolicyVersionMap(initial_train_iter=self.learner.train_iter)
        self.published_iter = self.learner.train_iter
        self.lag_max = 0
        self.lag_sum = 0.0
        self.lag_frames = 0
        self.learner_busy_s = 0.0
        self._pending_eval: dict[int, dict] = {}  # version -> the exact weights sent to an evaluator
        self._evaluated: set[int] = set()  # versions already sent to an evaluator
        self.threads = LearnerThreads(cores=reclaim_torch_threads(self.torch_threads),
                                      fixed=self.cfg.async_pipeline.learner_num_threads)
        self.thread_steps = self.thread_updates = 0  # learner threads summed over updates, and the updates

    # -- the driver's event loop -------------------------------------------------
    def _run_event_loop(self) -> None:
        cfg, ap = self.cfg, self.cfg.async_pipeline
        queue_cap = ap.max_train_budget_queue_size or 2 * ap.num_collector_actors
        budgets: deque[float] = deque()  # one budget per collected batch, consumed in order
        last_eval_submitted = -1
        if ap.eval_at_start:
            self._submit_eval()
            last_eval_submitted = self.learner.train_iter
        while not self.should_stop():
            cold = not self.train_budget_ready()
            # 1. collected data. Block only when there is nothing to train; during the cold
            #    start the budget queue does not throttle collection.
            while True:
                have_budget = sum(budgets) >= 1
                if have_budget and (not self.backend.batch_ready() or (not cold and len(budgets) >= queue_cap)):
                    break
                # nothing to train on while it waits: the collect gate (collect_pacing.py) holds no worker back
                self.backend.control[PACE_IDLE] = float(not have_budget)
                with self.stop_signals.interruptible():  # only waiting: a stop need not wait for a batch
                    batch = self.backend.next_batch()
                self._take_batch(batch, budgets)
                self.backend.control[PACE_IDLE] = 0.0
                cold = not self.train_budget_ready()
                if self.should_stop():
                    break
            if self.stop_reason is not None:
                break
            # 2. a chunk of training
            self._train(min(ap.max_train_chunk_steps, self._owed_updates(budgets)), budgets)
            # 3. evaluations
            if self.backend.evaluators is not None:
                for result in self.backend.evaluators.poll():
                    self._record_eval(result)
                if self.learner.train_iter - max(last_eval_submitted, 0) >= cfg.eval.interval and self._submit_eval():
                    last_eval_submitted = self.learner.train_iter
            self.metrics.progress(self.env_steps, self.learner.train_iter, lag=self._mean_lag())
        if self.env_steps >= cfg.train.total_env_steps:
            # as in sync, every collected batch gets its updates: train the budget still queued
            self._train(self._owed_updates(budgets), budgets)
        # final evaluation of the last weights, waited for (bounded)
        evaluators = self.backend.evaluators
        if evaluators is not None and self.learner.train_iter and "stop_return" not in (self.stop_reason or ""):
            self._final_eval()

    def _train(self, steps: int, budgets: deque) -> None:
        t0 = time.monotonic()
        for _ in range(steps):
            self.thread_steps += self.threads.update(self.backend.busy_actor_cpus())
            self.thread_updates += 1
            self.after_train_step(self.learner.step(before_optimizer_step=self._await_publish_interruptibly))
            self.backend.control[LEARNER_ITER] = self.learner.train_iter
            self._spend(budgets, 1.0)
            self._publish_if_due()
            self.stop_signals.check()  # a safe point: the update, its bookkeeping and its publish are done
        self.learner_busy_s += time.monotonic() - t0

    def _await_publish_interruptibly(self) -> None:
        # the gradients are computed, the weights and the optimizer untouched: a stop may land here
        with self.stop_signals.interruptible():
            self.backend.await_publish()

    @staticmethod
    def _owed_updates(budgets: deque) -> int:
        """Whole updates the queued budgets pay for (float sums of frames * replay_ratio)."""
        return int(math.floor(sum(budgets) + 1e-9))

    @staticmethod
    def _spend(budgets: deque, amount: float) -> None:
        while amount > 0 and budgets:
            take = min(amount, budgets[0])
            budgets[0] -= take
            amount -= take
            if budgets[0] <= 1e-9:
                budgets.popleft()

    def _take_batch(self, batch: TensorDictBase, budgets: deque) -> None:
        batch = batch.clone() if batch.is_shared() else batch
        versions = batch.get("policy_version")
        train_iters = self.versions.train_iters(versions)
        batch.set("policy_version", train_iters)
        lag = batch.get("learner_iter") - train_iters
        self.lag_max = max(self.lag_max, int(lag.max()))
        self.lag_sum += float(lag.float().sum())
        self.lag_frames += lag.numel()
        self.buffer.extend(batch.exclude("learner_iter"))
        self.note_collected(train_iters)
        frames = batch.numel()
        self.env_steps += frames
        returns = episode_returns(batch)
        self.episodes += len(returns)
        values = {"collect/policy_lag_max": self.lag_max, "collect/policy_lag_mean": self._mean_lag(),
                  "buffer/size": len(self.buffer)}
        if returns:
            values["collect/episode_return"] = sum(returns) / len(returns)
        self.metrics.log(self.env_steps, values)
        if self.train_budget_ready():
            budgets.append(frames * self.cfg.train.replay_ratio)
        progress = self.env_steps / max(self.cfg.train.total_env_steps, 1)
        self.backend.control[TEMPERATURE] = temperature_at(self.cfg, progress)

    def _mean_lag(self) -> float:
        return self.lag_sum / max(self.lag_frames, 1)

    def _publish_if_due(self) -> None:
        ap = self.cfg.async_pipeline
        if publish_due(self.learner.train_iter, self.published_iter, ap.weight_sync_interval, ap.max_policy_lag):
            self.backend.publish()
            self.published_iter = self.learner.train_iter

    def _submit_eval(self) -> bool:
        version = self.learner.train_iter
        evaluators = self.backend.evaluators
        if evaluators is None or not evaluators.can_submit() or version in self._evaluated:
            return False  # each version is scored once: its checkpoint holds exactly that score
        self._evaluated.add(version)
        weights = self.model_snapshot()
        self._pending_eval[version] = weights  # the exact weights, saved when their score arrives
        evaluators.submit(version, weights)
        return True

    def _record_eval(self, result) -> None:
        weights = self._pending_eval.pop(result.version)
        self.metrics.log_eval(self.env_steps, self.learner.train_iter, result.version, result.mean_return)
        self.metrics.log(self.env_steps, result.stats)  # board games: win / draw / loss rates per opponent
        self.save_evaluated(result.version, weights, result.mean_return)

    def evaluation_lost(self, version: int) -> None:
        """A backend lost the evaluation of ``version`` (its evaluator was replaced): drop the weights kept
        for its score; the version may be submitted again (the final evaluation resubmits the last one)."""
        self._pending_eval.pop(version, None)
        self._evaluated.discard(version)

    def _final_eval(self) -> None:
        deadline = time.monotonic() + self.cfg.async_pipeline.shutdown_timeout_s * 4
        while self.backend.evaluators.inflight and time.monotonic() < deadline:
            self._wait_for_evaluations()
        if self._submit_eval():
            while self.backend.evaluators.inflight and time.monotonic() < deadline:
                self._wait_for_evaluations()

    def _wait_for_evaluations(self) -> None:
        for result in self.backend.evaluators.poll():
            self._record_eval(result)
        with self.stop_signals.interruptible():  # Ctrl-C during the final evaluation: stop, checkpoint
            time.sleep(self.cfg.async_pipeline.poll_interval_s)

    def _counters(self) -> dict:
        counters = super()._counters()
        counters.update(policy_lag_max=getattr(self, "lag_max", 0), policy_lag_mean=self._mean_lag()
                        if hasattr(self, "lag_frames") else 0.0,
                        learner_busy_fraction=getattr(self, "learner_busy_s", 0.0) / max(self.metrics.wall(), 1e-6),
                        learner_threads_mean=getattr(self, "thread_steps", 0) / max(getattr(self, "thread_updates", 0), 1))
        if getattr(self, "backend", None) is not None:
            counters.update(self.backend.counters())
        return counters

    def _shutdown(self) -> None:
        # the backend stops its workers, each within a bound: a stuck one is reported, the checkpoint still written
        self.backend.shutdown()
        if getattr(self, "threads", None) is not None:
            self.threads.restore()
