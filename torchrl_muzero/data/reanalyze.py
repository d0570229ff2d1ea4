"""Reanalyze: fresh targets from the current models for stored observations.

Two kinds, both batched into one model call per :meth:`GameBuffer.sample
<torchrl_muzero.data.GameBuffer.sample>`:

* *policy reanalyze* (:func:`reanalyze_policies`) re-runs a search at a
  fraction of the sampled positions and uses its policy as the target. The
  search is an argument, a *reanalyze search*: any callable

  ``search(model, observation [n, *obs], action_mask [n, A] | None,
  to_play [n] | None, add_noise: bool, generator) -> policy [n, A]``

  so that each MuZero variant (Gumbel, sampled, stochastic, ...) plugs in its
  own search while the buffer stays the same. A search whose
  ``reads_stored`` attribute is true also gets ``stored=``: the positions'
  declared replay entries as stored (Sampled MuZero's keep-candidates option
  searches the stored root candidates again). :func:`muzero_reanalyze` makes
  the default one (plain MuZero :func:`~torchrl_muzero.mcts.search`). The
  buffer hands it inputs already on the model's device, the model in eval
  mode under ``torch.no_grad()``, and a ``generator`` only when that device
  is the CPU (``None`` otherwise: torch generators are per device).
* *value reanalyze* (:func:`bootstrap_values`) evaluates the target model at
  the n-step bootstrap states.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from tensordict import TensorDictBase

__all__ = ["ReanalyzeSearch", "bootstrap_values", "model_device", "muzero_reanalyze", "reanalyze_policies",
           "resolve_reanalyze_search"]

#: ``(model, observation, action_mask, to_play, add_noise, generator) -> policy [n, A]``
ReanalyzeSearch = Callable[
    [Any, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", bool, "torch.Generator | None"], torch.Tensor
]


def muzero_reanalyze(config: Any, search: Callable[..., Any] | None = None,
                     reads_stored: bool = False) -> ReanalyzeSearch:
    """A reanalyze search from a MuZero-style search function; by default :func:`~torchrl_muzero.mcts.search`.

    Args:
        config: the search settings (an :class:`~torchrl_muzero.mcts.MCTSConfig`
            or what ``search`` takes).
        search: ``(model, observation, config, action_mask=, to_play=,
            add_noise=, generator=) -> SearchResult`` (the signature of
            :func:`~torchrl_muzero.mcts.search`, which is the default);
            its ``search_policy`` (normalised root visit counts) is the target.
            When the buffer has a ``root_memory`` it also passes ``root=``
            (the history-window root), which ``search`` must then take.
        reads_stored: ``search`` also takes ``stored=`` (a TensorDict
            ``[n]`` of the positions' declared replay entries as stored); the
            buffer passes it when the algorithm declares entries.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import muzero_reanalyze
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8)
        >>> reanalyze = muzero_reanalyze(MCTSConfig(num_simulations=4))
        >>> policy = reanalyze(model, torch.zeros(5, 3), None, None, False, None)
        >>> policy.shape, bool(torch.allclose(policy.sum(-1), torch.ones(5)))
        (torch.Size([5, 2]), True)
    """

    def search_policy(model, observation, action_mask, to_play, add_noise, generator, root=None,
                      stored=None) -> torch.Tensor:
        run = search
        if run is None:
            from torchrl_muzero.mcts import search as run  # imported late: the search package is heavier

        # root= only when the buffer built one (a history window): a search without that argument still works
        extra = {} if root is None else {"root": root}
        if reads_stored:
            extra["stored"] = stored
        result = run(model, observation, config, action_mask=action_mask, to_play=to_play,
                     add_noise=add_noise, generator=generator, **extra)
        return result.search_policy

    search_policy.config = config  # for inspection, and reanalyze_policies builds the root under its backend
    search_policy.reads_stored = bool(reads_stored)  # reanalyze_policies passes stored= only to such a search
    return search_policy


def resolve_reanalyze_search(search: ReanalyzeSearch | None, mcts_config: Any, discount: float) -> ReanalyzeSearch:
    """The reanalyze search a buffer runs: ``search`` if given, else MuZero's with ``mcts_config``
    (``MCTSConfig(discount=discount)`` when that is None).

    Buffers resolve it at each sample, so a changed ``mcts_config`` / discount is followed.

    Examples:
        >>> from torchrl_muzero.data.reanalyze import resolve_reanalyze_search
        >>> resolve_reanalyze_search(None, None, 0.9).config.discount
        0.9
    """
    if search is not None:
        return search
    from torchrl_muzero.mcts import MCTSConfig  # imported late: the search package is heavier

    config = mcts_config if mcts_config is not None else MCTSConfig(discount=discount)
    return muzero_reanalyze(config)


def model_device(model: Any, device: torch.device | None = None) -> torch.device:
    """``device`` if given, else where ``model``'s parameters are (CPU without any)."""
    if device is not None:
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _backend_scope(config: Any) -> contextlib.AbstractContextManager:
    """The search's :func:`~torchrl_muzero.mcts.search.backend_scope` for a ``search`` that names its
    ``config`` (:func:`muzero_reanalyze`'s): the root built here before the search follows the backend."""
    if config is None:
        return contextlib.nullcontext()
    from torchrl_muzero.mcts.search import backend_scope  # imported late: the search package is heavier

    return backend_scope(config)


