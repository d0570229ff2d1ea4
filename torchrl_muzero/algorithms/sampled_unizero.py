"""``algo=sampled_unizero``: UniZero's world model searched over ``K`` actions drawn at each node (LightZero's
policy type of that name).

A composition of the two built pieces, no loop, tree, buffer or loss of its own:

* Model: a :class:`~torchrl_muzero.modules.unizero.UniZeroModel` (the
  ``algo.*`` transformer keys of ``algo=unizero``) wrapped as a
  :class:`~torchrl_muzero.modules.sampled.SampledModel`. For a box of ``D``
  dims the model takes ``action_dim=D``: an action token is
  ``nn.Linear(D, embed_dim)`` of the float action (LightZero's sampled
  UniZero embeds continuous actions with a linear layer) and the policy head
  outputs ``2 * D`` (the tanh-normal's location and scale). Discrete envs keep
  the embedding table and draw ``K`` distinct legal actions per node.
* Search: :func:`~torchrl_muzero.mcts.sampled.sampled_search` over the
  model's exact per-node KV cache (the sampled node state wraps UniZero's);
  the fused C++ UniZero search enumerates a fixed action set, so a sampled
  search runs the shared loop with the torch step.
* Acting: the root sees the env's last ``algo.context_length`` raw steps
  (:class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory`, float
  actions ``[L, D]`` for a box), and the buffer rebuilds the same window for
  bootstrap values and reanalyze roots (``root_memory``).
* Loss: :class:`~torchrl_muzero.objectives.sampled.SampledUniZeroLoss`:
  UniZero's (latent, reward, value, entropy; ``algo.*`` weights, EMA target
  encoder) with the policy learnt over each position's stored root candidates.
* Replay: the sampled family's declared entries (each root's candidates and
  visits) and its reanalysis, plus UniZero's future observations.

Examples:
    >>> from torchrl_muzero.algorithms import get_algorithm
    >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
    >>> from torchrl_muzero.trainers.config import load_config
    >>> cfg = load_config({"algo": {"name": "sampled_unizero", "embed_dim": 16, "num_samples": 4}})
    >>> model = get_algorithm("sampled_unizero").build_model(cfg, (3,), BoxActionSpace(-2.0, 2.0, (1,)))
    >>> type(model.base).__name__, model.base.action_dim, model.base.num_actions, model.num_actions
    ('UniZeroModel', 1, 2, 4)
"""
from __future__ import annotations

from torchrl_muzero.algorithms.registry import Algorithm, register
from torchrl_muzero.algorithms.sampled_muzero import (SAMPLED_KEYS, sampled_buffer_kwargs, sampled_model,
                                                      sampled_replay_entries, sampled_search_config,
                                                      sampled_search_fn)
from torchrl_muzero.algorithms.unizero import (UNIZERO_KEYS, check_unizero, unizero_loss_kwargs, unizero_memory,
                                               unizero_model_kwargs)

__all__ = ["SAMPLED_UNIZERO"]

#: UniZero's keys and the sampling's (``policy_entropy_weight`` is both's: UniZero's entropy term)
_KEYS = (*UNIZERO_KEYS, *(key for key in SAMPLED_KEYS if key not in UNIZERO_KEYS))


def _model(cfg, observation_shape, space):
    from torchrl_muzero.modules.unizero import UniZeroModel

    check_unizero(cfg)
    # sampled_model refuses a model.kind other than mlp in one line: build no ResNet encoder before it does
    network = unizero_model_kwargs(cfg, observation_shape) if cfg.model.kind == "mlp" else {}
    return sampled_model(cfg, space, UniZeroModel, observation_shape=observation_shape, network_kwargs=network)


def _loss(cfg, model):
    from torchrl_muzero.objectives.sampled import SampledUniZeroLoss

    return SampledUniZeroLoss(model, policy_loss=cfg.algo.policy_loss, **unizero_loss_kwargs(cfg))


def _buffer_kwargs(cfg) -> dict:
    # UniZero's history windows for the model-made targets, and the sampled family's reanalysis
    return {"root_memory": unizero_memory(cfg), **sampled_buffer_kwargs(cfg)}


SAMPLED_UNIZERO = register(
    Algorithm(
        name="sampled_unizero",
        build_model=_model,
        search_fn=sampled_search_fn,
        search_config=sampled_search_config,
        build_loss=_loss,
        needs_future_observations=lambda cfg: True,  # the latent term's targets
        acting_memory=unizero_memory,
        buffer_kwargs=_buffer_kwargs,
        replay_entries=sampled_replay_entries,
        config_keys=_KEYS,
        summary="Sampled UniZero: UniZero's transformer world model searched over K actions drawn per node",
        action_kinds=("discrete", "continuous"),
    )
)
