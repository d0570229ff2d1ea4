"""``algo=efficientzero``: EfficientZero (Ye et al. 2021).

MuZero's search and buffer with three changes: the dynamics predict a value
prefix with an LSTM (reset every ``algo.lstm_horizon_len`` steps, in training
and in search), the replay targets carry value prefixes, and the SimSiam
consistency loss is on (``loss.consistency_loss_weight``). The paper's
off-policy correction is ``algo.off_policy_correction`` (off by default, as in
LightZero: docs/variants.md says why).
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import (loss_kwargs, mlp_kwargs, muzero_search_config, muzero_search_fn,
                                             resnet_kwargs)
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["EFFICIENTZERO"]


def _model(cfg, observation_shape, num_actions: int):
    from torchrl_muzero.modules.efficientzero import EfficientZeroMLPModel, EfficientZeroResNetModel

    lstm = dict(lstm_hidden_size=cfg.algo.lstm_hidden_size, lstm_horizon_len=cfg.algo.lstm_horizon_len)
    if cfg.model.kind == "resnet":  # Atari frames
        return EfficientZeroResNetModel(observation_shape, num_actions, **resnet_kwargs(cfg), **lstm)
    return EfficientZeroMLPModel(observation_shape, num_actions, **mlp_kwargs(cfg), **lstm)


def _loss(cfg, model):
    from torchrl_muzero.objectives.efficientzero import EfficientZeroLoss

    return EfficientZeroLoss(model, **loss_kwargs(cfg))


def _targets(cfg) -> list:
    from torchrl_muzero.data import ValuePrefixTargets

    return [ValuePrefixTargets(cfg.algo.lstm_horizon_len)]


def _buffer_kwargs(cfg) -> dict:
    if not cfg.algo.off_policy_correction:
        return {}
    return {"off_policy_correction": True, "correction_age_scale": cfg.algo.correction_age_scale}


EFFICIENTZERO = register(
    Algorithm(
        name="efficientzero",
        build_model=_model,
        search_fn=muzero_search_fn,  # the value-prefix arithmetic is inside the model's search step
        search_config=muzero_search_config,
        build_loss=_loss,
        target_builders=_targets,
        needs_future_observations=lambda cfg: cfg.loss.consistency_loss_weight > 0,
        buffer_kwargs=_buffer_kwargs,
        config_keys=("lstm_horizon_len", "lstm_hidden_size", "off_policy_correction", "correction_age_scale"),
        summary="EfficientZero: value-prefix LSTM, SimSiam consistency, optional off-policy correction",
    )
)
