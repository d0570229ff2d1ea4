"""``GameBuffer``: the single-owner MuZero replay storage.

Layout
------
One *row* per stored observation, in a circular storage of ``capacity`` rows
(torchrl :class:`~torchrl.data.LazyTensorStorage` s: one for the frames, one
for the small per-step payload). A row holds

* the newest frame of its observation (the whole observation when
  ``frame_stack == 1``): stacks are rebuilt from the rows before it;
* when the row is a *step*, the transition leaving it: action, reward,
  search policy, search value, policy version (and the action mask /
  player to move when the env has them);
* links to the previous and next rows of its trajectory, so that chunks
  from different workers may interleave freely in storage.

Rows that end a stored trajectory hold only an observation: the terminal
observation of a terminated episode, the last observation of a truncated
one (the bootstrap state), or the newest observation of a trajectory still
running. When the next chunk of a running trajectory arrives its first step
is written into that row, so a running trajectory costs no extra row and a
finished episode exactly one.

A *segment* is the rows one ``extend`` writes for one trajectory; they are
contiguous in storage. When new rows overwrite the oldest ones, a segment
that is only partly overwritten is evicted whole. The rows after an evicted
one lose the frames their stacks need, and are not sampled as roots.

Targets
-------
See :meth:`GameBuffer.sample` and :mod:`torchrl_muzero.data.targets`.
"""
from __future__ import annotations

import math
import os
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from torchrl.data import LazyTensorStorage

from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.priority import PriorityTree
from torchrl_muzero.data.targets import plan_value_targets, reward_targets, value_targets

__all__ = ["GameBuffer"]

_FORMAT = "torchrl_muzero.GameBuffer"
_VERSION = 1

# row kinds
_STEP = 0  # an observation and the transition leaving it
_TERMINAL = 1  # the last observation of a terminated episode (absorbing after it)
_TRUNCATED = 2  # the last observation of a truncated episode (bootstrap, unknown after it)
_OPEN = 3  # the newest observation of a running trajectory (completed by its next chunk)

# link values (prev / next hold row slots otherwise)
_START = -1  # prev: first observation of its episode; next: nothing follows
_LOST = -2  # the neighbour was evicted, or is unknown


def _flat(x: torch.Tensor, batch_dims: int, m: int) -> torch.Tensor:
    return x.reshape(m, *x.shape[batch_dims:])


def _scalar_column(x: torch.Tensor, name: str, m: int) -> torch.Tensor:
    if x.shape == (m, 1):
        x = x.squeeze(-1)
    if x.shape != (m,):
        raise ValueError(f"rollout entry {name!r} must hold one scalar per step ([..., 1] or [...]), got {tuple(x.shape)}.")
    return x


