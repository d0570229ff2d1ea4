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


@pytest.mark.parametrize("algo", ["sampled_muzero", "sampled_efficientzero"])
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
