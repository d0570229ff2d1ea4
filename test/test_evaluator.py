"""Evaluators stop when told: between two env steps in-process, and within a short grace as processes."""
import os
import signal
import time

import pytest
import torch

from torchrl_muzero.envs import make_env
from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.trainers.config import EnvConfig, config_to_dict, load_config
from torchrl_muzero.trainers.evaluation import EvaluationCancelled, evaluate
from torchrl_muzero.trainers.evaluator import EvaluatorPool


def test_evaluate_abandons_the_episodes_when_asked_between_steps():
    torch.manual_seed(0)
    model = MuZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16, zero_init_heads=False)
    env = make_env(EnvConfig(), num_envs=2, seed=0, training=False)
    asked = []

    def should_stop() -> bool:
        asked.append(len(asked))
        return len(asked) > 3  # three steps played, stop before the fourth

    with pytest.raises(EvaluationCancelled):
        evaluate(model, env, MCTSConfig(num_simulations=2), should_stop=should_stop)
    assert len(asked) == 4
    # never asked to stop: the same call plays its episodes to the end
    returns = evaluate(model, env, MCTSConfig(num_simulations=2), should_stop=lambda: False)
    assert len(returns) == 2 and min(returns) >= 1.0


def _pool(tmp_path) -> EvaluatorPool:
    # not niced (actor_niceness 0): these tests are about stopping, and a niced evaluator on a loaded
    # machine spends most of a test starting up
    cfg = load_config({"run_dir": str(tmp_path), "eval": {"num_episodes": 1},
                       "mcts": {"num_simulations": 2}, "model": {"latent_dim": 16, "hidden_dim": 16},
                       "async_pipeline": {"actor_niceness": 0}})
    return EvaluatorPool(config_to_dict(cfg), (4,), 2)


def _weights() -> dict:
    torch.manual_seed(0)
    return MuZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16).state_dict()


def _score_once(pool: EvaluatorPool) -> list:
    """One evaluation end to end: the evaluator is up and idle afterwards."""
    pool.submit(version=0, weights=_weights())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        results = pool.poll()
        if results:
            return results
        time.sleep(0.1)
    raise AssertionError("the evaluator gave no result within 120 s")


def test_an_idle_evaluator_exits_by_itself_at_shutdown(tmp_path):
    pool = _pool(tmp_path)
    (result,) = _score_once(pool)
    assert result.version == 0 and len(result.returns) == 1
    # a long grace: on a loaded machine a niced evaluator needs seconds just to exit
    pool.shutdown(timeout_s=60.0, grace_s=60.0)
    assert [p.exitcode for p in pool.procs] == [0]  # it left its loop, not killed


def test_shutdown_kills_an_evaluator_that_cannot_answer(tmp_path):
    pool = _pool(tmp_path)
    _score_once(pool)
    (proc,) = pool.procs
    os.kill(proc.pid, signal.SIGSTOP)  # a stuck (or starved, at actor_niceness) evaluator
    started = time.monotonic()
    pool.shutdown(timeout_s=30.0)
    took = time.monotonic() - started
    assert not proc.is_alive() and proc.exitcode == -signal.SIGKILL
    assert took < 10.0, took  # the 2 s grace and a kill, never the 30 s timeout
