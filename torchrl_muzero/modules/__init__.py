from torchrl_muzero.modules.support import CategoricalSupport
from torchrl_muzero.modules.policy_distribution import CategoricalPolicy, PolicyDistribution, policy_distribution
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.model import MuZeroModel, scale_latent
from torchrl_muzero.modules.mlp import MuZeroMLPModel
from torchrl_muzero.modules.resnet import MuZeroResNetModel

__all__ = ["CategoricalSupport", "ModelStep", "MuZeroModel", "MuZeroMLPModel", "MuZeroResNetModel", "scale_latent"]
__all__ += ["CategoricalPolicy", "PolicyDistribution", "policy_distribution"]
from torchrl_muzero.modules.stochastic import StochasticMuZeroModel, StochasticMuZeroMLPModel, straight_through_one_hot

__all__ += ["StochasticMuZeroModel", "StochasticMuZeroMLPModel", "straight_through_one_hot"]
from torchrl_muzero.modules.efficientzero import EfficientZeroMLPModel, EfficientZeroModel, EfficientZeroResNetModel  # noqa: E402
__all__ += ["EfficientZeroModel", "EfficientZeroMLPModel", "EfficientZeroResNetModel"]
from torchrl_muzero.modules.stochastic_resnet import StochasticMuZeroResNetModel; __all__ += ["StochasticMuZeroResNetModel"]  # noqa: E402, E702
from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel, RNNFullObsModel, RNNFullObsResNetModel  # noqa: E402
__all__ += ["RNNFullObsModel", "RNNFullObsMLPModel", "RNNFullObsResNetModel"]
from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy  # noqa: E402
__all__ += ["TanhNormalPolicy"]
