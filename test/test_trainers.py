import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pipeline_utils import (
    kill_when_training, live_descendants, processes_with_marker, record_batch_sizes, stop_script_after_checkpoint,
    tiny_config,
)
from torchrl_muzero.trainers import AsyncTrainer, ConfigError, SyncTrainer, load_config
from torchrl_muzero.trainers.async_pipeline import publish_due
from torchrl_muzero.trainers.backends import make_backend
from torchrl_muzero.trainers.local_backend import LocalBackend
from torchrl_muzero.trainers.ray_backend import RayBackend
from torchrl_muzero.trainers.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]


def _wait_no_descendants(timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = live_descendants()
        if not left:
            return []
        time.sleep(0.2)
    return live_descendants()


# -- config ---------------------------------------------------------------------
def test_config_rejects_unknown_keys_and_wrong_types():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.replay_ratoi'.*Did you mean 'train\.replay_ratio'"):
        load_config({"train": {"replay_ratoi": 0.5}})
    with pytest.raises(ConfigError, match=r"'async_pipeline\.max_policy_lag' must be of type int, got 'x'"):
        load_config({"async_pipeline": {"max_policy_lag": "x"}})
    with pytest.raises(ConfigError, match=r"'env\.kind' must be one of"):
        load_config({"env": {"kind": "mujoco"}})
    with pytest.raises(ConfigError, match=r"unknown config key 'foo'"):
        load_config({"foo": 1})
    cfg = load_config({"train": {"replay_ratio": 1}}, **{"mcts.num_simulations": 7})
    assert cfg.train.replay_ratio == 1.0 and cfg.mcts.num_simulations == 7


def test_lightzero_keys_absent_on_purpose_say_why():
    """A LightZero UniZero config's ``kv_cache_clear_interval`` gets the reason, not only the key list."""
    with pytest.raises(ConfigError, match=r"'algo\.kv_cache_clear_interval' is not used by torchrl_muzero: "
                                          r"UniZero keeps no KV cache between searches.*remove the key") as err:
        load_config({"algo": {"name": "unizero", "kv_cache_clear_interval": 2000}})
    assert "Valid keys here" not in str(err.value)


def test_seed_knobs_exist():
    names = set(load_config().async_pipeline.__dataclass_fields__)
    for knob in ("enabled", "num_collector_actors", "num_evaluator_actors", "max_collect_inflight",
                 "max_eval_inflight", "max_train_chunk_steps", "weight_sync_interval", "max_policy_lag",
                 "max_train_budget_queue_size", "eval_at_start", "collector_num_cpus", "evaluator_num_cpus",
                 "collector_num_gpus", "evaluator_num_gpus", "buffer_stats_interval", "poll_interval_s",
                 "shutdown_timeout_s"):
        assert knob in names, knob


def test_unknown_env_fails_at_start(tmp_path):
    with pytest.raises(ValueError, match="unknown env id 'CartPole-v9'"):
        SyncTrainer(tiny_config(tmp_path, **{"env.id": "CartPole-v9"}))


# -- sync: checkpoints, resume, NaN -------------------------------------------------
def test_sync_run_checkpoints_and_resumes(tmp_path):
    summary = SyncTrainer(tiny_config(tmp_path)).run()
    assert summary["status"] == "ok" and summary["env_steps"] >= 512
    ckpt = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert ckpt["counters"]["train_iter"] == summary["train_iter"] > 0
    assert (tmp_path / "ckpt" / "buffer.pt").exists()
    assert list((tmp_path / "ckpt").glob("model_v*.pt")), "evaluated versions are checkpointed"
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    assert (tmp_path / "eval.csv").read_text().count("\n") >= 2

    resumed = SyncTrainer(tiny_config(tmp_path, resume=str(tmp_path), **{"train.total_env_steps": 768}))
    assert resumed.env_steps == summary["env_steps"]
    assert resumed.learner.train_iter == summary["train_iter"]
    assert len(resumed.buffer) > 0
    weights = load_checkpoint(tmp_path / "ckpt" / "last.pt")["model"]
    for k, v in resumed.learner.model.state_dict().items():
        assert torch.equal(v, weights[k])
    summary2 = resumed.run()
    assert summary2["env_steps"] >= 768 and summary2["train_iter"] > summary["train_iter"]


def test_corrupt_checkpoint_is_named(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="'resume': checkpoint .*last.pt.*corrupt"):
        SyncTrainer(tiny_config(tmp_path, resume=str(tmp_path)))


def _poison_loss(trainer, monkeypatch, key: str, factor: float, from_iter: int) -> None:
    """From train step ``from_iter`` on, multiply the loss term ``key`` by ``factor`` (nan / inf)."""
    real_forward = trainer.learner.loss_module.forward

    def poisoned(td):
        out = real_forward(td)
        if trainer.learner.train_iter >= from_iter:
            out[key] = out[key] * factor
        return out

    monkeypatch.setattr(trainer.learner.loss_module, "forward", poisoned)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 4096}))
    _poison_loss(trainer, monkeypatch, "loss_value", float("nan"), from_iter=25)
    summary = trainer.run()
    assert summary["status"] == "nan"
    assert "non-finite" in summary["reason"] and "train step 25" in summary["reason"]
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == 20  # the last periodic checkpoint, not a NaN one
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_a_stop_signal_wrapped_by_a_c_extension_still_stops_cleanly(tmp_path, monkeypatch, stop):
    # Ray's ray.wait runs signal handlers in check_signals and hands the handler's exception back
    # wrapped: "SystemError: <cyfunction CoreWorker.wait> returned a result with an exception set"
    # (seen in CI on test_script_on_ray_runs_and_leaves_nothing_behind[sigterm]); the run must
    # still end as the signal asks, with its final checkpoint
    from torchrl_muzero.trainers.stop_signals import Terminated

    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 10**6}))
    step = trainer.learner.step

    def step_then_signal(*args, **kwargs):
        out = step(*args, **kwargs)
        if trainer.learner.train_iter >= 3:
            try:
                raise Terminated() if stop == "sigterm" else KeyboardInterrupt()
            except BaseException as signalled:
                raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") \
                    from signalled
        return out

    monkeypatch.setattr(trainer.learner, "step", step_then_signal)
    summary = trainer.run()
    assert summary["status"] == ("terminated" if stop == "sigterm" else "interrupted"), summary
    assert summary["exit_code"] == (143 if stop == "sigterm" else 130)
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] >= 3


