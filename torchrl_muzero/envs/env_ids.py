"""Which env ids exist: checked at start without importing torchrl (the scripts' start-up checks)."""
from __future__ import annotations

__all__ = ["BOARD_GAMES", "GAMES", "is_board_game", "check_env_id"]

# env.kind == "board": two-player board games, by env.id (torchrl_muzero/envs/tictactoe.py)
BOARD_GAMES = ("TicTacToe",)
# env.kind == "game": single-player games implemented here, by env.id (torchrl_muzero/envs/game2048.py,
# memory_len.py, gamble.py, reach.py)
GAMES = ("2048", "memory_len", "gamble", "reach")
# env.kind == "dmc": DeepMind Control Suite tasks by '<domain>-<task>' (torchrl_muzero/envs/dmc.py, dm-control extra)


def is_board_game(env_cfg) -> bool:
    """Two-player zero-sum board game (self-play, ``to_play`` / ``action_mask``, board evaluation)."""
    return env_cfg.kind == "board"


def check_env_id(env_id: str, kind: str | None = None) -> None:
    """Raise a ``ValueError`` naming ``env_id`` if no env (of ``env.kind`` ``kind``, when given) has that id.

    Examples:
        >>> from torchrl_muzero.envs.env_ids import check_env_id
        >>> check_env_id("CartPole-v1")
        >>> check_env_id("CartPole-v9")
        Traceback (most recent call last):
        ...
        ValueError: unknown env id 'CartPole-v9': gymnasium has no such environment. Similar ids: CartPole-v0, CartPole-v1.
        >>> try:  # env.kind='dmc': a DeepMind Control task, if dm-control is installed
        ...     check_env_id("cartpole-swingup", "dmc")
        ... except ValueError as err:
        ...     assert "pip install 'torchrl_muzero[dmc]'" in str(err)
    """
    if kind == "board":
        if env_id not in BOARD_GAMES:
            raise ValueError(f"unknown board game {env_id!r}: the board games are {', '.join(BOARD_GAMES)}.")
        return
    if kind == "game":
        if env_id not in GAMES:
            raise ValueError(f"unknown game {env_id!r} for env.kind='game': the games are {', '.join(GAMES)}.")
        return
    if kind == "dmc":
        from torchrl_muzero.envs.dmc import check_dmc_id  # imports dm_control only, not torchrl

        check_dmc_id(env_id)
        return
    import gymnasium as gym

    if kind == "atari" and not env_id.startswith("ALE/"):
        raise ValueError(f"env.kind='atari' needs an ALE env id (such as 'ALE/Pong-v5'), got {env_id!r}: use "
                         "env.kind=gym for other gymnasium envs.")
    if kind == "gym" and env_id.startswith("ALE/"):
        raise ValueError(f"{env_id!r} is an Atari game: use env=atari env.id={env_id} (Atari preprocessing and "
                         "the ResNet model), not env.kind=gym.")
    if env_id.startswith("ALE/"):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError as err:
            raise ValueError(
                f"env id {env_id!r} needs ale-py (a dependency of torchrl_muzero), which does not import: "
                "pip install 'ale-py>=0.10'."
            ) from err
    if env_id not in gym.registry:
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower()[:4])][:5]
        hint = f" Similar ids: {', '.join(close)}." if close else ""
        raise ValueError(f"unknown env id {env_id!r}: gymnasium has no such environment.{hint}")


def effective_pool(env_cfg) -> str:
    """``env.pool``, with ``env.parallel=true`` (its older spelling) read as ``parallel``.

    Examples:
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> from torchrl_muzero.envs.env_ids import effective_pool
        >>> effective_pool(EnvConfig(kind="atari")), effective_pool(EnvConfig(kind="atari", parallel=True))
        ('serial', 'parallel')
    """
    return "parallel" if env_cfg.parallel and env_cfg.pool == "serial" else env_cfg.pool
