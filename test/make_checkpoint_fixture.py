"""Freeze a run folder written by today's checkpoint format (test/fixtures/checkpoint_v1/).

test_checkpoint_files.py loads it with every later version of the code: a
checkpoint a user has on disk keeps loading (weights-only) and resuming.
Made with the code of commit 0b5a955 (before checkpoints were read with
``weights_only=True``); regenerate only for an intended format change, and
keep the old folder beside the new one: ``python test/make_checkpoint_fixture.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "fixtures", "checkpoint_v1")

#: a tiny CartPole run: small networks and heads keep the files ~0.3 MB together
CONFIG = {
    "model": {"latent_dim": 16, "hidden_dim": 16}, "optim": {"batch_size": 16},
    "loss": {"projection_dim": 16, "projection_hidden_dim": 16, "prediction_hidden_dim": 8},
    "train": {"total_env_steps": 256, "train_start_after_envsteps": 64, "frames_per_batch": 64,
              "checkpoint_interval": 0, "keep_eval_checkpoints": 0},
    "buffer": {"capacity": 1000, "save_with_checkpoint": True}, "eval": {"num_episodes": 1, "interval": 20},
    "mcts": {"num_simulations": 4}, "logger": {"backend": "none", "progress_bar": False},
    "async_pipeline": {"enabled": False}, "seed": 0,
}


def weights_digest(model_state: dict) -> dict:
    """Per tensor: its shape and the sum of its values (what the test compares after a load)."""
    return {k: [list(v.shape), float(v.double().sum())] for k, v in model_state.items()}


def main() -> None:
    from torchrl_muzero.trainers import SyncTrainer

    run_dir = tempfile.mkdtemp(prefix="checkpoint_fixture_")
    summary = SyncTrainer({**CONFIG, "run_dir": run_dir}).run()
    shutil.rmtree(FOLDER, ignore_errors=True)
    os.makedirs(os.path.join(FOLDER, "ckpt"))
    shutil.copy(os.path.join(run_dir, "config.json"), FOLDER)
    for name in ("last.pt", "best.pt", "buffer.pt"):
        shutil.copy(os.path.join(run_dir, "ckpt", name), os.path.join(FOLDER, "ckpt", name))
    last = torch.load(os.path.join(FOLDER, "ckpt", "last.pt"), weights_only=False)
    expected = {"env_steps": summary["env_steps"], "train_iter": summary["train_iter"],
                "model": weights_digest(last["model"])}
    with open(os.path.join(FOLDER, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    shutil.rmtree(run_dir)
    print(f"wrote {FOLDER}")


if __name__ == "__main__":
    main()
