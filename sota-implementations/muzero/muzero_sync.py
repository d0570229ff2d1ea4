"""MuZero, synchronous pipeline: collect -> train -> evaluate in one process.

    python sota-implementations/muzero/muzero_sync.py            # CartPole-v1
    python sota-implementations/muzero/muzero_sync.py env=Pong
"""
import hydra

from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.hydra_entry import register_base_config, run_from_hydra

register_base_config()


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    run_from_hydra(cfg, SyncTrainer)


if __name__ == "__main__":
    main()
