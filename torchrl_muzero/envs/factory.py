"""Environment factories with the standard MuZero preprocessing."""
from __future__ import annotations

import functools
import multiprocessing

from torchrl.envs import EnvBase, GymEnv, RewardSum, SerialEnv, TransformedEnv

__all__ = ["make_env", "check_env_id", "env_spaces", "env_action_space", "is_board_game", "BOARD_GAMES"]

from torchrl_muzero.envs.action_spaces import ActionSpace, action_space_of
from torchrl_muzero.envs.env_ids import BOARD_GAMES, check_env_id, is_board_game  # noqa: F401 (re-exported)


def _make_gym(env_id: str, max_episode_steps: int) -> EnvBase:
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    return GymEnv(env_id, **kwargs)


def make_env(env_cfg, num_envs: int | None = None, seed: int = 0, training: bool = True) -> EnvBase:
    """Build a batched env of ``num_envs`` copies (``env_cfg.num_envs`` by default).

    Vector envs are stepped in-process (``SerialEnv``): one MuZero search
    covers all of them, so each step of the batch costs one batched search.
    Atari envs get the preprocessing of :mod:`torchrl_muzero.envs.atari`,
    in-process too unless ``env_cfg.pool`` says ``parallel`` (``ParallelEnv``)
    or ``async`` (the guarded ``AsyncEnvPool``); on 2 cores ``SerialEnv``
    steps Pong fastest (docs/performance_pipeline.md), more cores favour the others.
    A daemonic process (the evaluators) may not start env processes and
    always steps its games in-process.
    DeepMind Control tasks (``env_cfg.kind == "dmc"``, ``env_cfg.id`` such
    as ``"cartpole-swingup"``) get the state preprocessing of
    :mod:`torchrl_muzero.envs.dmc` (one float32 observation vector, action
    repeat ``env_cfg.action_repeat``), in-process.
    ``RewardSum`` tracks the episode return for logging.

    Examples:
        >>> from torchrl_muzero.envs import make_env
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> env = make_env(EnvConfig(), num_envs=2)
        >>> env.batch_size
        torch.Size([2])
    """
    n = env_cfg.num_envs if num_envs is None else num_envs
    if n < 1:
        raise ValueError(f"num_envs must be >= 1, got {n}.")
    check_env_id(env_cfg.id, env_cfg.kind)
    if is_board_game(env_cfg):
        from torchrl_muzero.envs.tictactoe import TicTacToeEnv

        opening = env_cfg.random_opening_moves if training else 0
        env = TransformedEnv(TicTacToeEnv(n, random_opening_moves=opening), RewardSum())  # episode_reward: 1 won, 0 drawn
        env.set_seed(seed)
        return env
    if env_cfg.kind == "game" and env_cfg.id == "memory_len":  # bsuite's memory task, batched in torch
        from torchrl_muzero.envs.memory_len import make_memory_env

        return make_memory_env(n, memory_length=env_cfg.memory_length, seed=seed)
    if env_cfg.kind == "game" and env_cfg.id == "gamble":  # two-step bet with a shown coin (Stochastic MuZero)
        from torchrl_muzero.envs.gamble import make_gamble_env

        return make_gamble_env(n, safe_reward=env_cfg.safe_reward, win_probability=env_cfg.win_probability,
                               seed=seed)
    if env_cfg.kind == "game" and env_cfg.id == "reach":  # a 1-D continuous reach (the sampled family's smallest)
        from torchrl_muzero.envs.reach import make_reach_env

        return make_reach_env(n, seed=seed)
    if env_cfg.kind == "game":  # 2048: batched in torch, chance outcomes drawn from its own seeded generator
        from torchrl_muzero.envs.game2048 import make_game2048_env

        return make_game2048_env(n, seed=seed, max_steps=env_cfg.max_episode_steps or None)
    if env_cfg.kind == "atari":
        from torchrl_muzero.envs.atari import make_atari_env
        from torchrl_muzero.envs.env_ids import effective_pool

        pool = effective_pool(env_cfg) if n > 1 and not multiprocessing.current_process().daemon else "serial"
        if pool == "async":  # its games run in worker processes: seeded in their factories
            return make_atari_env(env_cfg, n, training=training, pool=pool, seed=seed)
        env = make_atari_env(env_cfg, n, training=training, pool=pool)
    elif env_cfg.kind == "gym":
        env = SerialEnv(n, functools.partial(_make_gym, env_cfg.id, env_cfg.max_episode_steps))
        env = TransformedEnv(env, RewardSum())
    elif env_cfg.kind == "dmc":
        from torchrl_muzero.envs.dmc import make_dmc_env

        env = TransformedEnv(make_dmc_env(env_cfg, n), RewardSum())
    else:
        raise ValueError(f"env.kind must be 'gym', 'atari', 'board', 'game' or 'dmc', got {env_cfg.kind!r}.")
    env.set_seed(seed)
    return env


def env_action_space(env: EnvBase) -> ActionSpace:
    """The :class:`~torchrl_muzero.envs.action_spaces.ActionSpace` of a batched env's action spec.

    Examples:
        >>> from torchrl_muzero.envs import env_action_space, make_env
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> env_action_space(make_env(EnvConfig(), num_envs=2))
        DiscreteActionSpace(n=2, one_hot=True, dtype=torch.int64, shape=(2,))
    """
    return action_space_of(env)


def env_spaces(env: EnvBase) -> tuple[tuple[int, ...], int]:
    """``(observation_shape, num_actions)`` of a batched env, for building a model.

    Discrete actions only (a continuous env raises ``ValueError``: see
    :func:`env_action_space`).

    Examples:
        >>> from torchrl_muzero.envs import env_spaces, make_env
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> env_spaces(make_env(EnvConfig(), num_envs=2))
        ((4,), 2)
    """
    obs_spec = env.observation_spec["observation"]
    obs_shape = tuple(obs_spec.shape[len(env.batch_size) :])
    space = env_action_space(env)
    if not space.is_discrete:
        raise ValueError(f"env_spaces: the env's actions are {space.kind} ({space.describe()}); num_actions exists "
                         "for discrete actions only (use env_action_space).")
    return obs_shape, space.num_actions