def test_an_error_without_a_signal_behind_it_is_not_taken_for_a_stop(tmp_path, monkeypatch):
    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 10**6}))

    def broken(*args, **kwargs):
        try:
            raise ValueError("a bug")
        except ValueError as bug:
            raise SystemError("wrapped") from bug

    monkeypatch.setattr(trainer.learner, "step", broken)
    with pytest.raises(SystemError, match="wrapped"):
        trainer.run()


# -- async --------------------------------------------------------------------------
class _LagRecorder(AsyncTrainer):
    def _take_batch(self, batch, budgets):
        lag = batch["learner_iter"] - self.versions.train_iters(batch["policy_version"])
        self.seen_lags = getattr(self, "seen_lags", []) + lag.flatten().tolist()
        super()._take_batch(batch, budgets)


# (current version, last published, weight_sync_interval, max_policy_lag) -> publish now?
PUBLISH_CASES = [
    ((0, 0, 1, 0), False),    # nothing new to publish
    ((1, 0, 1, 0), True),     # the seed's defaults: every update
    ((5, 4, 10, 0), True),    # lag 0 tolerated: the learner moved, publish whatever the interval
    ((5, 4, 10, -1), False),  # no lag bound: the interval alone decides
    ((13, 4, 10, -1), False),
    ((14, 4, 10, -1), True),
    ((6, 4, 10, 3), False),   # the next update would make the lag 3: still allowed
    ((7, 4, 10, 3), True),    # the next update would make it 4 > 3: publish now
    ((9, 4, 5, 8), True),     # the interval comes first
    ((8, 4, 5, 8), False),
    ((4, 4, 1, -1), False),
    ((12, 10, 1, -1), True),
]


