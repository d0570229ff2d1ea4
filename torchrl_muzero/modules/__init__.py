from torchrl_muzero.modules.support import CategoricalSupport
from torchrl_muzero.modules.model import MuZeroModel, scale_latent
from torchrl_muzero.modules.mlp import MuZeroMLPModel

__all__ = ["CategoricalSupport", "MuZeroModel", "MuZeroMLPModel", "scale_latent"]
