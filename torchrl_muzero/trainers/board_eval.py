"""MuZero against fixed opponents on tic-tac-toe (random and perfect play): the trainers' board evaluation.

A match plays ``num_games`` games at once (one batched search per ply);
MuZero moves first in the first half of the games and second in the other
half, greedily (no root noise, the most visited action). Scores are from
MuZero's view: +1 win, 0 draw, -1 loss.

It lives in the trainers because it runs the algorithm's search on the env's
boards (it is above both); the command line that plays a run's weights is
``sota-implementations/muzero/board_eval.py``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from torchrl_muzero.envs.board_opponents import MinimaxPlayer, RandomPlayer
from torchrl_muzero.envs.tictactoe import NUM_CELLS, legal_moves, observe, play

__all__ = ["muzero_player", "play_match", "evaluate_board", "load_run_model"]


def muzero_player(model, mcts_config, search_fn=None):
    """A batched player ``(board, to_play) -> cells`` running a greedy search with ``model``.

    ``search_fn``: the algorithm's search (default MuZero's ``mcts.search``).
    """
    from torchrl_muzero.mcts import search
    from torchrl_muzero.mcts.loop import root_env_actions

    search = search_fn or search

    def act(board: torch.Tensor, to_play: torch.Tensor) -> torch.Tensor:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                result = search(model, observe(board, to_play), mcts_config, action_mask=legal_moves(board),
                                to_play=to_play, add_noise=False)
        finally:
            model.train(was_training)
        return root_env_actions(model, result.tree, result.action).cpu()  # a cell, never a sampled slot id

    return act


def play_match(player, opponent, num_games: int, player_first: torch.Tensor | None = None) -> torch.Tensor:
    """Play ``num_games`` games of ``player`` against ``opponent``; ``[num_games]`` scores for ``player``.

    ``player_first[g]`` says whether ``player`` is X (moves first) in game
    ``g`` (default: the first half of the games).
    """
    if player_first is None:
        player_first = torch.arange(num_games) < (num_games + 1) // 2
    side = torch.where(player_first, 0, 1)
    board = torch.zeros(num_games, NUM_CELLS, dtype=torch.int8)
    to_play = torch.zeros(num_games, dtype=torch.long)
    score = torch.zeros(num_games)
    live = torch.ones(num_games, dtype=torch.bool)
    while bool(live.any()):
        idx = live.nonzero().flatten()
        action = torch.empty(idx.numel(), dtype=torch.long)
        mine = to_play[idx] == side[idx]
        for chooser, sel in ((player, mine), (opponent, ~mine)):
            if bool(sel.any()):
                g = idx[sel]
                action[sel] = chooser(board[g], to_play[g]).long().cpu()
        new_board, reward, done = play(board[idx], to_play[idx], action)
        board[idx] = new_board
        # the mover won: +1 when it was the player, -1 when it was the opponent
        score[idx] += torch.where(mine, reward, -reward)
        to_play[idx] = 1 - to_play[idx]
        live[idx[done]] = False
    return score


def _rates(scores: torch.Tensor, prefix: str) -> dict:
    n = max(scores.numel(), 1)
    return {f"{prefix}/win": float((scores > 0).sum()) / n, f"{prefix}/draw": float((scores == 0).sum()) / n,
            f"{prefix}/loss": float((scores < 0).sum()) / n}


@torch.no_grad()
def evaluate_board(model, mcts_config, num_games: int = 100, seed: int = 0,
                   search_fn=None) -> tuple[list[float], dict]:
    """``num_games`` games against the random player, then against the minimax player.

    Returns the per-game scores of both matches (random first, +1/0/-1 from
    MuZero's view: their mean is the single evaluation score) and a dict of
    win / draw / loss rates per opponent (``eval/vs_random/win``, ...).
    """
    me = muzero_player(model, mcts_config, search_fn)
    vs_random = play_match(me, RandomPlayer(seed), num_games)
    vs_minimax = play_match(me, MinimaxPlayer(seed + 1), num_games)
    stats = {**_rates(vs_random, "eval/vs_random"), **_rates(vs_minimax, "eval/vs_minimax")}
    return [*vs_random.tolist(), *vs_minimax.tolist()], stats


def load_run_model(run_dir: str | Path, checkpoint: str = "last.pt"):
    """The model of a run folder's ``ckpt/<checkpoint>`` and the run's config."""
    from torchrl_muzero.trainers.builders import model_from_checkpoint

    return model_from_checkpoint(Path(run_dir) / "ckpt" / checkpoint)
