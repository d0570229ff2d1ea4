"""Build the pieces of a run from its config (shared by the sync and async trainers)."""
from __future__ import annotations

import dataclasses

import torch

from torchrl_muzero.envs.action_spaces import ActionSpace
from torchrl_muzero.envs.env_ids import is_board_game
from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.modules import MuZeroModel
from torchrl_muzero.trainers.config import TrainConfig

__all__ = ["algorithm", "build_buffer", "build_loss", "build_model", "build_policy", "model_from_checkpoint",
           "mcts_config", "resolve_device", "temperature_at"]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available on this machine.")
    return device


def algorithm(cfg: TrainConfig):
    """The :class:`~torchrl_muzero.algorithms.Algorithm` that ``algo.name`` names."""
    from torchrl_muzero.algorithms import get_algorithm

    return get_algorithm(cfg.algo.name)


def build_model(cfg: TrainConfig, observation_shape, action_space: "ActionSpace | int") -> MuZeroModel:
    """The model of the run's algorithm (``algo.name``, ``model.kind``) for the env's shapes.

    ``action_space``: the env's :class:`~torchrl_muzero.envs.action_spaces.ActionSpace`
    (``env_action_space(env)``), or an ``int`` ``n`` for ``n`` discrete actions;
    the model declares it as ``model.action_space``.

    Examples:
        >>> from torchrl_muzero.envs.action_spaces import DiscreteActionSpace
        >>> from torchrl_muzero.trainers.builders import build_model
        >>> from torchrl_muzero.trainers.config import load_config
        >>> cfg = load_config({"model": {"latent_dim": 8, "hidden_dim": 8}})
        >>> build_model(cfg, (4,), DiscreteActionSpace(2, one_hot=True)).action_space.num_actions
        2
        >>> build_model(cfg, (4,), 2).num_actions
        2
    """
    return algorithm(cfg).build_model(cfg, observation_shape, action_space)


def mcts_config(cfg: TrainConfig, temperature: float | None = None, num_simulations: int | None = None) -> MCTSConfig:
    """The settings of the run's search (an ``MCTSConfig``, or the algorithm's subclass of it)."""
    config = algorithm(cfg).search_config(cfg)
    changes = {}
    if temperature is not None:
        changes["temperature"] = temperature
    if num_simulations:
        changes["num_simulations"] = num_simulations
    return dataclasses.replace(config, **changes) if changes else config


def build_policy(cfg: TrainConfig, model, action_spec, generator: torch.Generator | None = None,
                 temperature: float | None = None, num_simulations: int | None = None):
    """The run's :class:`~torchrl_muzero.mcts.MCTSPolicy`: ``model`` searched with the algorithm's search."""
    from torchrl_muzero.mcts import MCTSPolicy

    algo = algorithm(cfg)
    return MCTSPolicy(model, mcts_config(cfg, temperature, num_simulations), action_spec, generator=generator,
                      search_fn=algo.search_fn, memory=algo.acting_memory(cfg))


def actor_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """The search's random generator for one collector actor, seeded like its envs.

    A collector worker is a spawned process, whose global torch generator starts
    from a seed of its own at every launch: a search drawing from it (root noise,
    sampling the action) made async runs unrepeatable for one ``seed``, and gave
    two workers no seed-controlled streams. Each actor passes its env seed here.

    Examples:
        >>> from torchrl_muzero.trainers.builders import actor_generator
        >>> a, b = actor_generator(1001), actor_generator(1001)
        >>> bool(torch.rand(3, generator=a).eq(torch.rand(3, generator=b)).all())
        True
    """
    return torch.Generator(device).manual_seed(int(seed))


def build_loss(cfg: TrainConfig, model):
    """The run's loss module (the algorithm's ``LossModule`` with ``loss.*`` / ``algo.*``)."""
    return algorithm(cfg).build_loss(cfg, model)


def temperature_at(cfg: TrainConfig, progress: float) -> float:
    """Visit-count temperature for training progress in [0, 1] (MuZero's decaying schedule).

    ``train.temperature_schedule`` is a list of ``[until_progress, temperature]``
    pairs; the multiplier applies to ``mcts.temperature``.
    """
    for until, value in cfg.train.temperature_schedule:
        if progress < until:
            return cfg.mcts.temperature * float(value)
    return cfg.mcts.temperature * float(cfg.train.temperature_schedule[-1][1])


def build_buffer(cfg: TrainConfig, seed: int | None = None, action_space: "ActionSpace | None" = None):
    """The run's :class:`~torchrl_muzero.data.GameBuffer` (frames stored once for Atari stacks).

    ``action_space``: the env's (``None``: discrete actions); a box space makes the
    buffer store the float env actions, and shapes the algorithm's declared
    entries (:attr:`Algorithm.replay_entries <torchrl_muzero.algorithms.Algorithm>`).
    """
    from torchrl_muzero.data import GameBuffer, muzero_reanalyze

    b = cfg.buffer
    algo = algorithm(cfg)
    # reanalyze re-runs the algorithm's own search (Gumbel: the improved policy); an algorithm's
    # buffer_kwargs may bring its own (a sampled search and its entries hook)
    kwargs = {"reanalyze_search": muzero_reanalyze(mcts_config(cfg), search=algo.search_fn)}
    kwargs.update(algo.buffer_kwargs(cfg))
    entries = list(algo.replay_entries(cfg, action_space))
    if entries:
        kwargs["extra_entries"] = [*kwargs.get("extra_entries", ()), *entries]
    # a box: the float env actions; an algorithm that may search fewer slots than the env's discrete actions
    # (the sampled family): the env's action count decodes the stored actions
    if action_space is not None and (not action_space.is_discrete or algo.takes_action_space):
        kwargs["action_space"] = action_space
    return GameBuffer(
        b.capacity,
        num_unroll_steps=b.num_unroll_steps,
        td_steps=b.td_steps,
        discount=cfg.mcts.discount,
        two_player=is_board_game(cfg.env),  # self-play board games: rewards are the mover's
        frame_stack=cfg.env.frame_stack if cfg.env.kind == "atari" else 1,
        alpha=b.alpha,
        beta=b.beta,
        beta_annealing_steps=b.beta_anneal_steps,
        reanalyze_ratio=b.reanalyze_ratio,
        mcts_config=mcts_config(cfg),
        with_future_observations=algo.needs_future_observations(cfg),
        target_builders=algo.target_builders(cfg),
        **kwargs,
        seed=cfg.seed if seed is None else seed,
    )


def model_from_checkpoint(path) -> tuple[MuZeroModel, TrainConfig]:
    """The model saved in a checkpoint file (``ckpt/last.pt``, ``best.pt``, ``model_v*.pt``), in eval mode,
    and the config of the run that wrote it (the env is probed for the model's shapes)."""
    from torchrl_muzero.envs import env_action_space, env_spaces, make_env
    from torchrl_muzero.trainers.checkpoint import load_checkpoint
    from torchrl_muzero.trainers.config import load_config

    state = load_checkpoint(path, map_location="cpu")
    cfg = load_config(state["config"])
    probe = make_env(cfg.env, num_envs=1, seed=0)
    (obs_shape, _), space = env_spaces(probe), env_action_space(probe)
    probe.close()
    model = build_model(cfg, obs_shape, space)
    model.load_state_dict(state["model"])
    return model.eval(), cfg
