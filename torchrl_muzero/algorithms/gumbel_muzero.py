"""``algo=gumbel_muzero``: Gumbel MuZero (Danihelka et al. 2022), as in the paper and mctx.

MuZero's model and loss; the search draws Gumbel noise per root, runs
Sequential Halving over ``algo.max_num_considered_actions`` at the root and a
deterministic rule inside the tree, acts by the halving winner and returns the
completed-Q improved policy as the policy target. Where LightZero deviates
(fixed noise, Dirichlet noise, probabilities used as logits): docs/variants.md.
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import loss_kwargs, mcts_kwargs, muzero_model
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["GUMBEL_MUZERO"]


def _search_config(cfg):
    from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig

    a = cfg.algo
    # no Dirichlet noise in Gumbel MuZero (the Gumbel draw explores): mcts.dirichlet_* are not read
    return GumbelMCTSConfig(
        **{**mcts_kwargs(cfg), "dirichlet_fraction": 0.0},
        max_num_considered_actions=a.max_num_considered_actions,
        gumbel_scale=a.gumbel_scale,
        value_scale=a.value_scale,
        maxvisit_init=a.maxvisit_init,
    )


def _search(*args, **kwargs):
    from torchrl_muzero.mcts.gumbel import gumbel_search

    return gumbel_search(*args, **kwargs)


def _loss(cfg, model):
    from torchrl_muzero.objectives import MuZeroLoss

    return MuZeroLoss(model, policy_loss=cfg.algo.policy_loss, **loss_kwargs(cfg))


GUMBEL_MUZERO = register(
    Algorithm(
        name="gumbel_muzero",
        build_model=muzero_model,
        search_fn=_search,
        search_config=_search_config,
        build_loss=_loss,
        needs_future_observations=lambda cfg: cfg.loss.consistency_loss_weight > 0,
        config_keys=("max_num_considered_actions", "gumbel_scale", "value_scale", "maxvisit_init", "policy_loss"),
        summary="Gumbel MuZero: Sequential Halving with Gumbel noise, completed-Q improved policy targets",
    )
)
