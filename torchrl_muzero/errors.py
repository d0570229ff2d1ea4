"""The library's own exceptions, in a module that imports nothing of the library.

Every layer raises them (the algorithms check their ``algo.*`` keys, the
trainers the rest of the configuration), so they live below all of them.
:mod:`torchrl_muzero.trainers.config` re-exports :class:`ConfigError`, where
users' scripts import it from.

Example:
    >>> from torchrl_muzero.errors import ConfigError
    >>> from torchrl_muzero.trainers.config import ConfigError as SameClass
    >>> ConfigError is SameClass, issubclass(ConfigError, ValueError)
    (True, True)
"""
from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad configuration key or value: the message names the dotted key, the value and what is allowed."""
