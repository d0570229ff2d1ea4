"""async_pipeline.backend=ray: the pipeline's guarantees through Ray actors (one Ray session for the module).

Ray stays on loopback (conftest.py sets the variables of shared/notes/ray-on-this-machine.md before
anything imports ray). Skipped, saying why, when ray is not installed (pip install torchrl_muzero[ray]).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="ray is not installed (pip install torchrl_muzero[ray]): the Ray backend's tests skip")

from pipeline_utils import kill_when_training, processes_with_marker, record_batch_sizes, tiny_config  # noqa: E402

from torchrl_muzero.trainers import AsyncTrainer  # noqa: E402
from torchrl_muzero.trainers.checkpoint import load_checkpoint  # noqa: E402
from torchrl_muzero.algorithms import algorithm_names  # noqa: E402
from torchrl_muzero.envs.action_spaces import BoxActionSpace  # noqa: E402
from torchrl_muzero.trainers.builders import build_model  # noqa: E402
from torchrl_muzero.trainers.config import config_to_dict, load_config  # noqa: E402
from torchrl_muzero.trainers.ray_backend import (  # noqa: E402
    CollectorActor,
    RayBackend,
    RaySession,
    WeightPacker,
)
from torchrl_muzero.trainers.worker_env import action_spec_of  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    # one Ray instance for the in-process tests (start-up is ~5 s); the trainers use it and leave it running
    session = RaySession(num_cpus=4)
    session.start()
    yield session
    session.stop()


def _ray_config(tmp_path, **overrides):
    return tiny_config(tmp_path, **{"async_pipeline.backend": "ray", "async_pipeline.num_collector_actors": 2,
                                    "async_pipeline.num_evaluator_actors": 0, **overrides})


class _Recorder(RayBackend):
    """The Ray backend, recording what the driver is handed and what it waits for (given to AsyncTrainer)."""

    def next_batch(self):
        batch = super().next_batch()
        versions = self.driver.versions
        train_iters = versions.train_iters(batch["policy_version"])
        self.seen_lags = getattr(self, "seen_lags", []) + (batch["learner_iter"] - train_iters).flatten().tolist()
        # a version is fixed within one collect: every frame of the batch has the same one
        self.versions_per_batch = getattr(self, "versions_per_batch", []) + [batch["policy_version"].unique().numel()]
        return batch

    def _fill(self):
        super()._fill()
        self.most_inflight = max(getattr(self, "most_inflight", 0), len(self.running))

    def _launch(self, slot):
        # was the learner's current version what this collect was given? (train_iter of the version vs now)
        versions = self.driver.versions
        on_current = versions.train_iter(versions.latest_version) == self.driver.learner.train_iter
        self.launched_on_current = getattr(self, "launched_on_current", []) + [on_current]
        super()._launch(slot)

    def await_publish(self):
        super().await_publish()
        # what the optimizer step may now do: every collect still running runs the newest published version
        stale = [v for _, _, v in self.running.values() if v < self.driver.versions.latest_version]
        self.stale_at_step = getattr(self, "stale_at_step", 0) + len(stale)


def test_loopback_variables_are_set_for_a_runs_own_instance_not_for_a_cluster(monkeypatch):
    """A run's own Ray instance stays on loopback; joining a cluster (``async_pipeline.address``) leaves the
    environment alone: its dead loopback proxy and ``GLOO_SOCKET_IFNAME=lo`` would cut the driver off from
    the cluster's other machines."""
    from torchrl_muzero.trainers import ray_backend

    for key in ray_backend.LOOPBACK_ENV:
        monkeypatch.delenv(key, raising=False)  # restored after the test (conftest set them for the suite)
    ray_backend.import_ray(loopback=False)
    assert not [key for key in ray_backend.LOOPBACK_ENV if key in os.environ]

    asked = []
    fake_ray = type("FakeRay", (), {"is_initialized": staticmethod(lambda: True)})
    monkeypatch.setattr(ray_backend, "import_ray", lambda loopback=True: asked.append(loopback) or fake_ray)
    RaySession(address="10.0.0.5:6379").start()
    RaySession().start()
    assert asked == [False, True]

    monkeypatch.undo()  # the real import_ray again, then the variables once more as a run's own instance needs
    for key in ray_backend.LOOPBACK_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")  # a user's own value wins
    ray_backend.import_ray()
    assert os.environ["http_proxy"] == "http://proxy.example:3128"
    assert all(os.environ[k] == v for k, v in ray_backend.LOOPBACK_ENV.items() if k != "http_proxy")