@pytest.mark.parametrize("args,expected", PUBLISH_CASES, ids=[str(c[0]) for c in PUBLISH_CASES])
def test_publish_decision(args, expected):
    assert publish_due(*args) is expected


def test_async_backend_comes_from_the_one_factory_unless_one_is_given(tmp_path):
    """async_pipeline.backend picks the worker backend through make_backend; a backend given to AsyncTrainer wins.

    Nothing starts here: a backend builds its workers when the run starts (Ray is not even imported)."""
    assert type(make_backend(load_config({"async_pipeline": {"backend": "ray"}}))) is RayBackend
    assert type(make_backend(load_config())) is LocalBackend
    cfg = load_config()
    cfg.async_pipeline.backend = "mpi"
    with pytest.raises(ConfigError, match="'async_pipeline.backend' is 'mpi'"):
        make_backend(cfg)
    assert type(AsyncTrainer(tiny_config(tmp_path / "default")).backend) is LocalBackend
    given = LocalBackend()
    assert AsyncTrainer(tiny_config(tmp_path / "given"), backend=given).backend is given


class _CallRecorder(LocalBackend):
    """The local backend, recording which of its methods the driver called."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def start(self, driver):
        self.calls.append("start")
        super().start(driver)

    def next_batch(self):
        self.calls.append("next_batch")
        return super().next_batch()

    def publish(self):
        self.calls.append("publish")
        super().publish()

    def await_publish(self):
        self.calls.append("await_publish")
        super().await_publish()

    def shutdown(self):
        self.calls.append("shutdown")
        super().shutdown()


def test_async_trainer_runs_on_the_backend_it_is_given(tmp_path):
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 256, "async_pipeline.num_collector_actors": 1,
                                   "async_pipeline.num_evaluator_actors": 0})
    backend = _CallRecorder()
    summary = AsyncTrainer(cfg, backend=backend).run()
    assert summary["status"] == "ok", summary
    assert backend.calls[0] == "start" and backend.calls[-1] == "shutdown" and backend.calls.count("shutdown") == 1
    assert backend.calls.count("next_batch") == 256 // 64  # every batch came through the given backend
    assert "publish" in backend.calls and "await_publish" in backend.calls
    assert backend.collector is None and backend.control is None  # shut down: workers and control file gone
    assert not _wait_no_descendants()


@pytest.mark.parametrize("interval,max_lag", [(3, -1), (8, 2), (4, 0)])
def test_async_policy_lag_is_bounded(tmp_path, interval, max_lag):
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 512, "train.replay_ratio": 1.0,
                                   "async_pipeline.weight_sync_interval": interval,
                                   "async_pipeline.max_policy_lag": max_lag,
                                   "async_pipeline.num_evaluator_actors": 0})
    threads_before = torch.get_num_threads()
    trainer = _LagRecorder(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    # max_policy_lag=0 still shows 1: frames searched while the publish of the update just made travels
    bound = interval if max_lag < 0 else min(interval, max(max_lag, 1))
    assert max(trainer.seen_lags) <= bound
    assert max(trainer.seen_lags) >= 1, "the learner never ran ahead: the test would not see a violation"
    # as in sync, every batch collected once training may start gets its updates (budget drained at
    # the end): 8 batches of 64 frames, the first one (64 < 128 env steps) buys none
    assert summary["train_iter"] == 7 * 64
    assert 1 <= summary["learner_threads_mean"] <= threads_before
    assert torch.get_num_threads() == threads_before, "the driver's thread count was not restored"
    assert not _wait_no_descendants()


def test_multi_sync_collector_hands_in_all_workers_at_once_with_the_lag_bound(tmp_path):
    """async_pipeline.collector=multi_sync: one batch of every worker's frames, versions mapped, lag bounded."""
    cfg = tiny_config(tmp_path, **{"async_pipeline.collector": "multi_sync", "async_pipeline.num_collector_actors": 2,
                                   "async_pipeline.num_evaluator_actors": 0, "train.replay_ratio": 0.5})
    trainer = _LagRecorder(cfg)
    sizes = record_batch_sizes(trainer)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert sizes and set(sizes) == {2 * 64}, sizes  # both workers' frames_per_batch in each batch
    assert max(trainer.seen_lags) <= 1  # the defaults' bound (interval 1, max_policy_lag 0)
    assert summary["train_iter"] == 512 * 0.5  # each of the 4 batches of 128 frames buys its updates
    assert not _wait_no_descendants()


