"""One harness for the pipeline benchmarks: run a trainer once, time it, report the same figures.

Both trainers call ``learner.step()`` once per update and ``buffer.extend()``
once per collected batch, in the driver process; the harness times both and
reports whole-run and steady-state rates (see :func:`steady_state`).
"""
from __future__ import annotations

import time

import torch

from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer


def build_trainer(pipeline: str, cfg, threads: int | None = None):
    """``"sync..."`` -> :class:`SyncTrainer` (evaluation off), anything else -> :class:`AsyncTrainer`.

    ``threads``: torch threads the trainer is built with (it keeps them); ``None`` leaves the count.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    sync = pipeline.startswith("sync")
    trainer = (SyncTrainer if sync else AsyncTrainer)(cfg)
    if sync:
        trainer._evaluate = lambda: 0.0  # evaluation off: SyncTrainer evaluates once more at the end
    return trainer


def steady_state(updates: list, batches: list, replay_ratio: float) -> dict:
    """Rates once both stages run: from the first update to the first update after the last batch.

    Leaves out start-up (worker spawn, the cold start before ``train_start_after_envsteps``) and,
    for async, the queued budget trained after collection ended. Env steps/s is counted from the
    updates done in that window (``updates / replay_ratio``), so queued-but-untrained batches count
    for nothing.
    """
    if len(updates) < 2 or not batches or replay_ratio <= 0:
        return {}
    t0, last_batch = updates[0][0], batches[-1][0]
    ends = [s for s, _, _ in updates if s >= last_batch]
    t1 = ends[0] if ends else updates[-1][1]
    n = sum(1 for s, _, _ in updates if t0 <= s < t1)
    span = t1 - t0
    return dict(steady_s=round(span, 1), steady_updates=n, steady_updates_per_s=round(n / span, 3),
                steady_env_steps_per_s=round(n / replay_ratio / span, 2),
                steady_learner_busy=round(sum(min(e, t1) - s for s, e, _ in updates if t0 <= s < t1) / span, 3))


def run_pipeline_benchmark(benchmark, trainer) -> dict:
    """Run ``trainer`` once under pytest-benchmark; return (and attach to the benchmark) its figures."""
    cfg = trainer.cfg
    steps, batches = [], []  # (start, end, env_steps at start), (time, env_steps before)
    inner_step, inner_extend = trainer.learner.step, trainer.buffer.extend

    def timed_step(**kwargs):
        t0 = time.monotonic()
        out = inner_step(**kwargs)
        steps.append((t0, time.monotonic(), trainer.env_steps))
        return out

    def timed_extend(batch):
        batches.append((time.monotonic(), trainer.env_steps))
        return inner_extend(batch)

    trainer.learner.step, trainer.buffer.extend = timed_step, timed_extend
    result = {}

    def run():
        t0 = time.monotonic()
        result.update(trainer.run())
        result["wall"] = time.monotonic() - t0

    benchmark.pedantic(run, rounds=1, iterations=1)
    assert result["status"] == "ok", result
    assert steps or cfg.train.replay_ratio == 0, "no update ran"
    wall, n = result["wall"], result["train_iter"]
    start = cfg.train.train_start_after_envsteps
    info = dict(
        env_steps=result["env_steps"], wall_s=round(wall, 1),
        env_steps_per_s=round(result["env_steps"] / wall, 2),
        updates=n, updates_per_s=round(n / wall, 3),
        realized_replay_ratio=round(n / max(result["env_steps"] - start + cfg.train.frames_per_batch, 1), 4),
        learner_busy_fraction=round(sum(e - s for s, e, _ in steps) / wall, 3),
        learner_threads_mean=round(result.get("learner_threads_mean", trainer.torch_threads), 2),
        policy_lag_max=result.get("policy_lag_max", 0), policy_lag_mean=round(result.get("policy_lag_mean", 0.0), 2),
        **steady_state(steps, batches, cfg.train.replay_ratio),
    )
    if cfg.train.replay_ratio == 0 and len(batches) > 1:  # collection alone: from the first batch on
        info["steady_env_steps_per_s"] = round((batches[-1][1] - batches[0][1]) / (batches[-1][0] - batches[0][0]), 2)
    benchmark.extra_info.update(info)
    return info