@pytest.mark.parametrize("name", algorithm_names())
def test_every_algorithm_collects_in_a_collector_actor(tmp_path, name):
    """What a Ray collector actor runs, in this process: packed learner weights loaded at the boundary, one collect."""
    # built in this (the test's) process: it must not lower its priority or take its threads
    # the sampled family collects its point, a continuous env (its workers build the model from the env's space)
    sampled = name.startswith("sampled_")
    env = {"env.id": "Pendulum-v1", "env.name": "Pendulum", "algo.num_samples": 4} if sampled else {}
    obs_shape, space = ((3,), BoxActionSpace(-2.0, 2.0, (1,))) if sampled else ((4,), 2)
    cfg = load_config(tiny_config(tmp_path, **{"algo.name": name, "train.frames_per_batch": 16,
                                               "async_pipeline.actor_niceness": 0,
                                               "async_pipeline.collector_num_cpus": torch.get_num_threads(), **env}))
    learner_model = build_model(cfg, obs_shape, space)
    actor = CollectorActor(config_to_dict(cfg), 0, 1, obs_shape, space, action_spec_of(cfg))
    try:
        batch = actor.collect(WeightPacker(learner_model).pack(learner_model), 3, 1.0)
    finally:
        actor.close()
    assert batch.numel() == 16 and batch["policy_version"].unique().tolist() == [3]
    for key, value in learner_model.state_dict().items():  # the actor runs exactly the learner's weights
        assert actor.search.model.state_dict()[key].equal(value), key


def test_ray_backend_tags_versions_and_bounds_the_lag(tmp_path):
    cfg = _ray_config(tmp_path, **{"train.total_env_steps": 768, "train.replay_ratio": 0.5,
                                   "async_pipeline.weight_sync_interval": 3, "async_pipeline.max_policy_lag": -1,
                                   "async_pipeline.max_collect_inflight": 1, "async_pipeline.num_evaluator_actors": 1,
                                   "eval.interval": 40})
    # the script's entry point picks the backend through make_backend (built, not run: nothing starts before run())
    assert type(AsyncTrainer(_ray_config(tmp_path / "type")).backend) is RayBackend
    backend = _Recorder()
    trainer = AsyncTrainer(cfg, backend=backend)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert set(backend.versions_per_batch) == {1}
    assert backend.most_inflight == 1  # max_collect_inflight=1 of 2 actors
    assert 1 <= max(backend.seen_lags) <= 3  # the local backend's bound: weight_sync_interval here
    assert trainer.versions.latest_version >= 2, "weights were never published"
    assert summary["train_iter"] == (768 - 64) * 0.5  # every batch once training may start buys its updates
    assert len(trainer.buffer) == summary["env_steps"] == 768
    assert (tmp_path / "eval.csv").read_text().count("\n") >= 2, "no evaluation came back from the evaluator actor"