class GameBuffer:
    """Prioritized MuZero replay with de-duplicated frames and reanalyzed targets.

    The driver process owns it alone: :meth:`extend` takes collector rollouts,
    :meth:`sample` returns learner batches with their targets, and
    :meth:`update_priority` writes the new priorities back.

    Args:
        capacity (int): rows of storage. A row is one transition, plus one
            row per finished episode for its last observation (a running
            trajectory's newest observation becomes the row of its next step).
            Oldest segments are evicted first, whole.

    Keyword Args:
        num_unroll_steps (int): ``K``. Defaults to 5.
        td_steps (int): ``n`` of the n-step value targets. Defaults to 5.
        discount (float): ``gamma`` of the value targets. Defaults to 0.997.
        two_player (bool): zero-sum, players alternate every move; rewards are
            the mover's and value targets take the view of the player to move.
        observation_key (NestedKey): the observation entry of the rollouts
            (``("next", observation_key)`` is read too). Defaults to
            ``"observation"``.
        frame_stack (int): ``N`` of the ``CatFrames`` that stacked the
            observations; 1 (default) stores observations as they are.
        frame_dim (int): the ``dim`` of that ``CatFrames`` (negative).
            Defaults to -3 (``[N * C, H, W]`` images).
        frame_padding (str) / frame_padding_value: the ``padding`` /
            ``padding_value`` of that ``CatFrames`` (``"same"`` default).
        alpha (float): priority exponent (0: uniform sampling). Defaults to 0.6.
        beta (float): initial importance-sampling exponent. Defaults to 0.4.
        beta_annealing_steps (int): number of :meth:`sample` calls over which
            beta rises linearly to 1; 0 (default) keeps it constant.
        priority_eps (float): added to priorities before ``** alpha``.
        reanalyze_ratio (float): fraction of each batch whose policy targets
            come from a fresh search with the current model. Defaults to 0.
        mcts_config (MCTSConfig): settings of that search (default:
            ``MCTSConfig(discount=discount)``).
        reanalyze_noise (bool): Dirichlet noise at the reanalyze roots, as
            during collection (LightZero does so). Defaults to True.
        with_future_observations (bool): fill ``observation[:, 1:]`` (for the
            consistency loss). Defaults to False.
        model: the current model (policy reanalyze). Can be given to
            :meth:`sample` instead.
        target_model: the model whose value bootstraps the n-step returns
            (value reanalyze). Defaults to ``model``; with neither, the stored
            search values are used.
        device: where model inputs go and where sampled batches are put
            (default: model calls on the model's device, batches on the
            storage device).
        storage_device: device of the storage (default ``"cpu"``).
        seed (int, optional): seeds the sampling / padding-action generator.
        tree_backend (str): ``"auto"``, ``"cpp"`` or ``"torch"`` (see
            :class:`~torchrl_muzero.data.PriorityTree`).

    Rollout entries read by :meth:`extend` (``[envs, T]`` or flat): the
    observation and ``("next", observation)``, ``"action"`` (index or one-hot),
    ``("next", "reward")``, ``("next", "done")`` / ``"terminated"`` /
    ``"truncated"``, ``("collector", "traj_ids")``, ``"search_policy"``
    ``[A]``, ``"root_value"``, and when present ``"policy_version"``,
    ``"action_mask"``, ``"to_play"`` (and their ``"next"`` counterparts), and
    ``("collector", "mask")`` (rows where it is False are skipped).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.data import GameBuffer
        >>> T, A = 6, 2
        >>> obs = torch.arange(T + 1, dtype=torch.float32).unsqueeze(-1)
        >>> done = torch.zeros(T, 1, dtype=torch.bool); done[-1] = True
        >>> rollout = TensorDict({
        ...     "observation": obs[:-1],
        ...     "action": torch.zeros(T, dtype=torch.long),
        ...     "search_policy": torch.full((T, A), 0.5),
        ...     "root_value": torch.zeros(T),
        ...     ("collector", "traj_ids"): torch.zeros(T, dtype=torch.long),
        ...     ("next", "observation"): obs[1:],
        ...     ("next", "reward"): torch.ones(T, 1),
        ...     ("next", "done"): done, ("next", "terminated"): done,
        ... }, [T])
        >>> buffer = GameBuffer(100, num_unroll_steps=2, td_steps=3, discount=0.5, seed=0)
        >>> buffer.extend(rollout)
        6
        >>> batch = buffer.sample(4)
        >>> batch.batch_size
        torch.Size([4, 3])
        >>> # the root at t = 4 sees rewards 1, 1 then the terminal: 1 + 0.5 = 1.5
        >>> t = batch["observation"][:, 0, 0].long()
        >>> bool((batch["target_value"][t == 4, 0] == 1.5).all())
        True
        >>> written = buffer.update_priority(batch["index"], torch.rand(4), batch["stamp"])
        >>> bool(written.all())
        True
    """

    def __init__(
        self,
        capacity: int,
        *,
        num_unroll_steps: int = 5,
        td_steps: int = 5,
        discount: float = 0.997,
        two_player: bool = False,
        observation_key: Any = "observation",
        frame_stack: int = 1,
        frame_dim: int = -3,
        frame_padding: str = "same",
        frame_padding_value: float = 0,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_annealing_steps: int = 0,
        priority_eps: float = 1e-6,
        reanalyze_ratio: float = 0.0,
        mcts_config=None,
        reanalyze_noise: bool = True,
        with_future_observations: bool = False,
        model=None,
        target_model=None,
        device: torch.device | str | None = None,
        storage_device: torch.device | str = "cpu",
        seed: int | None = None,
        tree_backend: str = "auto",
    ) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 2:
            raise ValueError(f"capacity must be an integer >= 2, got {capacity!r}.")
        if not isinstance(num_unroll_steps, int) or num_unroll_steps < 0:
            raise ValueError(f"num_unroll_steps must be an integer >= 0, got {num_unroll_steps!r}.")
        if not isinstance(td_steps, int) or td_steps < 1:
            raise ValueError(f"td_steps must be an integer >= 1, got {td_steps!r}.")
        if not 0.0 <= float(discount) <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount!r}.")
        if float(alpha) < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha!r}.")
        if not 0.0 <= float(beta) <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta!r}.")
        if not isinstance(beta_annealing_steps, int) or beta_annealing_steps < 0:
            raise ValueError(f"beta_annealing_steps must be an integer >= 0, got {beta_annealing_steps!r}.")
        if not float(priority_eps) > 0:
            raise ValueError(f"priority_eps must be > 0, got {priority_eps!r}.")
        if not 0.0 <= float(reanalyze_ratio) <= 1.0:
            raise ValueError(f"reanalyze_ratio must be in [0, 1], got {reanalyze_ratio!r}.")
        self.capacity = capacity
        self.num_unroll_steps = num_unroll_steps
        self.td_steps = td_steps
        self.discount = float(discount)
        self.two_player = bool(two_player)
        self.observation_key = observation_key
        self.frames = FrameStack(frame_stack, frame_dim, frame_padding, frame_padding_value)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.beta_annealing_steps = beta_annealing_steps
        self.priority_eps = float(priority_eps)
        self.reanalyze_ratio = float(reanalyze_ratio)
        self.mcts_config = mcts_config
        self.reanalyze_noise = bool(reanalyze_noise)
        self.with_future_observations = bool(with_future_observations)
        self.model = model
        self.target_model = target_model
        self.device = None if device is None else torch.device(device)
        self.storage_device = torch.device(storage_device)
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(int(seed))
        else:
            self._generator.seed()

        self._frame_store = LazyTensorStorage(capacity, device=self.storage_device)
        self._step_store = LazyTensorStorage(capacity, device=self.storage_device)
        self._tree = PriorityTree(capacity, backend=tree_backend)
        # bookkeeping, one entry per row (CPU)
        self._prev = torch.full((capacity,), _LOST, dtype=torch.int64)
        self._next = torch.full((capacity,), _LOST, dtype=torch.int64)
        self._kind = torch.full((capacity,), _OPEN, dtype=torch.int8)
        self._alive = torch.zeros(capacity, dtype=torch.bool)
        self._hist_ok = torch.zeros(capacity, dtype=torch.bool)
        self._write_time = torch.full((capacity,), -1, dtype=torch.int64)
        self._segment_end = torch.zeros(capacity, dtype=torch.int64)
        self._traj = torch.full((capacity,), -1, dtype=torch.int64)
        self._priority = torch.zeros(capacity, dtype=torch.float32)
        self._open: dict[int, tuple[int, int]] = {}  # traj id -> (row, write time) of its newest row
        self._cursor = 0  # rows written so far (absolute write position)
        self._num_samples = 0
        # fixed by the first rollout
        self._num_actions: int | None = None
        self._obs_shape: torch.Size | None = None
        self._frame_shape: torch.Size | None = None
        self._obs_dtype: torch.dtype | None = None
        self._has_action_mask = False
        self._has_to_play = False

    # ------------------------------------------------------------------ info
    def __len__(self) -> int:
        """Number of stored transitions (step rows)."""
        return int((self._alive & (self._kind == _STEP)).sum())

    @property
    def num_rows(self) -> int:
        """Rows in use: transitions plus last observations."""
        return int(self._alive.sum())

    @property
    def num_sampleable(self) -> int:
        """Transitions that can be drawn as roots (their frame history is stored)."""
        return int((self._tree.leaves > 0).sum())

    @property
    def write_count(self) -> int:
        """Rows written since creation (the clock of the sample stamps)."""
        return self._cursor

    @property
    def current_beta(self) -> float:
        """The importance-sampling exponent the next :meth:`sample` uses."""
        if self.beta_annealing_steps <= 0:
            return self.beta
        frac = min(1.0, self._num_samples / self.beta_annealing_steps)
        return self.beta + (1.0 - self.beta) * frac

    def nbytes(self) -> int:
        """Bytes held by the storage, the bookkeeping and the priority trees."""
        total = 0
        for store in (self._frame_store, self._step_store):
            if store.initialized:
                data = store._storage  # the preallocated tensor / TensorDict
                total += data.nbytes if isinstance(data, torch.Tensor) else data.bytes()
        for t in (self._prev, self._next, self._kind, self._alive, self._hist_ok, self._write_time,
                  self._segment_end, self._traj, self._priority):
            total += t.numel() * t.element_size()
        tree = self._tree
        for name in ("_leaves", "_sum", "_min"):
            t = getattr(tree, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        if tree.backend == "cpp":
            total += 2 * 2 * tree.capacity * 4
        return total

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(transitions={len(self)}, rows={self.num_rows}/{self.capacity}, "
            f"K={self.num_unroll_steps}, td_steps={self.td_steps}, frames={self.frames}, "
            f"reanalyze_ratio={self.reanalyze_ratio})"
        )

    # ---------------------------------------------------------------- extend
    def extend(self, rollout: TensorDictBase) -> int:
        """Store a collector batch; returns the number of transitions read.

        Rows are grouped by ``("collector", "traj_ids")`` (keeping their order
        inside a trajectory), so batches ``[envs, T]``, flat batches and chunks
        of different workers interleaved in any order are all fine, as long as
        one trajectory's steps come in time order. A trajectory id seen before
        continues that trajectory: its first observation must be the
        ``("next", observation)`` of its previous chunk.
        """
        if not is_tensor_collection(rollout):
            raise TypeError(f"GameBuffer.extend expects a TensorDict rollout, got {type(rollout).__name__}.")
        if rollout.batch_dims == 0:
            raise ValueError("GameBuffer.extend expects a batched rollout ([T] or [envs, T]), got batch_size [].")
        m = rollout.batch_size.numel()
        if m == 0:
            return 0
        data = self._read_rollout(rollout, m)
        m = data["m"]
        if m == 0:
            return 0
        self._check_and_fix_layout(data)

        # group the rows by trajectory, keeping their order inside each one
        traj = data["traj"]
        order = torch.sort(traj, stable=True).indices
        traj_sorted = traj[order]
        done_sorted = data["done"][order]
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

        # plan the segments
        segments = []
        offset = 0
        for tid_t, start_t, length_t in zip(seg_ids.tolist(), seg_starts.tolist(), seg_lens.tolist()):
            rows = order[start_t : start_t + length_t]
            last = int(rows[-1])
            continuing = tid_t in self._open
            tail_ok = False
            tail = -1
            if continuing:
                tail, stamp = self._open[tid_t]
                tail_ok = bool(self._alive[tail]) and int(self._write_time[tail]) == stamp and int(self._kind[tail]) == _OPEN
            n_rows = length_t if tail_ok else length_t + 1
            ends = bool(data["done"][last])
            if ends:
                kind = _TERMINAL if bool(data["terminated"][last]) else _TRUNCATED
            else:
                kind = _OPEN
            segments.append(
                dict(tid=tid_t, rows=rows, continuing=continuing, tail=tail, tail_ok=tail_ok,
                     offset=offset, n_rows=n_rows, end_kind=kind)
            )
            offset += n_rows
        n_new = offset
        if n_new > self.capacity:
            raise ValueError(
                f"this rollout needs {n_new} rows ({m} transitions plus last observations), more than the "
                f"buffer's capacity of {self.capacity}: extend with smaller batches or raise capacity."
            )

        # a running trajectory must continue from the observation stored for it
        newest_obs = self.frames.newest(data["obs"])
        tails = [s for s in segments if s["tail_ok"]]
        if tails:
            tail_slots = torch.tensor([s["tail"] for s in tails], dtype=torch.long)
            first_rows = torch.stack([s["rows"][0] for s in tails])
            stored = self._frame_store.get(tail_slots).to(newest_obs.device)
            same = (stored == newest_obs[first_rows]).flatten(1).all(1)
            if not bool(same.all()):
                tid = tails[int((~same).nonzero()[0])]["tid"]
                raise ValueError(
                    f"trajectory id {tid} continues, but its first observation differs from the "
                    f"('next', {self.observation_key!r}) of its previous chunk: were the envs reset between "
                    "batches without new trajectory ids?"
                )
        # episode starts of new trajectories (their frame history is the CatFrames padding)
        fresh = [s for s in segments if not s["continuing"]]
        fresh_start = {}
        if fresh:
            first_rows = torch.stack([s["rows"][0] for s in fresh])
            is_start = self.frames.is_padded_start(data["obs"][first_rows])
            fresh_start = {s["tid"]: bool(v) for s, v in zip(fresh, is_start.tolist())}

        # ---- from here on the buffer changes
        base = self._cursor
        cap = self.capacity
        new_abs = base + torch.arange(n_new, dtype=torch.int64)
        new_slots = new_abs % cap
        self._evict_range(base, n_new)
        max_priority = self._max_priority()

        newest_next = self.frames.newest(data["next_obs"])
        frame_buf = torch.empty((n_new, *self._frame_shape), dtype=self._obs_dtype)
        payload = self._empty_payload(n_new)
        kinds = torch.full((n_new,), _STEP, dtype=torch.int8)
        seg_end = torch.empty(n_new, dtype=torch.int64)
        trajs = torch.empty(n_new, dtype=torch.int64)
        new_step_pos = []  # positions (in the new block) of step rows
        new_step_src = []  # their rollout rows
        final_pos = []
        final_src = []
        tail_slots = []
        tail_src = []
        chains = []  # per segment: slots in trajectory order, and the prev of its first row
        for s in segments:
            rows, off, n_rows = s["rows"], s["offset"], s["n_rows"]
            seg_end[off : off + n_rows] = base + off + n_rows
            trajs[off : off + n_rows] = s["tid"]
            if s["tail_ok"]:
                tail_alive = bool(self._alive[s["tail"]])  # may have been evicted just now
                step_rows = rows[1:]
                if tail_alive:
                    tail_slots.append(s["tail"])
                    tail_src.append(rows[:1])
                    head = [s["tail"]]
                    first_prev = None  # keep the tail's own link
                else:
                    head = []
                    first_prev = _LOST
            else:
                step_rows = rows
                head = []
                if s["continuing"]:
                    first_prev = _LOST
                else:
                    first_prev = _START if fresh_start[s["tid"]] else _LOST
            k = step_rows.numel()
            new_step_pos.append(torch.arange(off, off + k))
            new_step_src.append(step_rows)
            final_pos.append(off + k)
            final_src.append(int(rows[-1]))
            kinds[off + k] = s["end_kind"]
            chain = torch.cat([torch.tensor(head, dtype=torch.long), new_slots[off : off + k + 1]])
            chains.append((chain, first_prev))
            s["final_slot"] = int(new_slots[off + k])
            s["final_time"] = base + off + k

        step_pos = torch.cat(new_step_pos)
        step_src = torch.cat(new_step_src)
        final_pos_t = torch.tensor(final_pos, dtype=torch.long)
        final_src_t = torch.tensor(final_src, dtype=torch.long)
        frame_buf[step_pos] = newest_obs[step_src].to(self._obs_dtype)
        frame_buf[final_pos_t] = newest_next[final_src_t].to(self._obs_dtype)
        self._fill_payload(payload, step_pos, data, step_src, final_pos_t, final_src_t)

        self._frame_store.set(new_slots, frame_buf.to(self.storage_device))
        self._step_store.set(new_slots, payload.to(self.storage_device))
        if tail_slots:
            tail_slots_t = torch.tensor(tail_slots, dtype=torch.long)
            tail_src_t = torch.cat(tail_src)
            tail_payload = self._empty_payload(len(tail_slots))
            self._fill_payload(tail_payload, torch.arange(len(tail_slots)), data, tail_src_t, None, None)
            self._step_store.set(tail_slots_t, tail_payload.to(self.storage_device))
            self._kind[tail_slots_t] = _STEP
        else:
            tail_slots_t = torch.empty(0, dtype=torch.long)

        self._kind[new_slots] = kinds
        self._alive[new_slots] = True
        self._write_time[new_slots] = new_abs
        self._segment_end[new_slots] = seg_end
        self._traj[new_slots] = trajs
        self._next[new_slots] = _START
        self._prev[new_slots] = _LOST
        for chain, first_prev in chains:
            if chain.numel() > 1:
                self._next[chain[:-1]] = chain[1:]
                self._prev[chain[1:]] = chain[:-1]
            if first_prev is not None:
                self._prev[chain[0]] = first_prev
        for s in segments:
            if s["end_kind"] == _OPEN:
                self._open[s["tid"]] = (s["final_slot"], s["final_time"])
            else:
                self._open.pop(s["tid"], None)
        self._cursor = base + n_new

        # priorities: new steps enter with the current maximum
        steps = torch.cat([new_slots[step_pos], tail_slots_t])
        self._hist_ok[new_slots] = False
        self._hist_ok[steps] = self._history_complete(steps)
        self._priority[new_slots] = 0.0
        self._priority[steps] = max_priority
        self._refresh_tree(torch.cat([new_slots, tail_slots_t]))
        return m

    def _read_rollout(self, rollout: TensorDictBase, m: int) -> dict:
        bd = rollout.batch_dims
        key = self.observation_key

        def get(k, required=True):
            v = rollout.get(k, None)
            if v is None and required:
                raise KeyError(
                    f"GameBuffer.extend: the rollout has no {k!r} entry (needed: the observation and "
                    f"('next', observation), 'action', ('next', 'reward'), ('next', 'done'), "
                    f"('collector', 'traj_ids'), 'search_policy', 'root_value')."
                )
            if v is None:
                return None
            if is_tensor_collection(v):
                raise ValueError(f"rollout entry {k!r} must be a tensor, got a {type(v).__name__}.")
            return _flat(v, bd, m).to(self.storage_device)

        nk = ("next", key) if isinstance(key, str) else ("next", *key)
        out = {
            "obs": get(key),
            "next_obs": get(nk),
            "action": get("action"),
            "reward": _scalar_column(get(("next", "reward")), "('next', 'reward')", m).float(),
            "traj": _scalar_column(get(("collector", "traj_ids")), "('collector', 'traj_ids')", m).long(),
            "search_policy": get("search_policy"),
            "root_value": _scalar_column(get("root_value"), "root_value", m).float(),
        }
        done = get(("next", "done"), required=False)
        terminated = get(("next", "terminated"), required=False)
        truncated = get(("next", "truncated"), required=False)
        if done is None and terminated is None:
            raise KeyError("GameBuffer.extend: the rollout has neither ('next', 'done') nor ('next', 'terminated').")
        terminated = _scalar_column(terminated if terminated is not None else done, "('next', 'terminated')", m).bool()
        if truncated is not None:
            truncated = _scalar_column(truncated, "('next', 'truncated')", m).bool()
        if done is None:
            done = terminated | (truncated if truncated is not None else torch.zeros_like(terminated))
        done = _scalar_column(done, "('next', 'done')", m).bool()
        out["done"] = done | terminated | (truncated if truncated is not None else False)
        out["terminated"] = terminated
        version = get("policy_version", required=False)
        out["policy_version"] = (
            torch.full((m,), -1, dtype=torch.int64) if version is None else _scalar_column(version, "policy_version", m).long()
        )
        out["action_mask"] = get("action_mask", required=False)
        out["next_action_mask"] = get(("next", "action_mask"), required=False)
        to_play = get("to_play", required=False)
        out["to_play"] = None if to_play is None else _scalar_column(to_play, "to_play", m).long()
        next_to_play = get(("next", "to_play"), required=False)
        out["next_to_play"] = None if next_to_play is None else _scalar_column(next_to_play, "('next', 'to_play')", m).long()

        sp = out["search_policy"]
        if sp.ndim != 2:
            raise ValueError(f"rollout entry 'search_policy' must be [..., num_actions], got {tuple(sp.shape)} after flattening.")
        num_actions = sp.shape[1]
        action = out["action"]
        if action.shape == (m, num_actions) and num_actions > 1:
            action = action.argmax(-1)  # one-hot
        else:
            action = _scalar_column(action, "action", m)
            if action.is_floating_point():
                raise ValueError("rollout entry 'action' must hold integer indices or one-hot vectors, got floats.")
        action = action.long()
        if m and (int(action.min()) < 0 or int(action.max()) >= num_actions):
            raise ValueError(f"rollout actions must lie in [0, {num_actions}), got [{int(action.min())}, {int(action.max())}].")
        out["action"] = action
        out["search_policy"] = sp.float()
        if out["obs"].shape != out["next_obs"].shape:
            raise ValueError(
                f"observation {tuple(out['obs'].shape)} and ('next', observation) {tuple(out['next_obs'].shape)} differ in shape."
            )

        mask = get(("collector", "mask"), required=False)
        if mask is not None:
            keep = _scalar_column(mask, "('collector', 'mask')", m).bool()
            if not bool(keep.all()):
                idx = keep.nonzero().squeeze(-1)
                out = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
                m = int(idx.numel())
        out["m"] = m
        return out

    def _check_and_fix_layout(self, data: dict) -> None:
        obs = data["obs"]
        obs_shape = obs.shape[1:]
        a = data["search_policy"].shape[1]
        if self._num_actions is None:
            self._frame_shape = self.frames.frame_shape(obs_shape)
            self._obs_shape = torch.Size(obs_shape)
            self._obs_dtype = obs.dtype
            self._num_actions = a
            self._has_action_mask = data["action_mask"] is not None
            self._has_to_play = data["to_play"] is not None
            return
        if obs_shape != self._obs_shape or obs.dtype != self._obs_dtype:
            raise ValueError(
                f"rollout observations are {tuple(obs_shape)} {obs.dtype}, the buffer stores "
                f"{tuple(self._obs_shape)} {self._obs_dtype}."
            )
        if a != self._num_actions:
            raise ValueError(f"rollout search_policy has {a} actions, the buffer stores {self._num_actions}.")
        if (data["action_mask"] is not None) != self._has_action_mask:
            raise ValueError("rollouts must all have, or all lack, an 'action_mask' entry.")
        if (data["to_play"] is not None) != self._has_to_play:
            raise ValueError("rollouts must all have, or all lack, a 'to_play' entry.")

    def _empty_payload(self, n: int) -> TensorDict:
        a = self._num_actions
        fields = {
            "action": torch.zeros(n, dtype=torch.int64),
            "reward": torch.zeros(n, dtype=torch.float32),
            "search_policy": torch.zeros(n, a, dtype=torch.float32),
            "root_value": torch.zeros(n, dtype=torch.float32),
            "policy_version": torch.full((n,), -1, dtype=torch.int64),
        }
        if self._has_action_mask:
            fields["action_mask"] = torch.ones(n, a, dtype=torch.bool)
        if self._has_to_play:
            fields["to_play"] = torch.zeros(n, dtype=torch.int64)
        return TensorDict(fields, batch_size=[n])

    def _fill_payload(self, payload, pos, data, src, final_pos, final_src) -> None:
        payload["action"][pos] = data["action"][src]
        payload["reward"][pos] = data["reward"][src]
        payload["search_policy"][pos] = data["search_policy"][src]
        payload["root_value"][pos] = data["root_value"][src]
        payload["policy_version"][pos] = data["policy_version"][src]
        if self._has_action_mask:
            payload["action_mask"][pos] = data["action_mask"][src].bool()
            if final_pos is not None and data["next_action_mask"] is not None:
                payload["action_mask"][final_pos] = data["next_action_mask"][final_src].bool()
        if self._has_to_play:
            payload["to_play"][pos] = data["to_play"][src]
            if final_pos is not None:
                if data["next_to_play"] is not None:
                    payload["to_play"][final_pos] = data["next_to_play"][final_src]
                else:  # players alternate
                    payload["to_play"][final_pos] = data["to_play"][final_src]

    # -------------------------------------------------------------- eviction
    def _evict_range(self, base: int, n_new: int) -> None:
        """Evict the rows at write positions ``base .. base + n_new`` and the rest of their segments."""
        cap = self.capacity
        slots = (base + torch.arange(n_new, dtype=torch.int64)) % cap
        dead = [slots[self._alive[slots]]]
        first_kept = base + n_new - cap  # absolute position of the oldest row not overwritten
        if first_kept > 0:
            last_slot = (base + n_new - 1) % cap
            end = int(self._segment_end[last_slot])
            if bool(self._alive[last_slot]) and int(self._write_time[last_slot]) == first_kept - 1 and end > first_kept:
                rest = torch.arange(first_kept, end, dtype=torch.int64) % cap
                dead.append(rest[self._alive[rest]])
        dead = torch.cat(dead)
        if dead.numel():
            self._evict(dead)

    def _evict(self, dead: torch.Tensor) -> None:
        # running trajectories whose newest row goes: forget them (a later chunk starts afresh)
        for slot in dead[self._kind[dead] == _OPEN].tolist():
            tid = int(self._traj[slot])
            if self._open.get(tid, (None,))[0] == slot:
                del self._open[tid]
        self._alive[dead] = False
        self._hist_ok[dead] = False
        self._priority[dead] = 0.0
        self._tree.update(dead, torch.zeros(dead.numel(), dtype=torch.float64))
        # the rows after an evicted one lose the frames of their stacks
        nxt = self._next[dead]
        valid = nxt >= 0
        src, nxt = dead[valid], nxt[valid]
        ok = self._alive[nxt] & (self._prev[nxt] == src)
        cur = nxt[ok]
        self._prev[cur] = _LOST
        for _ in range(self.frames.num_frames - 1):
            if cur.numel() == 0:
                break
            self._hist_ok[cur] = False
            self._tree.update(cur, torch.zeros(cur.numel(), dtype=torch.float64))
            cur = self._next[cur]
            cur = cur[cur >= 0]
            cur = cur[self._alive[cur]]
        # the rows before an evicted one lose their continuation
        prv = self._prev[dead]
        valid = prv >= 0
        src, prv = dead[valid], prv[valid]
        ok = self._alive[prv] & (self._next[prv] == src)
        self._next[prv[ok]] = _LOST

    def _history_complete(self, slots: torch.Tensor) -> torch.Tensor:
        """Whether the ``N - 1`` frames before each row are stored (or are padding)."""
        ok = torch.ones(slots.shape, dtype=torch.bool)
        stop = torch.zeros(slots.shape, dtype=torch.bool)
        cur = slots
        for _ in range(self.frames.num_frames - 1):
            p = self._prev[cur]
            lost = (p == _LOST) & ~stop
            ok &= ~lost
            stop |= p < 0
            cur = torch.where(stop, cur, p)
        return ok

    def _max_priority(self) -> float:
        live = self._priority[self._alive & (self._kind == _STEP)]
        return float(live.max()) if live.numel() else 1.0

    def _refresh_tree(self, slots: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        ok = self._alive[slots] & (self._kind[slots] == _STEP) & self._hist_ok[slots]
        p = (self._priority[slots].double() + self.priority_eps) ** self.alpha
        self._tree.update(slots, torch.where(ok, p, torch.zeros_like(p)))

    # ---------------------------------------------------------- observations
    def _observations(self, slots: torch.Tensor) -> torch.Tensor:
        """Rebuild the stacked observations of rows ``slots`` ``[M]`` -> ``[M, *obs_shape]``."""
        n = self.frames.num_frames
        if n == 1:
            return self._frame_store.get(slots)
        cur = slots
        pad = torch.zeros(slots.shape, dtype=torch.bool)
        hist, pads = [cur], [pad]
        for _ in range(n - 1):
            p = self._prev[cur]
            has = (p >= 0) & ~pad
            cur = torch.where(has, p, cur)
            pad = ~has
            hist.append(cur)
            pads.append(pad)
        index = torch.stack(hist[::-1], 1)  # oldest first
        padded = torch.stack(pads[::-1], 1)
        frames = self._frame_store.get(index.reshape(-1)).reshape(slots.numel(), n, *self._frame_shape)
        return self.frames.rebuild(frames, padded)

    def __getitem__(self, index) -> TensorDict:
        """Stored rows by slot: the rebuilt observation and the step payload.

        Holds ``"observation"``, ``"action"``, ``"reward"``, ``"search_policy"``,
        ``"root_value"``, ``"policy_version"``, ``"traj_id"``, ``"stamp"``
        (write time), ``"is_step"`` (False for last-observation rows) and
        ``"alive"``.
        """
        if self._num_actions is None:
            raise IndexError("the GameBuffer is empty.")
        slots = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= min(self.capacity, self._cursor)):
            raise IndexError(f"row index out of range [0, {min(self.capacity, self._cursor)}).")
        out = self._step_store.get(slots).clone()
        out["observation"] = self._observations(slots)
        out["traj_id"] = self._traj[slots].clone()
        out["stamp"] = self._write_time[slots].clone()
        out["is_step"] = self._kind[slots] == _STEP
        out["alive"] = self._alive[slots].clone()
        return out

    # ---------------------------------------------------------------- sample
    def _walk(self, roots: torch.Tensor, length: int):
        b = roots.numel()
        slots = torch.empty(b, length, dtype=torch.long)
        exists = torch.zeros(b, length, dtype=torch.bool)
        cur = roots
        ok = torch.ones(b, dtype=torch.bool)
        slots[:, 0] = cur
        exists[:, 0] = True
        for j in range(1, length):
            nxt = self._next[cur]
            step = ok & (self._kind[cur] == _STEP) & (nxt >= 0)
            nxt = torch.where(step, nxt, cur)
            step &= self._alive[nxt]
            cur = torch.where(step, nxt, cur)
            ok = step
            slots[:, j] = cur
            exists[:, j] = ok
        kinds = self._kind[slots]
        terminal = exists & (kinds == _TERMINAL)
        is_step = exists & (kinds == _STEP)
        return slots, exists, terminal, is_step

    @staticmethod
    def _model_device(model, device):
        if device is not None:
            return device
        try:
            return next(model.parameters()).device
        except (StopIteration, AttributeError):
            return torch.device("cpu")

    def sample(self, batch_size: int, *, model=None, target_model=None) -> TensorDict:
        """Draw ``batch_size`` roots (proportionally to priority) with their targets.

        Args:
            batch_size (int): ``B``.
            model: current model for policy reanalyze (default: ``self.model``).
            target_model: model whose value bootstraps the returns (default:
                ``self.target_model``, else ``model``; with neither, the
                stored search values are used, and 0 where no search ran: the
                last observation of a truncated or running trajectory).

        Returns:
            a TensorDict of batch size ``[B, K+1]`` on ``device`` holding

            * ``"observation"`` ``[B, K+1, *obs_shape]``: column 0 the root;
              with ``with_future_observations`` column ``k`` is the observation
              at ``t+k`` (the terminal observation repeated after a terminal),
              otherwise columns ``1..K`` are zeros;
            * ``"observation_mask"`` (bool): column ``k`` holds an observation;
            * ``"action"`` (long): the action taken at ``t+k``; uniformly random
              where no step is stored (after an episode's end, last column's
              padding);
            * ``"target_reward"``: reward of the transition into ``t+k`` (0 at
              ``k = 0`` and after a terminal);
            * ``"target_value"``: the n-step bootstrapped value (see
              :mod:`torchrl_muzero.data.targets`);
            * ``"target_policy"`` ``[B, K+1, A]``: the stored search policy, or a
              fresh search's for the first ``round(reanalyze_ratio * B)`` samples
              (zeros where ``policy_mask`` is False);
            * ``"mask"`` (bool): value / reward targets exist (inside the
              episode, and after a terminal where they are 0; False past a
              truncation or the newest stored step);
            * ``"policy_mask"`` (bool): a policy target exists (a step is stored);
            * ``"weight"``: importance weights ``(p_i / p_min) ** -beta`` with
              ``p_min`` the smallest priority *of the batch* (the largest weight
              is 1; the same in every column; read column 0);
            * ``"index"`` / ``"stamp"`` (long): the root rows and their write
              times (the same in every column), for :meth:`update_priority`;
            * ``"policy_version"`` (long): the version that searched the root.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not self._tree.total() > 0:
            raise RuntimeError("GameBuffer.sample: no transition can be sampled yet (extend the buffer first).")
        model = model if model is not None else self.model
        target_model = target_model if target_model is not None else self.target_model
        if target_model is None:
            target_model = model
        n_re = int(math.floor(self.reanalyze_ratio * batch_size + 0.5))
        if n_re > 0 and model is None:
            raise ValueError(
                f"reanalyze_ratio={self.reanalyze_ratio} needs a model: pass model= to GameBuffer or to sample()."
            )
        B, K, n, A = batch_size, self.num_unroll_steps, self.td_steps, self._num_actions
        g = self._generator

        roots = self._tree.sample(B, generator=g)
        prio = self._tree[roots]
        beta = self.current_beta
        # Normalised by the batch's own smallest priority (as LightZero does), not the
        # buffer's: one near-zero priority anywhere in the buffer would otherwise
        # shrink every weight, and the loss scale would jump whenever it is sampled
        # or overwritten, which Adam's running statistics follow only slowly.
        weight = (prio / prio.min()).pow(-beta).float()
        self._num_samples += 1

        J = K + n + 1
        slots, exists, terminal, is_step = self._walk(roots, J)
        plan = plan_value_targets(exists, terminal, K, n)
        steps = self._step_store.get(slots.reshape(-1)).reshape(B, J)
        zero = torch.zeros(())
        rewards = torch.where(is_step, steps["reward"].cpu(), zero)
        step_k = is_step[:, : K + 1]
        head = steps[:, : K + 1]

        # observations needed: roots (+ future), bootstrap states, reanalyze roots
        end_slots = slots.gather(1, plan.end)
        need_boot = plan.bootstrap
        requests = [roots]
        if self.with_future_observations and K > 0:
            future_ok = (exists[:, 1 : K + 1] | plan.absorbing[:, 1:])
            requests.append(slots[:, 1 : K + 1][future_ok])
        use_model_value = target_model is not None
        if use_model_value:
            requests.append(end_slots[need_boot])
        re_pos = None
        if n_re > 0:
            re_pos = step_k.clone()
            re_pos[n_re:] = False
            requests.append(slots[:, : K + 1][re_pos])
        unique, inverse = torch.unique(torch.cat(requests), return_inverse=True)
        obs_unique = self._observations(unique)
        pieces = list(torch.split(inverse, [r.numel() for r in requests]))

        out_device = self.device if self.device is not None else self.storage_device
        obs = torch.zeros((B, K + 1, *self._obs_shape), dtype=self._obs_dtype, device=out_device)
        obs[:, 0] = obs_unique[pieces.pop(0)].to(out_device)
        obs_mask = torch.zeros(B, K + 1, dtype=torch.bool)
        obs_mask[:, 0] = True
        if self.with_future_observations and K > 0:
            idx = pieces.pop(0)
            fut = obs[:, 1:]
            fut[future_ok.to(out_device)] = obs_unique[idx].to(out_device)
            obs_mask[:, 1:] = future_ok

        # value targets
        if use_model_value:
            idx = pieces.pop(0)
            boot_values = torch.zeros(B, K + 1)
            if idx.numel():
                values = self._model_values(target_model, obs_unique[idx])
                boot_values[need_boot] = values
        else:
            stored = steps["root_value"].cpu().gather(1, plan.end)
            boot_values = torch.where(is_step.gather(1, plan.end), stored, zero)
        target_value = value_targets(rewards, plan, boot_values, self.discount, n, self.two_player)
        target_reward = reward_targets(rewards, plan)

        # policy targets
        target_policy = torch.where(step_k.unsqueeze(-1), head["search_policy"].cpu(), zero)
        if re_pos is not None and bool(re_pos.any()):
            idx = pieces.pop(0)
            mask = head["action_mask"].cpu()[re_pos] if self._has_action_mask else None
            to_play = None
            if self.two_player:  # the search plays both sides when it gets players to move
                to_play = (
                    head["to_play"].cpu()[re_pos] if self._has_to_play else torch.zeros(int(re_pos.sum()), dtype=torch.long)
                )
            target_policy[re_pos] = self._reanalyze(model, obs_unique[idx], mask, to_play)

        random_actions = torch.randint(A, (B, K + 1), generator=g)
        action = torch.where(step_k, head["action"].cpu(), random_actions)
        mask = plan.inside | plan.absorbing
        stamp = self._write_time[roots]
        expand = lambda x: x.unsqueeze(1).expand(B, K + 1).contiguous()  # noqa: E731
        out = TensorDict(
            {
                "observation": obs,
                "observation_mask": obs_mask,
                "action": action,
                "target_reward": target_reward,
                "target_value": target_value,
                "target_policy": target_policy,
                "mask": mask,
                "policy_mask": step_k.clone(),
                "weight": expand(weight),
                "index": expand(roots),
                "stamp": expand(stamp),
                "policy_version": expand(head["policy_version"][:, 0].cpu()),
            },
            batch_size=[B, K + 1],
        )
        return out.to(out_device)

    def _model_values(self, model, observation: torch.Tensor) -> torch.Tensor:
        device = self._model_device(model, self.device)
        was_training = getattr(model, "training", False)
        if was_training:
            model.eval()
        try:
            with torch.no_grad():
                _, _, value_logits = model.initial_inference(observation.to(device))
                support = model.value_support
                decode = getattr(support, "decode_fast", support.decode)  # same value, fewer kernels
                values = decode(value_logits)
        finally:
            if was_training:
                model.train()
        return values.float().reshape(-1).cpu()

    def _reanalyze(self, model, observation, action_mask, to_play) -> torch.Tensor:
        from torchrl_muzero.mcts import MCTSConfig, search

        config = self.mcts_config if self.mcts_config is not None else MCTSConfig(discount=self.discount)
        device = self._model_device(model, self.device)
        generator = self._generator if device.type == "cpu" else None
        was_training = getattr(model, "training", False)
        if was_training:
            model.eval()
        try:
            with torch.no_grad():
                result = search(
                    model,
                    observation.to(device),
                    config,
                    action_mask=None if action_mask is None else action_mask.to(device),
                    to_play=None if to_play is None else to_play.to(device),
                    add_noise=self.reanalyze_noise,
                    generator=generator,
                )
        finally:
            if was_training:
                model.train()
        return result.search_policy.float().cpu()

    # ------------------------------------------------------------ priorities
    def update_priority(self, index, priority=None, stamp=None) -> torch.Tensor:
        """Write back new priorities for sampled roots, unless their row changed since.

        Args:
            index: ``[B]`` (or ``[B, K+1]``, column 0 is read) row ids from
                :meth:`sample`; or the sampled TensorDict itself, holding
                ``"index"``, ``"stamp"`` and ``"priority"`` (as
                ``MuZeroLoss`` leaves it).
            priority: ``[B]`` (or ``[B, K+1]``) non-negative priorities.
            stamp: ``[B]`` (or ``[B, K+1]``) the ``"stamp"`` of that sample.

        A row evicted, or overwritten by newer data, after the sample was drawn
        is left alone (LightZero's make_time / clear_time guard, per row).
        Returns a ``[B]`` bool tensor: True where the priority was written.
        """
        if is_tensor_collection(index):
            td = index
            for key in ("index", "stamp") + (("priority",) if priority is None else ()):
                if key not in td.keys():
                    raise KeyError(f"update_priority: the TensorDict has no {key!r} entry.")
            index, stamp = td["index"], td["stamp"]
            priority = td["priority"] if priority is None else priority
        if priority is None or stamp is None:
            raise ValueError("update_priority needs index, priority and stamp (the 'stamp' returned by sample).")

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
        fresh = self._alive[index] & (self._write_time[index] == stamp) & (self._kind[index] == _STEP)
        slots = index[fresh]
        self._priority[slots] = priority[fresh]
        self._refresh_tree(slots)
        return fresh

    # ----------------------------------------------------------------- state
    def _layout(self) -> dict:
        return {
            "capacity": self.capacity,
            "observation_key": str(self.observation_key),
            "frame_stack": self.frames.num_frames,
            "frame_dim": self.frames.dim,
            "frame_padding": self.frames.padding,
            "frame_padding_value": float(self.frames.padding_value),
        }

    def end_running_trajectories(self) -> int:
        """End every stored running trajectory as truncated; return how many.

        Call it when the collectors that produced them are gone (a resumed run
        starts new collectors whose trajectory ids begin again at 0): the
        newest observation of each becomes a truncation (bootstrap) row, and a
        later chunk with the same id starts a new trajectory instead of being
        checked against it.
        """
        ended = 0
        for slot, stamp in self._open.values():
            if bool(self._alive[slot]) and int(self._write_time[slot]) == stamp and int(self._kind[slot]) == _OPEN:
                self._kind[slot] = _TRUNCATED
                ended += 1
        self._open.clear()
        return ended

    def state_dict(self) -> dict:
        """Everything needed to resume: storage, links, priorities, cursors, RNG."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "layout": self._layout(),
            "shapes": {
                "num_actions": self._num_actions,
                "obs_shape": None if self._obs_shape is None else list(self._obs_shape),
                "obs_dtype": None if self._obs_dtype is None else str(self._obs_dtype).replace("torch.", ""),
                "has_action_mask": self._has_action_mask,
                "has_to_play": self._has_to_play,
            },
            "cursor": self._cursor,
            "num_samples": self._num_samples,
            "open_traj": torch.tensor([[t, s, w] for t, (s, w) in self._open.items()], dtype=torch.int64).reshape(-1, 3),
            "rows": {
                "prev": self._prev.clone(),
                "next": self._next.clone(),
                "kind": self._kind.clone(),
                "alive": self._alive.clone(),
                "hist_ok": self._hist_ok.clone(),
                "write_time": self._write_time.clone(),
                "segment_end": self._segment_end.clone(),
                "traj": self._traj.clone(),
                "priority": self._priority.clone(),
            },
            "frames": self._frame_store.state_dict(),
            "steps": self._step_store.state_dict(),
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict, *, _source: str = "state_dict") -> None:
        """Restore :meth:`state_dict`; raises ``ValueError`` if it does not fit this buffer."""
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"{_source} is not a GameBuffer state (missing format tag {_FORMAT!r}).")
        if state.get("version") != _VERSION:
            raise ValueError(f"{_source} has GameBuffer state version {state.get('version')!r}, expected {_VERSION}.")
        try:
            layout = state["layout"]
            mine = self._layout()
            diff = {k: (layout.get(k), v) for k, v in mine.items() if layout.get(k) != v}
            if diff:
                desc = ", ".join(f"{k}: saved {a!r} vs buffer {b!r}" for k, (a, b) in diff.items())
                raise ValueError(f"{_source} does not match this GameBuffer ({desc}).")
            rows = state["rows"]
            for name, ref in (("prev", self._prev), ("next", self._next), ("kind", self._kind), ("alive", self._alive),
                              ("hist_ok", self._hist_ok), ("write_time", self._write_time),
                              ("segment_end", self._segment_end), ("traj", self._traj), ("priority", self._priority)):
                t = rows[name]
                if not isinstance(t, torch.Tensor) or t.shape != ref.shape or t.dtype != ref.dtype:
                    raise ValueError(f"{_source}: row table {name!r} is corrupt (expected {tuple(ref.shape)} {ref.dtype}).")
            shapes = state["shapes"]
            frames = LazyTensorStorage(self.capacity, device=self.storage_device)
            steps = LazyTensorStorage(self.capacity, device=self.storage_device)
            if shapes["num_actions"] is not None:
                frames.load_state_dict(state["frames"])
                steps.load_state_dict(state["steps"])
                obs_shape = torch.Size(shapes["obs_shape"])
                frame_shape = self.frames.frame_shape(obs_shape)
                stored = frames._storage
                if not isinstance(stored, torch.Tensor) or stored.shape[1:] != frame_shape or stored.shape[0] != self.capacity:
                    raise ValueError(f"{_source}: the frame storage does not hold [{self.capacity}, {tuple(frame_shape)}] frames.")
            open_traj = state["open_traj"]
            cursor = int(state["cursor"])
            num_samples = int(state["num_samples"])
            gen_state = state["generator"]
        except (KeyError, TypeError, IndexError, RuntimeError, AttributeError) as err:
            raise ValueError(f"{_source} is a corrupt GameBuffer state ({type(err).__name__}: {err}).") from err

        self._prev.copy_(rows["prev"])
        self._next.copy_(rows["next"])
        self._kind.copy_(rows["kind"])
        self._alive.copy_(rows["alive"])
        self._hist_ok.copy_(rows["hist_ok"])
        self._write_time.copy_(rows["write_time"])
        self._segment_end.copy_(rows["segment_end"])
        self._traj.copy_(rows["traj"])
        self._priority.copy_(rows["priority"])
        self._frame_store = frames
        self._step_store = steps
        self._num_actions = shapes["num_actions"]
        self._obs_shape = None if shapes["obs_shape"] is None else torch.Size(shapes["obs_shape"])
        self._frame_shape = None if self._obs_shape is None else self.frames.frame_shape(self._obs_shape)
        self._obs_dtype = None if shapes["obs_dtype"] is None else getattr(torch, shapes["obs_dtype"])
        self._has_action_mask = bool(shapes["has_action_mask"])
        self._has_to_play = bool(shapes["has_to_play"])
        self._open = {int(t): (int(s), int(w)) for t, s, w in open_traj.tolist()}
        self._cursor = cursor
        self._num_samples = num_samples
        self._generator.set_state(gen_state)
        ok = self._alive & (self._kind == _STEP) & self._hist_ok
        p = (self._priority.double() + self.priority_eps) ** self.alpha
        self._tree.load(torch.where(ok, p, torch.zeros_like(p)))

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path`` (``torch.save``)."""
        torch.save(self.state_dict(), path)

    def load(self, path: str | os.PathLike) -> None:
        """Resume from a file written by :meth:`save`.

        Raises ``FileNotFoundError`` if it is missing and ``ValueError``
        naming the file if it is unreadable, corrupt or made by a buffer of a
        different capacity / frame layout.
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no GameBuffer checkpoint at {path!r}.")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain containers only
        except Exception as err:  # truncated / garbage files raise many different errors
            raise ValueError(f"cannot read GameBuffer checkpoint {path!r}: {type(err).__name__}: {err}") from err
        self.load_state_dict(state, _source=f"GameBuffer checkpoint {path!r}")
