from torchrl_muzero.objectives.muzero import MuZeroLoss, scale_gradient

__all__ = ["MuZeroLoss", "scale_gradient"]
