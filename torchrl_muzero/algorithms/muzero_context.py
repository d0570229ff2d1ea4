"""``algo=muzero_context``: MuZero acting from a rolled-forward context latent (UniZero paper's baseline).

Training, targets and reanalyze are MuZero's. Only acting differs: the policy
carries a context latent per env in the rollout TensorDict
(:class:`~torchrl_muzero.mcts.acting_memory.ContextLatentMemory`) and searches
from ``g(root_{t-1}, a_{t-1})`` instead of ``h(o_t)``, re-grounding from the
observation at episode start and every ``algo.context_length_init`` steps.
``context_length_init = 1`` is MuZero exactly. LightZero's ``muzero_context``
keeps this latent on the model object (a fixed batch, overwritten by the
search): docs/variants.md.
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import muzero_loss, muzero_model, muzero_search_config, muzero_search_fn
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["MUZERO_CONTEXT"]


def _memory(cfg):
    from torchrl_muzero.mcts.acting_memory import ContextLatentMemory

    return ContextLatentMemory(cfg.algo.context_length_init)


MUZERO_CONTEXT = register(
    Algorithm(
        name="muzero_context",
        build_model=muzero_model,
        search_fn=muzero_search_fn,
        search_config=muzero_search_config,
        build_loss=muzero_loss,
        needs_future_observations=lambda cfg: cfg.loss.consistency_loss_weight > 0,
        acting_memory=_memory,
        config_keys=("context_length_init",),
        summary="MuZero w/ Context: MuZero training; acting rolls the root latent forward with the dynamics, "
                "re-grounded every context_length_init steps",
    )
)