class _KnobRecorder(AsyncTrainer):
    """Records what the seed's knobs bound: updates per chunk, the budget queue, evaluation submits."""

    def _train(self, steps, budgets):
        self.chunks = getattr(self, "chunks", []) + [steps]
        super()._train(steps, budgets)

    def _take_batch(self, batch, budgets):
        super()._take_batch(batch, budgets)
        if self.train_budget_ready():  # the cap is inactive until the buffer is trainable
            self.queue_lengths = getattr(self, "queue_lengths", []) + [len(budgets)]

    def _submit_eval(self):
        submitted = super()._submit_eval()
        if submitted:
            self.submitted = getattr(self, "submitted", []) + [self.learner.train_iter]
        return submitted


def test_async_knobs_mean_what_the_seed_says(tmp_path):
    """max_train_chunk_steps, max_train_budget_queue_size, eval_at_start, buffer_stats_interval."""
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 1024, "train.replay_ratio": 0.5,
                                   "async_pipeline.max_train_chunk_steps": 3,
                                   "async_pipeline.max_train_budget_queue_size": 2,
                                   "async_pipeline.eval_at_start": True,
                                   "async_pipeline.buffer_stats_interval": 7, "eval.interval": 50})
    trainer = _KnobRecorder(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    # the final drain of the queued budget aside, no chunk has more than max_train_chunk_steps updates
    assert max(trainer.chunks[:-1]) == 3 and sum(trainer.chunks) == summary["train_iter"]
    assert max(trainer.queue_lengths) <= 2
    assert trainer.submitted[0] == 0, "eval_at_start: the first evaluation scores the initial weights"
    rows = (tmp_path / "logs" / "scalars" / "buffer" / "sampleable.csv")
    steps = [int(line.split(",")[0]) for line in rows.read_text().strip().splitlines()] if rows.exists() else []
    assert steps, "no buffer statistics were logged"
    assert len(steps) == summary["train_iter"] // 7


def test_async_evaluates_versions_and_saves_exact_checkpoints(tmp_path):
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 768, "async_pipeline.eval_at_start": True,
                                   "train.keep_eval_checkpoints": 1000})  # keep every evaluated version
    summary = AsyncTrainer(cfg).run()
    assert summary["status"] == "ok", summary
    rows = (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]
    assert len(rows) >= 2
    for row in rows:
        version = int(row.split(",")[3])
        state = load_checkpoint(tmp_path / "ckpt" / f"model_v{version}.pt")
        assert state["counters"]["policy_version"] == version
        assert math.isclose(state["counters"]["mean_return"], float(row.split(",")[4]), abs_tol=1e-3)
    assert not _wait_no_descendants()


@pytest.mark.parametrize("victim", ["collector", "evaluator"])
def test_dead_worker_stops_the_run_within_10s(tmp_path, victim):
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 10**6, "eval.interval": 5})
    trainer = AsyncTrainer(cfg)
    procs = ((lambda: trainer.backend.collector.procs) if victim == "collector"
             else (lambda: trainer.backend.evaluators.procs))
    killed = kill_when_training(trainer, 10, lambda: procs()[0].pid)
    summary = trainer.run()
    stopped_at = time.monotonic()
    assert killed, "the run never reached 10 updates"
    assert summary["status"] == "fault"
    assert f"{victim} " in summary["reason"] and "died" in summary["reason"]
    assert stopped_at - killed[0][0] < 10.0
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] > 0
    assert not _wait_no_descendants()


