"""Reading collector rollouts into flat, checked columns, and the per-row payload they fill.

:func:`read_rollout` is the one place that knows which rollout entries
:meth:`GameBuffer.extend <torchrl_muzero.data.GameBuffer.extend>` reads and
how lenient it is about their shapes (``[..., 1]`` or ``[...]`` scalars,
index or one-hot actions, ``done`` from ``terminated | truncated``).
:class:`RowSpec` is what the first rollout fixes for the life of the buffer
(observation shape and dtype, number of actions, optional entries) and builds
the step payload rows from those columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.replay_entries import ReplayEntry, read_entries
from torchrl_muzero.envs.action_spaces import ActionSpace, read_action_index

__all__ = ["RowSpec", "check_continuations", "episode_starts", "read_rollout"]


def _flat(x: torch.Tensor, batch_dims: int, m: int) -> torch.Tensor:
    return x.reshape(m, *x.shape[batch_dims:])


def _scalar_column(x: torch.Tensor, name: str, m: int) -> torch.Tensor:
    if x.shape == (m, 1):
        x = x.squeeze(-1)
    if x.shape != (m,):
        raise ValueError(f"rollout entry {name!r} must hold one scalar per step ([..., 1] or [...]), got {tuple(x.shape)}.")
    return x


def _box_column(action: torch.Tensor, space: ActionSpace, m: int) -> torch.Tensor:
    """The env actions of a box ``space`` as float32 ``[m, D]`` (a scalar box's ``[m]`` gains its ``D = 1``)."""
    d = space.dim
    if d == 1 and action.shape == (m,):
        action = action.unsqueeze(-1)
    if not action.is_floating_point() or action.shape != (m, d):
        raise ValueError(f"rollout entry 'action' must hold the box's float actions [..., {d}] "
                         f"({space.describe()}), got {tuple(action.shape)} {action.dtype} after flattening.")
    if m and not bool(torch.isfinite(action).all()):
        raise ValueError("rollout entry 'action' holds NaN or inf actions.")
    return action.float()


def read_rollout(rollout: TensorDictBase, observation_key: Any, device: torch.device,
                 entries: tuple[ReplayEntry, ...] = (), action_space: ActionSpace | None = None) -> dict:
    """Flatten a ``[envs, T]`` (or flat) rollout into ``[m]`` columns on ``device``.

    ``action_space``: the env's; a box one makes ``"action"`` the env's float
    actions ``[m, D]``, a discrete one (or None, the default) indices ``[m]``.

    Returns a dict of tensors (``"obs"``, ``"next_obs"``, ``"action"`` (indices,
    or floats ``[m, D]`` for a box), ``"reward"``, ``"traj"``, ``"search_policy"``, ``"root_value"``,
    ``"done"``, ``"terminated"``, ``"policy_version"`` (-1 when absent), and
    ``"action_mask"``, ``"next_action_mask"``, ``"to_play"``,
    ``"next_to_play"`` or None), ``"entries"`` (the declared ``entries``
    as a ``[m]`` TensorDict, None when none are declared) plus ``"m"``, the
    number of rows kept after ``("collector", "mask")``.
    """
    bd = rollout.batch_dims
    m = rollout.batch_size.numel()
    key = observation_key

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
        return _flat(v, bd, m).to(device)

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
    # the search_policy is over the search's slots; a discrete action space's own count decodes the actions
    # (a sampled model searches K of its A actions: the two differ)
    num_actions = sp.shape[1]
    if action_space is not None and action_space.is_discrete:
        num_actions = action_space.num_actions
    action = out["action"]
    box = action_space is not None and not action_space.is_discrete
    # one-hot [m, A] (A > 1; any dtype) or [m, 1] indices -> [m]; other shapes are _scalar_column's error
    if box:  # the env's own float actions, stored as they are (the search's slots are not actions)
        out["action"] = _box_column(action, action_space, m)
    else:
        action = _scalar_column(read_action_index(action, num_actions, (m,), single="index"), "action", m)
        if action.is_floating_point():
            raise ValueError("rollout entry 'action' must hold integer indices or one-hot vectors, got floats.")
        action = action.long()
        if m and (int(action.min()) < 0 or int(action.max()) >= num_actions):
            raise ValueError(
                f"rollout actions must lie in [0, {num_actions}), got [{int(action.min())}, {int(action.max())}].")
        out["action"] = action
    out["search_policy"] = sp.float()
    if out["obs"].shape != out["next_obs"].shape:
        raise ValueError(
            f"observation {tuple(out['obs'].shape)} and ('next', observation) {tuple(out['next_obs'].shape)} differ in shape."
        )

    out["entries"] = read_entries(rollout, entries, bd, m, device)

    mask = get(("collector", "mask"), required=False)
    if mask is not None:
        keep = _scalar_column(mask, "('collector', 'mask')", m).bool()
        if not bool(keep.all()):
            idx = keep.nonzero().squeeze(-1)
            out = {k: (v[idx] if isinstance(v, (torch.Tensor, TensorDictBase)) else v) for k, v in out.items()}
            m = int(idx.numel())
    out["m"] = m
    return out


def check_continuations(segments: list[dict], newest_obs: torch.Tensor, frame_store: Any, observation_key: Any) -> None:
    """Raise ``ValueError`` unless each continuing trajectory starts at the observation stored for it.

    ``segments`` from :meth:`RowTable.plan_segments
    <torchrl_muzero.data.storage_rows.RowTable.plan_segments>`; ``newest_obs``
    the rollout's newest frames; ``frame_store`` the buffer's frame storage.
    Catches envs reset between batches without new trajectory ids, which
    would otherwise stitch two episodes into one.
    """
    tails = [s for s in segments if s["tail_ok"]]
    if not tails:
        return
    tail_slots = torch.tensor([s["tail"] for s in tails], dtype=torch.long)
    first_rows = torch.stack([s["rows"][0] for s in tails])
    stored = frame_store.get(tail_slots).to(newest_obs.device)
    same = (stored == newest_obs[first_rows]).flatten(1).all(1)
    if not bool(same.all()):
        tid = tails[int((~same).nonzero()[0])]["tid"]
        raise ValueError(
            f"trajectory id {tid} continues, but its first observation differs from the "
            f"('next', {observation_key!r}) of its previous chunk: were the envs reset between "
            "batches without new trajectory ids?"
        )


def episode_starts(segments: list[dict], obs: torch.Tensor, frames: FrameStack) -> dict[int, bool]:
    """For each new trajectory id: does its first observation start an episode?

    It does when its frame history is the ``CatFrames`` padding; otherwise the
    trajectory joins mid-episode (its first stacks cannot be rebuilt).
    """
    fresh = [s for s in segments if not s["continuing"]]
    if not fresh:
        return {}
    first_rows = torch.stack([s["rows"][0] for s in fresh])
    is_start = frames.is_padded_start(obs[first_rows])
    return {s["tid"]: bool(v) for s, v in zip(fresh, is_start.tolist())}


@dataclass
class RowSpec:
    """What the first rollout fixes: observation shape / dtype, actions, optional entries.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.frames import FrameStack
        >>> from torchrl_muzero.data.rollout_reader import RowSpec
        >>> data = {"obs": torch.zeros(3, 4), "search_policy": torch.zeros(3, 2),
        ...         "action_mask": None, "to_play": None}
        >>> spec = RowSpec.of(data, FrameStack())
        >>> spec.num_actions, tuple(spec.obs_shape)
        (2, (4,))
        >>> sorted(spec.empty_payload(5).keys())
        ['action', 'policy_version', 'reward', 'root_value', 'search_policy']
        >>> RowSpec.of(data, FrameStack(), action_dim=2).empty_payload(5)["action"].shape  # a box's floats
        torch.Size([5, 2])
    """

    num_actions: int
    obs_shape: torch.Size
    frame_shape: torch.Size
    obs_dtype: torch.dtype
    has_action_mask: bool
    has_to_play: bool
    #: the declared extra entries (the buffer's, not the rollout's: saved apart from :meth:`to_state`)
    entries: tuple[ReplayEntry, ...] = ()
    #: ``D`` of a box action space (actions stored as float32 ``[D]``); None: discrete indices
    action_dim: int | None = None
    #: the width of ``action_mask`` (the env's actions) when it is not ``num_actions`` (the search's slots:
    #: a sampled model searches K of its A actions); None: the same
    mask_width: int | None = None

    @classmethod
    def of(cls, data: dict, frames: FrameStack, entries: tuple[ReplayEntry, ...] = (),
           action_dim: int | None = None) -> "RowSpec":
        """The spec of a rollout read by :func:`read_rollout` (``action_dim``: ``D`` of a box action space)."""
        obs_shape = torch.Size(data["obs"].shape[1:])
        num_actions = int(data["search_policy"].shape[1])
        mask = data["action_mask"]
        mask_width = None if mask is None or int(mask.shape[-1]) == num_actions else int(mask.shape[-1])
        return cls(
            num_actions=num_actions,
            mask_width=mask_width,
            obs_shape=obs_shape,
            frame_shape=frames.frame_shape(obs_shape),
            obs_dtype=data["obs"].dtype,
            has_action_mask=data["action_mask"] is not None,
            has_to_play=data["to_play"] is not None,
            entries=tuple(entries),
            action_dim=None if action_dim is None else int(action_dim),
        )

    def check(self, data: dict) -> None:
        """Raise ``ValueError`` unless a later rollout has the same layout."""
        obs = data["obs"]
        if obs.shape[1:] != self.obs_shape or obs.dtype != self.obs_dtype:
            raise ValueError(
                f"rollout observations are {tuple(obs.shape[1:])} {obs.dtype}, the buffer stores "
                f"{tuple(self.obs_shape)} {self.obs_dtype}."
            )
        a = data["search_policy"].shape[1]
        if a != self.num_actions:
            raise ValueError(f"rollout search_policy has {a} actions, the buffer stores {self.num_actions}.")
        if (data["action_mask"] is not None) != self.has_action_mask:
            raise ValueError("rollouts must all have, or all lack, an 'action_mask' entry.")
        if (data["to_play"] is not None) != self.has_to_play:
            raise ValueError("rollouts must all have, or all lack, a 'to_play' entry.")

    # state dicts store plain values (``torch.load(weights_only=True)`` reads them back)
    def to_state(self) -> dict:
        """Plain-container form for state dicts."""
        state = {
            "num_actions": self.num_actions,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": str(self.obs_dtype).replace("torch.", ""),
            "has_action_mask": self.has_action_mask,
            "has_to_play": self.has_to_play,
        }
        if self.action_dim is not None:  # only then: a discrete buffer writes the state it wrote before boxes
            state["action_dim"] = self.action_dim
        if self.mask_width is not None:  # likewise: only a sampled model's buffer has masks wider than its slots
            state["mask_width"] = self.mask_width
        return state

    @staticmethod
    def state_of(spec: "RowSpec | None") -> dict:
        """:meth:`to_state`, or the state of a buffer that never stored a rollout."""
        if spec is None:
            return {"num_actions": None, "obs_shape": None, "obs_dtype": None,
                    "has_action_mask": False, "has_to_play": False}
        return spec.to_state()

    @classmethod
    def from_state(cls, state: dict, frames: FrameStack, entries: tuple[ReplayEntry, ...] = ()) -> "RowSpec | None":
        """Inverse of :meth:`to_state` (with the buffer's declared ``entries``); None for a buffer that never
        stored a rollout."""
        if state["num_actions"] is None:
            return None
        obs_shape = torch.Size(state["obs_shape"])
        return cls(
            num_actions=int(state["num_actions"]),
            obs_shape=obs_shape,
            frame_shape=frames.frame_shape(obs_shape),
            obs_dtype=getattr(torch, state["obs_dtype"]),
            has_action_mask=bool(state["has_action_mask"]),
            has_to_play=bool(state["has_to_play"]),
            entries=tuple(entries),
            action_dim=None if state.get("action_dim") is None else int(state["action_dim"]),
            mask_width=None if state.get("mask_width") is None else int(state["mask_width"]),
        )

    # ------------------------------------------------------------- payloads
    def empty_payload(self, n: int) -> TensorDict:
        """``n`` payload rows with neutral values (what last-observation rows keep)."""
        a = self.num_actions
        fields = {
            "action": (torch.zeros(n, dtype=torch.int64) if self.action_dim is None
                       else torch.zeros(n, self.action_dim, dtype=torch.float32)),
            "reward": torch.zeros(n, dtype=torch.float32),
            "search_policy": torch.zeros(n, a, dtype=torch.float32),
            "root_value": torch.zeros(n, dtype=torch.float32),
            "policy_version": torch.full((n,), -1, dtype=torch.int64),
        }
        if self.has_action_mask:
            fields["action_mask"] = torch.ones(n, a if self.mask_width is None else self.mask_width, dtype=torch.bool)
        if self.has_to_play:
            fields["to_play"] = torch.zeros(n, dtype=torch.int64)
        for entry in self.entries:  # last-observation rows keep the default: no search ran there
            fields[entry.key] = entry.empty(n)
        return TensorDict(fields, batch_size=[n])

    def fill_payload(self, payload: TensorDict, pos: torch.Tensor, data: dict, src: torch.Tensor,
                     final_pos: torch.Tensor | None, final_src: torch.Tensor | None) -> None:
        """Write rollout rows ``src`` into payload rows ``pos``.

        ``final_pos`` / ``final_src``: the last-observation rows and the
        rollout rows whose ``"next"`` they are (their action mask and player
        to move come from the ``"next"`` entries).
        """
        payload["action"][pos] = data["action"][src]
        payload["reward"][pos] = data["reward"][src]
        payload["search_policy"][pos] = data["search_policy"][src]
        payload["root_value"][pos] = data["root_value"][src]
        payload["policy_version"][pos] = data["policy_version"][src]
        if self.has_action_mask:
            payload["action_mask"][pos] = data["action_mask"][src].bool()
            if final_pos is not None and data["next_action_mask"] is not None:
                payload["action_mask"][final_pos] = data["next_action_mask"][final_src].bool()
        if self.has_to_play:
            payload["to_play"][pos] = data["to_play"][src]
            if final_pos is not None:
                if data["next_to_play"] is not None:
                    payload["to_play"][final_pos] = data["next_to_play"][final_src]
                else:  # players alternate
                    payload["to_play"][final_pos] = data["to_play"][final_src]
        for entry in self.entries:
            payload.get(entry.key)[pos] = data["entries"].get(entry.key)[src]