@contextlib.contextmanager
def _evaluating(model: Any) -> Iterator[None]:
    # targets come from the model as it acts, not as it trains (batch-norm statistics, dropout)
    was_training = getattr(model, "training", False)
    if was_training:
        model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if was_training:
            model.train()


def reanalyze_policies(
    search: ReanalyzeSearch,
    model: Any,
    observation: torch.Tensor,
    action_mask: torch.Tensor | None,
    to_play: torch.Tensor | None,
    *,
    add_noise: bool,
    generator: torch.Generator | None,
    num_actions: int,
    device: torch.device | None = None,
    memory: Any = None,
    history: TensorDictBase | None = None,
    stored: TensorDictBase | None = None,
) -> torch.Tensor:
    """Run ``search`` on ``observation`` ``[n, *obs]``; the policies ``[n, A]`` as float32 on the CPU.

    Inputs go to :func:`model_device`; ``generator`` is passed only when that
    is the CPU. With an acting ``memory`` and each position's ``history``
    ``[n]`` (:mod:`torchrl_muzero.data.root_history`) the search starts from
    ``memory.root(...)``, the root acting builds, passed as ``root=``; a
    ``search`` that names its ``config`` (:func:`muzero_reanalyze`'s) builds it
    under that config's backend (``"torch"``: not in the C++ kernel). A search
    that ``reads_stored`` gets ``stored`` ``[n]`` (the positions' declared
    replay entries, on the model's device). Raises
    ``ValueError`` when the search returns another shape than ``[n, num_actions]``.
    """
    dev = model_device(model, device)
    n = observation.shape[0]
    with _evaluating(model), _backend_scope(getattr(search, "config", None)):
        obs = observation.to(dev)
        extra = {}
        if memory is not None:
            extra["root"] = memory.root(model, obs, history.to(dev))
        if getattr(search, "reads_stored", False):
            if stored is None:
                raise ValueError("the reanalyze search reads the stored replay entries (reads_stored=True), but "
                                 "the buffer declares none: give the buffer the algorithm's replay entries.")
            extra["stored"] = stored.to(dev)
        policy = search(
            model,
            obs,
            None if action_mask is None else action_mask.to(dev),
            None if to_play is None else to_play.to(dev),
            bool(add_noise),
            generator if dev.type == "cpu" else None,
            **extra,
        )
    policy = torch.as_tensor(policy)
    if tuple(policy.shape) != (n, num_actions):
        raise ValueError(
            f"the reanalyze search returned a {tuple(policy.shape)} policy for {n} observations; "
            f"it must be [n, num_actions] = [{n}, {num_actions}]."
        )
    return policy.detach().float().cpu()


def bootstrap_values(
    model: Any,
    observation: torch.Tensor,
    device: torch.device | None = None,
    memory: Any = None,
    history: TensorDictBase | None = None,
    stored: TensorDictBase | None = None,
) -> torch.Tensor:
    """``model``'s value estimate ``[n]`` (float32, CPU) of ``observation`` ``[n, *obs]``.

    With an acting ``memory`` and each position's ``history`` ``[n]``
    (:mod:`torchrl_muzero.data.root_history`) it is the value of the root
    acting builds there (``memory.root``), so a model that acts from history
    is asked about the state it acts from; otherwise ``initial_inference``'s.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data.reanalyze import bootstrap_values
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8)
        >>> bootstrap_values(model, torch.zeros(4, 3)).shape
        torch.Size([4])
    """
    dev = model_device(model, device)
    with _evaluating(model):
        if memory is not None:
            # the root's value alone (UniZero's root_value skips the window's K/V: ~5 % of an update)
            obs, hist = observation.to(dev), history.to(dev)
            root_value = getattr(memory, "root_value", None)  # None: a duck-typed memory without the hook
            values = root_value(model, obs, hist) if root_value is not None else memory.root(model, obs, hist).value
            return values.float().reshape(-1).cpu()
        _, _, value_logits = model.initial_inference(observation.to(dev))
        support = model.value_support
        decode = getattr(support, "decode_fast", support.decode)  # same value, fewer kernels
        values = decode(value_logits)
    return values.float().reshape(-1).cpu()