def _spawned_workers(marker: str) -> list[int]:
    """The script's multiprocessing children: collector workers and evaluator processes."""
    out = []
    for pid in processes_with_marker(marker):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            out.append(pid)
    return out


# how the run is stopped -> (exit status, summary status, what the output says)
STOPS = {
    "ctrl-c": (130, "interrupted", "interrupted"),
    # a terminal's Ctrl-C reaches every process of the group (workers, evaluator): the driver still
    # stops the run in order (its workers start deaf to it: stop_signals.children_deaf_to_ctrl_c)
    "terminal-ctrl-c": (130, "interrupted", "interrupted"),
    "sigterm": (143, "terminated", "terminated (SIGTERM)"),
    "dead-worker": (1, "fault", "died"),
}


@pytest.mark.parametrize("stop", list(STOPS))
def test_script_stops_cleanly_with_the_conventional_exit_status(tmp_path, stop):
    cmd = [sys.executable, str(REPO / "sota-implementations/muzero/muzero_async.py"),
           f"run_dir={tmp_path}", "env.num_envs=4", "model.latent_dim=16", "model.hidden_dim=16",
           "mcts.num_simulations=4", "optim.batch_size=32", "train.total_env_steps=1000000",
           "train.train_start_after_envsteps=128", "train.frames_per_batch=64", "logger.progress_bar=false",
           "eval.num_episodes=2", "train.checkpoint_interval=10",
           f"async_pipeline.num_evaluator_actors={int(stop == 'terminal-ctrl-c')}"]

    def do_stop(proc, marker):
        if stop == "dead-worker":
            workers = _spawned_workers(marker)
            assert workers, "no collector worker found"
            os.kill(workers[0], signal.SIGKILL)
        elif stop == "terminal-ctrl-c":
            assert len(_spawned_workers(marker)) >= 2  # the collector worker and the evaluator get it too
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT if stop == "ctrl-c" else signal.SIGTERM)

    returncode, out, leftovers = stop_script_after_checkpoint(cmd, tmp_path, do_stop, cwd=tmp_path,
                                                              own_process_group=stop == "terminal-ctrl-c")
    code, status, text = STOPS[stop]
    assert returncode == code, out[-4000:]
    assert text in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == status and summary["exit_code"] == code
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    if stop == "dead-worker":  # the last periodic checkpoint stays
        assert 0 < state["counters"]["train_iter"] <= summary["train_iter"]
    else:  # a final checkpoint
        assert state["counters"]["train_iter"] == summary["train_iter"] > 0
    assert leftovers == [], leftovers


def test_faults_exit_non_zero(tmp_path, monkeypatch):
    """A NaN loss and a failed publish: the script's entry point exits 1, summary.json says why."""
    from torchrl_muzero.trainers import local_backend
    from torchrl_muzero.trainers.hydra_entry import run_from_hydra
    from torchrl_muzero.torchrl_guards import WeightPublishError

    class PoisonedSync(SyncTrainer):
        def __init__(self, cfg):
            super().__init__(cfg)
            _poison_loss(self, monkeypatch, "loss_value", float("nan"), from_iter=5)

    with pytest.raises(SystemExit) as exit_info:
        run_from_hydra(load_config(tiny_config(tmp_path / "nan")), PoisonedSync)
    assert exit_info.value.code == 1
    assert json.loads((tmp_path / "nan" / "summary.json").read_text())["status"] == "nan"

    def failing_publish(*args, **kwargs):
        raise WeightPublishError("worker 0 did not apply weights version 3 within 1.0 s")

    monkeypatch.setattr(local_backend, "publish_weights", failing_publish)
    cfg = tiny_config(tmp_path / "publish", **{"async_pipeline.num_evaluator_actors": 0})
    with pytest.raises(SystemExit) as exit_info:
        run_from_hydra(load_config(cfg), AsyncTrainer)
    assert exit_info.value.code == 1
    summary = json.loads((tmp_path / "publish" / "summary.json").read_text())
    assert summary["status"] == "fault" and "did not apply weights version 3" in summary["reason"]
    assert not _wait_no_descendants()


