"""MuZero, synchronous pipeline: collect -> train -> evaluate in one process.

    python sota-implementations/muzero/muzero_sync.py            # CartPole-v1
    python sota-implementations/muzero/muzero_sync.py env=Pong
"""
import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    from torchrl_muzero.trainers import SyncTrainer, load_config

    run_cfg = load_config(cfg)
    if run_cfg.run_dir is None and run_cfg.resume is None:
        run_cfg.run_dir = HydraConfig.get().runtime.output_dir
    SyncTrainer(run_cfg).run()


if __name__ == "__main__":
    main()
