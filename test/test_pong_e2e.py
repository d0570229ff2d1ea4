"""A tiny Pong configuration end to end through the async pipeline, in bounded time."""
import time
from pathlib import Path

import pytest

from pipeline_utils import live_descendants
from torchrl_muzero.trainers import AsyncTrainer
from torchrl_muzero.trainers.checkpoint import load_checkpoint
from torchrl_muzero.trainers.hydra_entry import compose_config

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")


@pytest.mark.timeout(300)
def test_tiny_pong_async_end_to_end(tmp_path):
    cfg = compose_config(CONFIG_DIR, [
        "env=Pong", f"run_dir={tmp_path}", "logger.progress_bar=false",
        "env.num_envs=2", "env.max_episode_steps=40", "env.noop_max=4",
        "model.channels=8", "mcts.num_simulations=3",
        "loss.projection_dim=16", "loss.projection_hidden_dim=16", "loss.prediction_hidden_dim=8",
        "optim.batch_size=8", "buffer.capacity=2000", "buffer.num_unroll_steps=2", "buffer.td_steps=3",
        "train.total_env_steps=192", "train.train_start_after_envsteps=64", "train.frames_per_batch=32",
        "train.replay_ratio=0.1", "train.checkpoint_interval=5", "eval.num_episodes=1", "eval.interval=4",
    ])
    assert cfg.model.kind == "resnet" and cfg.env.id == "ALE/Pong-v5" and cfg.model.value_support_size == 300
    t0 = time.monotonic()
    summary = AsyncTrainer(cfg).run()
    assert summary["status"] == "ok", summary
    assert summary["env_steps"] >= 192 and summary["train_iter"] > 0
    rows = (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]
    assert rows, "no evaluation came back"
    version = int(rows[-1].split(",")[3])
    assert load_checkpoint(tmp_path / "ckpt" / f"model_v{version}.pt")["counters"]["policy_version"] == version
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == summary["train_iter"]
    assert time.monotonic() - t0 < 240
    assert not live_descendants()
