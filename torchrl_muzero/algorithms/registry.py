"""One registry of the MuZero family: what ``algo=<name>`` builds.

An :class:`Algorithm` bundles the builders a run needs: the model for an
env's shapes, the search (a function with :func:`torchrl_muzero.mcts.search`'s
signature) and its settings, the loss, and the replay targets beyond
MuZero's. The sync trainer, the async trainer's collector and evaluator
processes, the buffer's reanalyze and a user's own script all look an
algorithm up here by its name, so none of them constructs a variant's pieces
by hand. Names follow LightZero's policy types.

Each variant registers itself in its own module of this package
(``muzero.py``, ``efficientzero.py``, ...); :func:`get_algorithm` imports
them on first use.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from torchrl_muzero.envs import action_spaces

__all__ = ["Algorithm", "register", "get_algorithm", "algorithm_names", "algorithms_for", "check_action_space"]

_REGISTRY: dict[str, "Algorithm"] = {}
_MODULES = ("muzero", "efficientzero", "gumbel_muzero", "stochastic_muzero", "muzero_context",
            "muzero_rnn_full_obs", "unizero", "sampled_muzero", "sampled_efficientzero",
            "sampled_unizero")
_loaded = False


class _SpaceBuilder:
    """An algorithm's ``(cfg, observation_shape, num_actions)`` model builder, taking an
    :class:`~torchrl_muzero.envs.action_spaces.ActionSpace` (or an int, as before); the model it returns
    declares that space (``model.action_space``): the one place every model gets it. A class, not a
    closure, so that an :class:`Algorithm` still pickles (its builder by reference)."""

    def __init__(self, build: Callable[..., Any], algo: "Algorithm") -> None:
        # dataclasses.replace of an Algorithm passes its wrapped builder: wrap the algorithm's own again, for
        # the new Algorithm (its action_kinds), never a wrapper in a wrapper
        self._builder = getattr(build, "_builder", build)
        self._algo = algo
        functools.update_wrapper(self, self._builder)

    def __call__(self, cfg: Any, observation_shape: tuple, actions: Any) -> Any:
        from torchrl_muzero.envs.action_spaces import as_action_space

        space = as_action_space(actions)
        check_action_space(self._algo, space)
        # the discrete-only algorithms' builders take the number of actions; one that supports boxes gets the
        # space, whatever its kind
        model = self._builder(cfg, observation_shape, space if self._algo.takes_action_space else space.num_actions)
        model.action_space = space
        return model


def _no_targets(cfg) -> list:
    return []


def _no_future(cfg) -> bool:
    return False


def _no_memory(cfg) -> None:
    return None


def _no_entries(cfg, action_space) -> list:
    return []


@dataclass(frozen=True)
class Algorithm:
    """The builders of one algorithm of the family.

    Attributes:
        name: the ``algo=`` name (LightZero's policy type).
        build_model: ``(cfg, observation_shape, action_space) -> model``: the
            model for the env's ``ActionSpace`` (an ``int`` ``n`` means
            ``DiscreteActionSpace(n)``), declaring it as ``model.action_space``.
            Registered as ``(cfg, observation_shape, num_actions) -> model``
            (the builder of an algorithm that supports boxes gets the space
            itself, discrete or not); the registry wraps it.
        search_fn: the search, ``(model, observation, config, action_mask=,
            to_play=, add_noise=, generator=) -> SearchResult``.
        search_config: ``(cfg) -> config`` for ``search_fn`` (an
            :class:`~torchrl_muzero.mcts.MCTSConfig` or a subclass).
        build_loss: ``(cfg, model) -> LossModule``.
        target_builders: ``(cfg) -> list`` of the replay buffer's extra target
            builders (:mod:`torchrl_muzero.data`).
        needs_future_observations: ``(cfg) -> bool``: the loss reads the
            observations of the unrolled positions (consistency loss, chance
            encoder).
        buffer_kwargs: ``(cfg) -> dict`` of further
            :class:`~torchrl_muzero.data.GameBuffer` keyword arguments
            (EfficientZero's off-policy correction; the per-step entries a
            variant stores beyond MuZero's, ``extra_entries=[ReplayEntry(...)]``,
            and the ``reanalyze_entries`` hook that refreshes them).
        replay_entries: ``(cfg, action_space) -> list`` (``action_space``
            ``None``: a discrete env) of the
            :class:`~torchrl_muzero.data.ReplayEntry` s the algorithm stores
            per step whose shape depends on the env's action space (the
            sampled family: each root's candidate actions ``[K, *action]``
            and their visits); added to ``buffer_kwargs``' ``extra_entries``.
        acting_memory: ``(cfg) -> ActingMemory | None``: what the policy
            carries per env between steps (``muzero_context``'s rolled latent,
            ``muzero_rnn_full_obs``'s GRU state;
            :mod:`torchrl_muzero.mcts.acting_memory`); ``None`` (default) acts
            from the current observation alone.
        config_keys: the ``algo.*`` keys this algorithm reads; setting
            another algorithm's key is an error, not silently ignored.
        summary: one line for listings and docs.
        action_kinds: the kinds of action space it supports
            (:attr:`ActionSpace.kind <torchrl_muzero.envs.action_spaces.ActionSpace.kind>`):
            ``("discrete",)`` for every algorithm today; the trainers refuse
            an env of another kind at start (:func:`check_action_space`).

    Examples:
        >>> from torchrl_muzero.algorithms import get_algorithm
        >>> from torchrl_muzero.trainers.config import load_config
        >>> algo = get_algorithm("muzero")
        >>> cfg = load_config({"model": {"latent_dim": 16, "hidden_dim": 16}})
        >>> model = algo.build_model(cfg, (4,), 2)
        >>> type(model).__name__, algo.search_config(cfg).num_simulations
        ('MuZeroMLPModel', 25)
        >>> model.action_space
        DiscreteActionSpace(n=2, one_hot=False, dtype=torch.int64, shape=())
    """

    name: str
    build_model: Callable[[Any, tuple, Any], Any]
    search_fn: Callable[..., Any]
    search_config: Callable[[Any], Any]
    build_loss: Callable[[Any, Any], Any]
    target_builders: Callable[[Any], list] = _no_targets
    needs_future_observations: Callable[[Any], bool] = _no_future
    buffer_kwargs: Callable[[Any], dict] = lambda cfg: {}
    replay_entries: Callable[[Any, Any], list] = _no_entries
    acting_memory: Callable[[Any], Any] = _no_memory
    config_keys: tuple[str, ...] = field(default_factory=tuple)
    summary: str = ""
    action_kinds: tuple[str, ...] = ("discrete",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "build_model", _SpaceBuilder(self.build_model, self))  # frozen dataclass

    @property
    def takes_action_space(self) -> bool:
        """Whether it supports more than discrete actions (the sampled family): its model builder gets the
        env's ``ActionSpace`` whatever its kind, and its search may draw fewer slots than the env has
        discrete actions (its buffer decodes stored actions with the env's count)."""
        return any(kind != "discrete" for kind in self.action_kinds)


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` under its name (a second registration of a name replaces the first)."""
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    import importlib

    for module in _MODULES:
        importlib.import_module(f"torchrl_muzero.algorithms.{module}")
    _loaded = True


def algorithm_names() -> list[str]:
    """The registered names: the family's in this package's order (``muzero`` first), then any a user
    registered, in registration order (not import order: importing one variant module first must not
    reorder the listing)."""
    _load_all()
    builtin = [name for name in _MODULES if name in _REGISTRY]
    return builtin + [name for name in _REGISTRY if name not in builtin]


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an unknown name raises one line listing the known ones.

    Examples:
        >>> from torchrl_muzero.algorithms import get_algorithm
        >>> get_algorithm("muzero").name
        'muzero'
        >>> get_algorithm("muzeroo")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        torchrl_muzero.errors.ConfigError: config key 'algo.name' is 'muzeroo'. Did you mean 'muzero'? Known algorithms: muzero, ...
    """
    _load_all()
    if name not in _REGISTRY:
        from torchrl_muzero.errors import ConfigError

        known = algorithm_names()
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config key 'algo.name' is {name!r}.{hint} Known algorithms: {', '.join(known)}.")
    return _REGISTRY[name]


def algorithms_for(kind: str) -> str:
    """One phrase naming the registered algorithms that support action spaces of ``kind``.

    Examples:
        >>> from torchrl_muzero.algorithms.registry import algorithms_for
        >>> algorithms_for("continuous")
        'the algorithms that support continuous actions: sampled_muzero, sampled_efficientzero, sampled_unizero'
        >>> algorithms_for("multi-discrete")
        'no algorithm supports multi-discrete actions yet'
        >>> algorithms_for("discrete")  # doctest: +ELLIPSIS
        'the algorithms that support discrete actions: muzero, efficientzero, ...'
    """
    names = [name for name in algorithm_names() if kind in get_algorithm(name).action_kinds]
    if names:
        return f"the algorithms that support {kind} actions: {', '.join(names)}"
    return f"no algorithm supports {kind} actions yet"


# the envs' check of a model against an env's actions names the algorithms through this (it cannot import them)
action_spaces._algorithms_for = algorithms_for


def check_action_space(algorithm: "Algorithm | str", space: Any, env: str = "the env") -> None:
    """Raise a one-line ``ConfigError`` unless ``algorithm`` supports the kind of ``space``.

    ``space``: an :class:`~torchrl_muzero.envs.action_spaces.ActionSpace`
    (its ``kind`` and ``describe()``); ``env``: how the message names the env.
    The trainers call it on their probe env, before any model or process exists.

    Examples:
        >>> from torchrl_muzero.algorithms.registry import check_action_space
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace
        >>> check_action_space("muzero", DiscreteActionSpace(2, one_hot=True))
        >>> check_action_space("muzero", BoxActionSpace(-2.0, 2.0, (1,)), "env.id='Pendulum-v1'")
        Traceback (most recent call last):
        ...
        torchrl_muzero.errors.ConfigError: config key 'algo.name' is 'muzero', which supports discrete actions only, but env.id='Pendulum-v1' has continuous actions (1 dim in [-2, 2]): the algorithms that support continuous actions: sampled_muzero, sampled_efficientzero, sampled_unizero.
    """
    algo = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
    if space.kind in algo.action_kinds:
        return
    from torchrl_muzero.errors import ConfigError

    supported = " and ".join(algo.action_kinds)
    raise ConfigError(
        f"config key 'algo.name' is {algo.name!r}, which supports {supported} actions only, but {env} has "
        f"{space.kind} actions ({space.describe()}): {algorithms_for(space.kind)}."
    )