def test_async_knobs_with_no_meaning_here_fail_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"'async_pipeline.max_collect_inflight' must be 0 or num_collector_actors"):
        AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.num_collector_actors": 2,
                                              "async_pipeline.max_collect_inflight": 1}))
    with pytest.raises(ConfigError, match=r"'async_pipeline.actor_niceness' must be in \[0, 19\], got -1"):
        AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.actor_niceness": -1}))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'async_pipeline.collector_num_gpus' is 0.5: GPU actors"):
            AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.collector_num_gpus": 0.5}))
    assert not list(tmp_path.iterdir()), "a rejected start wrote into the run folder"
    assert not _wait_no_descendants()


def test_ray_knobs_fail_at_start_in_one_line(tmp_path, monkeypatch):
    """backend=ray's rules, and the install hint when ray is missing (checked before anything starts)."""
    import importlib.util

    ray = {"async_pipeline.backend": "ray", "async_pipeline.num_collector_actors": 2}
    with pytest.raises(ConfigError, match=r"'async_pipeline.max_collect_inflight' must be 0 \(num_collector_actors\) "
                                          r"or in \[1, 2\]"):
        load_config(tiny_config(tmp_path, **ray, **{"async_pipeline.max_collect_inflight": 3}))
    load_config(tiny_config(tmp_path, **ray, **{"async_pipeline.max_collect_inflight": 1}))  # any value up to 2
    with pytest.raises(ConfigError, match="'async_pipeline.ray_local_mode' is true, but Ray"):
        load_config(tiny_config(tmp_path, **ray, **{"async_pipeline.ray_local_mode": True}))
    load_config(tiny_config(tmp_path, **ray, **{"async_pipeline.collector": "multi_sync"}))  # rounds on Ray
    with pytest.raises(ConfigError, match=r"'async_pipeline.max_collect_inflight' must be 0 or num_collector_actors "
                                          r"\(2\) with collector=multi_sync, got 1"):
        load_config(tiny_config(tmp_path, **ray, **{"async_pipeline.collector": "multi_sync",
                                                    "async_pipeline.max_collect_inflight": 1}))
    with pytest.raises(ConfigError, match=r"'async_pipeline.backend' must be one of \('local', 'ray'\)"):
        load_config(tiny_config(tmp_path, **{"async_pipeline.backend": "rey"}))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"needs the ray package: pip install torchrl_muzero\[ray\]") as err:
        AsyncTrainer(tiny_config(tmp_path, **ray))
    assert len(str(err.value).splitlines()) == 1
    assert not list(tmp_path.iterdir()), "a rejected start wrote into the run folder"


def test_async_nan_loss_stops_cleanly_without_leftover_processes(tmp_path, monkeypatch):
    trainer = AsyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 10**6}))
    _poison_loss(trainer, monkeypatch, "loss_reward", float("inf"), from_iter=12)
    summary = trainer.run()
    assert summary["status"] == "nan" and "train step 12" in summary["reason"]
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] == 10
    assert not _wait_no_descendants()


def test_async_resume_continues_counters_and_buffer(tmp_path):
    first = AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.num_evaluator_actors": 0})).run()
    assert first["status"] == "ok"
    resumed = AsyncTrainer(tiny_config(tmp_path, resume=str(tmp_path), **{
        "train.total_env_steps": 1024, "async_pipeline.num_evaluator_actors": 0}))
    assert resumed.learner.train_iter == first["train_iter"] and resumed.env_steps == first["env_steps"]
    assert len(resumed.buffer) > 0
    second = resumed.run()
    assert second["status"] == "ok" and second["train_iter"] > first["train_iter"]
    assert second["env_steps"] >= 1024
    assert not _wait_no_descendants()


