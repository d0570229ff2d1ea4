"""Async vs sync pipeline throughput on CartPole at the same replay ratio.

Each case trains the shipped CartPole config (hydra composition of the real
script's config) for a fixed number of env steps, evaluation off, and reports
env steps/s over the whole run (start-up excluded), the policy lag seen in the
data and the fraction of wall time the learner was updating (async).

Run: python -m pytest benchmarks/test_pipeline_bench.py --benchmark-only
     --benchmark-columns=mean,rounds -s
"""
import time
from pathlib import Path

import pytest

from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer
from torchrl_muzero.trainers.hydra_entry import compose_config

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
STEPS = 6144

CASES = {
    # the shipped CartPole settings: 16 simulations, replay ratio 0.25
    "cartpole-default": [],
    # a heavier search
    "cartpole-50sims": ["mcts.num_simulations=50"],
    # publishing every 10 updates instead of every update
    "cartpole-sync10": ["async_pipeline.weight_sync_interval=10"],
}


def _config(run_dir, extra):
    return compose_config(CONFIG_DIR, [
        f"run_dir={run_dir}", "logger.progress_bar=false", "logger.backend=none",
        f"train.total_env_steps={STEPS}", "train.train_start_after_envsteps=512", "train.stop_return=0",
        "train.max_wall_time_s=0", "eval.interval=1000000", "async_pipeline.num_evaluator_actors=0",
        *extra])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_pipeline_env_steps_per_s(benchmark, tmp_path, case, pipeline, all_cores):
    trainer = (AsyncTrainer if pipeline == "async" else SyncTrainer)(_config(tmp_path, CASES[case]))
    result = {}

    def run():
        t0 = time.monotonic()
        result.update(trainer.run())
        result["wall"] = time.monotonic() - t0

    benchmark.pedantic(run, rounds=1, iterations=1)
    assert result["status"] == "ok", result
    rate = result["env_steps"] / result["wall"]
    benchmark.extra_info.update(env_steps_per_s=round(rate, 1), updates=result["train_iter"],
                                updates_per_s=round(result["train_iter"] / result["wall"], 1),
                                policy_lag_max=result.get("policy_lag_max", 0),
                                policy_lag_mean=round(result.get("policy_lag_mean", 0.0), 2),
                                learner_busy_fraction=round(result.get("learner_busy_fraction", 0.0), 2),
                                learner_threads_mean=round(result.get("learner_threads_mean", all_cores), 2),
                                torch_threads=all_cores)
    print(f"\n{pipeline} {case}: {rate:.1f} env steps/s, {benchmark.extra_info}")
