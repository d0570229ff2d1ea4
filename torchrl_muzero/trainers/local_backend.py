"""The local backend (``async_pipeline.backend=local``): collectors and evaluators as processes of this machine.

:class:`LocalBackend` runs torchrl's ``MultiAsyncCollector`` (or ``MultiSyncCollector`` with
``async_pipeline.collector=multi_sync``: one batch of every worker at once), one ``MCTSPolicy``
per worker process behind a :class:`LockedPolicy`, weights through a
:class:`GuardedWeightSyncScheme`, and the :class:`EvaluatorPool` processes. The driver's live
values (learner iter, temperature, the collect gate's) reach the workers through a
:class:`~torchrl_muzero.trainers.shared_control.SharedControl` file mapping.
"""
from __future__ import annotations

import contextlib
import functools
import time

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

from torchrl_muzero.trainers.base import TrainerBase
from torchrl_muzero.trainers.builders import actor_generator, build_model, build_policy, temperature_at
from torchrl_muzero.trainers.collect_pacing import PacedPolicy
from torchrl_muzero.trainers.config import config_to_dict, load_config
from torchrl_muzero.trainers.cpu_budget import yield_to_learner
from torchrl_muzero.trainers.evaluator import EvaluatorPool, WorkerDied
from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit
from torchrl_muzero.trainers.ready_collector import ReadyStepCollector, steps_ready_games
from torchrl_muzero.trainers.shared_control import SharedControl
from torchrl_muzero.trainers.stop_signals import children_deaf_to_ctrl_c
from torchrl_muzero.torchrl_guards import (
    GuardedWeightSyncScheme,
    LockedPolicy,
    WeightPublishError,
    publish_weights,
)
from torchrl_muzero.trainers.worker_backend import (
    CONTROL_SIZE,
    LEARNER_ITER,
    PACE_IDLE,
    PACE_OFFSET,
    PACE_RELEASE,
    TEMPERATURE,
    WorkerBackend,
)
from torchrl_muzero.trainers.worker_env import action_spec_of, make_worker_env

__all__ = ["LocalBackend", "make_worker_policy"]

#: seconds past async_pipeline.shutdown_timeout_s the driver waits for one component's shutdown before it
#: reports it stuck and goes on to the final checkpoint (torchrl bounds its collector's joins at 10 s)
_SHUTDOWN_GRACE_S = 15.0


