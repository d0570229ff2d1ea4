from torchrl_muzero.objectives.terms import LossTerm, scale_gradient
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss
from torchrl_muzero.objectives.muzero import MuZeroLoss
from torchrl_muzero.objectives.efficientzero import EfficientZeroLoss

__all__ = ["EfficientZeroLoss", "LossTerm", "MuZeroLoss", "UnrolledModelLoss", "scale_gradient"]
from torchrl_muzero.objectives.stochastic_muzero import StochasticMuZeroLoss

__all__ += ["StochasticMuZeroLoss"]
from torchrl_muzero.objectives.rnn_full_obs import RNNFullObsLoss  # noqa: E402

__all__ += ["RNNFullObsLoss"]
from torchrl_muzero.objectives.unizero import UniZeroLoss  # noqa: E402

__all__ += ["UniZeroLoss"]
