"""``algo=sampled_muzero``: Sampled MuZero (Hubert et al. 2021, "Learning and Planning in Complex Action Spaces").

MuZero's network, loss and buffer, searched over ``algo.num_samples`` (K)
actions drawn at each node (:class:`~torchrl_muzero.modules.sampled.SampledModel`,
:func:`~torchrl_muzero.mcts.sampled.sampled_search`): continuous actions
(Pendulum, DeepMind Control) through a tanh-squashed Gaussian policy head,
discrete ones through K distinct legal actions. The prior over a node's slots
is the paper's ``(beta_hat / beta) * pi`` (``algo.sampled_prior=paper``) or
LightZero's uniform 1/K (``uniform``); docs/variants.md says which the shipped
configs use and why. The buffer stores each root's candidates and the visits
over them (declared replay entries); the policy learns
``-sum_k target_k log pi(a_k)`` over them, plus an entropy bonus
(``algo.policy_entropy_weight``).
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import loss_kwargs, mcts_kwargs, mlp_kwargs, muzero_search_config
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["SAMPLED_KEYS", "SAMPLED_MUZERO", "sampled_buffer_kwargs", "sampled_model", "sampled_proposal",
           "sampled_replay_entries", "sampled_search_config", "sampled_search_fn"]

#: the ``algo.*`` keys every sampled algorithm reads
SAMPLED_KEYS = ("num_samples", "sampled_prior", "proposal_temperature", "sample_with_replacement",
                "widened_fraction", "widen_factor", "fixed_sigma", "policy_entropy_weight", "policy_loss",
                "sampled_search", "reanalyze_candidates", "max_num_considered_actions", "gumbel_scale", "value_scale", "maxvisit_init")


def sampled_proposal(cfg):
    """The :class:`~torchrl_muzero.modules.sampled_proposal.SampledProposal` of the ``algo.*`` keys."""
    from torchrl_muzero.modules.sampled_proposal import SampledProposal

    a = cfg.algo
    return SampledProposal(num_samples=a.num_samples, prior=a.sampled_prior, temperature=a.proposal_temperature,
                           replacement=a.sample_with_replacement, widened_fraction=a.widened_fraction,
                           widen_factor=a.widen_factor)


def sampled_model(cfg, space, base_class, network_kwargs: dict | None = None, **base_kwargs):
    """``base_class`` (an MLP network of the family) wrapped as a :class:`~torchrl_muzero.modules.sampled.SampledModel`
    for the env's action ``space`` (a box: continuous actions into the dynamics, a ``2 * D`` policy head).

    ``network_kwargs``: the base's own settings (default the ``model.*`` MLP's, ``mlp_kwargs``; UniZero
    passes its transformer's)."""
    from torchrl_muzero.modules.sampled import SampledModel, policy_head_width

    if cfg.model.kind != "mlp":
        from torchrl_muzero.errors import ConfigError

        raise ConfigError(f"config key 'model.kind' is {cfg.model.kind!r}; algo={cfg.algo.name} has MLP networks "
                          "only (vector observations): use model.kind=mlp.")
    a = cfg.algo
    if space.is_discrete and not a.sample_with_replacement and a.num_samples > space.num_actions:
        from torchrl_muzero.errors import ConfigError

        # refused, not clipped: a run whose K silently differs from its config would mislabel its results
        raise ConfigError(
            f"config key 'algo.num_samples' is {a.num_samples}, more than the env's {space.num_actions} discrete "
            f"actions, which sampling without replacement cannot draw; set algo.num_samples <= "
            f"{space.num_actions} (= {space.num_actions}: every action, as MuZero) or "
            "algo.sample_with_replacement=true.")
    if not space.is_discrete and len(tuple(space.shape)) != 1:
        from torchrl_muzero.errors import ConfigError

        raise ConfigError(f"config key 'algo.name' is {a.name!r}, which takes box actions of shape (D,); the env's "
                          f"are {space.describe()}.")
    action_dim = None if space.is_discrete else int(space.shape[0])
    observation_shape = base_kwargs.pop("observation_shape")
    network_kwargs = mlp_kwargs(cfg) if network_kwargs is None else network_kwargs
    base = base_class(observation_shape, policy_head_width(space), action_dim=action_dim, **network_kwargs,
                      **base_kwargs)
    sigma = cfg.algo.fixed_sigma if cfg.algo.fixed_sigma > 0 else None
    return SampledModel(base, space, sampled_proposal(cfg), sigma=sigma)


