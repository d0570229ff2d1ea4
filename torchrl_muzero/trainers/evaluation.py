"""Greedy evaluation episodes with a frozen model."""
from __future__ import annotations

from typing import Callable

import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.envs.env_ids import is_board_game
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.acting_memory import with_acting_memory

__all__ = ["EvaluationCancelled", "evaluate", "evaluate_with_stats"]


class EvaluationCancelled(Exception):
    """Raised by :func:`evaluate` when its ``should_stop`` says so between two env steps.

    An evaluator process is told to stop while an episode may have hundreds of
    steps (and searches) left; without this it would finish them before it saw
    the request, and the driver's shutdown would wait that long.
    """


@torch.no_grad()
def evaluate(model, env, mcts: MCTSConfig, max_steps: int = 100_000, search_fn=None, memory=None,
             should_stop: Callable[[], bool] | None = None) -> list[float]:
    """Play one episode in each of ``env``'s batched copies; return their returns.

    The search (``search_fn``, default MuZero's) runs greedily (no root
    noise, most-visited action). Episodes that end early wait for the others;
    each copy counts its first episode only. A policy acting from per-env
    ``memory`` (:mod:`torchrl_muzero.mcts.acting_memory`) gets its primer on a
    wrapper of ``env`` (``env`` itself is not changed). ``should_stop`` is
    asked before every step; when it returns ``True`` the episodes are
    abandoned with :class:`EvaluationCancelled`.
    """
    policy = MCTSPolicy(model, mcts, env.action_spec, search_fn=search_fn, memory=memory)
    env = with_acting_memory(env, policy)
    n = int(env.batch_size.numel()) if len(env.batch_size) else 1
    returns = torch.zeros(n)
    finished = torch.zeros(n, dtype=torch.bool)
    td = env.reset()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(max_steps):
            if should_stop is not None and should_stop():
                raise EvaluationCancelled
            td = policy(td)
            td, next_root = env.step_and_maybe_reset(td)
            reward = td["next", "reward"].reshape(n)
            done = td["next", "done"].reshape(n)
            returns += torch.where(finished, 0.0, reward)
            finished |= done
            if bool(finished.all()):
                break
            td = next_root
    return returns.tolist()


def evaluate_with_stats(model, env, mcts: MCTSConfig, env_cfg=None, search_fn=None,
                        memory=None, should_stop: Callable[[], bool] | None = None) -> tuple[list[float], dict]:
    """What the trainers score a version with: ``(per-episode returns, extra metrics)``.

    Board games (``env_cfg.kind == "board"``) play ``N`` games (``N``: the
    env's batch size, ``eval.num_episodes``) against a random player and ``N``
    against a perfect minimax player, MuZero first in half of them; the
    returns are the game scores (+1 / 0 / -1 from MuZero's view) and the
    metrics the win / draw / loss rates per opponent
    (:func:`torchrl_muzero.trainers.board_eval.evaluate_board`; short games, so
    ``should_stop`` is not consulted). Other envs: :func:`evaluate` and no
    extra metrics.
    """
    if env_cfg is not None and is_board_game(env_cfg):
        from torchrl_muzero.trainers.board_eval import evaluate_board

        return evaluate_board(model, mcts, num_games=int(env.batch_size.numel()) if len(env.batch_size) else 1,
                              search_fn=search_fn)
    return evaluate(model, env, mcts, search_fn=search_fn, memory=memory, should_stop=should_stop), {}
