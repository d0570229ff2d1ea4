"""MuZero, asynchronous pipeline: collection and evaluation overlap learning.

    python sota-implementations/muzero/muzero_async.py            # CartPole-v1
    python sota-implementations/muzero/muzero_async.py env=Pong
"""
import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig

from torchrl_muzero.trainers.config import TrainConfig

# The typed schema is the base of every config: every key exists (so any dotted
# override works) and OmegaConf checks types; load_config checks the rest.
ConfigStore.instance().store(name="base_config", node=TrainConfig)


@hydra.main(config_path="config", config_name="config", version_base=None)
def main(cfg) -> None:
    from torchrl_muzero.trainers import AsyncTrainer, load_config

    run_cfg = load_config(cfg)
    if run_cfg.run_dir is None and run_cfg.resume is None:
        run_cfg.run_dir = HydraConfig.get().runtime.output_dir
    AsyncTrainer(run_cfg).run()


if __name__ == "__main__":
    main()
