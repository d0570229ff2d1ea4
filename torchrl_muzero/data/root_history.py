"""The history window of a stored position: what an acting root at that position saw.

A policy that acts from history (UniZero's
:class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory`) builds its
search root from the current observation *and* the last ``L`` observations
and actions of the episode. The buffer's model-made targets at a stored
position (the n-step bootstrap value, a reanalyze search) must start from
that same root, or the target model is asked about a state it never acts
from: a value of the bare observation, without the context the acting root
and the loss's unroll both have.

The buffer stores each observation once and links the rows of a trajectory
(:class:`~torchrl_muzero.data.storage_rows.RowTable`), so the window is the
``prev`` chain: :func:`history_window` follows it back ``L`` rows, stopping at
the episode's first row (``prev`` is ``START``) or where the chain is lost
(evicted rows, a trajectory that joined mid-episode). The memory itself is
then rebuilt by the acting memory (``memory_from_steps``) and the root comes
from its own ``root`` (the code acting runs), not from a copy here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchrl_muzero.data.storage_rows import STEP

if TYPE_CHECKING:
    from torchrl_muzero.data.storage_rows import RowTable

__all__ = ["check_root_memory", "history_window"]


def check_root_memory(memory: Any, two_player: bool) -> Any:
    """``memory`` if the buffer can rebuild it from stored steps; ``None`` stays ``None``.

    It needs a ``context_length`` (``L``), ``memory_from_steps`` and ``root``
    (as :class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory` has).
    Memories that carry model outputs between steps (``muzero_context``'s
    rolled latent, ``muzero_rnn_full_obs``'s GRU state) cannot be rebuilt
    from what the buffer stores and are refused.
    """
    if memory is None:
        return None
    missing = [name for name in ("context_length", "memory_from_steps", "root") if not hasattr(memory, name)]
    if missing:
        raise TypeError(f"root_memory must be rebuildable from stored steps (a HistoryWindowMemory); "
                        f"{type(memory).__name__} has no {missing}.")
    if two_player:
        raise ValueError("root_memory is for one-player envs (acting from history has no player to move).")
    return memory


def history_window(rows: "RowTable", slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``length`` rows before each of ``slots [M]`` in its episode.

    Returns ``window [M, L]`` (row slots, oldest first) and ``valid [M, L]``
    (a suffix of True: the rows that exist). Where a row does not exist the
    slot is the position's own (a row whose observation is rebuilt anyway;
    the memory zeroes it). The chain stops at the episode's start and never
    crosses it, and at a lost link, an evicted row, or a row whose frame
    stack cannot be rebuilt.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.root_history import history_window
        >>> from torchrl_muzero.data.storage_rows import RowTable
        >>> rows = RowTable(8, num_frames=1, alpha=1.0, priority_eps=0.0, tree_backend="torch")
        >>> traj = torch.zeros(3, dtype=torch.long); done = torch.tensor([False, False, True])
        >>> _ = rows.write_block(rows.plan_segments(traj, done, terminated=done), base=0, fresh_start={0: True})
        >>> window, valid = history_window(rows, torch.tensor([0, 1, 3]), 2)  # 3 steps, then the terminal row
        >>> window.tolist(), valid.tolist()
        ([[0, 0], [1, 0], [1, 2]], [[False, False], [False, True], [True, True]])
    """
    M = slots.numel()
    window = slots.reshape(-1, 1).repeat(1, length)
    valid = torch.zeros(M, length, dtype=torch.bool)
    cur = slots.reshape(-1)
    ok = torch.ones(M, dtype=torch.bool)
    for back in range(1, length + 1):
        prev = rows.prev[cur]
        safe = prev.clamp(min=0)
        # prev < 0: START (the episode begins here) or LOST; either way nothing older is the same episode's
        ok = ok & (prev >= 0) & rows.alive[safe] & (rows.kind[safe] == STEP) & rows.hist_ok[safe]
        cur = torch.where(ok, prev, cur)
        window[:, length - back] = torch.where(ok, cur, slots.reshape(-1))
        valid[:, length - back] = ok
    return window, valid

