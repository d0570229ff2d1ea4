"""``algo=muzero``: MuZero (Schrittwieser et al. 2020), the family's base.

The builders here are the defaults the variants reuse: the model of
``model.kind`` (MLP for vector observations, ResNet for Atari frames), the
pUCT search with its settings from ``mcts.*``, and :class:`MuZeroLoss` with
``loss.*``.
"""
from __future__ import annotations

from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["mlp_kwargs", "resnet_kwargs", "muzero_model", "muzero_search_fn", "muzero_search_config",
           "muzero_loss", "MUZERO"]


def mlp_kwargs(cfg) -> dict:
    """The ``model.*`` settings of the MLP networks (every algorithm's MLP model takes them)."""
    m = cfg.model
    return dict(latent_dim=m.latent_dim, hidden_dim=m.hidden_dim, num_layers=m.num_layers,
                value_support_size=m.value_support_size, reward_support_size=m.reward_support_size)


def resnet_kwargs(cfg) -> dict:
    """The ``model.*`` settings of the ResNet networks (Atari frames)."""
    m = cfg.model
    return dict(channels=m.channels, num_blocks=m.num_blocks, downsample=m.downsample,
                value_support_size=m.value_support_size, reward_support_size=m.reward_support_size)


def muzero_model(cfg, observation_shape, num_actions: int):
    """The network ``model.kind`` names (``mlp`` or ``resnet``) for the env's shapes."""
    from torchrl_muzero.modules import MuZeroMLPModel

    if cfg.model.kind == "mlp":
        return MuZeroMLPModel(observation_shape, num_actions, **mlp_kwargs(cfg))
    if cfg.model.kind == "resnet":
        from torchrl_muzero.modules import MuZeroResNetModel

        return MuZeroResNetModel(observation_shape, num_actions, **resnet_kwargs(cfg))
    raise ValueError(f"model.kind must be 'mlp' or 'resnet', got {cfg.model.kind!r}.")


def mcts_kwargs(cfg) -> dict:
    """The ``mcts.*`` settings every search config shares."""
    s = cfg.mcts
    return dict(
        num_simulations=s.num_simulations,
        discount=s.discount,
        pb_c_base=s.pb_c_base,
        pb_c_init=s.pb_c_init,
        dirichlet_alpha=s.dirichlet_alpha,
        dirichlet_fraction=s.dirichlet_fraction,
        temperature=s.temperature,
        backend=s.backend,
        kernel_precision=s.kernel_precision,
    )


def muzero_search_config(cfg):
    from torchrl_muzero.mcts import MCTSConfig

    return MCTSConfig(**mcts_kwargs(cfg))


def loss_kwargs(cfg) -> dict:
    """The ``loss.*`` settings of :class:`~torchrl_muzero.objectives.MuZeroLoss` (shared by the variants)."""
    c = cfg.loss
    return dict(
        value_loss_weight=c.value_loss_weight,
        reward_loss_weight=c.reward_loss_weight,
        policy_loss_weight=c.policy_loss_weight,
        consistency_loss_weight=c.consistency_loss_weight,
        projection_dim=c.projection_dim,
        projection_hidden_dim=c.projection_hidden_dim,
        prediction_hidden_dim=c.prediction_hidden_dim,
    )


def muzero_loss(cfg, model):
    from torchrl_muzero.objectives import MuZeroLoss

    return MuZeroLoss(model, **loss_kwargs(cfg))


def muzero_search_fn(*args, **kwargs):
    """:func:`torchrl_muzero.mcts.search`, imported on first use (the registry loads without torch)."""
    from torchrl_muzero.mcts import search

    return search(*args, **kwargs)


def _consistency(cfg) -> bool:
    return cfg.loss.consistency_loss_weight > 0


MUZERO = register(
    Algorithm(
        name="muzero",
        build_model=muzero_model,
        search_fn=muzero_search_fn,
        search_config=muzero_search_config,
        build_loss=muzero_loss,
        needs_future_observations=_consistency,
        summary="MuZero: pUCT search over a learned model, visit-count policy targets",
    )
)
