"""What every collector worker builds, whichever backend runs it: the env and the unbatched action spec.

Its own module, below both backends: :mod:`~torchrl_muzero.trainers.local_backend`'s worker
processes and :mod:`~torchrl_muzero.trainers.ray_actors`' collector actors build their env with
:func:`make_worker_env`, and build their policies with the spec :func:`action_spec_of` gives.
"""
from __future__ import annotations

from torchrl.envs import TransformedEnv

from torchrl_muzero.envs import make_env
from torchrl_muzero.trainers.builders import algorithm, build_model
from torchrl_muzero.trainers.config import load_config

__all__ = ["action_spec_of", "make_worker_env"]


def action_spec_of(cfg):
    """The action spec of one unbatched env (what the collectors' policies are built with)."""
    probe = make_env(cfg.env, num_envs=1, seed=cfg.seed)
    action_spec = probe.action_spec[0] if len(probe.batch_size) else probe.action_spec
    probe.close()
    return action_spec


def make_worker_env(cfg_dict: dict, seed: int, observation_shape, action_space):
    """Runs in each collector worker: the env, with the primer of the policy's acting memory if it has one."""
    cfg = load_config(cfg_dict)
    env = make_env(cfg.env, seed=seed)
    memory = algorithm(cfg).acting_memory(cfg)
    if memory is None:
        return env
    # the primer's shapes come from the model (the latent's); this throwaway copy only answers them
    return TransformedEnv(env, memory.make_tensordict_primer(build_model(cfg, observation_shape, action_space)),
                          auto_unwrap=False)
