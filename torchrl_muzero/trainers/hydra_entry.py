"""What the hydra scripts of ``sota-implementations/`` share.

The typed schema (:class:`~torchrl_muzero.trainers.config.TrainConfig`) is
registered as hydra's ``base_config``: every key exists, so any dotted
override works, and OmegaConf checks the types; :func:`load_config` checks
the rest.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hydra.core.config_store import ConfigStore

from torchrl_muzero.trainers.config import TrainConfig, load_config

__all__ = ["register_base_config", "compose_config", "run_from_hydra"]


def register_base_config() -> None:
    ConfigStore.instance().store(name="base_config", node=TrainConfig)


def compose_config(config_dir: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Compose a script's config (``config.yaml`` + groups + overrides) outside ``@hydra.main``.

    Examples:
        >>> from pathlib import Path
        >>> import torchrl_muzero
        >>> config_dir = Path(torchrl_muzero.__file__).parents[1] / "sota-implementations/muzero/config"
        >>> cfg = compose_config(config_dir, ["mcts.num_simulations=8"])
        >>> cfg.env.id, cfg.mcts.num_simulations
        ('CartPole-v1', 8)
    """
    from hydra import compose, initialize_config_dir

    register_base_config()
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return load_config(compose(config_name="config", overrides=list(overrides)))


def run_from_hydra(cfg, trainer_cls) -> dict:
    """Validate a hydra config, default the run folder to hydra's output folder, and train."""
    from hydra.core.hydra_config import HydraConfig

    run_cfg = load_config(cfg)
    if run_cfg.run_dir is None and run_cfg.resume is None:
        run_cfg.run_dir = HydraConfig.get().runtime.output_dir
    return trainer_cls(run_cfg).run()
