"""Pong collection env steps/s: ``SerialEnv``, ``ParallelEnv``, the guarded AsyncEnvPool stepped as a batch, and ready.

The shipped Pong env (``env=Pong``: ``ALE/Pong-v5``, sticky actions, ALE frame
skip 4, grayscale 96x96 stacked by 4, ``RewardSum``) with its 8 games per
collector, batched by ``SerialEnv`` (in-process), ``ParallelEnv`` (one process
per game) or ``GuardedAsyncEnvPool`` (torchrl's ``AsyncEnvPool``,
multiprocessing backend, shared-memory exchange, one process per game). The
first three are stepped as a batch by a torchrl ``Collector`` with no policy
(random actions from the action spec: the env is what is measured); ``ready``
is the same guarded pool under :class:`ReadyStepCollector` (what
``env.pool=async`` runs), which steps the games that are ready, with a policy
that draws random actions for those rows. 400 frames per collect (the
shipped ``train.frames_per_batch``: 50 steps of the 8 games).

The four collectors are built first (workers started, first batch
discarded), then their collects are interleaved round by round, so the four
see the same machine load; each round times one collect of each. Reports
per-pool env steps/s (``extra_info``) and the ratios to ``SerialEnv``.

Run (figures in docs/performance_pipeline.md, "Pong env pools"):
    python -m pytest benchmarks/test_env_pool_bench.py --benchmark-only \
        --benchmark-columns=mean,median,min,max,rounds -s
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

pytest.importorskip("ale_py")

from torchrl.collectors import Collector  # noqa: E402

from torchrl_muzero.envs import make_env  # noqa: E402
from torchrl_muzero.trainers.ready_collector import ReadyStepCollector  # noqa: E402
from torchrl_muzero.trainers.hydra_entry import compose_config  # noqa: E402

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
POOLS = ("serial", "parallel", "async", "ready")  # "ready": the async pool under ReadyStepCollector
FRAMES = 400  # per collect: the shipped Pong frames_per_batch
ROUNDS = 8


class _RandomRows:
    """Random actions for whichever rows the collector hands in (the games that are ready)."""

    def __init__(self, action_spec) -> None:
        self.spec = action_spec[0]  # one game's

    def __call__(self, td):
        td.set("action", self.spec.rand(td.shape))
        return td


def _collector(pool: str):
    cfg = compose_config(CONFIG_DIR, ["env=Pong", f"env.pool={'async' if pool == 'ready' else pool}"])
    env = make_env(cfg.env, seed=0)
    if pool == "ready":
        collector = ReadyStepCollector(env, _RandomRows(env.action_spec), frames_per_batch=FRAMES, total_frames=-1)
    else:
        collector = Collector(env, policy=None, frames_per_batch=FRAMES, total_frames=-1)
    batches = iter(collector)
    next(batches)  # workers started, first reset and batch: not measured
    return collector, batches


@pytest.mark.timeout(1800)
def test_pong_collection_env_pools_side_by_side(benchmark):
    load_start = os.getloadavg()
    collectors = {pool: _collector(pool) for pool in POOLS}
    seconds: dict[str, list[float]] = {pool: [] for pool in POOLS}

    def one_round():
        for pool in POOLS:
            start = time.perf_counter()
            batch = next(collectors[pool][1])
            seconds[pool].append(time.perf_counter() - start)
            assert batch.numel() == FRAMES

    try:
        benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    finally:
        for collector, _ in collectors.values():
            collector.shutdown()
    rates = {pool: FRAMES / statistics.median(s) for pool, s in seconds.items()}
    for pool in POOLS:
        benchmark.extra_info[f"{pool}_env_steps_per_s_median"] = round(rates[pool], 1)
        benchmark.extra_info[f"{pool}_env_steps_per_s_min_max"] = (
            round(FRAMES / max(seconds[pool]), 1), round(FRAMES / min(seconds[pool]), 1))
        benchmark.extra_info[f"{pool}_vs_serial"] = round(rates[pool] / rates["serial"], 2)
    benchmark.extra_info["load_average_start_end"] = (load_start, os.getloadavg())
    print(f"\nload average (1, 5, 15 min) at the start: {load_start}, at the end: {os.getloadavg()}")
    print("Pong collection, 8 games, 400 frames per collect, median env steps/s (ratio to serial):")
    for pool in POOLS:
        lo, hi = benchmark.extra_info[f"{pool}_env_steps_per_s_min_max"]
        print(f"  {pool:>8}: {rates[pool]:7.1f}  ({rates[pool] / rates['serial']:.2f}x)  min-max {lo}-{hi}")
