"""A tiny Pong configuration end to end through the async pipeline, in bounded time."""
import time
from pathlib import Path

import pytest

from pipeline_utils import live_descendants, tiny_pong_overrides
from torchrl_muzero.trainers import AsyncTrainer
from torchrl_muzero.trainers.checkpoint import load_checkpoint
from torchrl_muzero.trainers.hydra_entry import compose_config

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")


@pytest.mark.timeout(300)
def test_tiny_pong_async_end_to_end(tmp_path):
    cfg = compose_config(CONFIG_DIR, tiny_pong_overrides(tmp_path))
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
