"""The row bookkeeping of :class:`~torchrl_muzero.data.GameBuffer`: kinds, links, eviction, priorities.

The buffer's tensors (frames, step payloads) live in torchrl storages indexed
by *row slot*; :class:`RowTable` holds everything else about a row, one CPU
entry per slot, and is the only place that knows how rows chain into
trajectories:

* ``kind``: what the row is (:data:`STEP`, :data:`TERMINAL`,
  :data:`TRUNCATED`, :data:`OPEN`, see below);
* ``prev`` / ``next``: the neighbouring rows of its trajectory, or
  :data:`START` / :data:`LOST`. Links, not storage order, define a trajectory,
  so chunks from different workers may interleave freely;
* ``alive``, ``write_time`` (the absolute write position, the stamp that
  guards priority updates), ``segment_end`` (where the segment written with
  it ends, so eviction can take the rest of it), ``traj`` (the collector's
  trajectory id);
* ``hist_ok``: the ``N - 1`` frames before the row are stored, so its stacked
  observation can be rebuilt and it may be drawn as a root;
* ``priority`` (raw, before ``** alpha``) and the :class:`PriorityTree` that
  samples roots;
* ``open``: trajectory id -> ``(slot, write time)`` of the newest row of each
  running trajectory, the row its next chunk completes.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from torchrl_muzero.data.priority import PriorityTree

__all__ = ["BlockPlacement", "RowTable", "STEP", "TERMINAL", "TRUNCATED", "OPEN", "START", "LOST"]

# row kinds
STEP = 0  #: an observation and the transition leaving it
TERMINAL = 1  #: the last observation of a terminated episode (absorbing after it)
TRUNCATED = 2  #: the last observation of a truncated episode (bootstrap, unknown after it)
OPEN = 3  #: the newest observation of a running trajectory (completed by its next chunk)

# link values (prev / next hold row slots otherwise)
START = -1  #: prev: first observation of its episode; next: nothing follows
LOST = -2  #: the neighbour was evicted, or is unknown

# the per-row tables, in the order state dicts list them
TABLES = ("prev", "next", "kind", "alive", "hist_ok", "write_time", "segment_end", "traj", "priority")


class BlockPlacement(NamedTuple):
    """Where the frames and payloads of a block written by :meth:`RowTable.write_block` go.

    Attributes:
        new_slots: ``[n_new]`` the slots of the new rows, in write order.
        step_pos / step_src: step rows, as positions in the block and the
            rollout rows they hold.
        final_pos / final_src: last-observation rows, as positions in the
            block and the rollout rows whose ``"next"`` observation they hold.
        tail_slots / tail_src: stored open rows (not in the block) that the
            rollout rows ``tail_src`` complete into steps; their frame is
            already stored, their payload is not.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.storage_rows import RowTable
        >>> rows = RowTable(8, num_frames=1, alpha=1.0, priority_eps=0.0, tree_backend="torch")
        >>> traj = torch.zeros(3, dtype=torch.long); done = torch.tensor([False, False, True])
        >>> segments = rows.plan_segments(traj, done, terminated=done)
        >>> placed = rows.write_block(segments, base=0, fresh_start={0: True})
        >>> placed.step_pos.tolist(), placed.final_pos.tolist(), placed.final_src.tolist()
        ([0, 1, 2], [3], [2])
        >>> rows.kind[:4].tolist(), rows.prev[:4].tolist()  # three steps, then the terminal observation
        ([0, 0, 0, 1], [-1, 0, 1, 2])
    """

    new_slots: torch.Tensor
    step_pos: torch.Tensor
    step_src: torch.Tensor
    final_pos: torch.Tensor
    final_src: torch.Tensor
    tail_slots: torch.Tensor
    tail_src: torch.Tensor


class RowTable:
    """Per-row bookkeeping of a circular row storage of ``capacity`` slots.

    Args:
        capacity (int): number of row slots.
        num_frames (int): ``N`` of the frame stacks (a row needs the ``N - 1``
            rows before it to be sampleable).
        alpha (float): priority exponent of the tree leaves.
        priority_eps (float): added to priorities before ``** alpha``.
        tree_backend (str): backend of the :class:`PriorityTree`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.storage_rows import RowTable, START, STEP
        >>> rows = RowTable(8, num_frames=1, alpha=1.0, priority_eps=0.0, tree_backend="torch")
        >>> slots = torch.arange(3)
        >>> rows.kind[slots] = STEP; rows.alive[slots] = True; rows.next[slots] = START
        >>> rows.link([(slots, -1)])  # one trajectory 0 -> 1 -> 2
        >>> rows.next[:3].tolist(), rows.prev[:3].tolist()
        ([1, 2, -1], [-1, 0, 1])
        >>> walked, exists, terminal, is_step = rows.walk(torch.tensor([1]), 3)
        >>> walked.tolist(), exists.tolist()  # the chain stops after row 2's step: -1 follows
        ([[1, 2, 2]], [[True, True, False]])
    """

    def __init__(self, capacity: int, *, num_frames: int, alpha: float, priority_eps: float,
                 tree_backend: str = "auto") -> None:
        self.capacity = capacity
        self.num_frames = num_frames
        self.alpha = float(alpha)
        self.priority_eps = float(priority_eps)
        self.tree = PriorityTree(capacity, backend=tree_backend)
        self.prev = torch.full((capacity,), LOST, dtype=torch.int64)
        self.next = torch.full((capacity,), LOST, dtype=torch.int64)
        self.kind = torch.full((capacity,), OPEN, dtype=torch.int8)
        self.alive = torch.zeros(capacity, dtype=torch.bool)
        self.hist_ok = torch.zeros(capacity, dtype=torch.bool)
        self.write_time = torch.full((capacity,), -1, dtype=torch.int64)
        self.segment_end = torch.zeros(capacity, dtype=torch.int64)
        self.traj = torch.full((capacity,), -1, dtype=torch.int64)
        self.priority = torch.zeros(capacity, dtype=torch.float32)
        self.open: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ info
    def num_transitions(self) -> int:
        """Alive step rows."""
        return int((self.alive & (self.kind == STEP)).sum())

    def num_alive(self) -> int:
        """Alive rows of any kind."""
        return int(self.alive.sum())

    def nbytes(self) -> int:
        """Bytes of the tables and the priority tree."""
        total = sum(t.numel() * t.element_size() for t in self.tables().values())
        for name in ("_leaves", "_sum", "_min"):
            t = getattr(self.tree, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        if self.tree.backend == "cpp":
            total += 2 * 2 * self.tree.capacity * 4  # two float32 trees of 2 * capacity nodes
        return total

    def is_open_tail(self, tid: int) -> tuple[bool, int]:
        """Whether trajectory ``tid``'s newest row is still stored as its open end; and that slot."""
        if tid not in self.open:
            return False, -1
        slot, stamp = self.open[tid]
        ok = bool(self.alive[slot]) and int(self.write_time[slot]) == stamp and int(self.kind[slot]) == OPEN
        return ok, slot

    def is_fresh(self, slots: torch.Tensor, stamps: torch.Tensor) -> torch.Tensor:
        """Step rows still holding what was written at ``stamps`` (the priority-update guard)."""
        return self.alive[slots] & (self.write_time[slots] == stamps) & (self.kind[slots] == STEP)

    # ---------------------------------------------------------------- writes
    def plan_segments(self, traj: torch.Tensor, done: torch.Tensor, terminated: torch.Tensor) -> list[dict]:
        """Group the ``[m]`` rollout rows of one ``extend`` into segments, one per trajectory.

        Rows are grouped by trajectory id, keeping their order inside each
        one. Each segment dict holds ``tid``, ``rows`` (rollout row indices in
        time order), ``continuing`` (the id runs on from an earlier chunk),
        ``tail`` / ``tail_ok`` (the stored open row its first step completes,
        and whether it is still there), ``offset`` / ``n_rows`` (its place in
        the block of new rows: one per step, plus the last observation unless
        the first step fills the stored tail) and ``end_kind``.
        """
        order = torch.sort(traj, stable=True).indices
        traj_sorted = traj[order]
        done_sorted = done[order]
        same_next = traj_sorted[1:] == traj_sorted[:-1]
        bad = done_sorted[:-1] & same_next
        if bool(bad.any()):
            tid = int(traj_sorted[:-1][bad][0])
            raise ValueError(
                f"trajectory id {tid} has steps after its episode ended (done): trajectory ids must "
                "change at every reset (as ('collector', 'traj_ids') of torchrl collectors do)."
            )
        seg_ids, seg_lens = torch.unique_consecutive(traj_sorted, return_counts=True)
        seg_starts = torch.cumsum(seg_lens, 0) - seg_lens
        segments = []
        offset = 0
        for tid, start, length in zip(seg_ids.tolist(), seg_starts.tolist(), seg_lens.tolist()):
            rows = order[start : start + length]
            last = int(rows[-1])
            continuing = tid in self.open
            tail_ok, tail = self.is_open_tail(tid) if continuing else (False, -1)
            n_rows = length if tail_ok else length + 1
            if bool(done[last]):
                end_kind = TERMINAL if bool(terminated[last]) else TRUNCATED
            else:
                end_kind = OPEN
            segments.append(dict(tid=tid, rows=rows, continuing=continuing, tail=tail, tail_ok=tail_ok,
                                 offset=offset, n_rows=n_rows, end_kind=end_kind))
            offset += n_rows
        return segments

    def write_block(self, segments: list[dict], base: int, fresh_start: dict[int, bool]) -> "BlockPlacement":
        """Record the rows of :meth:`plan_segments`' segments at absolute positions ``base ..``.

        Evicts what they overwrite (:meth:`evict_range`), sets their kinds,
        links, segment ends and the running trajectories, turns the stored
        tails their first steps complete into steps, and gives the new steps
        the current largest priority. ``fresh_start[tid]``: a new trajectory
        starts its episode (its frame history is the padding, ``prev = START``).
        Returns where the caller writes the rows' frames and payloads.
        """
        n_new = sum(s["n_rows"] for s in segments)
        new_abs = base + torch.arange(n_new, dtype=torch.int64)
        new_slots = new_abs % self.capacity
        self.evict_range(base, n_new)
        max_priority = self.max_priority()

        kinds = torch.full((n_new,), STEP, dtype=torch.int8)
        segment_end = torch.empty(n_new, dtype=torch.int64)
        traj = torch.empty(n_new, dtype=torch.int64)
        step_pos, step_src = [], []  # step rows: positions in the new block, rollout rows
        final_pos, final_src = [], []  # last-observation rows: positions, rollout rows whose "next" they hold
        tail_slots, tail_src = [], []  # stored open rows completed by a first step
        chains = []  # per segment: slots in trajectory order, and the prev of its first row
        for s in segments:
            rows, off, n_rows = s["rows"], s["offset"], s["n_rows"]
            segment_end[off : off + n_rows] = base + off + n_rows
            traj[off : off + n_rows] = s["tid"]
            head, first_prev, steps_here = [], LOST, rows
            if s["tail_ok"]:
                steps_here = rows[1:]
                if bool(self.alive[s["tail"]]):  # it may have been evicted just now
                    tail_slots.append(s["tail"])
                    tail_src.append(rows[:1])
                    head, first_prev = [s["tail"]], None  # keep the tail's own link
            elif not s["continuing"] and fresh_start[s["tid"]]:
                first_prev = START
            k = steps_here.numel()
            step_pos.append(torch.arange(off, off + k))
            step_src.append(steps_here)
            final_pos.append(off + k)
            final_src.append(int(rows[-1]))
            kinds[off + k] = s["end_kind"]
            chains.append((torch.cat([torch.tensor(head, dtype=torch.long), new_slots[off : off + k + 1]]), first_prev))
            if s["end_kind"] == OPEN:
                self.open[s["tid"]] = (int(new_slots[off + k]), base + off + k)
            else:
                self.open.pop(s["tid"], None)

        tail_slots = torch.tensor(tail_slots, dtype=torch.long)
        self.kind[tail_slots] = STEP
        self.kind[new_slots] = kinds
        self.alive[new_slots] = True
        self.write_time[new_slots] = new_abs
        self.segment_end[new_slots] = segment_end
        self.traj[new_slots] = traj
        self.next[new_slots] = START
        self.prev[new_slots] = LOST
        self.link(chains)

        # priorities: new steps enter with the current maximum, once their frame history is stored
        step_pos = torch.cat(step_pos)
        steps = torch.cat([new_slots[step_pos], tail_slots])
        self.hist_ok[new_slots] = False
        self.hist_ok[steps] = self.history_complete(steps)
        self.priority[new_slots] = 0.0
        self.priority[steps] = max_priority
        self.refresh_tree(torch.cat([new_slots, tail_slots]))
        return BlockPlacement(
            new_slots, step_pos, torch.cat(step_src), torch.tensor(final_pos, dtype=torch.long),
            torch.tensor(final_src, dtype=torch.long), tail_slots,
            torch.cat(tail_src) if tail_src else torch.empty(0, dtype=torch.long),
        )

    # --------------------------------------------------------------- linking
    def link(self, chains: list[tuple[torch.Tensor, int | None]]) -> None:
        """Chain each ``slots`` list in trajectory order; set the first one's ``prev``.

        ``first_prev`` None keeps the first row's own ``prev`` (a running
        trajectory's stored tail); the last row's ``next`` is left as it is.
        """
        for chain, first_prev in chains:
            if chain.numel() > 1:
                self.next[chain[:-1]] = chain[1:]
                self.prev[chain[1:]] = chain[:-1]
            if first_prev is not None:
                self.prev[chain[0]] = first_prev

    def end_running_trajectories(self) -> int:
        """Turn every stored open end into a truncation row; forget the running ids."""
        ended = 0
        for tid in list(self.open):
            ok, slot = self.is_open_tail(tid)
            if ok:
                self.kind[slot] = TRUNCATED
                ended += 1
        self.open.clear()
        return ended

    # -------------------------------------------------------------- eviction
    def evict_range(self, base: int, n_new: int) -> None:
        """Evict the rows at write positions ``base .. base + n_new`` and the rest of their segments.

        A segment only partly overwritten goes whole: its surviving rows would
        otherwise be a trajectory whose start is gone, which is cheaper to drop
        now than to special-case at sampling time.
        """
        cap = self.capacity
        slots = (base + torch.arange(n_new, dtype=torch.int64)) % cap
        dead = [slots[self.alive[slots]]]
        first_kept = base + n_new - cap  # absolute position of the oldest row not overwritten
        if first_kept > 0:
            last_slot = (base + n_new - 1) % cap
            end = int(self.segment_end[last_slot])
            if bool(self.alive[last_slot]) and int(self.write_time[last_slot]) == first_kept - 1 and end > first_kept:
                rest = torch.arange(first_kept, end, dtype=torch.int64) % cap
                dead.append(rest[self.alive[rest]])
        dead = torch.cat(dead)
        if dead.numel():
            self._evict(dead)

    def _evict(self, dead: torch.Tensor) -> None:
        # running trajectories whose newest row goes: forget them (a later chunk starts afresh)
        for slot in dead[self.kind[dead] == OPEN].tolist():
            tid = int(self.traj[slot])
            if self.open.get(tid, (None,))[0] == slot:
                del self.open[tid]
        self.alive[dead] = False
        self.hist_ok[dead] = False
        self.priority[dead] = 0.0
        self.tree.update(dead, torch.zeros(dead.numel(), dtype=torch.float64))
        # the rows after an evicted one lose the frames of their stacks
        nxt = self.next[dead]
        valid = nxt >= 0
        src, nxt = dead[valid], nxt[valid]
        ok = self.alive[nxt] & (self.prev[nxt] == src)
        cur = nxt[ok]
        self.prev[cur] = LOST
        for _ in range(self.num_frames - 1):
            if cur.numel() == 0:
                break
            self.hist_ok[cur] = False
            self.tree.update(cur, torch.zeros(cur.numel(), dtype=torch.float64))
            cur = self.next[cur]
            cur = cur[cur >= 0]
            cur = cur[self.alive[cur]]
        # the rows before an evicted one lose their continuation
        prv = self.prev[dead]
        valid = prv >= 0
        src, prv = dead[valid], prv[valid]
        ok = self.alive[prv] & (self.next[prv] == src)
        self.next[prv[ok]] = LOST

    # ------------------------------------------------------------ histories
    def history_complete(self, slots: torch.Tensor) -> torch.Tensor:
        """Whether the ``N - 1`` frames before each row are stored (or are padding)."""
        ok = torch.ones(slots.shape, dtype=torch.bool)
        stop = torch.zeros(slots.shape, dtype=torch.bool)
        cur = slots
        for _ in range(self.num_frames - 1):
            p = self.prev[cur]
            lost = (p == LOST) & ~stop
            ok &= ~lost
            stop |= p < 0
            cur = torch.where(stop, cur, p)
        return ok

    def stack_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows whose frames make the stacks of ``slots`` ``[M]``.

        Returns ``index`` ``[M, N]`` (oldest first) and ``padded`` ``[M, N]``:
        True where the stack reaches before its episode's start (the frame is
        the ``CatFrames`` padding, ``index`` repeats the first row there).
        """
        cur = slots
        pad = torch.zeros(slots.shape, dtype=torch.bool)
        hist, pads = [cur], [pad]
        for _ in range(self.num_frames - 1):
            p = self.prev[cur]
            has = (p >= 0) & ~pad
            cur = torch.where(has, p, cur)
            pad = ~has
            hist.append(cur)
            pads.append(pad)
        return torch.stack(hist[::-1], 1), torch.stack(pads[::-1], 1)

    def walk(self, roots: torch.Tensor, length: int) -> tuple[torch.Tensor, ...]:
        """Follow ``next`` links ``length - 1`` steps from each root.

        Returns ``slots`` ``[B, length]`` (the last reached row repeats where
        the chain stops), ``exists`` (a prefix of True: the position is
        stored), ``terminal`` (it is a terminated episode's last observation)
        and ``is_step`` (it holds a transition).
        """
        b = roots.numel()
        slots = torch.empty(b, length, dtype=torch.long)
        exists = torch.zeros(b, length, dtype=torch.bool)
        cur = roots
        ok = torch.ones(b, dtype=torch.bool)
        slots[:, 0] = cur
        exists[:, 0] = True
        for j in range(1, length):
            nxt = self.next[cur]
            step = ok & (self.kind[cur] == STEP) & (nxt >= 0)
            nxt = torch.where(step, nxt, cur)
            step &= self.alive[nxt]
            cur = torch.where(step, nxt, cur)
            ok = step
            slots[:, j] = cur
            exists[:, j] = ok
        kinds = self.kind[slots]
        terminal = exists & (kinds == TERMINAL)
        is_step = exists & (kinds == STEP)
        return slots, exists, terminal, is_step

    # ------------------------------------------------------------ priorities
    def max_priority(self) -> float:
        """The priority new steps enter with: the largest stored one (1 when empty)."""
        live = self.priority[self.alive & (self.kind == STEP)]
        return float(live.max()) if live.numel() else 1.0

    def _leaves(self, slots: torch.Tensor | slice) -> torch.Tensor:
        ok = self.alive[slots] & (self.kind[slots] == STEP) & self.hist_ok[slots]
        p = (self.priority[slots].double() + self.priority_eps) ** self.alpha
        return torch.where(ok, p, torch.zeros_like(p))

    def update_priorities(self, index: Any, priority: Any, stamp: Any) -> torch.Tensor:
        """Set the priorities of step rows ``index`` unless they changed since ``stamp``.

        Each argument is ``[B]`` or ``[B, K+1]`` (column 0 is read). Returns
        a ``[B]`` bool tensor: True where the row still holds the step written
        at ``stamp`` and the priority was written.
        """

        def column(x, name):
            x = torch.as_tensor(x).detach().cpu()
            if x.ndim == 2:
                x = x[:, 0]
            if x.ndim != 1:
                raise ValueError(f"update_priority: {name} must be [B] or [B, K+1], got {tuple(x.shape)}.")
            return x

        index = column(index, "index").long()
        priority = column(priority, "priority").float()
        stamp = column(stamp, "stamp").long()
        if not (index.shape == priority.shape == stamp.shape):
            raise ValueError(
                f"update_priority: index {tuple(index.shape)}, priority {tuple(priority.shape)} and "
                f"stamp {tuple(stamp.shape)} must have the same length."
            )
        if not bool(torch.isfinite(priority).all()) or bool((priority < 0).any()):
            raise ValueError("update_priority: priorities must be finite and >= 0.")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.capacity):
            raise ValueError(f"update_priority: indices must lie in [0, {self.capacity}).")
        fresh = self.is_fresh(index, stamp)
        slots = index[fresh]
        self.priority[slots] = priority[fresh]
        self.refresh_tree(slots)
        return fresh

    def refresh_tree(self, slots: torch.Tensor) -> None:
        """Write the tree leaves of ``slots`` from their priority (0 if not sampleable)."""
        if slots.numel():
            self.tree.update(slots, self._leaves(slots))

    def rebuild_tree(self) -> None:
        """Write every tree leaf (after loading the tables)."""
        self.tree.load(self._leaves(slice(None)))

    # ----------------------------------------------------------------- state
    def tables(self) -> dict[str, torch.Tensor]:
        """The per-row tables by name (the tensors themselves, not copies)."""
        return {name: getattr(self, name) for name in TABLES}

    def check_tables(self, tables: dict, source: str) -> None:
        """Raise ``ValueError`` unless ``tables`` fits :meth:`tables` in names, shapes and dtypes."""
        for name, ref in self.tables().items():
            t = tables[name]
            if not isinstance(t, torch.Tensor) or t.shape != ref.shape or t.dtype != ref.dtype:
                raise ValueError(f"{source}: row table {name!r} is corrupt (expected {tuple(ref.shape)} {ref.dtype}).")

    def load_tables(self, tables: dict, open_traj: dict[int, tuple[int, int]]) -> None:
        """Copy checked tables in, set the running trajectories and rebuild the tree."""
        for name, ref in self.tables().items():
            ref.copy_(tables[name])
        self.open = dict(open_traj)
        self.rebuild_tree()
