"""``algo=muzero_rnn_full_obs``: MuZero w/ RNN (UniZero paper's baseline; LightZero's ``muzero_rnn_full_obs``).

A GRU (``algo.rnn_hidden_size`` units) carries the history in the dynamics and
the prediction (:mod:`torchrl_muzero.modules.rnn_full_obs`). Training is
teacher forcing: every unroll step feeds the encoded real observation on
(:class:`~torchrl_muzero.objectives.rnn_full_obs.RNNFullObsLoss`), so the
buffer always returns the future observations. Acting carries each env's GRU
state in the rollout TensorDict
(:class:`~torchrl_muzero.mcts.acting_memory.RecurrentHiddenMemory`), zeroed at
the episode start and every ``algo.context_length_init`` steps. The search is
MuZero's pUCT over the model's ``(latent, hidden)`` node state.
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import (loss_kwargs, mlp_kwargs, muzero_search_config, muzero_search_fn,
                                             resnet_kwargs)
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["MUZERO_RNN_FULL_OBS"]


def _model(cfg, observation_shape, num_actions: int):
    from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel, RNNFullObsResNetModel

    if cfg.model.kind == "resnet":  # Atari frames
        return RNNFullObsResNetModel(observation_shape, num_actions, **resnet_kwargs(cfg),
                                     rnn_hidden_size=cfg.algo.rnn_hidden_size)
    if cfg.model.kind == "mlp":
        return RNNFullObsMLPModel(observation_shape, num_actions, **mlp_kwargs(cfg),
                                  rnn_hidden_size=cfg.algo.rnn_hidden_size)
    raise ValueError(f"model.kind must be 'mlp' or 'resnet', got {cfg.model.kind!r}.")


def _loss(cfg, model):
    from torchrl_muzero.objectives.rnn_full_obs import RNNFullObsLoss

    return RNNFullObsLoss(model, **loss_kwargs(cfg))


def _memory(cfg):
    from torchrl_muzero.mcts.acting_memory import RecurrentHiddenMemory

    return RecurrentHiddenMemory(cfg.algo.context_length_init)


MUZERO_RNN_FULL_OBS = register(
    Algorithm(
        name="muzero_rnn_full_obs",
        build_model=_model,
        search_fn=muzero_search_fn,  # the GRU state lives in the model's node state
        search_config=muzero_search_config,
        build_loss=_loss,
        needs_future_observations=lambda cfg: True,  # teacher forcing reads o_{t+1..t+K}
        acting_memory=_memory,
        config_keys=("context_length_init", "rnn_hidden_size"),
        summary="MuZero w/ RNN: a GRU state in dynamics and prediction, trained by teacher forcing on real "
                "observations; acting carries it per env, zeroed every context_length_init steps",
    )
)
