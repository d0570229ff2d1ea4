"""What the sync and async trainers share: run folder, resume, checkpoints, stop rules, faults."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import torch

from torchrl_muzero.envs import env_spaces, make_env
from torchrl_muzero.trainers.builders import build_buffer, build_model, resolve_device
from torchrl_muzero.trainers.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from torchrl_muzero.trainers.config import TrainConfig, config_to_dict, load_config
from torchrl_muzero.trainers.learner import Learner, NonFiniteLossError
from torchrl_muzero.trainers.metrics import RunMetrics
from torchrl_muzero.trainers.torchrl_guards import reclaim_torch_threads

__all__ = ["TrainerBase", "TrainingStopped"]


class TrainingStopped(RuntimeError):
    """The run ended on a fault (dead worker, NaN loss, ...): the message says which."""


class _Terminated(BaseException):
    """SIGTERM (a scheduler, ``kill``, ``timeout``) arrived: stop like Ctrl-C does."""


def _raise_terminated(signum, frame):
    raise _Terminated()


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
            cfg = load_config(cfg)
        self.cfg = cfg
        # the thread count the run was started with; torchrl's envs and collectors change it
        # behind our back (torchrl_guards.reclaim_torch_threads), the trainers put it back
        self.torch_threads = torch.get_num_threads()
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(cfg.device)
        self.run_dir = Path(cfg.resume or cfg.run_dir or f"runs/{cfg.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir = self.run_dir / "ckpt"

        probe = make_env(cfg.env, num_envs=1, seed=cfg.seed)
        self.observation_shape, self.num_actions = env_spaces(probe)
        probe.close()
        reclaim_torch_threads(self.torch_threads)
        model = build_model(cfg, self.observation_shape, self.num_actions)
        self.buffer = build_buffer(cfg)
        self.learner = Learner(model, self.buffer, cfg, self.device)
        self.env_steps = 0
        self.episodes = 0
        self.metrics = RunMetrics(
            self.run_dir, cfg.logger.backend, cfg.logger.project, cfg.logger.progress_bar, cfg.train.total_env_steps
        )
        self.best_return = float("-inf")
        self.stop_reason: str | None = None
        if cfg.resume:
            self._resume()
        with open(self.run_dir / "config.json", "w") as f:
            json.dump(config_to_dict(cfg), f, indent=2)

    # -- checkpoints ------------------------------------------------------
    def _counters(self) -> dict:
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "train_iter": self.learner.train_iter,
            "wall_s": self.metrics.wall(),
            "best_return": self.best_return,
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
        """Save the exact weights an evaluation scored, as ``ckpt/model_v{version}.pt``."""
        state = {"model": model_state, "counters": {**self._counters(), "policy_version": version,
                                                    "mean_return": mean_return},
                 "config": config_to_dict(self.cfg)}
        path = save_checkpoint(self.ckpt_dir / f"model_v{version}.pt", state)
        if mean_return > self.best_return:
            self.best_return = mean_return
            save_checkpoint(self.ckpt_dir / "best.pt", state)
        return path

    def _resume(self) -> None:
        path = latest_checkpoint(self.run_dir)
        state = load_checkpoint(path, map_location=self.device)
        try:
            self.learner.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit this model/config: {err}") from err
        counters = state["counters"]
        self.env_steps = int(counters["env_steps"])
        self.episodes = int(counters.get("episodes", 0))
        self.best_return = float(counters.get("best_return", float("-inf")))
        self.metrics.wall_offset = float(counters.get("wall_s", 0.0))
        buffer_path = self.ckpt_dir / "buffer.pt"
        if buffer_path.exists():
            self.buffer.load(buffer_path)
            # the new collectors number their trajectories from 0 again
            self.buffer.end_running_trajectories()
        print(f"torchrl_muzero: resumed {self.run_dir} at {self.env_steps} env steps, "
              f"train step {self.learner.train_iter}, buffer {len(self.buffer)} transitions")

    # -- stop rules -------------------------------------------------------
    def should_stop(self) -> bool:
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

    def after_train_step(self, metrics: dict) -> None:
        it = self.learner.train_iter
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
        if it % self.cfg.train.checkpoint_interval == 0:
            self.save(with_buffer=False)

    # -- the run ----------------------------------------------------------
    def _loop(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        pass

    def run(self) -> dict:
        """Train until a stop rule fires; return a summary dict.

        Ctrl-C or SIGTERM stops cleanly with a final checkpoint; a NaN loss stops
        without overwriting the last good checkpoint; a dead worker stops
        the run within seconds. Every process is shut down in all cases.
        """
        status = "ok"
        # SIGTERM ends the run as cleanly as Ctrl-C (final checkpoint, every process stopped);
        # signal handlers can only be set from the main thread
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            self._loop()
        except KeyboardInterrupt:
            status = "interrupted"
            self.stop_reason = "interrupted by Ctrl-C"
            print("\ntorchrl_muzero: interrupted, writing a final checkpoint ...")
        except _Terminated:
            status = "interrupted"
            self.stop_reason = "terminated by SIGTERM"
            print("\ntorchrl_muzero: terminated (SIGTERM), writing a final checkpoint ...")
        except NonFiniteLossError as err:
            status = "nan"
            self.stop_reason = str(err)
        except TrainingStopped as err:
            status = "fault"
            self.stop_reason = str(err)
        finally:
            try:
                self._shutdown()
            finally:
                if previous is not None:
                    signal.signal(signal.SIGTERM, previous)
        if status in ("ok", "interrupted"):
            self.save()
        self.metrics.close()
        summary = {"status": status, "reason": self.stop_reason, **self._counters(), "run_dir": str(self.run_dir)}
        with open(self.run_dir / "summary.json", "w") as f:
            json.dump(summary, f, indent=2)
        msg = f"torchrl_muzero: run stopped ({status}): {self.stop_reason}. Run folder: {self.run_dir}"
        if status == "nan":
            msg += f"; last good checkpoint: {self.ckpt_dir / 'last.pt'}"
        print(msg)
        return summary
