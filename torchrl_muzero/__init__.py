"""torchrl_muzero: the MuZero family as plain TorchRL pieces."""
__version__ = "0.1.0"
