from torchrl_muzero.objectives.terms import LossTerm, scale_gradient
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss
from torchrl_muzero.objectives.muzero import MuZeroLoss

__all__ = ["LossTerm", "MuZeroLoss", "UnrolledModelLoss", "scale_gradient"]
