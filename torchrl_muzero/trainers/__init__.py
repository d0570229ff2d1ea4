from torchrl_muzero.trainers.config import ConfigError, TrainConfig, load_config
from torchrl_muzero.trainers.learner import Learner, NonFiniteLossError
from torchrl_muzero.trainers.base import TrainerBase, TrainingStopped
from torchrl_muzero.trainers.sync import SyncTrainer
from torchrl_muzero.trainers.async_pipeline import AsyncTrainer

__all__ = ["ConfigError", "TrainConfig", "load_config", "Learner", "NonFiniteLossError", "TrainerBase",
           "TrainingStopped", "SyncTrainer", "AsyncTrainer"]
