"""Learning tests: the pipelines must raise CartPole's return clearly above random.

A uniformly random CartPole-v1 policy averages about 22. These runs use the
shipped CartPole config (hydra composition of the real script's config) with
a short budget, and stop early once an evaluation passes the bar.
"""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore

from pipeline_utils import live_descendants
from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer, load_config
from torchrl_muzero.trainers.config import TrainConfig

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
RANDOM_RETURN = 22.0


def _cartpole_config(run_dir, *overrides):
    ConfigStore.instance().store(name="base_config", node=TrainConfig)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"run_dir={run_dir}", "logger.progress_bar=false",
                                                        *overrides])
    return load_config(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("trainer_cls", [AsyncTrainer, SyncTrainer])
def test_cartpole_return_rises_well_above_random(tmp_path, trainer_cls):
    cfg = _cartpole_config(tmp_path, "train.max_wall_time_s=150", "train.stop_return=150",
                           "eval.interval=150", "eval.num_episodes=4")
    summary = trainer_cls(cfg).run()
    assert summary["status"] == "ok", summary
    rows = [line.split(",") for line in (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]]
    returns = [float(r[4]) for r in rows]
    assert returns, "no evaluation ran"
    assert max(returns) >= 5 * RANDOM_RETURN, (trainer_cls.__name__, returns)
    assert json.loads((tmp_path / "summary.json").read_text())["best_return"] == max(returns)
    assert not live_descendants()