@pytest.mark.parametrize("collector", ["multi_async", "multi_sync"])
def test_ray_default_lag_bound_and_multi_sync_rounds(tmp_path, collector):
    """The defaults (publish every update, max_policy_lag=0) on Ray, with both collectors.

    Every collect starts on the learner's current weights, and the learner never makes an update while
    a collect of older weights still runs, so each frame is at most the one update in flight behind
    (the local backend's bound for max_policy_lag=0, test_trainers.py test_async_policy_lag_is_bounded).
    multi_sync: each batch the driver takes holds one collect of every actor (2 x 64 frames), one version.
    """
    cfg = _ray_config(tmp_path, **{"async_pipeline.collector": collector, "train.replay_ratio": 0.5})
    backend = _Recorder()
    trainer = AsyncTrainer(cfg, backend=backend)
    sizes = record_batch_sizes(trainer)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert set(sizes) == ({128} if collector == "multi_sync" else {64}), sizes
    assert set(backend.versions_per_batch) == {1}  # weights fixed within a collect, and within a round
    assert backend.most_inflight == 2
    # every collect was given the learner's current weights, and no optimizer step ran while a collect of
    # older weights was still running: a frame is at most the one update in flight behind (lag <= 1)
    assert all(backend.launched_on_current) and backend.stale_at_step == 0
    assert max(backend.seen_lags) == 1 and summary["policy_lag_max"] == 1
    # a version per update; every batch once training may start (128 env steps) buys its updates
    first_trained = 128 if collector == "multi_sync" else 64
    assert trainer.versions.latest_version == summary["train_iter"] == (512 - 128 + first_trained) * 0.5
    assert len(trainer.buffer) == summary["env_steps"] == 512


def test_dead_evaluator_actor_stops_the_run_within_10s(tmp_path):
    cfg = _ray_config(tmp_path, **{"train.total_env_steps": 10**6, "async_pipeline.num_evaluator_actors": 1,
                                   "eval.interval": 5})
    trainer = AsyncTrainer(cfg)

    def evaluator_pid():  # the evaluator actor's pid, once it is up
        evaluators = trainer.backend.evaluators
        up = evaluators is not None and evaluators.where[0]
        return evaluators.where[0]["pid"] if up else None

    killed = kill_when_training(trainer, 10, evaluator_pid)
    summary = trainer.run()
    assert killed, "the run never reached 10 updates"
    assert summary["status"] == "fault" and "evaluator actor 0 (pid" in summary["reason"], summary
    assert "died" in summary["reason"] and time.monotonic() - killed[0][0] < 10.0


def test_dead_evaluator_actor_is_restarted_and_evaluations_go_on(tmp_path):
    cfg = _ray_config(tmp_path, **{"train.total_env_steps": 512, "async_pipeline.num_evaluator_actors": 1,
                                   "eval.interval": 5, "async_pipeline.restart_dead_actors": True})
    trainer = AsyncTrainer(cfg)
    where = []  # the evaluator's pid at each poll; the one killed is the last before the kill

    def evaluator_pid():
        evaluators = trainer.backend.evaluators
        up = evaluators is not None and evaluators.where[0]
        return where.append(evaluators.where[0]["pid"]) or where[-1] if up else None

    killed = kill_when_training(trainer, 10, evaluator_pid)
    summary = trainer.run()
    assert killed, "the run never reached 10 updates"
    assert summary["status"] == "ok", summary
    assert summary["evaluator_restarts"] == summary["actor_restarts"] == 1
    rows = [line.split(",") for line in (tmp_path / "eval.csv").read_text().splitlines()[1:]]
    # evaluations kept coming after the kill, from the replacement: periodic ones and the final one
    assert len([r for r in rows if int(r[0]) > killed[0][1]]) >= 2, (killed, rows)
    assert len(trainer.buffer) == summary["env_steps"] == 512


@pytest.mark.parametrize("restart", [False, True], ids=["stops", "restarts"])
def test_dead_collector_actor_stops_the_run_or_is_restarted(tmp_path, restart):
    cfg = _ray_config(tmp_path, **{"train.total_env_steps": 10**6 if not restart else 1024,
                                   "async_pipeline.restart_dead_actors": restart})
    trainer = AsyncTrainer(cfg)
    killed = kill_when_training(trainer, 10, lambda: trainer.backend.actor_where[0]["pid"])
    summary = trainer.run()
    stopped_at = time.monotonic()
    assert killed, "the run never reached 10 updates"
    if not restart:
        assert summary["status"] == "fault", summary
        assert "collector actor 0 (pid" in summary["reason"] and "died" in summary["reason"]
        assert stopped_at - killed[0][0] < 10.0
        assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] > 0
    else:
        assert summary["status"] == "ok", summary
        assert summary["actor_restarts"] == 1
        # nothing lost: every frame handed in is in the buffer, and collection went on after the restart
        assert len(trainer.buffer) == summary["env_steps"] == 1024 > killed[0][1]


