"""Checkpoints: written atomically, read with errors that name the file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint"]

_FORMAT = "torchrl_muzero.checkpoint.v1"
_REQUIRED = ("format", "model", "counters", "config")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit this run."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` via a temporary file and an atomic rename.

    A crash or Ctrl-C while writing leaves the previous checkpoint intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": _FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist.")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # truncated, not a torch file, ...
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt or unreadable: {err}") from err
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a torchrl_muzero checkpoint (format {_FORMAT}).")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}.")
    return state


def latest_checkpoint(run_dir: str | os.PathLike) -> Path:
    """The run's ``ckpt/last.pt``; raises :class:`CheckpointError` naming the folder if absent."""
    path = Path(run_dir) / "ckpt" / "last.pt"
    if not path.is_file():
        raise CheckpointError(f"no checkpoint to resume from in {str(run_dir)!r} (looked for {str(path)!r}).")
    return path
