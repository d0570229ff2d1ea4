"""MuZero, asynchronous pipeline: collection and evaluation overlap learning.

    python sota-implementations/muzero/muzero_async.py            # CartPole-v1
    python sota-implementations/muzero/muzero_async.py env=Pong
"""
import hydra

from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer
from torchrl_muzero.trainers.hydra_entry import register_base_config, run_from_hydra

register_base_config()


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    # async_pipeline.enabled=false runs the same training in one process
    run_from_hydra(cfg, AsyncTrainer if cfg.async_pipeline.enabled else SyncTrainer)


if __name__ == "__main__":
    main()
