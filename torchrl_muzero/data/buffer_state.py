"""Checkpointing a :class:`~torchrl_muzero.data.GameBuffer`: state dicts and files.

The state is plain containers and tensors only, so that files load with
``torch.load(weights_only=True)`` (no code runs while reading a checkpoint).
It is tagged with a format name and a version, and records the buffer's
storage layout (capacity, observation key, frame stacking): loading checks
all of it, and every table's shape and dtype, *before* changing the buffer,
so a file that does not fit leaves the buffer as it was.

A buffer with declared replay entries (``extra_entries``,
:mod:`~torchrl_muzero.data.replay_entries`) records them under
``"entries"`` (absent otherwise, so a buffer without them writes the same
state as before they existed). A box action space's buffer records the
actions' ``D`` under ``"shapes"`` (``"action_dim"``, absent for discrete
actions, so files from before box actions load as they did); a file loads
only into a buffer storing the same kind of actions. A file loads only into a buffer declaring the
same entries (keys, shapes, dtypes): one saved before them, or without them,
is refused in one line rather than filled with defaults, which would make
targets out of values no search produced.

The buffer is read and restored through its public interface only: its
settings, :attr:`GameBuffer.store <torchrl_muzero.data.GameBuffer.store>`
(a :class:`~torchrl_muzero.data.replay_store.ReplayStore`),
``num_samples`` and ``generator``.

Configuration is not state: the models, the reanalyze search (a callable)
and the target builders belong to the buffer's constructor and are never
saved.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from torchrl_muzero.data.replay_entries import describe_entries, entries_state
from torchrl_muzero.data.rollout_reader import RowSpec
from torchrl_muzero.durable_files import UnreadableFile, atomic_torch_save, read_tensors_file

if TYPE_CHECKING:
    from torchrl.data import LazyTensorStorage

    from torchrl_muzero.data.game_buffer import GameBuffer
    from torchrl_muzero.data.replay_store import ReplayStore

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
    store = buffer.store
    rows = store.rows
    state = {
        "format": FORMAT,
        "version": VERSION,
        "layout": storage_layout(buffer),
        "shapes": RowSpec.state_of(store.spec),
        "cursor": store.cursor,
        "num_samples": buffer.num_samples,
        "open_traj": torch.tensor([[t, s, w] for t, (s, w) in rows.open.items()], dtype=torch.int64).reshape(-1, 3),
        "rows": {name: t.clone() for name, t in rows.tables().items()},
        "frames": store.frame_storage.state_dict(),
        "steps": store.step_storage.state_dict(),
        "generator": buffer.generator.get_state(),
    }
    if store.entries:  # only then: a buffer without them writes what it wrote before they existed
        state["entries"] = entries_state(store.entries)
    return state


def _check_entries(store: "ReplayStore", state: dict, steps: "LazyTensorStorage | None", source: str) -> None:
    """``ValueError`` unless the saved entries are the store's (keys, shapes, dtypes) and ``steps`` (when
    given, loaded) holds them."""
    saved, mine = state.get("entries", []), entries_state(store.entries)

    def layout(s: dict) -> tuple:  # the default is configuration, not layout
        return (tuple(s["key"]) if isinstance(s["key"], list) else s["key"], list(s["shape"]), s["dtype"])

    if [layout(s) for s in saved] != [layout(s) for s in mine]:
        raise ValueError(f"{source} stores the replay entries {describe_entries(saved)}, this GameBuffer declares "
                         f"{describe_entries(mine)} (extra_entries must match the buffer that saved it).")
    if steps is None:
        return
    stored = steps._storage  # torchrl's preallocated TensorDict
    for entry in store.entries:
        value = stored.get(entry.key, None)
        if (not isinstance(value, torch.Tensor) or tuple(value.shape) != (store.capacity, *entry.shape)
                or value.dtype != entry.dtype):
            raise ValueError(f"{source}: the stored replay entry {entry.key!r} is corrupt "
                             f"(expected [{store.capacity}, {', '.join(map(str, entry.shape))}] {entry.dtype}).")


def _actions_text(action_dim: int | None) -> str:
    return "discrete actions" if action_dim is None else f"continuous actions of {action_dim} dims"


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
        store = buffer.store
        _check_entries(store, state, None, source)  # the declared ones first: the clearest message
        tables = state["rows"]
        store.rows.check_tables(tables, source)
        spec = RowSpec.from_state(state["shapes"], buffer.frames, store.entries)
        if spec is not None and spec.action_dim != buffer.action_dim:
            raise ValueError(f"{source} stores {_actions_text(spec.action_dim)}, this GameBuffer stores "
                             f"{_actions_text(buffer.action_dim)} (its action_space must match the buffer that "
                             "saved it).")
        frames, steps = store.new_storages()
        if spec is not None:
            frames.load_state_dict(state["frames"])
            steps.load_state_dict(state["steps"])
            stored = frames._storage
            if (not isinstance(stored, torch.Tensor) or stored.shape[1:] != spec.frame_shape
                    or stored.shape[0] != buffer.capacity):
                raise ValueError(
                    f"{source}: the frame storage does not hold [{buffer.capacity}, {tuple(spec.frame_shape)}] frames."
                )
            if spec.action_dim is not None:  # box actions: float32 [capacity, D]
                action = steps._storage.get("action", None)
                if (not isinstance(action, torch.Tensor) or action.dtype != torch.float32
                        or tuple(action.shape) != (buffer.capacity, spec.action_dim)):
                    raise ValueError(f"{source}: the stored actions are corrupt "
                                     f"(expected [{buffer.capacity}, {spec.action_dim}] torch.float32).")
            if store.entries:
                _check_entries(store, state, steps, source)
        open_traj = {int(t): (int(s), int(w)) for t, s, w in state["open_traj"].tolist()}
        cursor = int(state["cursor"])
        num_samples = int(state["num_samples"])
        gen_state = state["generator"]
        torch.Generator().set_state(gen_state)  # a bad RNG state fails here, before the buffer changes
    except (KeyError, TypeError, IndexError, RuntimeError, AttributeError) as err:
        raise ValueError(f"{source} is a corrupt GameBuffer state ({type(err).__name__}: {err}).") from err

    buffer.store.replace(frame_storage=frames, step_storage=steps, spec=spec, cursor=cursor, tables=tables,
                         open_traj=open_traj)
    buffer.num_samples = num_samples
    buffer.generator.set_state(gen_state)


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
