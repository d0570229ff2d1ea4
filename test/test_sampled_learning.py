"""The sampled family learns: on a continuous task, the return rises from random play to near the optimum.

``env=Reach`` (torchrl_muzero/envs/reach.py): a target in [-1.5, 1.5] each step, a float action in [-2, 2],
reward -(action - target)^2, 8 steps. Random play scores about -17 an episode, the best action that ignores
the target -6, reading it 0. The untrained model's reward and value heads start at zero, so its search picks
among its candidates at random; after ~2,000 env steps the greedy evaluation must beat every policy that
ignores the target, which takes a learned reward model, a search that finds the good candidates among the
drawn ones, and a policy that learns to draw near them.
"""
import csv
import math

import pytest
import torch

from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.hydra_entry import compose_config
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "sota-implementations" / "muzero" / "config"


@pytest.mark.parametrize("algo", ["sampled_muzero", "sampled_efficientzero", "sampled_unizero"])
def test_the_sampled_family_learns_a_continuous_reach(tmp_path, algo):
    run_dir = tmp_path / algo
    cfg = compose_config(str(CONFIG_DIR), ["env=Reach", f"algo={algo}", f"run_dir={run_dir}",
                                           "train.total_env_steps=2048", "logger.progress_bar=false",
                                           "eval.interval=50", "seed=1"])
    torch.manual_seed(1)
    summary = SyncTrainer(cfg).run()
    assert summary["status"] == "ok", summary
    with open(run_dir / "eval.csv") as f:
        returns = [float(row["mean_return"]) for row in csv.DictReader(f)]
    assert len(returns) >= 4 and all(math.isfinite(r) for r in returns)
    # the best policy that ignores the target scores -6; random play ~-17
    assert max(returns[-3:]) > -4.5, returns


def test_a_board_game_with_fewer_samples_than_actions_end_to_end(tmp_path):
    """TicTacToe (9 actions, illegal ones masked, two players) searched over K = 4 drawn legal actions: the run
    trains, and every stored step's action is one of its root's candidates and was legal there."""
    cfg = compose_config(str(CONFIG_DIR), ["env=TicTacToe", "algo=sampled_muzero", "algo.num_samples=4",
                                           f"run_dir={tmp_path / 'ttt'}", "train.total_env_steps=512",
                                           "train.train_start_after_envsteps=128", "train.frames_per_batch=64",
                                           "optim.batch_size=32", "mcts.num_simulations=8",
                                           "logger.progress_bar=false"])
    trainer = SyncTrainer(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok" and summary["train_iter"] > 0, summary
    rows = trainer.buffer[torch.arange(len(trainer.buffer))]
    step = rows["search_policy"].sum(-1) > 0  # rows where a search ran (not an episode's last observation)
    action, candidates = rows["action"][step], rows["root", "candidates"][step]
    legal = rows["action_mask"][step]
    assert candidates.shape[-1] == 4 and bool((candidates >= 0).all() and (candidates < 9).all())
    assert bool((candidates == action[:, None]).any(-1).all())
    assert bool(legal[torch.arange(len(action)), action].all())
