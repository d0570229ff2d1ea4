"""``algo=sampled_efficientzero``: Sampled EfficientZero (LightZero's policy type of that name).

EfficientZero's network (value-prefix LSTM), targets and consistency loss,
searched over ``algo.num_samples`` actions drawn at each node, exactly as
``algo=sampled_muzero`` wraps MuZero's (:mod:`torchrl_muzero.algorithms.sampled_muzero`
has the sampling's keys and why).
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import loss_kwargs
from torchrl_muzero.algorithms.registry import Algorithm, register
from torchrl_muzero.algorithms.sampled_muzero import (SAMPLED_KEYS, sampled_buffer_kwargs, sampled_model,
                                                      sampled_replay_entries, sampled_search_config,
                                                      sampled_search_fn)

__all__ = ["SAMPLED_EFFICIENTZERO"]


def _model(cfg, observation_shape, space):
    from torchrl_muzero.modules.efficientzero import EfficientZeroMLPModel

    return sampled_model(cfg, space, EfficientZeroMLPModel, observation_shape=observation_shape,
                         lstm_hidden_size=cfg.algo.lstm_hidden_size, lstm_horizon_len=cfg.algo.lstm_horizon_len)


def _loss(cfg, model):
    from torchrl_muzero.objectives.sampled import SampledEfficientZeroLoss

    return SampledEfficientZeroLoss(model, policy_loss=cfg.algo.policy_loss,
                                    policy_entropy_loss_weight=cfg.algo.policy_entropy_weight, **loss_kwargs(cfg))


def _targets(cfg) -> list:
    from torchrl_muzero.data import ValuePrefixTargets

    return [ValuePrefixTargets(cfg.algo.lstm_horizon_len)]


SAMPLED_EFFICIENTZERO = register(
    Algorithm(
        name="sampled_efficientzero",
        build_model=_model,
        search_fn=sampled_search_fn,
        search_config=sampled_search_config,
        build_loss=_loss,
        target_builders=_targets,
        needs_future_observations=lambda cfg: cfg.loss.consistency_loss_weight > 0,
        buffer_kwargs=sampled_buffer_kwargs,
        replay_entries=sampled_replay_entries,
        config_keys=(*SAMPLED_KEYS, "lstm_horizon_len", "lstm_hidden_size"),
        summary="Sampled EfficientZero: EfficientZero searched over K actions drawn per node",
        action_kinds=("discrete", "continuous"),
    )
)
