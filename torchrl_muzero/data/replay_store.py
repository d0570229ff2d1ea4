"""``ReplayStore``: what a :class:`~torchrl_muzero.data.GameBuffer` stores, behind a narrow interface.

The buffer's sampling (:mod:`~torchrl_muzero.data.sample_batch`) and
checkpoints (:mod:`~torchrl_muzero.data.buffer_state`) read and restore the
stored rows through this object only (plus the buffer's public settings),
never through the buffer's private fields: the storages and the row table
can change shape without those modules following.
"""
from __future__ import annotations

from typing import Iterable

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.replay_entries import ReplayEntry
from torchrl_muzero.data.rollout_reader import RowSpec
from torchrl_muzero.data.storage_rows import RowTable

__all__ = ["ReplayStore"]


class ReplayStore:
    """The stored rows: frames, step payloads, the row table, the layout and the write cursor.

    Args:
        capacity (int): rows of storage.
        frames (FrameStack): how observations are stacked from frames.
        rows (RowTable): the per-row bookkeeping (links, kinds, priorities).

    Keyword Args:
        storage_device: device of the frame and step storages (default CPU).
        entries (iterable of ReplayEntry): the declared extra per-step
            entries stored with each step (:mod:`~torchrl_muzero.data.replay_entries`).

    Attributes:
        frame_storage / step_storage: torchrl storages by row slot, of the
            newest frame of each row and of its step payload (a TensorDict).
        rows: the :class:`~torchrl_muzero.data.storage_rows.RowTable`.
        spec: the :class:`~torchrl_muzero.data.rollout_reader.RowSpec` the
            first rollout fixed (``None`` before any).
        cursor: rows written so far (the absolute write position).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import GameBuffer
        >>> from torchrl_muzero.data.replay_store import ReplayStore
        >>> buffer = GameBuffer(8, seed=0)
        >>> store = buffer.store  # empty: no layout yet
        >>> isinstance(store, ReplayStore), store.spec, store.cursor
        (True, None, 0)
    """

    def __init__(self, capacity: int, frames: FrameStack, rows: RowTable, *,
                 storage_device: torch.device | str = "cpu", entries: Iterable[ReplayEntry] = ()) -> None:
        self.capacity = capacity
        self.frames = frames
        self.rows = rows
        self.storage_device = torch.device(storage_device)
        self.entries: tuple[ReplayEntry, ...] = tuple(entries)
        self.frame_storage = LazyTensorStorage(capacity, device=self.storage_device)
        self.step_storage = LazyTensorStorage(capacity, device=self.storage_device)
        self.spec: RowSpec | None = None
        self.cursor = 0

    def new_storages(self) -> tuple[LazyTensorStorage, LazyTensorStorage]:
        """Empty frame and step storages like this store's (what a checkpoint loads into before it is checked)."""
        return (LazyTensorStorage(self.capacity, device=self.storage_device),
                LazyTensorStorage(self.capacity, device=self.storage_device))

    def replace(self, *, frame_storage: LazyTensorStorage, step_storage: LazyTensorStorage, spec: RowSpec | None,
                cursor: int, tables: dict, open_traj: dict[int, tuple[int, int]]) -> None:
        """Swap in checked contents (a loaded checkpoint); the row tables are copied in and the tree rebuilt."""
        self.frame_storage = frame_storage
        self.step_storage = step_storage
        self.spec = spec
        self.cursor = cursor
        self.rows.load_tables(tables, open_traj)

    def steps(self, slots: torch.Tensor) -> TensorDict:
        """The step payloads of rows ``slots`` (any shape, flattened): a ``[slots.numel()]`` TensorDict."""
        return self.step_storage.get(slots)

    def observations(self, slots: torch.Tensor) -> torch.Tensor:
        """Rebuild the stacked observations of rows ``slots`` ``[M]`` -> ``[M, *obs_shape]``."""
        if self.frames.num_frames == 1:
            return self.frame_storage.get(slots)
        index, padded = self.rows.stack_slots(slots)
        frames = self.frame_storage.get(index.reshape(-1)).reshape(slots.numel(), *index.shape[1:],
                                                                  *self.spec.frame_shape)
        return self.frames.rebuild(frames, padded)

    def nbytes(self) -> int:
        """Bytes held by the storages and the row table (its priority trees included)."""
        total = 0
        for store in (self.frame_storage, self.step_storage):
            if store.initialized:
                data = store._storage  # torchrl's preallocated tensor / TensorDict
                total += data.nbytes if isinstance(data, torch.Tensor) else data.bytes()
        return total + self.rows.nbytes()
