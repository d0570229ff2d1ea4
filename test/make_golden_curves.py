"""Freeze today's seeded sync training runs, one per algorithm (test/fixtures/golden_curves.json).

The sync trainer is deterministic given its seed (one process, its own
generators), so a refactor that means to change no behaviour (issue 38: action
spaces, slots, the policy as a distribution, the replay payload) must give the
same runs bit for bit: the same evaluation returns, the same losses and the
same final weights. ``test_golden_curves.py`` reruns them. Regenerate only for
an intended change of what training does: ``python test/make_golden_curves.py``.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "golden_curves.json")
ALGOS = ("muzero", "efficientzero", "gumbel_muzero", "stochastic_muzero", "unizero")


def config(algo: str, run_dir: str) -> dict:
    """A CartPole run of a few seconds that trains (~60 updates) and evaluates four times."""
    cfg = {
        "run_dir": run_dir, "seed": 3, "algo": {"name": algo},
        "env": {"num_envs": 4},
        "model": {"latent_dim": 16, "hidden_dim": 16},
        "loss": {"projection_dim": 16, "projection_hidden_dim": 16, "prediction_hidden_dim": 8},
        "mcts": {"num_simulations": 6},
        "optim": {"batch_size": 16},
        "buffer": {"capacity": 4000, "num_unroll_steps": 3, "td_steps": 5, "save_with_checkpoint": False},
        "train": {"total_env_steps": 384, "train_start_after_envsteps": 128, "frames_per_batch": 64,
                  "replay_ratio": 0.25, "checkpoint_interval": 0, "keep_eval_checkpoints": 0},
        "eval": {"num_episodes": 2, "interval": 16},
        "logger": {"backend": "csv", "progress_bar": False, "log_interval": 8},
        "async_pipeline": {"enabled": False},
    }
    if algo == "unizero":
        cfg["algo"].update(embed_dim=16, num_layers=1, context_length=2, max_blocks=6)
    return cfg


def run(algo: str) -> dict:
    """One run's record: evaluation returns, logged losses, and a hash of the final weights."""
    from torchrl_muzero.trainers import SyncTrainer

    run_dir = tempfile.mkdtemp(prefix=f"golden_{algo}_")
    trainer = SyncTrainer(config(algo, run_dir))
    summary = trainer.run()
    with open(os.path.join(run_dir, "eval.csv")) as f:
        evals = [[row["env_steps"], row.get("mean_return", row.get("eval/mean_return"))] for row in csv.DictReader(f)]
    state = trainer.learner.model.state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().cpu().contiguous().numpy().tobytes() for k in sorted(state)))
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"env_steps": summary["env_steps"], "train_iter": summary["train_iter"], "evals": evals,
            "weights_sha256": digest.hexdigest()}


def main() -> None:
    torch.set_num_threads(1)
    # torch's own kernels (BLAS, vectorized ops) may round differently on another instruction set
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
           **{algo: run(algo) for algo in (sys.argv[1:] or ALGOS)}}
    with open(PATH, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