def _model(cfg, observation_shape, space):
    from torchrl_muzero.modules import MuZeroMLPModel

    return sampled_model(cfg, space, MuZeroMLPModel, observation_shape=observation_shape)


def _loss(cfg, model):
    from torchrl_muzero.objectives.sampled import SampledMuZeroLoss

    return SampledMuZeroLoss(model, policy_loss=cfg.algo.policy_loss,
                             policy_entropy_loss_weight=cfg.algo.policy_entropy_weight, **loss_kwargs(cfg))


def sampled_search_config(cfg):
    """``mcts.*`` as an :class:`~torchrl_muzero.mcts.MCTSConfig` (``algo.sampled_search=puct``) or, for
    ``gumbel``, a :class:`~torchrl_muzero.mcts.gumbel.GumbelMCTSConfig` with the ``algo.*`` Gumbel keys
    (no Dirichlet noise: the Gumbel draw explores)."""
    if cfg.algo.sampled_search != "gumbel":
        return muzero_search_config(cfg)
    from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig

    a = cfg.algo
    return GumbelMCTSConfig(**{**mcts_kwargs(cfg), "dirichlet_fraction": 0.0},
                            max_num_considered_actions=a.max_num_considered_actions, gumbel_scale=a.gumbel_scale,
                            value_scale=a.value_scale, maxvisit_init=a.maxvisit_init)


def sampled_search_fn(*args, **kwargs):
    """:func:`torchrl_muzero.mcts.sampled.sampled_search`, imported on first use."""
    from torchrl_muzero.mcts.sampled import sampled_search

    return sampled_search(*args, **kwargs)


def sampled_replay_entries(cfg, space) -> list:
    """The declared replay entries: each root's K candidates ``[K, *action]`` and the visits over them ``[K]``."""
    import torch

    from torchrl_muzero.data import ReplayEntry
    from torchrl_muzero.mcts.sampled import CANDIDATES_KEY, VISITS_KEY

    K = cfg.algo.num_samples
    if space is None or space.is_discrete:  # None: a discrete env (build_buffer's default)
        candidates = ReplayEntry(CANDIDATES_KEY, (K,), torch.int64)
    else:
        candidates = ReplayEntry(CANDIDATES_KEY, (K, *space.shape), torch.float32)
    return [candidates, ReplayEntry(VISITS_KEY, (K,), torch.float32)]


def sampled_buffer_kwargs(cfg) -> dict:
    """The reanalyze search and the entries hook that share its new candidates
    (:class:`~torchrl_muzero.mcts.sampled.SampledReanalysis`): a reanalysed position's stored candidates are
    replaced with the ones its new target is over (``algo.reanalyze_candidates=resample``), or searched again
    and kept (``keep``)."""
    from torchrl_muzero.data import muzero_reanalyze
    from torchrl_muzero.mcts.sampled import SampledReanalysis

    reanalysis = SampledReanalysis(keep_candidates=cfg.algo.reanalyze_candidates == "keep")
    return {"reanalyze_search": muzero_reanalyze(sampled_search_config(cfg), search=reanalysis.search,
                                                 reads_stored=reanalysis.reads_stored),
            "reanalyze_entries": reanalysis.hook}


SAMPLED_MUZERO = register(
    Algorithm(
        name="sampled_muzero",
        build_model=_model,
        search_fn=sampled_search_fn,
        search_config=sampled_search_config,
        build_loss=_loss,
        buffer_kwargs=sampled_buffer_kwargs,
        replay_entries=sampled_replay_entries,
        config_keys=SAMPLED_KEYS,
        summary="Sampled MuZero: search over K actions drawn per node (continuous or large discrete actions)",
        action_kinds=("discrete", "continuous"),
    )
)
