"""MuZero, asynchronous pipeline: collection and evaluation overlap learning.

    python sota-implementations/muzero/muzero_async.py            # CartPole-v1
    python sota-implementations/muzero/muzero_async.py env=Pong
"""
import hydra

from torchrl_muzero.trainers import AsyncTrainer
from torchrl_muzero.trainers.hydra_entry import register_base_config, run_from_hydra

register_base_config()


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    run_from_hydra(cfg, AsyncTrainer)


if __name__ == "__main__":
    main()
