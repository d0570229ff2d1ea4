"""Fixed tic-tac-toe opponents: a uniformly random player and a perfect (minimax) player.

Both are batched callables ``player(board [N, 9], to_play [N]) -> cells [N]``
(boards as in :mod:`torchrl_muzero.envs.tictactoe`: 0 empty, 1 X, 2 O).
The minimax player looks its moves up in a table of the game-theoretic value
of every move in every reachable position (5,478 positions, solved once per
process in well under a second), and breaks ties between equally good
moves at random, so repeated games differ.
"""
from __future__ import annotations

import functools

import torch

from torchrl_muzero.envs.tictactoe import LINES, NUM_CELLS

__all__ = ["MinimaxPlayer", "RandomPlayer", "minimax_move_values", "position_value", "num_positions"]

_LINES = LINES.tolist()
_POW3 = torch.tensor([3**i for i in range(NUM_CELLS)], dtype=torch.int64)
_ILLEGAL = -2  # value of an occupied cell in the move table


def _won(board: tuple, stone: int) -> bool:
    return any(board[a] == stone and board[b] == stone and board[c] == stone for a, b, c in _LINES)


@functools.lru_cache(maxsize=None)
def _value(board: tuple) -> int:
    """Value for the player to move (+1 win, 0 draw, -1 loss) under perfect play by both."""
    stones = sum(1 for c in board if c)
    mover, last = (1, 2) if stones % 2 == 0 else (2, 1)
    if _won(board, last):
        return -1  # the previous move won
    if stones == NUM_CELLS:
        return 0
    best = -1
    for cell in range(NUM_CELLS):
        if board[cell] == 0:
            child = board[:cell] + (mover,) + board[cell + 1:]
            best = max(best, -_value(child))
            if best == 1:
                break
    return best


def position_value(board) -> int:
    """Minimax value of a position (a 9-sequence, 0 empty / 1 X / 2 O) for the player to move."""
    return _value(tuple(int(c) for c in board))


def _move_values(board: tuple) -> list[int]:
    stones = sum(1 for c in board if c)
    mover = 1 if stones % 2 == 0 else 2
    out = []
    for cell in range(NUM_CELLS):
        if board[cell] != 0:
            out.append(_ILLEGAL)
            continue
        child = board[:cell] + (mover,) + board[cell + 1:]
        out.append(1 if _won(child, mover) else -_value(child))
    return out


@functools.lru_cache(maxsize=1)
def _reachable() -> tuple:
    """Every position reachable from the empty board, as ``(board, finished)`` pairs."""
    seen, out, stack = set(), [], [(0,) * NUM_CELLS]
    while stack:
        b = stack.pop()
        if b in seen:
            continue
        seen.add(b)
        stones = sum(1 for c in b if c)
        finished = _won(b, 1) or _won(b, 2) or stones == NUM_CELLS
        out.append((b, finished))
        if not finished:
            mover = 1 if stones % 2 == 0 else 2
            stack.extend(b[:i] + (mover,) + b[i + 1:] for i in range(NUM_CELLS) if b[i] == 0)
    return tuple(out)


def num_positions() -> int:
    """Reachable positions (finished ones included) the solver visited: 5,478 for tic-tac-toe."""
    return len(_reachable())


@functools.lru_cache(maxsize=1)
def _move_table() -> torch.Tensor:
    """``[3**9, 9]`` int8: the value of each move for the mover, indexed by the base-3 board code."""
    table = torch.full((3**NUM_CELLS, NUM_CELLS), _ILLEGAL, dtype=torch.int8)
    for b, finished in _reachable():
        if not finished:
            code = sum(c * 3**i for i, c in enumerate(b))
            table[code] = torch.tensor(_move_values(b), dtype=torch.int8)
    return table


def minimax_move_values(board: torch.Tensor) -> torch.Tensor:
    """``[N, 9]`` long: each move's minimax value for the mover (+1/0/-1; -2 on occupied cells)."""
    code = (board.long().cpu() * _POW3).sum(-1)
    return _move_table()[code].long()


class RandomPlayer:
    """Uniformly random legal moves, reproducible from ``seed``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.board_opponents import RandomPlayer
        >>> board = torch.tensor([[1, 2, 1, 2, 1, 2, 0, 0, 1]], dtype=torch.int8)
        >>> RandomPlayer(seed=0)(board).item() in (6, 7)
        True
    """

    def __init__(self, seed: int | None = 0) -> None:
        self.rng = torch.Generator()
        self.rng.manual_seed(seed) if seed is not None else self.rng.seed()

    def __call__(self, board: torch.Tensor, to_play: torch.Tensor | None = None) -> torch.Tensor:
        legal = (board.cpu() == 0).float()
        return torch.multinomial(legal, 1, generator=self.rng).squeeze(-1).to(board.device)


class MinimaxPlayer:
    """Perfect play: a move of the best minimax value, uniformly at random among ties.

    ``prefer_fast=True`` (default) breaks ties toward the quickest win: among
    winning moves it takes one that wins at once when there is one.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.board_opponents import MinimaxPlayer
        >>> # X . .      O (to move) must block X's column 0-3-6
        >>> # X O .
        >>> # . . .
        >>> board = torch.tensor([[1, 0, 0, 1, 2, 0, 0, 0, 0]], dtype=torch.int8)
        >>> MinimaxPlayer(seed=0)(board).item()
        6
    """

    def __init__(self, seed: int | None = 0, prefer_fast: bool = True) -> None:
        self.rng = torch.Generator()
        self.rng.manual_seed(seed) if seed is not None else self.rng.seed()
        self.prefer_fast = prefer_fast

    def __call__(self, board: torch.Tensor, to_play: torch.Tensor | None = None) -> torch.Tensor:
        values = minimax_move_values(board).float()
        if self.prefer_fast:  # an immediately winning move ranks above a slower forced win
            from torchrl_muzero.envs.tictactoe import play

            b = board.cpu()
            mover = ((b != 0).sum(-1) % 2).long()
            for cell in range(NUM_CELLS):
                free = b[:, cell] == 0
                if bool(free.any()):
                    _, reward, _ = play(b[free], mover[free], torch.full((int(free.sum()),), cell))
                    values[free, cell] += 0.5 * reward
        noise = torch.rand(values.shape, generator=self.rng) * 0.1
        return (values + noise).argmax(-1).to(board.device)
