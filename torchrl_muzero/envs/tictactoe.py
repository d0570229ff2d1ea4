"""Tic-tac-toe as a batched torchrl env: one env object steps ``N`` boards at once.

Perspective convention (what :class:`~torchrl_muzero.data.GameBuffer` with
``two_player=True`` and the search's negated-discount backup expect):

* ``observation`` is seen by the **player to move**: 27 floats, three 3x3
  planes flattened — the mover's stones, the opponent's stones, and a plane
  of ones when the mover is the first player (X), zeros otherwise.
* ``to_play`` (long, 0 = X moves first, 1 = O) is the player to move.
* ``reward`` of the transition ``s_t -> s_t+1`` belongs to the player who
  moved at ``t`` (``to_play`` of ``s_t``): 1 when that move wins, 0 otherwise
  (a move can never lose at once, so rewards are 0 or 1).
* values are the view of the player to move; every ply flips the sign, so a
  position's value is ``r - v(next)`` (``discount = -1`` inside the search
  and in the n-step targets with ``mcts.discount=1.0``).

``done`` / ``terminated`` on a win or a full board; an illegal move (an
occupied cell) raises ``ValueError`` naming the board and the cell.
``action_mask`` (bool ``[N, 9]``) marks the empty cells. Cells are numbered
0..8 row by row. The rules are plain functions (:func:`play`,
:func:`observe`, :func:`legal_moves`) that the opponents and the match
runner of :mod:`torchrl_muzero.trainers.board_eval` share.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Binary, Bounded, Categorical, Composite

from torchrl_muzero.envs.batched_game import BatchedGameEnv

__all__ = ["TicTacToeEnv", "LINES", "legal_moves", "observe", "play", "winner"]

NUM_CELLS = 9
OBS_SIZE = 3 * NUM_CELLS
# the 8 lines of three: rows, columns, diagonals
LINES = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8], [0, 4, 8], [2, 4, 6]])


def legal_moves(board: torch.Tensor) -> torch.Tensor:
    """``[N, 9]`` bool: the empty cells of boards ``[N, 9]`` (0 empty, 1 X, 2 O)."""
    return board == 0


def winner(board: torch.Tensor) -> torch.Tensor:
    """``[N]`` long: 0 if X has three in a line, 1 if O has, -1 if nobody has."""
    cells = board[:, LINES.to(board.device)]  # [N, 8, 3]
    x = (cells == 1).all(-1).any(-1)
    o = (cells == 2).all(-1).any(-1)
    return torch.where(x, 0, torch.where(o, 1, -1)).long()


def observe(board: torch.Tensor, to_play: torch.Tensor) -> torch.Tensor:
    """``[N, 27]`` float observation of boards ``[N, 9]`` seen by ``to_play`` ``[N]``."""
    own = board == (to_play + 1).unsqueeze(-1)
    opp = (board != 0) & ~own
    first = (to_play == 0).unsqueeze(-1).expand_as(own)
    return torch.cat([own, opp, first], -1).float()


def play(board: torch.Tensor, to_play: torch.Tensor, action: torch.Tensor):
    """Play ``action`` ``[N]`` (cell index) for ``to_play`` on boards ``[N, 9]``.

    Returns ``(new_board, reward, done)``: ``reward`` (float ``[N]``) is the
    mover's, 1 for a winning move; ``done`` on a win or a full board. Raises
    ``ValueError`` on an occupied cell.
    """
    action = action.long().reshape(-1)
    rows = torch.arange(board.shape[0], device=board.device)
    if action.shape[0] != board.shape[0]:
        raise ValueError(f"expected {board.shape[0]} actions, got {action.shape[0]}.")
    if bool(((action < 0) | (action >= NUM_CELLS)).any()):
        raise ValueError(f"tic-tac-toe actions are cells 0..8, got {action.tolist()}.")
    taken = board[rows, action] != 0
    if bool(taken.any()):
        bad = taken.nonzero().flatten().tolist()
        raise ValueError(
            f"illegal tic-tac-toe move: cell {action[bad[0]].item()} of board {bad[0]} is occupied "
            f"(illegal moves on boards {bad}); pick an action where action_mask is True."
        )
    board = board.clone()
    board[rows, action] = (to_play + 1).to(board.dtype)
    won = winner(board) == to_play
    done = won | (board != 0).all(-1)
    return board, won.float(), done


class TicTacToeEnv(BatchedGameEnv):
    """``N`` tic-tac-toe boards stepped together, self-play: the same agent plays both sides.

    See the module docstring for the observation / reward / ``to_play``
    convention. Actions are one-hot ``[N, 9]`` (index actions ``[N]`` are
    accepted too). :meth:`rand_action` draws legal moves only, so torchrl's
    ``check_env_specs`` and ``rollout()`` without a policy work.
    ``random_opening_moves=k`` starts each game after 0..k uniformly random
    moves (drawn from ``seed``): self-play then also sees the openings a
    random or a minimax opponent plays, not only its own favourite lines.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.tictactoe import TicTacToeEnv
        >>> env = TicTacToeEnv(num_envs=2)
        >>> td = env.reset()
        >>> td["observation"].shape, td["action_mask"].shape, td["to_play"].tolist()
        (torch.Size([2, 27]), torch.Size([2, 9]), [0, 0])
        >>> td["action"] = torch.nn.functional.one_hot(torch.tensor([4, 0]), 9)
        >>> out = env.step(td)
        >>> out["next", "to_play"].tolist(), out["next", "action_mask"][0, 4].item()
        ([1, 1], False)
    """

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", seed: int | None = None,
                 random_opening_moves: int = 0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        if not 0 <= random_opening_moves <= 4:  # 5 plies can end a game
            raise ValueError(f"random_opening_moves must be in 0..4, got {random_opening_moves}.")
        self.random_opening_moves = int(random_opening_moves)
        super().__init__(num_envs, num_actions=NUM_CELLS, device=device)
        n = num_envs
        self.observation_spec = Composite(
            observation=Bounded(0.0, 1.0, shape=(n, OBS_SIZE), dtype=torch.float32, device=self.device),
            action_mask=Binary(n=NUM_CELLS, shape=(n, NUM_CELLS), dtype=torch.bool, device=self.device),
            to_play=Categorical(2, shape=(n,), dtype=torch.int64, device=self.device),
            shape=(n,),
            device=self.device,
        )
        self.board = torch.zeros(n, NUM_CELLS, dtype=torch.int8, device=self.device)
        self.to_play = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.game_over = torch.zeros(n, dtype=torch.bool, device=self.device)
        self._set_seed(seed)

    def _observation(self) -> TensorDict:
        return TensorDict(
            {"observation": observe(self.board, self.to_play), "action_mask": legal_moves(self.board),
             "to_play": self.to_play.clone()},
            batch_size=self.batch_size, device=self.device,
        )

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = self.reset_mask(tensordict)
        self.board[mask] = 0
        self.to_play[mask] = 0
        self.game_over[mask] = False
        if self.random_opening_moves:  # start from 0..k uniformly random moves (self-play diversity)
            plies = torch.randint(0, self.random_opening_moves + 1, self.batch_size, generator=self.rng)
            for ply in range(self.random_opening_moves):
                move = mask & (plies > ply).to(self.device)
                if bool(move.any()):
                    legal = legal_moves(self.board[move]).float().cpu()
                    cells = torch.multinomial(legal, 1, generator=self.rng).squeeze(-1).to(self.device)
                    self.board[move], _, _ = play(self.board[move], self.to_play[move], cells)
                    self.to_play[move] = 1 - self.to_play[move]
        out = self._observation()
        out.update(self.done_flags(self.game_over))
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        if action.shape[-1:] == (NUM_CELLS,) and action.ndim == 2:
            action = action.argmax(-1)
        if bool(self.game_over.any()):
            over = self.game_over.nonzero().flatten().tolist()
            raise ValueError(f"tic-tac-toe boards {over} are finished: reset them before stepping.")
        self.board, reward, done = play(self.board, self.to_play, action.to(self.device))
        self.to_play = 1 - self.to_play
        self.game_over = done
        out = self._observation()
        out.update({"reward": reward.unsqueeze(-1), "done": done.unsqueeze(-1).clone(),
                    "terminated": done.unsqueeze(-1).clone(), "truncated": torch.zeros_like(done).unsqueeze(-1)})
        return out

    def legal_actions(self) -> torch.Tensor:
        return legal_moves(self.board)