@pytest.mark.parametrize("trainer_cls", [SyncTrainer, AsyncTrainer])
def test_evaluated_checkpoints_stay_bounded_and_best_matches_the_log(tmp_path, trainer_cls):
    keep = 3
    # the async evaluator takes whatever version is newest when it is free, so under load it can
    # evaluate few of them: a longer run and one episode per evaluation give it room
    steps = 1024 if trainer_cls is SyncTrainer else 1536
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": steps, "eval.interval": 4,
                                   "eval.num_episodes": 1, "train.keep_eval_checkpoints": keep})
    summary = trainer_cls(cfg).run()
    assert summary["status"] == "ok", summary
    rows = [line.split(",") for line in (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]]
    versions = [int(r[3]) for r in rows]
    scores = [float(r[4]) for r in rows]
    # at most keep + 1 files survive (the last `keep` and the best), so more evaluations than that
    # means some checkpoint had to be deleted: the bound is exercised
    assert len(versions) > keep + 1, f"too few evaluations to see the bound: {versions}"
    best = versions[scores.index(max(scores))]  # the first version that reached the best score
    kept = {int(p.stem[len("model_v"):]) for p in (tmp_path / "ckpt").glob("model_v*.pt")}
    assert kept == set(versions[-3:]) | {best}
    best_state = load_checkpoint(tmp_path / "ckpt" / "best.pt")
    assert best_state["counters"]["policy_version"] == best
    assert math.isclose(best_state["counters"]["mean_return"], max(scores), abs_tol=1e-3)
    assert summary["best_return"] == pytest.approx(max(scores), abs=1e-3) and summary["best_version"] == best
    best_file = load_checkpoint(tmp_path / "ckpt" / f"model_v{best}.pt")
    for k, v in best_state["model"].items():
        assert torch.equal(v, best_file["model"][k])
    assert not _wait_no_descendants()


def _first_async_actions(tmp_path, name: str, seed: int) -> torch.Tensor:
    """The actions of the batches an async run collects before training starts (initial weights)."""
    cfg = tiny_config(tmp_path / name, seed=seed, **{"train.total_env_steps": 128,
                                                      "train.train_start_after_envsteps": 10_000,
                                                      "async_pipeline.num_evaluator_actors": 0,
                                                      # the driver lowers the temperature when its env-step
                                                      # count crosses a schedule point, at a frame of the
                                                      # worker's next batch that depends on timing
                                                      "train.temperature_schedule": [[1.0, 1.0]]})
    trainer = AsyncTrainer(cfg)
    actions = []
    take = trainer._take_batch
    trainer._take_batch = lambda batch, budgets: (actions.append(batch["action"].clone()), take(batch, budgets))
    trainer.run()
    return torch.cat(actions)


def test_async_collection_is_reproducible_from_the_seed(tmp_path):
    # the collector worker is a spawned process: its search drew from a global generator seeded
    # differently at every launch, so two runs with one seed collected different games
    first = _first_async_actions(tmp_path, "a", seed=3)
    again = _first_async_actions(tmp_path, "b", seed=3)
    other = _first_async_actions(tmp_path, "c", seed=4)
    assert first.shape == again.shape and first.numel() >= 128
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_newest_data_age_measures_how_fresh_the_trained_data_is(tmp_path):
    # sync: each batch of 64 frames buys 16 updates, made at ages 0, 1, ..., 15 of its data
    summary = SyncTrainer(tiny_config(tmp_path / "sync", **{"train.total_env_steps": 256})).run()
    assert summary["train_iter"] == 48 and summary["newest_data_age_mean"] == pytest.approx(7.5)
    # four times the frames per collect: ages 0..63
    summary = SyncTrainer(tiny_config(tmp_path / "sync4", **{"train.total_env_steps": 256,
                                                             "train.frames_per_batch": 256})).run()
    assert summary["newest_data_age_mean"] == pytest.approx(31.5)
    assert json.loads((tmp_path / "sync4" / "summary.json").read_text())["newest_data_age_mean"] == pytest.approx(31.5)
