"""Declared replay entries: per-step payload an algorithm adds to the :class:`~torchrl_muzero.data.GameBuffer`.

MuZero's replay payload is fixed (action, reward, search policy, root value,
...; :class:`~torchrl_muzero.data.rollout_reader.RowSpec`). A variant that
needs more per step (Sampled MuZero: a root's candidate actions ``[S, d]``
and the visits over them ``[S]``) declares it as :class:`ReplayEntry` s,
``GameBuffer(..., extra_entries=[...])`` (an algorithm passes them through
its registry's ``buffer_kwargs``). The buffer then, without knowing what
they mean,

* reads each from every rollout by its key (shape and dtype checked, one
  line naming the key on a mismatch) and stores it with the step;
* saves and loads it with the rest of the state (a file must declare the
  same entries as the buffer loading it);
* puts it in every sample at the unrolled positions ``[B, K+1, *shape]``
  (the entry's ``default`` where no step is stored, as ``target_policy``
  holds zeros there), before the target builders run; they read it from
  :attr:`TargetContext.entries <torchrl_muzero.data.TargetContext>`;
* lets a ``reanalyze_entries`` hook (:data:`EntriesHook`) replace the
  sampled values, e.g. with what a fresh search found; by default the
  stored values are kept. Replacements change the batch, not the storage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection
from tensordict.utils import unravel_key

__all__ = [
    "EntriesHook",
    "EntryReanalysis",
    "ReplayEntry",
    "ROW_KEYS",
    "batch_entries",
    "check_replay_entries",
    "describe_entries",
    "entries_state",
    "read_entries",
    "replace_entries",
]

NestedKey = Union[str, tuple]

#: the names a stored row already uses (``RowSpec.empty_payload`` and ``GameBuffer.__getitem__``):
#: a declared entry may not shadow them
ROW_KEYS: tuple[str, ...] = (
    "action", "reward", "search_policy", "root_value", "policy_version", "action_mask", "to_play",
    "observation", "traj_id", "stamp", "is_step", "alive",
)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class ReplayEntry:
    """One per-step entry an algorithm stores in the replay buffer.

    Args:
        key (NestedKey): where the rollouts hold it (``"x"`` or ``("root", "x")``);
            the samples hold it under the same key.
        shape (tuple of int): the shape of one step's value (``()`` a scalar;
            no ``[..., 1]`` leniency: the rollout must match exactly).
        dtype (torch.dtype): its dtype (exact, no casting). Defaults to float32.
        default: the value of the rows with no step (an episode's last
            observation) and of the sampled positions without a stored step.
            Defaults to 0.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import ReplayEntry
        >>> entry = ReplayEntry(("root", "candidates"), (3, 2))
        >>> entry
        ReplayEntry(('root', 'candidates') [3, 2] float32)
        >>> entry.empty(4).shape
        torch.Size([4, 3, 2])
        >>> ReplayEntry(("visits",), (3,), torch.int64).key  # a one-element key is the plain name
        'visits'
    """

    key: NestedKey
    shape: tuple = ()
    dtype: torch.dtype = torch.float32
    default: Any = 0

    def __post_init__(self) -> None:
        try:
            key = unravel_key(self.key)
        except Exception as err:  # tensordict's own message names the bad part
            raise TypeError(f"ReplayEntry key must be a string or a tuple of strings, got {self.key!r} "
                            f"({err}).") from err
        if not isinstance(self.shape, (tuple, list, torch.Size)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.shape
        ):
            raise ValueError(f"ReplayEntry {key!r}: shape must be a tuple of integers >= 0, got {self.shape!r}.")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"ReplayEntry {key!r}: dtype must be a torch.dtype, got {self.dtype!r}.")
        if not isinstance(self.default, (bool, int, float)):
            raise TypeError(f"ReplayEntry {key!r}: default must be a Python number or bool, got {self.default!r}.")
        # frozen: normalised once here, so keys compare equal however they were spelled
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        """``key [shape] dtype``, as error messages name it."""
        return f"{self.key!r} {list(self.shape)} {_dtype_name(self.dtype)}"

    def empty(self, n: int) -> torch.Tensor:
        """``n`` rows holding :attr:`default` ``[n, *shape]``."""
        return torch.full((n, *self.shape), self.default, dtype=self.dtype)

    def read(self, rollout: TensorDictBase, batch_dims: int, m: int) -> torch.Tensor:
        """This entry of ``rollout`` flattened to ``[m, *shape]``; one-line ``KeyError`` / ``ValueError`` otherwise."""
        value = rollout.get(self.key, None)
        if value is None:
            raise KeyError(f"GameBuffer.extend: the rollout has no {self.key!r} entry (declared in extra_entries "
                           f"as {self.describe()}).")
        if is_tensor_collection(value):
            raise ValueError(f"rollout entry {self.key!r} must be a tensor, got a {type(value).__name__}.")
        got = tuple(value.shape[batch_dims:])
        if got != self.shape or value.dtype != self.dtype:
            raise ValueError(
                f"rollout entry {self.key!r} must hold {list(self.shape)} {_dtype_name(self.dtype)} per step "
                f"(declared in extra_entries), got {list(got)} {_dtype_name(value.dtype)}."
            )
        return value.reshape(m, *self.shape)

    def to_state(self) -> dict:
        """Plain-container form for state dicts (the default is configuration, not layout: not saved)."""
        return {"key": list(self.key) if isinstance(self.key, tuple) else self.key,
                "shape": list(self.shape), "dtype": _dtype_name(self.dtype)}


def _top(key: NestedKey) -> str:
    return key[0] if isinstance(key, tuple) else key


def _prefix(a: NestedKey, b: NestedKey) -> bool:
    """``a`` is ``b`` or holds it (a TensorDict cannot hold both)."""
    a, b = (a,) if isinstance(a, str) else a, (b,) if isinstance(b, str) else b
    return b[: len(a)] == a


def check_replay_entries(entries: Iterable[ReplayEntry] | None, taken: Mapping[str, str]) -> tuple[ReplayEntry, ...]:
    """The entries as a tuple; ``ValueError`` if one shadows a name in ``taken`` (name -> its user) or another entry.

    Examples:
        >>> from torchrl_muzero.data.replay_entries import ReplayEntry, check_replay_entries
        >>> check_replay_entries([ReplayEntry("x", ())], {"action": "the stored rows"})
        (ReplayEntry('x' [] float32),)
        >>> check_replay_entries([ReplayEntry(("action", "y"), ())], {"action": "the stored rows"})
        Traceback (most recent call last):
        ...
        ValueError: extra_entries: ('action', 'y') would shadow 'action', which the stored rows use.
    """
    entries = () if entries is None else tuple(entries)
    for i, entry in enumerate(entries):
        if not isinstance(entry, ReplayEntry):
            raise TypeError(f"extra_entries must be ReplayEntry instances, got {type(entry).__name__}.")
        top = _top(entry.key)
        if top in taken:
            raise ValueError(f"extra_entries: {entry.key!r} would shadow {top!r}, which {taken[top]} use.")
        for other in entries[:i]:
            if _prefix(other.key, entry.key) or _prefix(entry.key, other.key):
                raise ValueError(f"extra_entries: {other.key!r} and {entry.key!r} overlap (declared twice?).")
    return entries


def describe_entries(states: Iterable[dict]) -> str:
    """``[key [shape] dtype, ...]`` of :meth:`ReplayEntry.to_state` s, or ``none``."""
    parts = [f"{unravel_key(tuple(s['key']) if isinstance(s['key'], list) else s['key'])!r} "
             f"{list(s['shape'])} {s['dtype']}" for s in states]
    return "[" + ", ".join(parts) + "]" if parts else "none"


def entries_state(entries: Iterable[ReplayEntry]) -> list[dict]:
    """The :meth:`ReplayEntry.to_state` of each entry, in order."""
    return [entry.to_state() for entry in entries]


def read_entries(rollout: TensorDictBase, entries: tuple[ReplayEntry, ...], batch_dims: int, m: int,
                 device: torch.device) -> TensorDict | None:
    """The declared entries of ``rollout`` as a ``[m]`` TensorDict on ``device``; None when none are declared."""
    if not entries:
        return None
    return TensorDict({e.key: e.read(rollout, batch_dims, m).to(device) for e in entries}, batch_size=[m])


def batch_entries(steps: TensorDictBase, is_step: torch.Tensor, entries: tuple[ReplayEntry, ...]) -> TensorDict:
    """The declared entries of the sampled rows ``steps`` ``[B, K+1]`` on the CPU (their default where not
    ``is_step``)."""
    out = {}
    for e in entries:
        value = steps.get(e.key).cpu()
        mask = is_step.reshape(*is_step.shape, *([1] * len(e.shape)))
        out[e.key] = torch.where(mask, value, torch.full((), e.default, dtype=e.dtype))
    return TensorDict(out, batch_size=is_step.shape)


@dataclass(frozen=True)
class EntryReanalysis:
    """What a ``reanalyze_entries`` hook (:data:`EntriesHook`) sees besides the sampled entries.

    Attributes:
        model: the model of this sample (``None`` without one).
        reanalyzed: ``[B, K+1]`` bool, the positions whose policy target a
            fresh search made in this sample (all False without reanalyze).
        observation: ``[n, *obs]`` the observations of those positions, in
            the order of ``reanalyzed.nonzero()`` (``None`` where ``n == 0``).
        policy_mask: ``[B, K+1]`` bool, a step is stored (elsewhere the
            entries hold their defaults).
        target_policy: ``[B, K+1, A]`` the batch's policy targets (the
            fresh ones at ``reanalyzed``).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import EntryReanalysis
        >>> mask = torch.ones(2, 3, dtype=torch.bool)
        >>> ctx = EntryReanalysis(None, torch.zeros_like(mask), None, mask, torch.full((2, 3, 4), 0.25))
        >>> int(ctx.reanalyzed.sum())
        0
    """

    model: Any
    reanalyzed: torch.Tensor
    observation: torch.Tensor | None
    policy_mask: torch.Tensor
    target_policy: torch.Tensor


#: ``(entries [B, K+1], EntryReanalysis) -> replacements | None``: replacements map some declared keys to
#: ``[B, K+1, *shape]`` tensors of the entry's dtype (a dict or TensorDict); ``None`` keeps the stored values
EntriesHook = Callable[[TensorDict, EntryReanalysis], "TensorDictBase | Mapping | None"]


def replace_entries(sampled: TensorDict, replacements: TensorDictBase | Mapping | None,
                    entries: tuple[ReplayEntry, ...]) -> TensorDict:
    """``sampled`` with a hook's ``replacements`` written in (checked: declared keys, ``[B, K+1, *shape]``, dtype).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.data.replay_entries import ReplayEntry, replace_entries
        >>> entry = ReplayEntry("v", (2,))
        >>> sampled = TensorDict({"v": torch.zeros(1, 3, 2)}, [1, 3])
        >>> replace_entries(sampled, {"v": torch.ones(1, 3, 2)}, (entry,))["v"].sum().item()
        6.0
        >>> replace_entries(sampled, {"v": torch.ones(1, 3)}, (entry,))
        Traceback (most recent call last):
        ...
        ValueError: reanalyze_entries returned 'v' as [1, 3] float32, expected [1, 3, 2] float32.
    """
    if replacements is None:
        return sampled
    if not isinstance(replacements, Mapping) and not is_tensor_collection(replacements):
        raise TypeError(f"reanalyze_entries must return a dict / TensorDict or None, "
                        f"got {type(replacements).__name__}.")
    declared = {e.key: e for e in entries}
    keys = replacements.keys(True, True) if is_tensor_collection(replacements) else replacements.keys()
    for raw in list(keys):
        key = unravel_key(raw)
        if key not in declared:
            raise ValueError(f"reanalyze_entries returned {key!r}, which is not a declared replay entry "
                             f"({', '.join(repr(k) for k in declared)}).")
        e, value = declared[key], torch.as_tensor(replacements[raw])
        want = (*sampled.batch_size, *e.shape)
        if tuple(value.shape) != want or value.dtype != e.dtype:
            raise ValueError(f"reanalyze_entries returned {key!r} as {list(value.shape)} {_dtype_name(value.dtype)}, "
                             f"expected {list(want)} {_dtype_name(e.dtype)}.")
        sampled.set(key, value.to(sampled.get(key).device))
    return sampled
