"""Checkpointing a :class:`~torchrl_muzero.data.GameBuffer`: state dicts and files.

The state is plain containers and tensors only, so that files load with
``torch.load(weights_only=True)`` (no code runs while reading a checkpoint).
It is tagged with a format name and a version, and records the buffer's
storage layout (capacity, observation key, frame stacking): loading checks
all of it, and every table's shape and dtype, *before* changing the buffer,
so a file that does not fit leaves the buffer as it was.

Configuration is not state: the models, the reanalyze search (a callable)
and the target builders belong to the buffer's constructor and are never
saved.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torchrl.data import LazyTensorStorage

from torchrl_muzero.data.rollout_reader import RowSpec
from torchrl_muzero.durable_files import UnreadableFile, atomic_torch_save, read_tensors_file

if TYPE_CHECKING:
    from torchrl_muzero.data.game_buffer import GameBuffer

__all__ = ["FORMAT", "VERSION", "buffer_state_dict", "load_buffer_file", "load_buffer_state", "save_buffer"]

FORMAT = "torchrl_muzero.GameBuffer"
VERSION = 1


def storage_layout(buffer: "GameBuffer") -> dict:
    """What a saved state must share with the buffer loading it."""
    return {
        "capacity": buffer.capacity,
        "observation_key": str(buffer.observation_key),
        "frame_stack": buffer.frames.num_frames,
        "frame_dim": buffer.frames.dim,
        "frame_padding": buffer.frames.padding,
        "frame_padding_value": float(buffer.frames.padding_value),
    }


def buffer_state_dict(buffer: "GameBuffer") -> dict:
    """Everything needed to resume: storage, row tables, priorities, cursors, RNG."""
    rows = buffer._rows
    return {
        "format": FORMAT,
        "version": VERSION,
        "layout": storage_layout(buffer),
        "shapes": RowSpec.state_of(buffer._spec),
        "cursor": buffer._cursor,
        "num_samples": buffer._num_samples,
        "open_traj": torch.tensor([[t, s, w] for t, (s, w) in rows.open.items()], dtype=torch.int64).reshape(-1, 3),
        "rows": {name: t.clone() for name, t in rows.tables().items()},
        "frames": buffer._frame_store.state_dict(),
        "steps": buffer._step_store.state_dict(),
        "generator": buffer._generator.get_state(),
    }


def load_buffer_state(buffer: "GameBuffer", state: dict, source: str = "state_dict") -> None:
    """Restore :func:`buffer_state_dict` into ``buffer``; ``ValueError`` naming ``source`` if it does not fit."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{source} is not a GameBuffer state (missing format tag {FORMAT!r}).")
    if state.get("version") != VERSION:
        raise ValueError(f"{source} has GameBuffer state version {state.get('version')!r}, expected {VERSION}.")
    # check and build everything first: the buffer changes only once all of it fits
    try:
        layout = state["layout"]
        mine = storage_layout(buffer)
        diff = {k: (layout.get(k), v) for k, v in mine.items() if layout.get(k) != v}
        if diff:
            desc = ", ".join(f"{k}: saved {a!r} vs buffer {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"{source} does not match this GameBuffer ({desc}).")
        tables = state["rows"]
        buffer._rows.check_tables(tables, source)
        spec = RowSpec.from_state(state["shapes"], buffer.frames)
        frames = LazyTensorStorage(buffer.capacity, device=buffer.storage_device)
        steps = LazyTensorStorage(buffer.capacity, device=buffer.storage_device)
        if spec is not None:
            frames.load_state_dict(state["frames"])
            steps.load_state_dict(state["steps"])
            stored = frames._storage
            if (not isinstance(stored, torch.Tensor) or stored.shape[1:] != spec.frame_shape
                    or stored.shape[0] != buffer.capacity):
                raise ValueError(
                    f"{source}: the frame storage does not hold [{buffer.capacity}, {tuple(spec.frame_shape)}] frames."
                )
        open_traj = {int(t): (int(s), int(w)) for t, s, w in state["open_traj"].tolist()}
        cursor = int(state["cursor"])
        num_samples = int(state["num_samples"])
        gen_state = state["generator"]
    except (KeyError, TypeError, IndexError, RuntimeError, AttributeError) as err:
        raise ValueError(f"{source} is a corrupt GameBuffer state ({type(err).__name__}: {err}).") from err

    buffer._frame_store = frames
    buffer._step_store = steps
    buffer._spec = spec
    buffer._cursor = cursor
    buffer._num_samples = num_samples
    buffer._generator.set_state(gen_state)
    buffer._rows.load_tables(tables, open_traj)


def save_buffer(buffer: "GameBuffer", path: str | os.PathLike) -> None:
    """Write :func:`buffer_state_dict` to ``path`` (``torch.save``), durably and atomically: a crash while
    writing leaves the previous file whole (:func:`~torchrl_muzero.durable_files.atomic_write`)."""
    atomic_torch_save(buffer_state_dict(buffer), path)


def load_buffer_file(buffer: "GameBuffer", path: str | os.PathLike) -> None:
    """Resume ``buffer`` from a file written by :func:`save_buffer`.

    Raises ``FileNotFoundError`` if it is missing and ``ValueError`` naming
    the file if it is unreadable, corrupt or made by a buffer of a different
    capacity / frame layout.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no GameBuffer checkpoint at {path!r}.")
    try:
        state = read_tensors_file(path)  # tensors and plain containers only: no code runs
    except UnreadableFile as err:  # truncated / garbage files, a pickled object that could run code, ...
        raise ValueError(f"cannot read GameBuffer checkpoint {path!r}: {err}") from err
    load_buffer_state(buffer, state, source=f"GameBuffer checkpoint {path!r}")
