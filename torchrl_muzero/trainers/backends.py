"""The one place where ``async_pipeline.backend`` picks the async run's worker backend: :func:`make_backend`."""
from __future__ import annotations

from torchrl_muzero.trainers.config import ConfigError, TrainConfig
from torchrl_muzero.trainers.local_backend import LocalBackend
from torchrl_muzero.trainers.ray_backend import RayBackend
from torchrl_muzero.trainers.worker_backend import WorkerBackend

__all__ = ["BACKENDS", "make_backend"]

#: ``async_pipeline.backend`` -> the :class:`WorkerBackend` it names
BACKENDS: dict[str, type[WorkerBackend]] = {"local": LocalBackend, "ray": RayBackend}


def make_backend(cfg: TrainConfig) -> WorkerBackend:
    """A fresh (not started) backend for ``cfg.async_pipeline.backend``.

    Nothing starts here: the backend builds its workers when the trainer's run calls
    :meth:`WorkerBackend.start` (Ray is imported then, not here).

    Examples:
        >>> from torchrl_muzero.trainers.config import load_config
        >>> make_backend(load_config({"async_pipeline": {"backend": "ray"}})).name
        'ray'
    """
    name = cfg.async_pipeline.backend
    if name not in BACKENDS:
        raise ConfigError(f"config key 'async_pipeline.backend' is {name!r}; choose one of {sorted(BACKENDS)}.")
    return BACKENDS[name]()
