"""The async pipeline on Ray (``async_pipeline.backend=ray``): collectors and evaluators as Ray actors.

:class:`RayBackend` is the :class:`~torchrl_muzero.trainers.worker_backend.WorkerBackend`
that :func:`~torchrl_muzero.trainers.backends.make_backend` picks for it. The driver is
:class:`~torchrl_muzero.trainers.AsyncTrainer`'s, unchanged: it stays the single
owner of the buffer, sampling, reanalyze and priorities
(the seed's 2.2); only where the actors run changes, so they can live on
other machines of a Ray cluster (docs/multi-node.md).

**Why Ray actors that wrap our torchrl collectors, not torchrl's RayCollector.**
Each collector actor (:class:`~torchrl_muzero.trainers.ray_actors.CollectorActor`) holds a single-process torchrl
``Collector`` over the run's env and a :class:`LockedPolicy`; one
``collect`` call returns one batch of ``train.frames_per_batch`` frames.
torchrl 0.14.1's ``RayCollector`` would not keep the pipeline's guarantees:

* its weights travel through ``RayWeightSyncScheme``, a ``torch.distributed``
  (gloo) process group with the driver as rank 0: a dead actor leaves the
  group broken (a restart needs a new rendezvous of everyone), and a weight
  update lands whenever the driver sends it, not at a collect boundary;
* it schedules the collections itself and hands out batches without saying
  which actor made them or which publish they ran, so the driver could not
  bound the lag, name a dead actor or restart one.

**Weights** go through the object store instead: each version is one
``ray.put`` of a CPU snapshot (the seed: "the same version reuses one Ray
ObjectRef"); a collect is submitted with the newest ref only when the actor
does not run that version yet, Ray fetches it once per node, and the actor
loads it *before* it starts collecting: the version is fixed within one
collect and every frame carries it (``policy_version``).

**collector=multi_sync** runs rounds: one collect on every actor with the
same (newest) version, gathered and handed to the driver as one batch that
extends the buffer at once, as torchrl's ``MultiSyncCollector`` does for the
local backend; the next round starts when that batch is taken.

**The lag bound** is the local backend's, kept by the driver: before each
optimizer step (:meth:`RayBackend.await_publish`) it waits until no
collect of an older version than the newest published one is still running,
the collect-boundary counterpart of the local workers' acknowledgment. A
frame's ``learner_iter`` is the learner's ``train_iter`` when the driver saw
its collect finished, an upper bound on the learner's progress while the
frame was searched, so the logged lag never understates.

Ray itself must stay on loopback on the test machines: :func:`import_ray`
sets the variables of shared/notes/ray-on-this-machine.md before ray is
imported (users' own values win) for a run's own Ray instance, not when the
run joins a cluster (``async_pipeline.address``: the user's network).
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import torch
from tensordict import TensorDictBase

from torchrl_muzero.trainers.builders import temperature_at
from torchrl_muzero.trainers.collect_pacing import collect_gate_open
from torchrl_muzero.trainers.config import ConfigError, config_to_dict
from torchrl_muzero.trainers.evaluator import WorkerDied
from torchrl_muzero.trainers.ray_actors import CollectorActor, EvaluatorActor, WeightPacker, unpack_weights
from torchrl_muzero.trainers.ray_env import LOOPBACK_ENV
from torchrl_muzero.trainers.ray_evaluators import RayEvaluatorPool, actor_died, first_line
from torchrl_muzero.trainers.worker_backend import CONTROL_SIZE, PACE_IDLE, TEMPERATURE, WorkerBackend
from torchrl_muzero.trainers.worker_env import action_spec_of

# the actors' classes are re-exported: the backend's one import for users and tests
__all__ = ["RayBackend", "RaySession", "import_ray", "LOOPBACK_ENV"]
_ACTORS = (CollectorActor, EvaluatorActor, WeightPacker, unpack_weights)  # noqa: the re-export


_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def import_ray(loopback: bool = True):
    """``import ray`` after PYTHONPATH (and, with ``loopback``, the loopback variables) are set; a ConfigError without ray.

    Ray's worker processes do not see the driver's ``sys.path`` edits, so the
    folder holding ``torchrl_muzero`` goes into ``PYTHONPATH`` (inherited by
    the daemons ``ray.init`` starts). ``loopback`` sets :data:`LOOPBACK_ENV`
    where the user has not (a run's own one-machine Ray instance);
    :class:`RaySession` passes ``False`` when it joins a cluster, whose nodes
    talk over the user's network: a dead loopback proxy and ``GLOO_SOCKET_IFNAME=lo``
    would cut the driver off from them.
    """
    if loopback:
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PACKAGE_ROOT not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *parts])
    try:
        import ray
    except ImportError:
        raise ConfigError("config key 'async_pipeline.backend' is 'ray', which needs the ray package: "
                          "pip install torchrl_muzero[ray] (or use async_pipeline.backend=local).") from None
    return ray


class RaySession:
    """The Ray instance of one run: started (and stopped, its temp folder removed) or joined.

    An ``address`` joins a running cluster (``ray start --head`` elsewhere);
    without one a Ray instance is started for the run, with a short temp
    folder (Ray's socket paths must stay under 108 characters) and as many
    CPUs as the actors ask for (Ray would otherwise hold an actor back until
    a core is free, and the actors share the cores with the learner as the
    local backend's processes do). If Ray is already initialised in this
    process (a test module's session) the run uses it and leaves it running.

    Examples:
        >>> session = RaySession(address="", num_cpus=3)  # doctest: +SKIP
        >>> ray = session.start()  # doctest: +SKIP
        >>> session.stop()  # doctest: +SKIP
    """

    def __init__(self, address: str = "", num_cpus: float = 1, num_gpus: float = 0) -> None:
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.owned = False
        self.temp_dir: str | None = None

    def start(self):
        ray = import_ray(loopback=not self.address)
        if ray.is_initialized():
            return ray
        kwargs = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}
        # ray.init replaces the driver's SIGTERM handler with sys.exit: the trainer's (a clean stop) is put back
        previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:
            self._init(ray, kwargs)
        except BaseException:  # Ctrl-C / SIGTERM while Ray starts: whatever it started goes, and its folder
            self.owned = True
            self.stop()
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        self.owned = True
        return ray

    def _init(self, ray, kwargs: dict) -> None:
        if self.address:
            # the cluster's nodes may not share this machine's environment: the package path travels too
            ray.init(address=self.address, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
                     **kwargs)
        else:
            self.temp_dir = tempfile.mkdtemp(prefix="trm_ray_", dir="/tmp" if os.path.isdir("/tmp") else None)
            cpus = max(os.cpu_count() or 1, int(-(-self.num_cpus // 1)))
            gpus = max(torch.cuda.device_count(), int(-(-self.num_gpus // 1))) if self.num_gpus else None
            ray.init(num_cpus=cpus, num_gpus=gpus, _temp_dir=self.temp_dir,
                     object_store_memory=512 * 2**20, **kwargs)

    def stop(self) -> None:
        if not self.owned:
            return
        import ray

        try:
            ray.shutdown()
        finally:
            self.owned = False
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None


class RayBackend(WorkerBackend):
    """Collectors and evaluators as Ray actors (``async_pipeline.backend=ray``).

    :func:`~torchrl_muzero.trainers.backends.make_backend` picks it for ``backend=ray``;
    ``AsyncTrainer(cfg, backend=RayBackend())`` asks for it directly. The
    seed's Ray knobs: ``collector_num_cpus`` / ``evaluator_num_cpus`` and
    ``collector_num_gpus`` / ``evaluator_num_gpus`` (fractional) are each
    actor's Ray resources (and its torch threads), ``max_collect_inflight``
    any number of collects at once from 1 to ``num_collector_actors``,
    ``address`` joins a cluster, ``shutdown_timeout_s`` bounds every wait on
    an actor; ``restart_dead_actors=true`` replaces a collector or evaluator
    actor that died (its collect or evaluation in flight is lost, the buffer
    is untouched) instead of stopping the run. Collector actors are spread
    over the cluster's nodes. ``collector=multi_sync`` collects in rounds:
    one collect on every actor, all of one version, handed to the driver as
    one batch (the local backend's MultiSyncCollector semantics).

    Examples:
        >>> from torchrl_muzero.trainers import AsyncTrainer
        >>> trainer = AsyncTrainer({"async_pipeline": {"backend": "ray"}})  # doctest: +SKIP
        >>> type(trainer.backend).__name__, trainer.run()["status"]  # doctest: +SKIP
        ('RayBackend', 'ok')
    """

    name = "ray"

    def __init__(self) -> None:
        super().__init__()
        self.ray = None
        self.session: RaySession | None = None
        self.actors: list = []
        self.actor_where: list[dict] = []
        self.running: dict = {}  # ObjectRef -> (slot, incarnation, version) of each collect in flight
        self.restarts = 0  # collector actors replaced
        self.eval_restarts = 0  # evaluator actors replaced (counted by _eval_lost)
        self.publish_s: list[float] = []

    # -- start / stop ------------------------------------------------------------------
    def start(self, driver) -> None:
        self.driver = driver
        cfg, ap = driver.cfg, driver.cfg.async_pipeline
        n = ap.num_collector_actors
        self.session = RaySession(ap.address, n * ap.collector_num_cpus + ap.num_evaluator_actors *
                                  ap.evaluator_num_cpus, n * ap.collector_num_gpus +
                                  ap.num_evaluator_actors * ap.evaluator_num_gpus)
        self.ray = ray = self.session.start()
        # what the local backend shares through memory (learner iter, temperature) travels with each collect
        self.control = _DriverControl()
        self.control[TEMPERATURE] = temperature_at(cfg, driver.env_steps / max(cfg.train.total_env_steps, 1))
        self._cfg_dict = config_to_dict(cfg)
        self._action_spec = action_spec_of(cfg)
        self._remote = ray.remote(num_cpus=ap.collector_num_cpus, num_gpus=ap.collector_num_gpus, max_restarts=0,
                                  scheduling_strategy="SPREAD")(CollectorActor)
        self.actors: list = [None] * n
        self.actor_where: list[dict] = [{}] * n
        self.incarnation = [0] * n
        self.actor_version = [-1] * n  # the version each actor runs (-1: none loaded yet)
        for slot in range(n):
            self._spawn(slot)
        self.running: dict = {}  # ObjectRef -> (slot, incarnation, version) of each collect in flight
        self._done: deque = deque()  # finished collects: (batch, slot, incarnation, learner_iter at harvest)
        self._traj_maps: list[dict] = [{} for _ in range(n)]  # per slot: actor's trajectory id -> the run's
        self._next_traj = 0
        self._packer = WeightPacker(driver.learner.model)
        self._latest_ref = ray.put(self._packer.pack(driver.learner.model))
        if ap.num_evaluator_actors > 0:
            self.evaluators = RayEvaluatorPool(ray, self._cfg_dict, driver.observation_shape, driver.action_space,
                                               ap.num_evaluator_actors, ap.max_eval_inflight,
                                               ap.evaluator_num_cpus, ap.evaluator_num_gpus,
                                               restart_dead=ap.restart_dead_actors,
                                               start_timeout_s=ap.shutdown_timeout_s * 4, on_lost=self._eval_lost)
        # wait for the actors to exist (their start-up errors surface here, naming the actor)
        for slot in range(n):
            self.actor_where[slot] = self._get(self.actors[slot].where.remote(), slot, ap.shutdown_timeout_s * 4)
        if self.evaluators is not None:
            self.evaluators.started()
        self._fill()

    def _spawn(self, slot: int) -> None:
        cfg, ap = self.cfg, self.cfg.async_pipeline
        device = "cuda" if ap.collector_num_gpus > 0 else "cpu"
        # a restarted actor gets a fresh seed: it must not replay the episodes of its predecessor
        seed = cfg.seed + 1000 * (slot + 1) + 100_003 * self.incarnation[slot]
        self.actors[slot] = self._remote.remote(self._cfg_dict, slot, seed, self.driver.observation_shape,
                                                self.driver.action_space, self._action_spec, device)
        self.actor_version[slot] = -1

    def shutdown(self) -> None:
        ray = self.ray
        errors = []
        if ray is not None and ray.is_initialized():
            if self.evaluators is not None:
                try:
                    self.evaluators.shutdown()
                except Exception as err:
                    errors.append(f"evaluators: {err}")
            actors = [a for a in self.actors if a is not None]
            closing = []
            for actor in actors:
                try:
                    closing.append(actor.close.remote())
                except Exception:
                    pass
            if closing:  # let each torchrl collector close its env, within shutdown_timeout_s
                ray.wait(closing, num_returns=len(closing), timeout=self.cfg.async_pipeline.shutdown_timeout_s)
            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception as err:
                    errors.append(f"collector: {err}")
        self.evaluators = None
        self.actors = []
        self.running = {}
        if self.session is not None:
            try:
                self.session.stop()
            except Exception as err:
                errors.append(f"ray: {err}")
        if errors:
            print("torchrl_muzero: errors while shutting down: " + "; ".join(errors))

    # -- collects ----------------------------------------------------------------------
    def _frames_coming(self) -> int:
        per = self.cfg.train.frames_per_batch
        return self.driver.env_steps + per * (len(self.running) + len(self._done))

    def _fill(self) -> None:
        """Start collects on idle actors, at most max_collect_inflight at once, none past the budget.

        ``collector=multi_sync``: rounds instead (:meth:`_fill_round`).
        """
        ap = self.cfg.async_pipeline
        if ap.collector == "multi_sync":
            self._fill_round()
            return
        limit = ap.max_collect_inflight or ap.num_collector_actors
        busy = {slot for slot, _, _ in self.running.values()} | {slot for _, slot, _, _ in self._done}
        for slot in range(ap.num_collector_actors):
            if len(self.running) >= limit or self._frames_coming() >= self.cfg.train.total_env_steps:
                return
            if not self._collect_allowed():
                return
            if slot not in busy:
                self._launch(slot)

    def _collect_allowed(self) -> bool:
        """Just-in-time collection (collect_pacing.py), here per collect: the driver starts it or waits."""
        ap, t = self.cfg.async_pipeline, self.cfg.train
        if ap.collect_ahead_frames < 0 or self.control[PACE_IDLE]:
            return True
        return collect_gate_open(frames_after=self._frames_coming() + t.frames_per_batch,
                                 learner_iter=self.driver.learner.train_iter, ahead=ap.collect_ahead_frames,
                                 replay_ratio=t.replay_ratio, warmup=t.train_start_after_envsteps)

    def _fill_round(self) -> None:
        """multi_sync: one collect on every actor, all of one version, once the last round was handed in.

        The whole round is the driver's one batch (:meth:`_next_batch`), as
        torchrl's MultiSyncCollector hands in all its workers' frames at once;
        the next round starts as soon as that batch is taken, so collection
        still overlaps the learner's updates. The last round starts only the
        actors the budget still needs, so no frame is collected past it.
        """
        if self.running or self._done:
            return
        per, left = self.cfg.train.frames_per_batch, self.cfg.train.total_env_steps - self.driver.env_steps
        for slot in range(min(self.cfg.async_pipeline.num_collector_actors, max(0, -(-left // per)))):
            self._launch(slot)

    def _launch(self, slot: int) -> None:
        """One collect on ``slot``'s actor with the newest version (its weights sent only if new to it)."""
        version = self.driver.versions.latest_version
        weights = self._latest_ref if self.actor_version[slot] != version else None
        ref = self.actors[slot].collect.remote(weights, version, self.control[TEMPERATURE])
        self.running[ref] = (slot, self.incarnation[slot], version)
        self.actor_version[slot] = version

    def _harvest(self, refs: list) -> None:
        """Move finished collects into ``_done`` (or handle their actor's death) and refill."""
        for ref in refs:
            slot, incarnation, version = self.running.pop(ref)
            try:
                batch = self.ray.get(ref)
            except Exception as err:
                self._collector_fault(slot, err)
                continue
            self._done.append((batch, slot, incarnation, self.driver.learner.train_iter))
        self._fill()

    def _collector_fault(self, slot: int, err: BaseException) -> None:
        where = self.actor_where[slot]
        name = f"collector actor {slot} (pid {where.get('pid', '?')}, host {where.get('host', '?')})"
        first = first_line(err)
        if not actor_died(self.ray, err):
            raise WorkerDied(f"{name} failed: {type(err).__name__}: {first}") from err
        if not self.cfg.async_pipeline.restart_dead_actors:
            raise WorkerDied(f"{name} died: {type(err).__name__}: {first}") from err
        # its collect in flight is lost; what it handed in before is in the buffer already
        print(f"torchrl_muzero: {name} died ({type(err).__name__}); restarting it")
        self.incarnation[slot] += 1
        self.restarts += 1
        self._traj_maps[slot] = {}
        self._spawn(slot)
        self.actor_where[slot] = self._get(self.actors[slot].where.remote(), slot,
                                           self.cfg.async_pipeline.shutdown_timeout_s * 4)

    def _get(self, ref, slot: int, timeout_s: float):
        try:
            return self.ray.get(ref, timeout=timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise WorkerDied(f"collector actor {slot} did not start within {timeout_s:g} s") from None
        except Exception as err:
            first = first_line(err)
            raise WorkerDied(f"collector actor {slot} failed to start: {type(err).__name__}: {first}") from err

    def _poll(self, timeout_s: float) -> None:
        if self.running:
            ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=timeout_s)
            if ready:  # take every other finished one too
                more, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
                self._harvest(list(dict.fromkeys([*ready, *more])))
        elif timeout_s:
            time.sleep(min(timeout_s, 0.01))
        self._fill()

    def batch_ready(self) -> bool:
        self._poll(0)
        return self._handed_in()

    def _handed_in(self) -> bool:
        """A batch for the driver: one finished collect, or with multi_sync a whole finished round."""
        return bool(self._done) and (self.cfg.async_pipeline.collector != "multi_sync" or not self.running)

    def next_batch(self) -> TensorDictBase:
        ap = self.cfg.async_pipeline
        wait_s = max(ap.shutdown_timeout_s * 10, 60.0)
        deadline = time.monotonic() + wait_s
        while not self._handed_in():
            if not self.running:
                self._fill()
                if not self.running and not self._done:
                    raise WorkerDied("no collector actor could be given a collect (all dead?)")
            # short waits: a dead actor surfaces within one of them, and Ctrl-C / SIGTERM get through
            self._poll(0.5)
            if time.monotonic() > deadline:
                raise WorkerDied(f"no collector actor handed in a batch within {wait_s:g} s")
        if ap.collector == "multi_sync":  # the round's batches, in actor order, as one [actors * envs, T] batch
            done = sorted(self._done, key=lambda d: d[1])
            self._done.clear()
            batch = torch.cat([self._tag(b, slot, learner_iter) for b, slot, _, learner_iter in done], 0)
        else:
            batch, slot, _, learner_iter = self._done.popleft()
            batch = self._tag(batch, slot, learner_iter)
        self._fill()
        return batch

    def _tag(self, batch: TensorDictBase, slot: int, learner_iter: int) -> TensorDictBase:
        """The run's trajectory ids (each actor numbers its own from 0) and the harvest's learner_iter."""
        key = ("collector", "traj_ids")
        ids = batch.get(key)
        old = self._traj_maps[slot]
        new: dict[int, int] = {}
        out = torch.empty_like(ids)
        for local in ids.unique().tolist():
            if local in old:
                new[local] = old[local]
            else:
                new[local] = self._next_traj
                self._next_traj += 1
            out[ids == local] = new[local]
        # a trajectory absent from a batch has ended: only the ids of the last batch can continue
        self._traj_maps[slot] = new
        batch.set(key, out)
        batch.set("learner_iter", torch.full(batch.batch_size, int(learner_iter), dtype=torch.int64))
        return batch

    # -- weights and the lag bound -----------------------------------------------------------
    def publish(self) -> None:
        driver = self.driver
        t0 = time.perf_counter()
        # one snapshot per version in the object store; every actor's next collect reuses the ref
        self._latest_ref = self.ray.put(self._packer.pack(driver.learner.model))
        self.publish_s.append(time.perf_counter() - t0)
        driver.versions.record(driver.versions.latest_version + 1, driver.learner.train_iter)

    def await_publish(self) -> None:
        """Before the weights change: no collect of an older version than the newest is still running."""
        latest = self.driver.versions.latest_version
        stale = [ref for ref, (_, _, version) in self.running.items() if version < latest]
        if not stale:
            return
        timeout = self.cfg.async_pipeline.shutdown_timeout_s
        deadline = time.monotonic() + timeout
        while stale:
            ready, stale = self.ray.wait(stale, num_returns=len(stale), timeout=min(0.5, timeout))
            self._harvest(ready)
            if stale and time.monotonic() > deadline:
                slots = sorted({self.running[r][0] for r in stale if r in self.running})
                raise WorkerDied(f"collector actor(s) {slots} did not finish a collect of weights version "
                                 f"< {latest} within {timeout:g} s")

    def _eval_lost(self, version: int) -> None:
        """A restarted evaluator's lost evaluation: the driver drops the weights kept for its score."""
        self.driver.evaluation_lost(version)  # the final evaluation resubmits the last version if it was this one
        self.eval_restarts += 1

    def busy_actor_cpus(self) -> int:
        ap = self.cfg.async_pipeline
        evaluating = self.evaluators.inflight if self.evaluators is not None else 0
        return int(len(self.running) * ap.collector_num_cpus + evaluating * ap.evaluator_num_cpus)

    def counters(self) -> dict:
        publish = self.publish_s
        # actor_restarts: collectors and evaluators together; evaluator_restarts: the evaluators' share
        evaluators = self.eval_restarts
        return {"actor_restarts": self.restarts + evaluators, "evaluator_restarts": evaluators,
                "publish_ms_mean": 1000 * sum(publish) / max(len(publish), 1)}


class _DriverControl:
    """The values the local backend shares through memory; on Ray they travel with each collect
    (temperature) or stay with the driver (the collect gate's, read by :meth:`RayBackend._fill`)."""

    def __init__(self) -> None:
        self.values = [0.0] * CONTROL_SIZE
        self.values[TEMPERATURE] = 1.0

    def __getitem__(self, i: int) -> float:
        return self.values[i]

    def __setitem__(self, i: int, value: float) -> None:
        self.values[i] = float(value)

    def close(self) -> None:
        pass
