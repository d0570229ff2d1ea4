"""Checkpoints: written durably and atomically, read without running code, with errors that name the file.

A checkpoint holds tensors and plain containers only (dicts, lists, tuples,
numbers, strings, ``None``), so :func:`load_checkpoint` reads it with
``torch.load(weights_only=True)``: a file that holds any other pickled object
(which could run code while it is read: a shared ``best.pt`` is a file like
any other) is refused in one line naming the file, before anything of it is
used.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchrl_muzero.durable_files import RefusedPickle, UnreadableFile, atomic_torch_save, read_tensors_file

__all__ = ["CheckpointError", "save_checkpoint", "load_checkpoint", "latest_checkpoint"]

_FORMAT = "torchrl_muzero.checkpoint.v1"
_REQUIRED = ("format", "model", "counters", "config")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not fit this run."""


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` durably: a temporary file, fsync, an atomic rename, fsync of the folder.

    A crash, Ctrl-C or power cut while writing leaves the previous checkpoint
    intact; once this returns, the new one survives them
    (:func:`~torchrl_muzero.durable_files.atomic_write`). ``state`` must hold
    tensors and plain containers only, or :func:`load_checkpoint` refuses it.

    Examples:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> from torchrl_muzero.trainers.checkpoint import load_checkpoint, save_checkpoint
        >>> path = Path(tempfile.mkdtemp()) / "last.pt"
        >>> state = {"model": {"w": torch.ones(2)}, "counters": {"env_steps": 10}, "config": {}}
        >>> load_checkpoint(save_checkpoint(path, state))["counters"]
        {'env_steps': 10}
    """
    return atomic_torch_save({"format": _FORMAT, **state}, path)


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` without running code from it.

    Raises :class:`CheckpointError`, one line naming the file, when it is
    missing, truncated, not a torch file, not ours, or holds a pickled object
    other than tensors and plain containers (``weights_only=True`` refuses it
    before it is built).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist.")
    try:
        state = read_tensors_file(path, map_location)
    except RefusedPickle as err:  # the file would run code: never load it
        raise CheckpointError(f"checkpoint {str(path)!r} is refused: {err}; torchrl_muzero never writes "
                              "such objects into a checkpoint.") from None
    except UnreadableFile as err:  # truncated, not a torch file, ...
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