STOPS = {"ok": (0, "ok"), "ctrl-c": (130, "interrupted"), "sigterm": (143, "terminated")}


@pytest.mark.slow
@pytest.mark.parametrize("stop", list(STOPS))
def test_script_on_ray_runs_and_leaves_nothing_behind(tmp_path, stop):
    """muzero_async.py async_pipeline.backend=ray: no Ray process, no temp folder left, however it ends."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "TORCHRL_MUZERO_TEST_MARKER": marker, "PYTHONUNBUFFERED": "1"}
    before = set(glob.glob("/tmp/trm_ray_*"))
    cmd = [sys.executable, str(REPO / "sota-implementations/muzero/muzero_async.py"),
           f"run_dir={tmp_path}", "env.num_envs=4", "model.latent_dim=16", "model.hidden_dim=16",
           "mcts.num_simulations=4", "optim.batch_size=32",
           f"train.total_env_steps={384 if stop == 'ok' else 10**6}", "train.train_start_after_envsteps=128",
           "train.frames_per_batch=64", "logger.progress_bar=false", "eval.num_episodes=2", "eval.interval=20",
           "train.checkpoint_interval=10", "async_pipeline.backend=ray", "async_pipeline.num_collector_actors=2",
           f"async_pipeline.num_evaluator_actors={1 if stop == 'ok' else 0}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if stop != "ok":
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not (tmp_path / "ckpt" / "last.pt").exists():
                time.sleep(0.5)
            assert proc.poll() is None, proc.stdout.read()
            proc.send_signal(signal.SIGINT if stop == "ctrl-c" else signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    code, status = STOPS[stop]
    assert proc.returncode == code, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == status and summary["train_iter"] > 0
    if stop == "ok":
        assert summary["env_steps"] == 384 and summary["best_version"] is not None
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with_marker(marker) == [], "Ray processes were left behind"
    assert set(glob.glob("/tmp/trm_ray_*")) - before == set(), "the Ray temp folder was left behind"


class _GateRecorder(RayBackend):
    """Records, at each collect start, whether the collect gate allowed it on its own or the driver was idle."""

    def _launch(self, slot):
        ahead, t = self.cfg.async_pipeline.collect_ahead_frames, self.cfg.train
        owed = t.replay_ratio * (self._frames_coming() + t.frames_per_batch - ahead - t.train_start_after_envsteps)
        self.launches = getattr(self, "launches", []) + [(owed <= self.driver.learner.train_iter + 1,
                                                          self.control[4])]
        super()._launch(slot)

    def _collect_allowed(self):
        allowed = super()._collect_allowed()
        self.held_back = getattr(self, "held_back", 0) + (not allowed)
        return allowed


def test_ray_collect_gate_starts_each_collect_just_in_time(tmp_path):
    """async_pipeline.collect_ahead_frames on Ray: the driver starts a collect only within the bound
    (or while it waits for a batch with nothing to train on), and every batch still buys its updates."""
    cfg = _ray_config(tmp_path, **{"train.total_env_steps": 384, "train.replay_ratio": 1.0,
                                   "async_pipeline.collect_ahead_frames": 128})
    backend = _GateRecorder()
    summary = AsyncTrainer(cfg, backend=backend).run()
    assert summary["status"] == "ok", summary
    assert summary["train_iter"] == (384 - 64) * 1.0
    assert all(within or idle for within, idle in backend.launches), backend.launches
    assert backend.held_back > 0, "the bound never held a collect back: the test would not see it ignored"
