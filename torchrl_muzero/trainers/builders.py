"""Build the pieces of a run from its config (shared by the sync and async trainers)."""
from __future__ import annotations

import torch

from torchrl_muzero.envs.env_ids import is_board_game
from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.modules import MuZeroMLPModel, MuZeroModel
from torchrl_muzero.trainers.config import TrainConfig

__all__ = ["build_buffer", "build_model", "model_from_checkpoint", "mcts_config", "resolve_device",
           "temperature_at"]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available on this machine.")
    return device


def build_model(cfg: TrainConfig, observation_shape, num_actions: int) -> MuZeroModel:
    """The model the config names, for the env's observation shape and action count."""
    m = cfg.model
    if m.kind == "mlp":
        return MuZeroMLPModel(
            observation_shape,
            num_actions,
            latent_dim=m.latent_dim,
            hidden_dim=m.hidden_dim,
            num_layers=m.num_layers,
            value_support_size=m.value_support_size,
            reward_support_size=m.reward_support_size,
        )
    if m.kind == "resnet":
        from torchrl_muzero.modules import MuZeroResNetModel

        return MuZeroResNetModel(
            observation_shape,
            num_actions,
            channels=m.channels,
            num_blocks=m.num_blocks,
            downsample=m.downsample,
            value_support_size=m.value_support_size,
            reward_support_size=m.reward_support_size,
        )
    raise ValueError(f"model.kind must be 'mlp' or 'resnet', got {m.kind!r}.")


def mcts_config(cfg: TrainConfig, temperature: float | None = None, num_simulations: int | None = None) -> MCTSConfig:
    s = cfg.mcts
    return MCTSConfig(
        num_simulations=num_simulations or s.num_simulations,
        discount=s.discount,
        pb_c_base=s.pb_c_base,
        pb_c_init=s.pb_c_init,
        dirichlet_alpha=s.dirichlet_alpha,
        dirichlet_fraction=s.dirichlet_fraction,
        temperature=s.temperature if temperature is None else temperature,
        backend=s.backend,
    )


def temperature_at(cfg: TrainConfig, progress: float) -> float:
    """Visit-count temperature for training progress in [0, 1] (MuZero's decaying schedule).

    ``train.temperature_schedule`` is a list of ``[until_progress, temperature]``
    pairs; the multiplier applies to ``mcts.temperature``.
    """
    for until, value in cfg.train.temperature_schedule:
        if progress < until:
            return cfg.mcts.temperature * float(value)
    return cfg.mcts.temperature * float(cfg.train.temperature_schedule[-1][1])


def build_buffer(cfg: TrainConfig, seed: int | None = None):
    """The run's :class:`~torchrl_muzero.data.GameBuffer` (frames stored once for Atari stacks)."""
    from torchrl_muzero.data import GameBuffer

    b = cfg.buffer
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
        with_future_observations=cfg.loss.consistency_loss_weight > 0,
        seed=cfg.seed if seed is None else seed,
    )


def model_from_checkpoint(path) -> tuple[MuZeroModel, TrainConfig]:
    """The model saved in a checkpoint file (``ckpt/last.pt``, ``best.pt``, ``model_v*.pt``), in eval mode,
    and the config of the run that wrote it (the env is probed for the model's shapes)."""
    from torchrl_muzero.envs import env_spaces, make_env
    from torchrl_muzero.trainers.checkpoint import load_checkpoint
    from torchrl_muzero.trainers.config import load_config

    state = load_checkpoint(path, map_location="cpu")
    cfg = load_config(state["config"])
    probe = make_env(cfg.env, num_envs=1, seed=0)
    obs_shape, num_actions = env_spaces(probe)
    probe.close()
    model = build_model(cfg, obs_shape, num_actions)
    model.load_state_dict(state["model"])
    return model.eval(), cfg