class _ControlledPolicy(TensorDictModuleBase):
    """Worker-side wrapper: reads the driver's live counters from shared memory.

    It sits *inside* the :class:`LockedPolicy`, so it runs under the lock that
    weight updates take: the ``"learner_iter"`` it writes (the learner's
    ``train_iter`` once the search is done) and the version the lock holder
    writes belong to the same instant, and ``learner_iter - version`` is the
    exact policy lag of the frame. It also follows the driver's temperature
    schedule.
    """

    def __init__(self, policy, control: SharedControl) -> None:
        super().__init__()
        self.policy = policy
        self.control = control
        self.in_keys = list(policy.in_keys)
        self.out_keys = [*policy.out_keys, "learner_iter"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.policy.config.temperature = float(self.control[TEMPERATURE])
        out = self.policy(tensordict)
        out.set("learner_iter", torch.full(out.batch_size, int(self.control[LEARNER_ITER]), dtype=torch.int64))
        return out


def make_worker_policy(cfg_dict: dict, observation_shape, action_space, action_spec, control: SharedControl,
                        device: str, seed: int):
    """Runs in each collector worker (``policy_factory``): a fresh model the scheme fills with weights.

    ``seed`` (the worker's env seed) seeds the search's generator: the spawned worker's
    global generator would start from a different seed at every launch.
    """
    cfg = load_config(cfg_dict)
    yield_to_learner(cfg.async_pipeline.actor_niceness)
    freeze_heap_at_exit()  # the worker ends several times sooner at the shutdown (quick_exit.py)
    torch.set_num_threads(max(1, cfg.async_pipeline.collector_num_cpus))
    model = build_model(cfg, observation_shape, action_space).to(device).eval()
    policy = build_policy(cfg, model, action_spec, generator=actor_generator(seed, device))
    locked = LockedPolicy(_ControlledPolicy(policy, control), weights_module=model)
    ap = cfg.async_pipeline
    if ap.collect_ahead_frames < 0:
        return locked
    # outside the lock: a worker waiting under it would block the publish the learner waits for
    return PacedPolicy(locked, control, learner_iter_index=LEARNER_ITER, offset_index=PACE_OFFSET,
                       release_index=PACE_RELEASE, idle_index=PACE_IDLE, num_workers=ap.num_collector_actors,
                       ahead=ap.collect_ahead_frames, replay_ratio=cfg.train.replay_ratio,
                       warmup=cfg.train.train_start_after_envsteps)


@contextlib.contextmanager
def _publish_failures_are_worker_faults():
    """A publish that failed or timed out stops the run, naming the worker (WorkerDied)."""
    try:
        yield
    except WeightPublishError as err:
        raise WorkerDied(f"weight publishing to the collector workers failed: {err}") from err



class LocalBackend(WorkerBackend):
    """Collectors and evaluators as local processes (``async_pipeline.backend=local``, the default).

    :meth:`start` builds torchrl's multi-process collector (``async_pipeline.collector``:
    ``multi_async`` or ``multi_sync``; ``env.pool=async``: each worker a
    :class:`ReadyStepCollector`) and, with ``num_evaluator_actors > 0``, the evaluator
    processes; the workers start deaf to a terminal's Ctrl-C (the driver stops them).

    Examples:
        >>> from torchrl_muzero.trainers import AsyncTrainer
        >>> trainer = AsyncTrainer({"train": {"total_env_steps": 2048}}, backend=LocalBackend())  # doctest: +SKIP
        >>> trainer.run()["status"]  # doctest: +SKIP
        'ok'
    """

    name = "local"

    def __init__(self) -> None:
        super().__init__()
        self.collector = None
        self.scheme = None
        self._iterator = None

    def start(self, driver) -> None:
        self.driver = driver
        cfg, ap = driver.cfg, driver.cfg.async_pipeline
        # the knobs' ranges, max_collect_inflight and GPU actors were checked at start (config_ranges, config_checks)
        collector_device = "cuda" if ap.collector_num_gpus > 0 else "cpu"
        cfg_dict = config_to_dict(cfg)
        control = SharedControl(CONTROL_SIZE)
        control[LEARNER_ITER] = driver.learner.train_iter
        control[PACE_OFFSET] = driver.env_steps  # a resumed run's workers count their frames from here
        control[TEMPERATURE] = temperature_at(cfg, driver.env_steps / max(cfg.train.total_env_steps, 1))
        self.control = control
        action_spec = action_spec_of(cfg)
        n_workers = ap.num_collector_actors
        self.scheme = GuardedWeightSyncScheme(initial_weights=driver.learner.model, timeout_s=ap.shutdown_timeout_s)
        # multi_sync: one next() starts every worker and returns all their batches at once (stacked
        # [workers, envs, T]); each worker still collects frames_per_batch frames, as with multi_async
        sync = ap.collector == "multi_sync"
        seeds = [cfg.seed + 1000 * (i + 1) for i in range(n_workers)]  # each worker's envs and search
        # the workers start deaf to a terminal's Ctrl-C (it goes to the whole process group): the driver stops them
        with children_deaf_to_ctrl_c():
            self.collector = self._make_collector(sync, cfg_dict, seeds, control, action_spec, collector_device)
            driver.stop_signals.check()  # a stop that came while the collector's workers started: no evaluator
            if ap.num_evaluator_actors > 0:
                self.evaluators = EvaluatorPool(cfg_dict, driver.observation_shape, driver.action_space,
                                                ap.num_evaluator_actors, ap.max_eval_inflight)

    def _make_collector(self, sync: bool, cfg_dict: dict, seeds: list[int], control: SharedControl,
                        action_spec, collector_device: str):
        driver = self.driver
        cfg, ap = driver.cfg, driver.cfg.async_pipeline
        n_workers = ap.num_collector_actors
        return (MultiSyncCollector if sync else MultiAsyncCollector)(
            [functools.partial(make_worker_env, cfg_dict, seed, driver.observation_shape, driver.action_space)
             for seed in seeds],
            policy_factory=[functools.partial(
                make_worker_policy, cfg_dict, driver.observation_shape, driver.action_space, action_spec, control,
                collector_device, seed,
            ) for seed in seeds],
            frames_per_batch=cfg.train.frames_per_batch * (n_workers if sync else 1),
            total_frames=-1,
            **({"cat_results": "stack"} if sync else {}),
            weight_sync_schemes={"policy": self.scheme},
            use_buffers=False,  # batches travel as copies: the driver never reads a buffer a worker refills
            # torchrl would fix the driver at (cores - workers) threads; LearnerThreads decides per update
            num_threads=driver.threads.cores,
            auto_register_policy_transforms=False,
            # env.pool=async: each worker steps the games of its pool that are ready
            collector_class=ReadyStepCollector if steps_ready_games(cfg) else None,
        )

    def batch_ready(self) -> bool:
        # MultiAsyncCollector hands out one worker batch per next(); a non-empty output
        # queue means next() will not block. MultiSyncCollector's workers wait for next()
        # to start them, so with multi_sync a batch is never ready ahead.
        if isinstance(self.collector, MultiSyncCollector):
            return False
        q = getattr(self.collector, "queue_out", None)
        return q is not None and not q.empty()

    def busy_actor_cpus(self) -> int:
        """Cores the actors use right now: collectors collecting, evaluators evaluating."""
        ap = self.cfg.async_pipeline
        q = getattr(self.collector, "queue_out", None)
        if isinstance(self.collector, MultiSyncCollector):
            evaluating = self.evaluators.inflight if self.evaluators is not None else 0
            return evaluating * ap.evaluator_num_cpus
        try:  # a worker whose batch waits in the queue is idle until the driver takes it
            waiting = q.qsize() if q is not None else 0
        except NotImplementedError:  # macOS multiprocessing queues
            waiting = 0 if q.empty() else 1
        collecting = max(0, ap.num_collector_actors - waiting)
        evaluating = self.evaluators.inflight if self.evaluators is not None else 0
        return collecting * ap.collector_num_cpus + evaluating * ap.evaluator_num_cpus

    def await_publish(self) -> None:
        """Before the weights change: every worker runs the last published weights (the lag bound)."""
        with _publish_failures_are_worker_faults():
            self.scheme.wait_applied(self.cfg.async_pipeline.shutdown_timeout_s)

    def publish(self) -> None:
        driver = self.driver
        with _publish_failures_are_worker_faults():
            publish_weights(self.collector, driver.learner.model, timeout_s=self.cfg.async_pipeline.shutdown_timeout_s,
                            train_iter=driver.learner.train_iter, version_map=driver.versions, wait=False)

    def shutdown(self) -> None:
        if self.control is not None:
            self.control[PACE_RELEASE] = 1.0  # workers waiting at the collect gate go on, and see the close
        # the weight-sync scheme after its collector, while the interpreter is alive (torchrl guard 8);
        # each within a bound (TrainerBase._close_each): a stuck one is reported, the checkpoint still written
        closes = []
        if self.driver is not None:
            timeout_s = self.cfg.async_pipeline.shutdown_timeout_s
            for name in ("collector", "evaluators", "scheme"):
                obj = getattr(self, name, None)
                if obj is not None:
                    closes.append((name, functools.partial(obj.shutdown, timeout_s) if name == "evaluators"
                                   else obj.shutdown))
            TrainerBase._close_each(closes, timeout_s + _SHUTDOWN_GRACE_S)
        self.collector = self.evaluators = self.scheme = self._iterator = None
        if self.control is not None:
            self.control.close()
            self.control = None

    def next_batch(self) -> TensorDictBase:
        """The collector's next batch, with a dead collector worker turned into a clear stop."""
        if self._iterator is None:
            self._iterator = iter(self.collector)
        try:
            batch = next(self._iterator)
            # multi_sync stacks the workers' [envs, T] batches; the buffer takes [envs, T]
            # (trajectory ids are unique across workers: torchrl numbers them from one pool)
            return batch.flatten(0, 1) if batch.batch_dims == 3 else batch
        except (RuntimeError, OSError, EOFError) as err:
            # a worker killed while its batch is in flight also shows up as a broken
            # connection (ConnectionResetError / EOFError) when the batch is unpickled
            deadline = time.monotonic() + 2.0
            while True:
                dead = [f"collector worker {i} (pid {p.pid}, exit code {p.exitcode})"
                        for i, p in enumerate(getattr(self.collector, "procs", []))
                        if not p._closed and not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if dead or "process failed" in str(err) or "exit code" in str(err):
                raise WorkerDied(f"{', '.join(dead) or 'a collector worker'} died: {err!r}") from err
            raise
