"""``algo=stochastic_muzero``: Stochastic MuZero (Antonoglou et al. 2022).

Afterstates and chance outcomes: the model splits a step into afterstate
dynamics (decision -> chance node) and a dynamics over a discrete chance code
(chance -> decision node); a chance encoder of ``(o_t, o_t+1)`` learns the
codes with a straight-through one-hot. Decision and chance nodes share one
tree (``A + algo.chance_space_size`` edge slots).
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import loss_kwargs, mlp_kwargs, muzero_search_config, resnet_kwargs
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["STOCHASTIC_MUZERO"]


def _model(cfg, observation_shape, num_actions: int):
    chance = dict(chance_space_size=cfg.algo.chance_space_size)
    if cfg.model.kind == "mlp":
        from torchrl_muzero.modules.stochastic import StochasticMuZeroMLPModel

        return StochasticMuZeroMLPModel(observation_shape, num_actions, **chance, **mlp_kwargs(cfg))
    if cfg.model.kind == "resnet":
        from torchrl_muzero.modules.stochastic_resnet import StochasticMuZeroResNetModel

        return StochasticMuZeroResNetModel(observation_shape, num_actions, **chance, **resnet_kwargs(cfg))
    raise ValueError(f"algo=stochastic_muzero: model.kind must be 'mlp' or 'resnet', got {cfg.model.kind!r}.")


def _search(*args, **kwargs):
    from torchrl_muzero.mcts.stochastic import stochastic_search

    return stochastic_search(*args, **kwargs)


def _loss(cfg, model):
    from torchrl_muzero.objectives.stochastic_muzero import StochasticMuZeroLoss

    a = cfg.algo
    return StochasticMuZeroLoss(
        model,
        afterstate_value_loss_weight=a.afterstate_value_loss_weight,
        chance_loss_weight=a.chance_loss_weight,
        commitment_loss_weight=a.commitment_loss_weight,
        **loss_kwargs(cfg),
    )


STOCHASTIC_MUZERO = register(
    Algorithm(
        name="stochastic_muzero",
        build_model=_model,
        search_fn=_search,
        search_config=muzero_search_config,
        build_loss=_loss,
        needs_future_observations=lambda cfg: True,  # the chance encoder reads o_t+1
        config_keys=("chance_space_size", "afterstate_value_loss_weight", "chance_loss_weight",
                     "commitment_loss_weight"),
        summary="Stochastic MuZero: afterstates and learned chance codes in one tree",
    )
)
