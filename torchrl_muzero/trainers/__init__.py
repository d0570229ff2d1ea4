"""Trainers: the sync and async pipelines, their config and the pieces they share.

The names below are imported on first use, so that reading and checking a
config (``load_config``, the scripts' start-up checks) answers without
importing torch and torchrl first.
"""
import importlib

_WHERE = {
    "ConfigError": "config", "TrainConfig": "config", "load_config": "config",
    "Learner": "learner", "NonFiniteLossError": "learner",
    "TrainerBase": "base", "TrainingStopped": "base",
    "SyncTrainer": "sync", "AsyncTrainer": "async_pipeline",
}

__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
