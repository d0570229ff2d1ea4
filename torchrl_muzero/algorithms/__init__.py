"""The MuZero family by name (``algo=``): :func:`get_algorithm` and the :class:`Algorithm` builders."""
from torchrl_muzero.algorithms.registry import Algorithm, algorithm_names, get_algorithm, register

__all__ = ["Algorithm", "algorithm_names", "get_algorithm", "register"]
