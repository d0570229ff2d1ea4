"""MuZero, asynchronous pipeline: collection and evaluation overlap learning.

    python sota-implementations/muzero/muzero_async.py            # CartPole-v1
    python sota-implementations/muzero/muzero_async.py env=Pong

Exit status: 0 when the run ended as configured, 2 for a rejected start (one ``error:`` line on
stderr), 1 for a fault (dead worker, NaN loss), 130 / 143 after Ctrl-C / SIGTERM.
"""
from pathlib import Path

import hydra

from torchrl_muzero.trainers.hydra_entry import preflight, register_base_config, run_from_hydra, run_script

register_base_config()


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer  # torch and torchrl load here

    # async_pipeline.enabled=false runs the same training in one process
    run_from_hydra(cfg, AsyncTrainer if cfg.async_pipeline.enabled else SyncTrainer)


if __name__ == "__main__":
    # a bad key or value: one line and exit 2 within a second, before hydra (and torch) start
    preflight(Path(__file__).parent / "config")
    run_script(main)  # main(), then a guarantee that the process ends (trainers/exit_watchdog.py)
