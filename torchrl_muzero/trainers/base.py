"""What the sync and async trainers share: run folder, resume, checkpoints, stop rules, faults."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import torch

from torchrl_muzero.algorithms.registry import check_action_space
from torchrl_muzero.durable_files import atomic_write_json
from torchrl_muzero.envs import env_action_space, make_env
from torchrl_muzero.bounded_call import call_within
from torchrl_muzero.trainers.builders import build_buffer, build_model, resolve_device
from torchrl_muzero.trainers.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    save_checkpoint,
)
from torchrl_muzero.trainers.config import ConfigError, TrainConfig, config_to_dict
from torchrl_muzero.trainers.config_checks import check_run_targets, run_folder_of
from torchrl_muzero.trainers.learner import Learner, NonFiniteLossError
from torchrl_muzero.trainers.metrics import RunMetrics
from torchrl_muzero.trainers.resume_config import load_run_config
from torchrl_muzero.trainers.search_engine import probe_search_engine
from torchrl_muzero.trainers.stop_signals import StopSignals, Terminated
from torchrl_muzero.torchrl_guards import reclaim_torch_threads

__all__ = ["TrainerBase", "TrainingStopped", "EXIT_CODES"]

#: The process exit status of each way a run ends (``summary.json`` carries both): 0 only when the
#: run ended as configured; the shell's conventions for SIGINT / SIGTERM (128 + signal number).
EXIT_CODES = {"ok": 0, "fault": 1, "nan": 1, "interrupted": 130, "terminated": 143}


class TrainingStopped(RuntimeError):
    """The run ended on a fault (dead worker, NaN loss, ...): the message says which."""


def _stop_signal_behind(err: BaseException) -> BaseException | None:
    """The Ctrl-C / SIGTERM exception an error was raised from, if any.

    A signal handler runs wherever the main thread is; inside a C extension
    that polls for signals (Ray's ``ray.wait`` calls ``check_signals``) the
    handler's exception can come back wrapped, e.g. as ``SystemError: ...
    returned a result with an exception set`` caused by our :class:`Terminated`.
    That is still the user's stop, not a crash: the run must end as the
    signal asks (final checkpoint, its exit status).
    """
    seen = set()
    cause = err.__cause__ or err.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (KeyboardInterrupt, Terminated)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class TrainerBase:
    """Run folder, resume, checkpoints and the stop rules of one training run.

    Subclasses implement :meth:`_loop` (collect / train / evaluate) and
    :meth:`_shutdown` (stop their processes). :meth:`run` wraps the loop so
    that every way out — the budget reached, Ctrl-C, a NaN loss, a dead
    worker — writes what must be written and stops every process.

    Examples:
        >>> from torchrl_muzero.trainers import SyncTrainer  # a TrainerBase
        >>> summary = SyncTrainer({"train": {"total_env_steps": 256}}).run()  # doctest: +SKIP
        >>> summary["status"]  # doctest: +SKIP
        'ok'
    """

    def __init__(self, cfg: TrainConfig | dict | None = None) -> None:
        if not isinstance(cfg, TrainConfig):
            cfg = load_run_config(cfg)  # resume=RUN: the saved run's config, changed by cfg's keys only
        self.cfg = cfg
        #: Ctrl-C / SIGTERM recorded until the loop reaches a safe point (installed by :meth:`run`)
        self.stop_signals = StopSignals()
        # everything this run touches on the machine is checked before a folder, env or process exists
        resume_state = check_run_targets(cfg)
        # the thread count the run was started with; torchrl's envs and collectors change it
        # behind our back (torchrl_guards.reclaim_torch_threads), the trainers put it back
        self.torch_threads = torch.get_num_threads()
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(cfg.device)
        self.run_dir = run_folder_of(cfg) or Path(f"runs/{cfg.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.ckpt_dir = self.run_dir / "ckpt"

        probe = make_env(cfg.env, num_envs=1, seed=cfg.seed)
        try:  # an action space the algorithm does not support stops the run here, in one line
            self.action_space = env_action_space(probe)  # what the model is built for, and declares
            check_action_space(cfg.algo.name, self.action_space, f"env.id={cfg.env.id!r}")
            self.observation_shape = tuple(probe.observation_spec["observation"].shape[len(probe.batch_size):])
            # workers build their models from self.action_space; num_actions stays for discrete envs' readers
            self.num_actions = self.action_space.num_actions if self.action_space.is_discrete else None
        finally:
            probe.close()
        reclaim_torch_threads(self.torch_threads)
        try:
            model = build_model(cfg, self.observation_shape, self.action_space)
        except ValueError as err:  # e.g. a ResNet for vector observations
            raise ConfigError(f"config key 'model.kind' is {cfg.model.kind!r}, which does not fit env.id="
                              f"{cfg.env.id!r} (observations of shape {self.observation_shape}): {err}") from None
        self.buffer = build_buffer(cfg, action_space=self.action_space)
        self.learner = Learner(model, self.buffer, cfg, self.device)
        self.env_steps = 0
        self.episodes = 0
        self.best_return = float("-inf")
        self.best_version: int | None = None
        self.evaluated_versions: list[int] = []  # in the order their scores arrived
        self.stop_reason: str | None = None
        # how many updates old the newest collected data is when the learner steps (see note_collected)
        self.newest_version: int | None = None
        self.newest_age_sum = 0
        self.newest_age_updates = 0
        wall_offset = 0.0
        if resume_state is not None:  # a checkpoint that does not fit stops here, before anything is written
            wall_offset = self._resume(resume_state)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = RunMetrics(
            self.run_dir, cfg.logger.backend, cfg.logger.project, cfg.logger.progress_bar, cfg.train.total_env_steps
        )
        self.metrics.wall_offset = wall_offset
        atomic_write_json(self.run_dir / "config.json", config_to_dict(cfg))
        # which engine the acting searches use, said once here and kept in summary.json
        self.search_engine = probe_search_engine(cfg, self.learner.model, self.observation_shape, self.acting_device())
        print(f"torchrl_muzero: search engine: {self.search_engine} (mcts.backend={cfg.mcts.backend})")

    def acting_device(self) -> torch.device:
        """Where the run's acting searches run (the async trainers' collectors override it)."""
        return self.device

    # -- checkpoints ------------------------------------------------------
    def _counters(self) -> dict:
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "train_iter": self.learner.train_iter,
            "wall_s": self.metrics.wall(),
            "best_return": self.best_return,
            "best_version": self.best_version,
            "newest_data_age_mean": self.newest_data_age_mean(),
        }

    def save(self, with_buffer: bool | None = None) -> Path:
        """Write ``ckpt/last.pt`` (and the buffer to ``ckpt/buffer.pt`` when configured)."""
        state = {**self.learner.state_dict(), "counters": self._counters(), "config": config_to_dict(self.cfg)}
        path = save_checkpoint(self.ckpt_dir / "last.pt", state)
        if with_buffer if with_buffer is not None else self.cfg.buffer.save_with_checkpoint:
            self.buffer.save(self.ckpt_dir / "buffer.pt")
        return path

    def model_snapshot(self) -> dict:
        """A private CPU copy of the learner's weights (what evaluations score and checkpoints keep)."""
        return {k: v.detach().cpu().clone() for k, v in self.learner.model.state_dict().items()}

    def save_evaluated(self, version: int, model_state: dict, mean_return: float) -> Path:
        """Save the exact weights an evaluation scored, as ``ckpt/model_v{version}.pt``.

        The best version's weights also go to ``ckpt/best.pt``. Of the
        ``model_v*.pt`` files, those of the last ``train.keep_eval_checkpoints``
        evaluations and of the best version are kept (a long run evaluates
        thousands of times). A version still being evaluated has no file yet,
        so it is never among those deleted.
        """
        state = {"model": model_state, "counters": {**self._counters(), "policy_version": version,
                                                    "mean_return": mean_return},
                 "config": config_to_dict(self.cfg)}
        path = save_checkpoint(self._evaluated_path(version), state)
        if mean_return > self.best_return:
            self.best_return, self.best_version = mean_return, version
            state["counters"].update(best_return=mean_return, best_version=version)
            save_checkpoint(self.ckpt_dir / "best.pt", state)
        self.evaluated_versions.append(version)
        self._prune_evaluated()
        return path

    def _evaluated_path(self, version: int) -> Path:
        return self.ckpt_dir / f"model_v{version}.pt"

    def _prune_evaluated(self) -> None:
        n = self.cfg.train.keep_eval_checkpoints
        recent = self.evaluated_versions[-n:] if n else []
        keep = set(recent) | {self.best_version}
        for version in self.evaluated_versions:
            if version not in keep:
                self._evaluated_path(version).unlink(missing_ok=True)
        self.evaluated_versions = [v for v in self.evaluated_versions if v in keep]

    def _resume(self, state: dict) -> float:
        """Load a checkpoint read by ``check_run_targets``; returns the wall time already spent."""
        path = latest_checkpoint(self.run_dir)
        try:
            self.learner.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit this run's model: "
                                  f"{_config_difference(state.get('config', {}), config_to_dict(self.cfg), err)}"
                                  ) from err
        counters = state["counters"]
        self.env_steps = int(counters["env_steps"])
        self.episodes = int(counters.get("episodes", 0))
        self.best_return = float(counters.get("best_return", float("-inf")))
        self.best_version = counters.get("best_version")
        # the evaluated versions on disk, oldest first, join the retention window
        self.evaluated_versions = sorted(int(p.stem[len("model_v"):]) for p in self.ckpt_dir.glob("model_v*.pt")
                                         if p.stem[len("model_v"):].isdigit())
        buffer_path = self.ckpt_dir / "buffer.pt"
        if buffer_path.exists():
            try:
                self.buffer.load(buffer_path)  # checks all of the file before it changes the buffer
            except ValueError as err:  # corrupt, another layout, a pickled object: one line, nothing started
                raise CheckpointError(f"{err} (delete it to resume with an empty buffer)") from None
            # the new collectors number their trajectories from 0 again
            self.buffer.end_running_trajectories()
        print(f"torchrl_muzero: resumed {self.run_dir} at {self.env_steps} env steps, "
              f"train step {self.learner.train_iter}, buffer {len(self.buffer)} transitions")
        return float(counters.get("wall_s", 0.0))

    # -- stop rules -------------------------------------------------------
    def should_stop(self) -> bool:
        """A safe point (a recorded Ctrl-C / SIGTERM is raised here), then the configured stop rules."""
        self.stop_signals.check()
        t = self.cfg.train
        if self.env_steps >= t.total_env_steps:
            self.stop_reason = f"reached train.total_env_steps={t.total_env_steps}"
        elif t.max_wall_time_s and self.metrics.wall() >= t.max_wall_time_s:
            self.stop_reason = f"reached train.max_wall_time_s={t.max_wall_time_s}"
        elif t.stop_return and self.best_return >= t.stop_return:
            self.stop_reason = f"an evaluation reached train.stop_return={t.stop_return}"
        return self.stop_reason is not None

    def train_budget_ready(self) -> bool:
        return self.env_steps >= self.cfg.train.train_start_after_envsteps and len(self.buffer) > 0

    def note_collected(self, versions) -> None:
        """Record the policy versions (``train_iter`` values) of a batch that just entered the buffer.

        Every update then measures the *freshness* of the data it trains on: its
        ``train_iter`` minus the newest version in the buffer. The sync pipeline's is
        ``0 .. frames * replay_ratio - 1``; an async pipeline whose collectors run
        ahead of a slow learner trains on older data at the same policy lag (which is
        measured when an action is chosen, not when its data is trained on).
        """
        newest = int(versions.max())
        self.newest_version = newest if self.newest_version is None else max(self.newest_version, newest)

    def newest_data_age_mean(self) -> float:
        """Mean over updates of ``train_iter`` minus the newest collected version (see note_collected)."""
        return self.newest_age_sum / max(self.newest_age_updates, 1)

    def after_train_step(self, metrics: dict) -> None:
        it = self.learner.train_iter
        if self.newest_version is not None:  # the update just made ran at train_iter it - 1
            age = max(it - 1 - self.newest_version, 0)
            self.newest_age_sum += age
            self.newest_age_updates += 1
            metrics = {**metrics, "newest_data_age": float(age)}
        if it % self.cfg.logger.log_interval == 0:
            self.metrics.log(self.env_steps, {f"train/{k}": v for k, v in metrics.items()})
            self.metrics.log(self.env_steps, {"train/train_iter": it, "buffer/size": len(self.buffer),
                                              "time/env_steps_per_s": self.env_steps / max(self.metrics.wall(), 1e-6),
                                              "time/updates_per_s": it / max(self.metrics.wall(), 1e-6)})
        if it % self.cfg.async_pipeline.buffer_stats_interval == 0:
            self.metrics.log(self.env_steps, {"buffer/transitions": len(self.buffer),
                                              "buffer/sampleable": self.buffer.num_sampleable,
                                              "buffer/megabytes": self.buffer.nbytes() / 2**20,
                                              "buffer/beta": self.buffer.current_beta})
        if self.cfg.train.checkpoint_interval and it % self.cfg.train.checkpoint_interval == 0:
            self.save(with_buffer=False)

    # -- the run ----------------------------------------------------------
    def _loop(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        pass

    @staticmethod
    def _close_each(closes: list, timeout_s: float) -> None:
        """Run each ``(name, close)`` of ``closes`` in order, each within ``timeout_s`` (:func:`call_within`)
        and whatever the others did; print one line naming what failed or got stuck.

        The subclasses' :meth:`_shutdown` calls it with their components (collector, evaluators, weight
        scheme, eval env; ``close`` ``None`` is skipped). Why: the final checkpoint is written after the
        shutdown, so one stuck or failing close must neither hang the run nor keep the other closes or
        the checkpoint from happening; a stuck one is reported with its thread's stack.
        """
        errors = []
        for name, close in closes:
            if close is None:
                continue
            try:
                stuck = call_within(close, timeout_s, f"the {name} shutdown")
                if stuck:
                    errors.append(stuck)
            except Exception as err:  # keep shutting the others down
                errors.append(f"{name}: {err}")
        if errors:
            print("torchrl_muzero: errors while shutting down: " + "; ".join(errors))

    def run(self) -> dict:
        """Train until a stop rule fires; return a summary dict.

        Ctrl-C or SIGTERM stops cleanly with a final checkpoint; a NaN loss stops
        without overwriting the last good checkpoint; a dead worker stops
        the run within seconds. Every process is shut down in all cases.
        ``summary["status"]`` says which way the run ended and
        ``summary["exit_code"]`` the exit status the scripts end with
        (:data:`EXIT_CODES`).
        """
        # Ctrl-C and SIGTERM end the run at its next safe point (stop_signals.py): the final checkpoint
        # holds an untorn state and the shutdown starts from one; a signal during the shutdown or the
        # save is recorded, not raised (a second one stops at once). Main thread only (Python's rule).
        with self.stop_signals.installed():
            status = self._run_loop_and_shut_down()
            if status in ("ok", "interrupted", "terminated"):
                self.save()
            self.metrics.close()
            summary = {"status": status, "exit_code": EXIT_CODES[status], "reason": self.stop_reason,
                       **self._counters(), "run_dir": str(self.run_dir), "search_engine": self.search_engine}
            atomic_write_json(self.run_dir / "summary.json", summary)
        msg = f"torchrl_muzero: run stopped ({status}): {self.stop_reason}. Run folder: {self.run_dir}"
        if status == "nan":
            msg += f"; last good checkpoint: {self.ckpt_dir / 'last.pt'}"
        print(msg)
        return summary

    def _stopped_by_signal(self, interrupted: bool, then: str | None = None) -> str:
        status = "interrupted" if interrupted else "terminated"
        self.stop_reason = "interrupted by Ctrl-C" if interrupted else "terminated by SIGTERM"
        if then:
            self.stop_reason += f" (then: {then})"
        print(f"\ntorchrl_muzero: {'interrupted' if interrupted else 'terminated (SIGTERM)'}, "
              "writing a final checkpoint ...")
        return status

    def _run_loop_and_shut_down(self) -> str:
        """:meth:`_loop`, then :meth:`_shutdown` whichever way it ended; returns the run's status."""
        status = "ok"
        try:
            try:
                self._loop()
            except Exception as err:  # a stop signal that came back wrapped by a C extension
                stop = _stop_signal_behind(err)
                if stop is None:
                    raise
                raise stop from err
        except KeyboardInterrupt:
            status = self._stopped_by_signal(interrupted=True)
        except Terminated:
            status = self._stopped_by_signal(interrupted=False)
        except NonFiniteLossError as err:
            status = "nan"
            self.stop_reason = str(err)
        except TrainingStopped as err:
            if self.stop_signals.received is None:
                status = "fault"
                self.stop_reason = str(err)
            else:  # the signal reached the workers too (a terminal's Ctrl-C goes to the whole process
                # group, a scheduler's SIGTERM to the whole job) and they stopped before the driver's
                # next safe point: the run ends as the signal asks
                status = self._stopped_by_signal(interrupted=self.stop_signals.received == signal.SIGINT,
                                                 then=str(err))
        finally:
            self._shutdown()
        return status


def _config_difference(saved: dict, current: dict, err: Exception) -> str:
    """Which model-shaping keys differ between a checkpoint's config and this run's (else torch's error)."""
    diffs = []
    for section in ("env", "model", "loss"):
        old, new = saved.get(section, {}), current.get(section, {})
        for key in new:
            if key in old and old[key] != new[key] and (section != "env" or key in ("id", "frame_stack",
                                                                               "screen_size", "grayscale")):
                diffs.append(f"{section}.{key}={old[key]!r} (this run: {new[key]!r})")
    if diffs:
        return "it was written with " + ", ".join(diffs) + "."
    return str(err).strip().splitlines()[0]
