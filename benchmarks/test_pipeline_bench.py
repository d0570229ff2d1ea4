"""Async vs sync pipeline throughput on CartPole at the same replay ratio.

Each case trains the shipped CartPole config (hydra composition of the real
script's config) for a fixed number of env steps, evaluation off, torch on every
core, and reports (benchmarks/pipeline_harness.py, as the Pong benchmark) env
steps/s over the whole run (trainer construction excluded) and in the steady
state, the policy lag seen in the data, the learner's busy fraction and threads.

Run: python -m pytest benchmarks/test_pipeline_bench.py --benchmark-only
     --benchmark-columns=mean,rounds -s
"""
from pathlib import Path

import pytest
from pipeline_harness import build_trainer, run_pipeline_benchmark

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
    info = run_pipeline_benchmark(benchmark, build_trainer(pipeline, _config(tmp_path, CASES[case])))
    print(f"\n{pipeline} {case}: {info}")
