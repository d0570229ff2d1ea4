"""One object per env action space: what an action is, how it is encoded, how it is checked.

The family's models, searches, losses and buffers work on *canonical*
actions: an index ``[...]`` (long) for a discrete space, a float vector
``[..., D]`` for a box. The env may want something else (torchrl's ``OneHot``
spec: one-hot vectors of its dtype; ``Categorical(n, shape=(1,))``: indices
with a trailing dimension of size 1). An :class:`ActionSpace`, made from the
env's spec by :func:`action_space_of`, converts between the two
(:meth:`~ActionSpace.encode`, :meth:`~ActionSpace.decode`) and checks
canonical actions (:meth:`~ActionSpace.validate`), so that none of the
pieces guesses the encoding on its own.

:func:`read_action_index` is the one place that reads "index or one-hot"
action tensors of a known leading shape as indices; the model's TensorDict
view, the loss and the replay buffer's rollout reader call it, each with its
own (historical) rules for the ambiguous cases.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import torch

__all__ = [
    "ActionSpace",
    "DiscreteActionSpace",
    "BoxActionSpace",
    "action_space_of",
    "as_action_space",
    "read_action_index",
    "check_model_action_space",
]


def _is_index_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def read_action_index(
    action: torch.Tensor,
    num_actions: int,
    lead_shape: Sequence[int],
    *,
    single: str = "by_dtype",
    squeeze_floats: bool = True,
    squeeze_any_lead: bool = False,
) -> torch.Tensor:
    """Read ``[*lead, num_actions]`` one-hot or ``[*lead, 1]`` index actions as ``[*lead]`` indices.

    Anything else comes back unchanged, for the caller's own shape and dtype
    checks (and their error messages). The one-hot reading is an ``argmax``
    (long indices; bool one-hots included). The keyword arguments keep
    each caller's rules for the cases the shape alone does not settle:

    * ``single``: how ``[*lead, 1]`` reads when ``num_actions == 1`` (one-hot
      or index look the same): ``"one_hot"`` (always one-hot: the model's
      TensorDict view), ``"index"`` (always an index: the rollout reader) or
      ``"by_dtype"`` (floats and bools one-hot, integers an index: the loss).
    * ``squeeze_floats``: whether a float ``[*lead, 1]`` is squeezed too (so
      that the caller's dtype check names the squeezed shape) or left as is.
    * ``squeeze_any_lead``: squeeze a trailing size-1 dimension whatever the
      leading sizes are (the model's view: its batch check then names the
      squeezed shape).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import read_action_index
        >>> read_action_index(torch.tensor([[0, 1, 0], [1, 0, 0]]), 3, (2,)).tolist()
        [1, 0]
        >>> read_action_index(torch.tensor([[2], [0]]), 3, (2,)).tolist()
        [2, 0]
        >>> read_action_index(torch.tensor([[1], [0]]), 1, (2,), single="index").tolist()
        [1, 0]
        >>> read_action_index(torch.tensor([[1.0], [0.0]]), 1, (2,), single="by_dtype").tolist()
        [0, 0]
        >>> read_action_index(torch.tensor([2, 0]), 3, (2,)).tolist()  # already indices
        [2, 0]
    """
    lead = tuple(lead_shape)
    trailing = action.ndim == len(lead) + 1
    lead_ok = trailing and tuple(action.shape[:-1]) == lead
    if lead_ok and action.shape[-1] == num_actions:
        one_hot = num_actions > 1 or single == "one_hot" or (
            single == "by_dtype" and not _is_index_dtype(action.dtype)
        )
        if one_hot:
            # torch's argmax takes no bools (torchrl's OneHot default dtype): read them as uint8, same argmax
            return (action.to(torch.uint8) if action.dtype == torch.bool else action).argmax(-1)
    if (
        trailing
        and action.shape[-1] == 1
        and (lead_ok or squeeze_any_lead)
        and (squeeze_floats or not action.dtype.is_floating_point)
    ):
        return action.squeeze(-1)
    return action


def _got(action: Any) -> str:
    return f"{tuple(action.shape)} of dtype {action.dtype}" if isinstance(action, torch.Tensor) else type(action).__name__


def _range_text(low: torch.Tensor, high: torch.Tensor) -> str:
    lo, hi = low.unique(), high.unique()
    if lo.numel() == 1 and hi.numel() == 1:
        return f"[{float(lo):g}, {float(hi):g}]"
    return f"[{[round(float(x), 6) for x in low]}, {[round(float(x), 6) for x in high]}]"


class ActionSpace(ABC):
    """What every action space says: its kind, its sizes, and the canonical <-> env conversions.

    Canonical actions are indices ``[...]`` (long) for a discrete space and
    floats ``[..., D]`` for a box; env actions are what the env's spec wants.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import ActionSpace, DiscreteActionSpace
        >>> space: ActionSpace = DiscreteActionSpace(3, one_hot=True)
        >>> space.is_discrete, space.kind, space.num_actions, space.dim
        (True, 'discrete', 3, None)
        >>> space.decode(space.encode(torch.tensor([2, 0]))).tolist()
        [2, 0]
    """

    @property
    @abstractmethod
    def is_discrete(self) -> bool:
        """Whether actions are indices (else float vectors)."""

    @property
    def kind(self) -> str:
        """``"discrete"`` or ``"continuous"``: what :class:`~torchrl_muzero.algorithms.Algorithm` lists."""
        return "discrete" if self.is_discrete else "continuous"

    @property
    def num_actions(self) -> int | None:
        """The number of discrete actions (``None`` for a box)."""
        return None

    @property
    def dim(self) -> int | None:
        """The number of dimensions of a box action (``None`` for a discrete space)."""
        return None

    @abstractmethod
    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """Canonical ``[N, ...]`` actions -> what the env's spec wants, per row."""

    @abstractmethod
    def decode(self, action: torch.Tensor) -> torch.Tensor:
        """The env's actions -> canonical ones."""

    @abstractmethod
    def validate(self, action: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Raise ``ValueError`` (one line naming what is expected) unless ``action`` is canonical and allowed."""

    @abstractmethod
    def describe(self) -> str:
        """One phrase for error messages, e.g. ``'2 actions, one-hot torch.int64'``."""


class DiscreteActionSpace(ActionSpace):
    """``n`` actions, given to the env as indices or one-hot vectors of ``dtype``.

    Args:
        n: the number of actions (>= 1).
        one_hot: the env wants one-hot ``[..., n]`` vectors (torchrl's
            ``OneHot`` spec) instead of indices (``Categorical``).
        dtype: the dtype of the env's actions.
        shape: the shape of one env action: ``(n,)`` when one-hot (the
            default), ``()`` or ``(1,)`` for indices (``Categorical(n, shape=(1,))``).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import DiscreteActionSpace
        >>> space = DiscreteActionSpace(3, one_hot=True, dtype=torch.bool)
        >>> space.encode(torch.tensor([2, 0]))
        tensor([[False, False,  True],
                [ True, False, False]])
        >>> space.decode(torch.tensor([[0, 1, 0]])).tolist()
        [1]
        >>> index = DiscreteActionSpace(3, shape=(1,))
        >>> index.encode(torch.tensor([2, 0])).shape
        torch.Size([2, 1])
        >>> index.validate(torch.tensor([0, 2]), mask=torch.tensor([[True, False, False], [False, False, True]]))
        >>> index.validate(torch.tensor([3]))
        Traceback (most recent call last):
        ...
        ValueError: discrete actions must lie in [0, 3), got values in [3, 3].
    """

    def __init__(self, n: int, one_hot: bool = False, dtype: torch.dtype = torch.int64,
                 shape: Sequence[int] | None = None) -> None:
        if int(n) < 1:
            raise ValueError(f"a discrete action space needs at least 1 action, got n={n}.")
        self.n = int(n)
        self.one_hot = bool(one_hot)
        self.dtype = dtype
        if shape is None:
            shape = (self.n,) if self.one_hot else ()
        self.shape = torch.Size(shape)
        expected = ((self.n,),) if self.one_hot else ((), (1,))
        if tuple(self.shape) not in expected:
            raise ValueError(
                f"a {'one-hot' if self.one_hot else 'index'} action has shape "
                f"{' or '.join(str(list(s)) for s in expected)}, got {list(self.shape)}."
            )

    @property
    def is_discrete(self) -> bool:
        return True

    @property
    def num_actions(self) -> int:
        return self.n

    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """Indices ``[N]`` -> one-hot ``[N, n]`` or indices ``[N]`` / ``[N, 1]``, of the space's dtype."""
        if self.one_hot:
            return torch.nn.functional.one_hot(action, self.n).to(self.dtype)
        action = action.to(self.dtype)
        # Categorical(n, shape=(1,)) keeps a trailing dimension of its own
        return action.unsqueeze(-1) if self.shape == (1,) else action

    def decode(self, action: torch.Tensor) -> torch.Tensor:
        """The env's actions (one-hot ``[..., n]`` or indices ``[...]`` / ``[..., 1]``) -> indices ``[...]`` long."""
        if self.one_hot:
            if action.ndim == 0 or action.shape[-1] != self.n:
                raise ValueError(f"one-hot actions must have shape [..., {self.n}], got {tuple(action.shape)}.")
            action = read_action_index(action, self.n, action.shape[:-1], single="one_hot")
        elif self.shape == (1,):
            if action.ndim == 0 or action.shape[-1] != 1:
                raise ValueError(f"index actions must have shape [..., 1], got {tuple(action.shape)}.")
            action = action.squeeze(-1)
        return action.long()

    def validate(self, action: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Raise ``ValueError`` unless ``action`` is integer indices in ``[0, n)`` (legal under ``mask [..., n]``)."""
        if not isinstance(action, torch.Tensor) or not _is_index_dtype(action.dtype):
            raise ValueError(f"discrete actions must be integer indices [...] in [0, {self.n}), got {_got(action)}.")
        if action.numel() and (int(action.min()) < 0 or int(action.max()) >= self.n):
            raise ValueError(
                f"discrete actions must lie in [0, {self.n}), got values in [{int(action.min())}, {int(action.max())}]."
            )
        if mask is None:
            return
        if tuple(mask.shape) != (*action.shape, self.n):
            raise ValueError(
                f"the action mask must have shape [..., {self.n}] = {[*action.shape, self.n]}, got {tuple(mask.shape)}."
            )
        legal = mask.bool().gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        if not bool(legal.all()):
            first = int(action[~legal].flatten()[0])
            raise ValueError(
                f"{int((~legal).sum())} of {action.numel()} actions are illegal under the action mask "
                f"(the first: action {first})."
            )

    def describe(self) -> str:
        return f"{self.n} action{'s' if self.n != 1 else ''}, {'one-hot' if self.one_hot else 'index'} {self.dtype}"

    def __repr__(self) -> str:
        return f"DiscreteActionSpace(n={self.n}, one_hot={self.one_hot}, dtype={self.dtype}, shape={tuple(self.shape)})"


class BoxActionSpace(ActionSpace):
    """Continuous actions: ``D`` floats, each within ``[low, high]``.

    Args:
        low: lower bounds (a number or ``D`` values; ``-inf`` for none).
        high: upper bounds (a number or ``D`` values; ``inf`` for none).
        shape: the shape of one env action: ``(D,)``, or ``()`` for a
            single scalar (``D = 1``, canonical ``[..., 1]``).
        dtype: the env's float dtype.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> space = BoxActionSpace(-2.0, 2.0, shape=(1,))
        >>> space.is_discrete, space.dim, space.num_actions
        (False, 1, None)
        >>> space.decode(space.encode(torch.tensor([[0.5], [-1.0]]))).tolist()
        [[0.5], [-1.0]]
        >>> space.validate(torch.tensor([[3.0]]))
        Traceback (most recent call last):
        ...
        ValueError: continuous actions must lie in [-2, 2], got values in [3, 3].
    """

    def __init__(self, low: Any, high: Any, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> None:
        self.shape = torch.Size(shape)
        if len(self.shape) > 1:
            raise ValueError(f"a box action has shape [] or [D], got {list(self.shape)}.")
        self.dtype = dtype
        d = self.shape[0] if len(self.shape) else 1
        self.low = torch.as_tensor(low, dtype=torch.float64).flatten().expand(d).clone()
        self.high = torch.as_tensor(high, dtype=torch.float64).flatten().expand(d).clone()
        if bool((self.low > self.high).any()):
            raise ValueError(f"a box needs low <= high, got {_range_text(self.low, self.high)}.")

    @property
    def is_discrete(self) -> bool:
        return False

    @property
    def dim(self) -> int:
        return int(self.low.numel())

    def encode(self, action: torch.Tensor) -> torch.Tensor:
        """Floats ``[N, D]`` -> the env's ``[N, D]`` (``[N]`` for a scalar box), of its dtype."""
        action = action.to(self.dtype)
        return action.squeeze(-1) if len(self.shape) == 0 else action

    def decode(self, action: torch.Tensor) -> torch.Tensor:
        """The env's actions -> floats ``[..., D]``."""
        action = action.float() if not action.is_floating_point() else action
        return action.unsqueeze(-1) if len(self.shape) == 0 else action

    def validate(self, action: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Raise ``ValueError`` unless ``action`` is finite floats ``[..., D]`` within the bounds."""
        if mask is not None:
            raise ValueError("continuous actions take no action mask.")
        if not isinstance(action, torch.Tensor) or not action.is_floating_point() or action.ndim == 0 \
                or action.shape[-1] != self.dim:
            raise ValueError(f"continuous actions must be floats [..., {self.dim}], got {_got(action)}.")
        if action.numel() == 0:
            return
        if not bool(torch.isfinite(action).all()):
            raise ValueError("continuous actions must be finite, got NaN or inf.")
        low, high = self.low.to(action.device), self.high.to(action.device)
        if bool(((action < low) | (action > high)).any()):
            raise ValueError(
                f"continuous actions must lie in {_range_text(self.low, self.high)}, got values in "
                f"[{float(action.min()):g}, {float(action.max()):g}]."
            )

    def describe(self) -> str:
        return f"{self.dim} dim{'s' if self.dim != 1 else ''} in {_range_text(self.low, self.high)}"

    def __repr__(self) -> str:
        return f"BoxActionSpace(low={self.low.tolist()}, high={self.high.tolist()}, shape={tuple(self.shape)})"


def action_space_of(spec_or_env: Any, batch_dims: int | None = None) -> ActionSpace:
    """The :class:`ActionSpace` of an env (its ``action_spec``) or of a torchrl action spec.

    ``OneHot`` -> one-hot :class:`DiscreteActionSpace`; ``Categorical`` ->
    index :class:`DiscreteActionSpace`; ``Bounded`` / ``Unbounded`` of a
    float dtype -> :class:`BoxActionSpace`. Anything else (``Binary``,
    ``MultiOneHot``, ``MultiCategorical``, integer boxes) raises
    ``ValueError``.

    ``batch_dims``: how many leading dimensions of the spec are batch ones
    (an env's own ``batch_size`` when an env is given). Without it (a bare
    spec, maybe batched) the trailing dimensions decide: a last dimension of
    size 1 of a ``Categorical`` is the index's own, and a box's last
    dimension is its ``D``.

    Examples:
        >>> import torch
        >>> from torchrl.data import Bounded, Categorical, OneHot
        >>> from torchrl_muzero.envs.action_spaces import action_space_of
        >>> action_space_of(OneHot(4))
        DiscreteActionSpace(n=4, one_hot=True, dtype=torch.bool, shape=(4,))
        >>> action_space_of(Categorical(3, shape=(1,)))
        DiscreteActionSpace(n=3, one_hot=False, dtype=torch.int64, shape=(1,))
        >>> action_space_of(Bounded(-2.0, 2.0, shape=(8, 1)), batch_dims=1)
        BoxActionSpace(low=[-2.0], high=[2.0], shape=(1,))
    """
    from torchrl.data import Binary, Bounded, Categorical, MultiCategorical, MultiOneHot, OneHot, Unbounded

    spec = spec_or_env
    if hasattr(spec_or_env, "action_spec") and hasattr(spec_or_env, "batch_size"):  # an env
        spec = spec_or_env.action_spec
        if batch_dims is None:
            batch_dims = len(spec_or_env.batch_size)
    shape = tuple(spec.shape)
    own = shape[batch_dims:] if batch_dims is not None else None  # one action's shape, when known
    name = type(spec).__name__
    if isinstance(spec, (MultiOneHot, MultiCategorical, Binary)):
        raise ValueError(f"action specs of type {name} are not supported (OneHot, Categorical, Bounded and "
                         "Unbounded are).")
    if isinstance(spec, OneHot):
        if own is not None and len(own) != 1:
            raise ValueError(f"a OneHot action must have shape [n], got {list(own)} ({name} of shape {list(shape)}).")
        return DiscreteActionSpace(shape[-1], one_hot=True, dtype=spec.dtype)
    if isinstance(spec, Categorical):
        if own is None:  # a bare spec: torchrl's Categorical(n, shape=(1,)) keeps a trailing 1
            own = (1,) if shape[-1:] == (1,) else ()
        if own not in ((), (1,)):
            raise ValueError(f"a Categorical action must have shape [] or [1], got {list(own)} "
                             f"({name} of shape {list(shape)}).")
        return DiscreteActionSpace(int(spec.space.n), one_hot=False, dtype=spec.dtype, shape=own)
    if isinstance(spec, (Bounded, Unbounded)):
        if not spec.dtype.is_floating_point:
            raise ValueError(f"integer {name} action specs are not supported (use Categorical for discrete actions).")
        if own is None:
            own = shape[-1:]
        if len(own) > 1:
            raise ValueError(f"a box action must have shape [] or [D], got {list(own)} "
                             f"({name} of shape {list(shape)}).")
        d = own[0] if own else 1
        if isinstance(spec, Unbounded):  # torchrl fills an unbounded box with the dtype's extremes
            low, high = torch.full((d,), -math.inf), torch.full((d,), math.inf)
        else:  # one env's bounds (the envs of a batch share their spec's bounds)
            low, high = spec.space.low.reshape(-1, d)[0], spec.space.high.reshape(-1, d)[0]
        return BoxActionSpace(low, high, shape=own, dtype=spec.dtype)
    raise ValueError(f"action specs of type {name} are not supported (OneHot, Categorical, Bounded and Unbounded are).")


def as_action_space(actions: "ActionSpace | int") -> ActionSpace:
    """``actions`` as an :class:`ActionSpace`: an ``int`` ``n`` is ``DiscreteActionSpace(n)``.

    Model builders took the number of actions before they took spaces; an
    int keeps meaning what it meant (users' scripts call ``build_model(cfg, (4,), 2)``).

    Examples:
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace, as_action_space
        >>> as_action_space(2)
        DiscreteActionSpace(n=2, one_hot=False, dtype=torch.int64, shape=())
        >>> as_action_space(BoxActionSpace(-1.0, 1.0, (2,))).dim
        2
        >>> as_action_space(2.5)
        Traceback (most recent call last):
        ...
        TypeError: an action space must be an ActionSpace or a number of discrete actions (int), got float.
    """
    if isinstance(actions, ActionSpace):
        return actions
    if isinstance(actions, bool) or not isinstance(actions, int):
        # numpy / torch integers are ints too (``operator.index``), floats and the rest are not
        try:
            import operator

            actions = operator.index(actions)
        except TypeError:
            raise TypeError("an action space must be an ActionSpace or a number of discrete actions (int), "
                            f"got {type(actions).__name__}.") from None
    return DiscreteActionSpace(actions)


def _same_space(a: ActionSpace, b: ActionSpace) -> bool:
    """Whether a model built for ``b`` takes the actions of ``a`` (the env's encoding does not matter)."""
    if a.is_discrete != b.is_discrete:
        return False
    if a.is_discrete:
        return a.num_actions == b.num_actions
    return a.dim == b.dim and torch.equal(a.low, b.low) and torch.equal(a.high, b.high)


def _generic_algorithms_for(kind: str) -> str:
    return f"use an algorithm that supports {kind} actions (torchrl_muzero.algorithms.algorithms_for names them)"


#: ``kind -> phrase naming the algorithms that support it``, for the refusal below. The algorithm
#: registry (:mod:`torchrl_muzero.algorithms.registry`, a layer above the envs, which must not
#: import it) installs its ``algorithms_for`` here when it is imported; before that a generic phrase.
_algorithms_for: Callable[[str], str] = _generic_algorithms_for


def check_model_action_space(space: ActionSpace, model: Any, who: str = "") -> None:
    """Raise ``ValueError`` (one line, naming both) unless ``model`` takes the actions of ``space``.

    A model that declares ``model.action_space`` (the space it was built
    for: the registry's builders set it) fits an env space of the same kind
    and size (a box: the same bounds); the env's encoding (one-hot or index)
    does not matter. A model without one takes ``model.num_actions``
    discrete actions: a box space does not fit it, nor a discrete space of
    another size.

    Examples:
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace, check_model_action_space
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> check_model_action_space(DiscreteActionSpace(2, one_hot=True), model)
        >>> check_model_action_space(DiscreteActionSpace(3), model)
        Traceback (most recent call last):
        ...
        ValueError: the action spec has 3 actions but the model has 2.
        >>> check_model_action_space(BoxActionSpace(-1.0, 1.0, (2,)), model)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: the env's actions are continuous (2 dims in [-1, 1]), but MuZeroMLPModel takes 2 discrete actions: ...
        >>> model.action_space = BoxActionSpace(-1.0, 1.0, (2,))  # a model built for a box says so
        >>> check_model_action_space(BoxActionSpace(-1.0, 1.0, (2,)), model)
        >>> check_model_action_space(DiscreteActionSpace(2), model)
        Traceback (most recent call last):
        ...
        ValueError: the env's actions are discrete (2 actions, index torch.int64), but MuZeroMLPModel was built for continuous actions (2 dims in [-1, 1]).
    """
    prefix = f"{who}: " if who else ""
    model_actions = getattr(model, "num_actions", None)
    declared = getattr(model, "action_space", None)
    if isinstance(declared, ActionSpace) and not declared.is_discrete:
        if not _same_space(space, declared):
            raise ValueError(f"{prefix}the env's actions are {space.kind} ({space.describe()}), but "
                             f"{type(model).__name__} was built for {declared.kind} actions ({declared.describe()}).")
        return
    if isinstance(declared, ActionSpace):  # discrete: today's checks and messages, by its size
        model_actions = declared.num_actions
    if not space.is_discrete:
        raise ValueError(
            f"{prefix}the env's actions are {space.kind} ({space.describe()}), but {type(model).__name__} takes "
            f"{model_actions} discrete actions: {_algorithms_for(space.kind)}."
        )
    if model_actions is not None and space.num_actions != int(model_actions):
        raise ValueError(f"{prefix}the action spec has {space.num_actions} actions but the model has {model_actions}.")
