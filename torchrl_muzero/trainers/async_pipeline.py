"""The asynchronous pipeline: collection and evaluation overlap learning.

Same training semantics as :class:`~torchrl_muzero.trainers.SyncTrainer`
(LightZero's async segment pipeline, see docs/architecture.md): the driver process owns
the buffer, the learner and every priority update; collector workers
(torchrl ``MultiAsyncCollector``, one ``MCTSPolicy`` each) and evaluator
processes only receive immutable weight snapshots and return data.

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

import contextlib
import functools
import math
import os
import re
import time
from collections import deque

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import TransformedEnv

from torchrl_muzero.envs import make_env
from torchrl_muzero.trainers.base import TrainerBase
from torchrl_muzero.trainers.builders import actor_generator, algorithm, build_model, build_policy, temperature_at
from torchrl_muzero.trainers.collect_pacing import PacedPolicy
from torchrl_muzero.trainers.config import config_to_dict, load_config
from torchrl_muzero.trainers.cpu_budget import LearnerThreads, yield_to_learner
from torchrl_muzero.trainers.evaluator import EvaluatorPool, WorkerDied
from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit
from torchrl_muzero.trainers.ready_collector import ReadyStepCollector, steps_ready_games
from torchrl_muzero.trainers.stop_signals import children_deaf_to_ctrl_c
from torchrl_muzero.trainers.sync import episode_returns
from torchrl_muzero.trainers.torchrl_guards import (
    GuardedWeightSyncScheme,
    LockedPolicy,
    PolicyVersionMap,
    WeightPublishError,
    publish_weights,
    reclaim_torch_threads,
)

__all__ = ["AsyncTrainer", "publish_due"]

# index of the driver-written values in the shared control tensor read by workers
_LEARNER_ITER, _TEMPERATURE = 0, 1
# just-in-time collection (collect_pacing.py): env steps at the actors' start, and the flag that releases
# workers waiting at the gate when the run shuts down, and the driver's "waiting for a batch, nothing to train"
_PACE_OFFSET, _PACE_RELEASE, _PACE_IDLE = 2, 3, 4
#: seconds past async_pipeline.shutdown_timeout_s the driver waits for one component's shutdown before it
#: reports it stuck and goes on to the final checkpoint (torchrl bounds its collector's joins at 10 s)
_SHUTDOWN_GRACE_S = 15.0


#: name of the driver's control file (:class:`SharedControl`): ``<prefix><pid>_<pid namespace>_<random>``
_CONTROL_PREFIX = "torchrl_muzero_control_"
_CONTROL_NAME = re.compile(re.escape(_CONTROL_PREFIX) + r"(\d+)_(\d+)_.+")


def _pid_namespace() -> int:
    """This process's pid namespace (an inode number), 0 where /proc does not say.

    A pid means something only inside its namespace: containers started with
    ``--ipc=host`` (as PyTorch's docs advise for shared memory) share one
    /dev/shm but each has its own pids, so another container's live driver
    can carry a pid that is free here.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def remove_stale_control_files(folder: str) -> list[str]:
    """Remove the :class:`SharedControl` files in ``folder`` whose driver process is gone; returns their paths.

    Why: a driver ended by SIGKILL (the OOM killer, a scheduler's hard stop)
    never runs :meth:`SharedControl.close`, and its file would stay in
    /dev/shm until the machine reboots. A file is removed only when its name
    says which process created it, in this pid namespace, and that process no
    longer exists: a live run's file is never touched (a reused pid only keeps
    a stale file a while longer). Names without a pid (written before the pid
    was part of the name) are left alone: nothing tells whether their run is
    still going. Never raises: a cleanup must not stop a run.
    """
    removed: list[str] = []
    namespace = _pid_namespace()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _CONTROL_NAME.fullmatch(name)
        if match is None or int(match.group(2)) != namespace or _process_alive(int(match.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            os.unlink(path)
        except OSError:  # gone already (another run cleaned up first), or another user's file
            continue
        removed.append(path)
    return removed


class SharedControl:
    """A few float64 values the driver writes and every worker reads, in a shared file mapping.

    A shared-memory tensor handed to ``policy_factory`` does not stay shared:
    torchrl copies the factory on its way to the workers (measured: workers
    kept reading 0). A file mapping survives any pickling: only the path
    travels, and each process maps the same pages.

    The file is named after the creating process (:data:`_CONTROL_PREFIX`
    ``<pid>_<pid namespace>_<random>``), and creating one first removes the
    files of drivers that died without :meth:`close`
    (:func:`remove_stale_control_files`).
    """

    def __init__(self, size: int, path: str | None = None) -> None:
        import tempfile

        if path is None:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            remove_stale_control_files(folder)
            # the owner is in the name from the file's first instant: no window in which another run's
            # cleanup could take a just-created file for a dead run's
            fd, path = tempfile.mkstemp(prefix=f"{_CONTROL_PREFIX}{os.getpid()}_{_pid_namespace()}_", dir=folder)
            os.close(fd)
            with open(path, "wb") as f:
                f.write(b"\0" * 8 * size)
            self.owner = True
        else:
            self.owner = False
        self.path, self.size = path, size
        self.values = torch.from_file(path, shared=True, size=size, dtype=torch.float64)

    def __getstate__(self):
        return {"path": self.path, "size": self.size}

    def __setstate__(self, state):
        self.__init__(state["size"], state["path"])

    def __getitem__(self, i: int) -> float:
        return float(self.values[i])

    def __setitem__(self, i: int, value: float) -> None:
        self.values[i] = value

    def close(self) -> None:
        if self.owner and os.path.exists(self.path):
            os.unlink(self.path)


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
        self.policy.config.temperature = float(self.control[_TEMPERATURE])
        out = self.policy(tensordict)
        out.set("learner_iter", torch.full(out.batch_size, int(self.control[_LEARNER_ITER]), dtype=torch.int64))
        return out


def _make_worker_policy(cfg_dict: dict, observation_shape, action_space, action_spec, control: SharedControl,
                        device: str, seed: int):
    """Runs in each collector worker (``policy_factory``): a fresh model the scheme fills with weights.

    ``seed`` (the worker's env seed) seeds the search's generator: the spawned worker's
    global generator would start from a different seed at every launch.
    """
    cfg = load_config(cfg_dict)
    yield_to_learner(cfg.async_pipeline.actor_niceness)
    freeze_heap_at_exit()  # the worker ends in ~0.2 s, not ~1 s, at the shutdown (quick_exit.py)
    torch.set_num_threads(max(1, cfg.async_pipeline.collector_num_cpus))
    model = build_model(cfg, observation_shape, action_space).to(device).eval()
    policy = build_policy(cfg, model, action_spec, generator=actor_generator(seed, device))
    locked = LockedPolicy(_ControlledPolicy(policy, control), weights_module=model)
    ap = cfg.async_pipeline
    if ap.collect_ahead_frames < 0:
        return locked
    # outside the lock: a worker waiting under it would block the publish the learner waits for
    return PacedPolicy(locked, control, learner_iter_index=_LEARNER_ITER, offset_index=_PACE_OFFSET,
                       release_index=_PACE_RELEASE, idle_index=_PACE_IDLE, num_workers=ap.num_collector_actors,
                       ahead=ap.collect_ahead_frames, replay_ratio=cfg.train.replay_ratio,
                       warmup=cfg.train.train_start_after_envsteps)


@contextlib.contextmanager
def _publish_failures_are_worker_faults():
    """A publish that failed or timed out stops the run, naming the worker (WorkerDied)."""
    try:
        yield
    except WeightPublishError as err:
        raise WorkerDied(f"weight publishing to the collector workers failed: {err}") from err


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


def _backend_of(cfg) -> str:
    """``async_pipeline.backend`` of a config given as a TrainConfig, a dict or None."""
    if cfg is None:
        return "local"
    if isinstance(cfg, dict):
        return str((cfg.get("async_pipeline") or {}).get("backend", "local"))
    return getattr(getattr(cfg, "async_pipeline", None), "backend", "local")


def action_spec_of(cfg):
    """The action spec of one unbatched env (what the collectors' policies are built with)."""
    probe = make_env(cfg.env, num_envs=1, seed=cfg.seed)
    action_spec = probe.action_spec[0] if len(probe.batch_size) else probe.action_spec
    probe.close()
    return action_spec


def _make_worker_env(cfg_dict: dict, seed: int, observation_shape, action_space):
    """Runs in each collector worker: the env, with the primer of the policy's acting memory if it has one."""
    cfg = load_config(cfg_dict)
    env = make_env(cfg.env, seed=seed)
    memory = algorithm(cfg).acting_memory(cfg)
    if memory is None:
        return env
    # the primer's shapes come from the model (the latent's); this throwaway copy only answers them
    return TransformedEnv(env, memory.make_tensordict_primer(build_model(cfg, observation_shape, action_space)),
                          auto_unwrap=False)


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

    Where the actors run: ``backend=local`` (torchrl's ``MultiAsyncCollector``,
    or ``MultiSyncCollector`` with ``collector=multi_sync``: one batch of every
    worker at once) or ``backend=ray``, for which ``AsyncTrainer(cfg)`` returns
    a :class:`~torchrl_muzero.trainers.ray_backend.RayAsyncTrainer` (the same
    event loop; collectors and evaluators as Ray actors, docs/multi-node.md;
    ``collector=multi_sync`` there: rounds of one collect per actor).

    Examples:
        >>> from torchrl_muzero.trainers import AsyncTrainer
        >>> trainer = AsyncTrainer({"train": {"total_env_steps": 2048}})  # doctest: +SKIP
        >>> summary = trainer.run()  # doctest: +SKIP
    """

    def __new__(cls, cfg=None):
        # async_pipeline.backend=ray: the same driver with Ray actors (trainers/ray_backend.py)
        if cls is AsyncTrainer and _backend_of(cfg) == "ray":
            from torchrl_muzero.trainers.ray_backend import RayAsyncTrainer

            cls = RayAsyncTrainer
        return super().__new__(cls)

    def acting_device(self) -> torch.device:
        """The collectors' device (``async_pipeline.collector_num_gpus``), not the learner's."""
        return torch.device("cuda" if self.cfg.async_pipeline.collector_num_gpus > 0 else "cpu")

    def _loop(self) -> None:
        self._init_driver_state()
        self.stop_signals.check()  # a stop that came before any worker exists starts none
        try:
            self._start_actors()
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

    def _start_actors(self) -> None:
        """Local backend: torchrl's multi-process collector and the evaluator processes."""
        cfg, ap = self.cfg, self.cfg.async_pipeline
        # the knobs' ranges, max_collect_inflight and GPU actors were checked at start (config_checks)
        collector_device = "cuda" if ap.collector_num_gpus > 0 else "cpu"
        cfg_dict = config_to_dict(cfg)
        control = SharedControl(5)
        control[_LEARNER_ITER] = self.learner.train_iter
        control[_PACE_OFFSET] = self.env_steps  # a resumed run's workers count their frames from here
        control[_TEMPERATURE] = temperature_at(cfg, self.env_steps / max(cfg.train.total_env_steps, 1))
        self.control = control
        action_spec = action_spec_of(cfg)
        n_workers = ap.num_collector_actors
        self.scheme = GuardedWeightSyncScheme(initial_weights=self.learner.model, timeout_s=ap.shutdown_timeout_s)
        # multi_sync: one next() starts every worker and returns all their batches at once (stacked
        # [workers, envs, T]); each worker still collects frames_per_batch frames, as with multi_async
        sync = ap.collector == "multi_sync"
        seeds = [cfg.seed + 1000 * (i + 1) for i in range(n_workers)]  # each worker's envs and search
        # the workers start deaf to a terminal's Ctrl-C (it goes to the whole process group): the driver stops them
        self.evaluators = None
        with children_deaf_to_ctrl_c():
            self.collector = self._make_collector(sync, cfg_dict, seeds, control, action_spec, collector_device)
            self.stop_signals.check()  # a stop that came while the collector's workers started: no evaluator
            if ap.num_evaluator_actors > 0:
                self.evaluators = EvaluatorPool(cfg_dict, self.observation_shape, self.action_space,
                                                ap.num_evaluator_actors, ap.max_eval_inflight)

    def _make_collector(self, sync: bool, cfg_dict: dict, seeds: list[int], control: SharedControl,
                        action_spec, collector_device: str):
        cfg, ap = self.cfg, self.cfg.async_pipeline
        n_workers = ap.num_collector_actors
        return (MultiSyncCollector if sync else MultiAsyncCollector)(
            [functools.partial(_make_worker_env, cfg_dict, seed, self.observation_shape, self.action_space)
             for seed in seeds],
            policy_factory=[functools.partial(
                _make_worker_policy, cfg_dict, self.observation_shape, self.action_space, action_spec, control,
                collector_device, seed,
            ) for seed in seeds],
            frames_per_batch=cfg.train.frames_per_batch * (n_workers if sync else 1),
            total_frames=-1,
            **({"cat_results": "stack"} if sync else {}),
            weight_sync_schemes={"policy": self.scheme},
            use_buffers=False,  # batches travel as copies: the driver never reads a buffer a worker refills
            # torchrl would fix the driver at (cores - workers) threads; LearnerThreads decides per update
            num_threads=self.threads.cores,
            auto_register_policy_transforms=False,
            # env.pool=async: each worker steps the games of its pool that are ready
            collector_class=ReadyStepCollector if steps_ready_games(cfg) else None,
        )

    def _batches(self):
        """What :meth:`_next_batch` draws from (local: the torchrl collector's iterator)."""
        return iter(self.collector)

    # -- the driver's event loop -------------------------------------------------
    def _run_event_loop(self) -> None:
        cfg, ap = self.cfg, self.cfg.async_pipeline
        queue_cap = ap.max_train_budget_queue_size or 2 * ap.num_collector_actors
        budgets: deque[float] = deque()  # one budget per collected batch, consumed in order
        iterator = self._batches()
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
                if have_budget and (not self._batch_ready() or (not cold and len(budgets) >= queue_cap)):
                    break
                # nothing to train on while it waits: the collect gate (collect_pacing.py) holds no worker back
                self.control[_PACE_IDLE] = float(not have_budget)
                with self.stop_signals.interruptible():  # only waiting: a stop need not wait for a batch
                    batch = self._next_batch(iterator)
                self._take_batch(batch, budgets)
                self.control[_PACE_IDLE] = 0.0
                cold = not self.train_budget_ready()
                if self.should_stop():
                    break
            if self.stop_reason is not None:
                break
            # 2. a chunk of training
            self._train(min(ap.max_train_chunk_steps, self._owed_updates(budgets)), budgets)
            # 3. evaluations
            if self.evaluators is not None:
                for result in self.evaluators.poll():
                    self._record_eval(result)
                if self.learner.train_iter - max(last_eval_submitted, 0) >= cfg.eval.interval and self._submit_eval():
                    last_eval_submitted = self.learner.train_iter
            self.metrics.progress(self.env_steps, self.learner.train_iter, lag=self._mean_lag())
        if self.env_steps >= cfg.train.total_env_steps:
            # as in sync, every collected batch gets its updates: train the budget still queued
            self._train(self._owed_updates(budgets), budgets)
        # final evaluation of the last weights, waited for (bounded)
        if self.evaluators is not None and self.learner.train_iter and "stop_return" not in (self.stop_reason or ""):
            self._final_eval()

    def _batch_ready(self) -> bool:
        # MultiAsyncCollector hands out one worker batch per next(); a non-empty output
        # queue means next() will not block. MultiSyncCollector's workers wait for next()
        # to start them, so with multi_sync a batch is never ready ahead.
        if isinstance(self.collector, MultiSyncCollector):
            return False
        q = getattr(self.collector, "queue_out", None)
        return q is not None and not q.empty()

    def _train(self, steps: int, budgets: deque) -> None:
        t0 = time.monotonic()
        for _ in range(steps):
            self.thread_steps += self.threads.update(self._busy_actor_cpus())
            self.thread_updates += 1
            self.after_train_step(self.learner.step(before_optimizer_step=self._await_publish_interruptibly))
            self.control[_LEARNER_ITER] = self.learner.train_iter
            self._spend(budgets, 1.0)
            self._publish_if_due()
            self.stop_signals.check()  # a safe point: the update, its bookkeeping and its publish are done
        self.learner_busy_s += time.monotonic() - t0

    def _busy_actor_cpus(self) -> int:
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

    def _await_publish_interruptibly(self) -> None:
        # the gradients are computed, the weights and the optimizer untouched: a stop may land here
        with self.stop_signals.interruptible():
            self._await_publish()

    def _await_publish(self) -> None:
        """Before the weights change: every worker runs the last published weights (the lag bound)."""
        with _publish_failures_are_worker_faults():
            self.scheme.wait_applied(self.cfg.async_pipeline.shutdown_timeout_s)

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
        self.control[_TEMPERATURE] = temperature_at(self.cfg, self.env_steps / max(self.cfg.train.total_env_steps, 1))

    def _mean_lag(self) -> float:
        return self.lag_sum / max(self.lag_frames, 1)

    def _publish_if_due(self) -> None:
        ap = self.cfg.async_pipeline
        if publish_due(self.learner.train_iter, self.published_iter, ap.weight_sync_interval, ap.max_policy_lag):
            with _publish_failures_are_worker_faults():
                publish_weights(self.collector, self.learner.model, timeout_s=ap.shutdown_timeout_s,
                                train_iter=self.learner.train_iter, version_map=self.versions, wait=False)
            self.published_iter = self.learner.train_iter

    def _submit_eval(self) -> bool:
        version = self.learner.train_iter
        if self.evaluators is None or not self.evaluators.can_submit() or version in self._evaluated:
            return False  # each version is scored once: its checkpoint holds exactly that score
        self._evaluated.add(version)
        weights = self.model_snapshot()
        self._pending_eval[version] = weights  # the exact weights, saved when their score arrives
        self.evaluators.submit(version, weights)
        return True

    def _record_eval(self, result) -> None:
        weights = self._pending_eval.pop(result.version)
        self.metrics.log_eval(self.env_steps, self.learner.train_iter, result.version, result.mean_return)
        self.metrics.log(self.env_steps, result.stats)  # board games: win / draw / loss rates per opponent
        self.save_evaluated(result.version, weights, result.mean_return)

    def _final_eval(self) -> None:
        deadline = time.monotonic() + self.cfg.async_pipeline.shutdown_timeout_s * 4
        while self.evaluators.inflight and time.monotonic() < deadline:
            self._wait_for_evaluations()
        if self._submit_eval():
            while self.evaluators.inflight and time.monotonic() < deadline:
                self._wait_for_evaluations()

    def _wait_for_evaluations(self) -> None:
        for result in self.evaluators.poll():
            self._record_eval(result)
        with self.stop_signals.interruptible():  # Ctrl-C during the final evaluation: stop, checkpoint
            time.sleep(self.cfg.async_pipeline.poll_interval_s)

    def _counters(self) -> dict:
        counters = super()._counters()
        counters.update(policy_lag_max=getattr(self, "lag_max", 0), policy_lag_mean=self._mean_lag()
                        if hasattr(self, "lag_frames") else 0.0,
                        learner_busy_fraction=getattr(self, "learner_busy_s", 0.0) / max(self.metrics.wall(), 1e-6),
                        learner_threads_mean=getattr(self, "thread_steps", 0) / max(getattr(self, "thread_updates", 0), 1))
        return counters

    def _shutdown(self) -> None:
        if getattr(self, "control", None) is not None:
            self.control[_PACE_RELEASE] = 1.0  # workers waiting at the collect gate go on, and see the close
        # the weight-sync scheme after its collector, while the interpreter is alive (torchrl guard 8);
        # each within a bound (TrainerBase._close_each): a stuck one is reported, the checkpoint still written
        timeout_s = self.cfg.async_pipeline.shutdown_timeout_s
        closes = []
        for name in ("collector", "evaluators", "scheme"):
            obj = getattr(self, name, None)
            if obj is not None:
                closes.append((name, functools.partial(obj.shutdown, timeout_s) if name == "evaluators"
                               else obj.shutdown))
        self._close_each(closes, timeout_s + _SHUTDOWN_GRACE_S)
        self.collector = self.evaluators = self.scheme = None
        if getattr(self, "control", None) is not None:
            self.control.close()
        if getattr(self, "threads", None) is not None:
            self.threads.restore()

    def _next_batch(self, iterator) -> TensorDictBase:
        """``next(iterator)``, with a dead collector worker turned into a clear stop."""
        try:
            batch = next(iterator)
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
