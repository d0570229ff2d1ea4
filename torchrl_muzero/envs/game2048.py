"""2048 on a 4x4 board as a batched torchrl env: one env object steps ``N`` boards at once.

The single-player stochastic game that Stochastic MuZero is shown on
(LightZero ``zoo/game_2048``). Conventions:

* The board is kept as **exponents** (``[N, 4, 4]`` int64, 0 = empty,
  ``e`` = a tile of value ``2 ** e``); :func:`to_exponents` /
  :func:`to_values` convert from and to tile values.
* Actions are ``0 up, 1 right, 2 down, 3 left`` (LightZero's numbering),
  one-hot ``[N, 4]`` (index actions ``[N]`` are accepted too).
* ``reward`` = ``reward_scale`` x the sum of the tiles made by merges in the
  move (LightZero's ``reward_type='raw'``, which it leaves unnormalised by
  default; its ``reward_normalize`` option divides by 100, which is
  ``reward_scale=0.01`` here).
* After every move one tile appears on a uniformly random empty cell: a 2
  with probability 0.9, a 4 with probability 0.1, drawn from the env's own
  ``torch.Generator`` (seeded by :meth:`~torchrl.envs.EnvBase.set_seed`), so
  a seeded run is reproducible. A new game starts with two such tiles.
* ``chance`` (long ``[N]``) is the outcome of the last spawn:
  ``cell * 2 + (tile == 4)`` with ``cell = 4 * row + col``, 32 outcomes
  (LightZero orders the same 32 outcomes as ``16 * (tile == 4) + cell``).
* ``observation`` (float ``[N, 256]``): LightZero's ``dict_encoded_board``
  (16 one-hot planes of the tile exponent, plane 0 = empty cells, then the
  4x4 cells) flattened plane-major, index ``plane * 16 + cell``. A tile of
  ``2 ** 16`` or more (which ends the game by default) is put on plane 15.
* ``action_mask`` (bool ``[N, 4]``) marks the moves that change the board;
  a move that changes nothing is illegal and stepping it raises
  ``ValueError``. ``terminated`` when no move is legal (or a tile of
  ``max_tile`` is made); ``truncated`` after ``max_steps`` moves when given.
  Finished boards are reset the torchrl way: the collector / ``rollout()``
  passes ``"_reset"`` to :meth:`reset`.
* Extra entries for analysis: ``board`` (tile values ``[N, 4, 4]``),
  ``max_tile`` (long ``[N]``) and ``score`` (float ``[N]``, the unscaled
  sum of merge rewards since the game started).

The rules are plain functions (:func:`slide_left`, :func:`all_moves`,
:func:`spawn`, :func:`encode`) so a search, a bot or a test can call them
on any batch of boards.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Binary, Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from torchrl_muzero.envs.batched_game import BatchedGameEnv

__all__ = [
    "Game2048Env", "make_game2048_env", "slide_left", "all_moves", "legal_moves", "spawn", "encode",
    "to_exponents", "to_values", "NUM_ACTIONS", "NUM_CHANCE", "OBS_SIZE", "ACTION_NAMES",
]

SIZE = 4
NUM_CELLS = SIZE * SIZE
NUM_ACTIONS = 4
NUM_PLANES = 16
OBS_SIZE = NUM_PLANES * NUM_CELLS  # 256
NUM_CHANCE = 2 * NUM_CELLS  # 32: (cell, tile 2 or 4)
ACTION_NAMES = ("up", "right", "down", "left")
FOUR_PROBABILITY = 0.1


def to_exponents(values: torch.Tensor) -> torch.Tensor:
    """Tile values (0, 2, 4, 8, ...) -> exponents (0, 1, 2, 3, ...), int64."""
    values = torch.as_tensor(values).long()
    exps = torch.zeros_like(values)
    nonzero = values > 0
    exps[nonzero] = torch.log2(values[nonzero].double()).round().long()
    return exps


def to_values(exps: torch.Tensor) -> torch.Tensor:
    """Exponents -> tile values (0 stays 0), int64."""
    exps = exps.long()
    return torch.where(exps > 0, torch.ones_like(exps) << exps, torch.zeros_like(exps))


def _compact(rows: torch.Tensor) -> torch.Tensor:
    """Move the non-zero entries of ``rows [M, 4]`` to the left, keeping their order."""
    order = torch.sort((rows == 0).to(torch.int8), dim=-1, stable=True).indices
    return rows.gather(-1, order)


def slide_left(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slide rows of exponents ``[..., 4]`` to the left and merge equal neighbours once.

    Returns ``(new_rows, reward)``, ``reward [...]`` the sum of the merged
    tiles' values. Each tile merges at most once per move, the leftmost pair
    first: ``[2, 2, 2, 2] -> [4, 4, 0, 0]``, ``[2, 2, 4, 0] -> [4, 4, 0, 0]``.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.game2048 import slide_left, to_exponents, to_values
        >>> rows, reward = slide_left(to_exponents(torch.tensor([[2, 2, 2, 2], [4, 4, 4, 0], [0, 2, 0, 2]])))
        >>> to_values(rows).tolist(), reward.tolist()
        ([[4, 4, 0, 0], [8, 4, 0, 0], [4, 0, 0, 0]], [8, 8, 4])
    """
    shape = rows.shape
    c = _compact(rows.reshape(-1, SIZE).long())
    reward = torch.zeros(c.shape[0], dtype=torch.long, device=c.device)
    for i in range(SIZE - 1):  # left to right: a merged tile's right neighbour becomes 0, so it cannot merge again
        merge = (c[:, i] != 0) & (c[:, i] == c[:, i + 1])
        c[:, i] += merge
        c[:, i + 1] = torch.where(merge, 0, c[:, i + 1])
        reward += torch.where(merge, torch.ones_like(reward) << c[:, i], 0)
    return _compact(c).reshape(shape), reward.reshape(shape[:-1])


def _orient(board: torch.Tensor) -> torch.Tensor:
    """``[N, 4, 4]`` -> ``[N, 4, 4, 4]``: for each action, the board turned so the move is a slide to the left."""
    t = board.transpose(-1, -2)
    return torch.stack([t, board.flip(-1), t.flip(-1), board], 1)


def _unorient(boards: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_orient` on ``[N, 4, 4, 4]``."""
    up, right, down, left = boards.unbind(1)
    return torch.stack([up.transpose(-1, -2), right.flip(-1), down.flip(-1).transpose(-1, -2), left], 1)


def all_moves(board: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every move from boards of exponents ``[N, 4, 4]`` at once.

    Returns ``(next_boards [N, 4, 4, 4], rewards [N, 4], legal [N, 4])``
    indexed by action (up, right, down, left), before any new tile;
    ``legal`` marks the moves that change the board.
    """
    board = board.long()
    slid, reward = slide_left(_orient(board))
    nxt = _unorient(slid)
    legal = (nxt != board.unsqueeze(1)).flatten(2).any(-1)
    return nxt, reward.sum(-1), legal


def legal_moves(board: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` bool: the moves that change boards of exponents ``[N, 4, 4]``."""
    return all_moves(board)[2]


def spawn(board: torch.Tensor, generator: torch.Generator | None = None,
          where: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Put a 2 (p 0.9) or a 4 (p 0.1) on a uniformly random empty cell of each board ``[N, 4, 4]``.

    Only boards where ``where [N]`` (bool) is True get a tile (all by
    default); a board without an empty cell is left as it is. Returns
    ``(new_board, chance [N])`` with ``chance = cell * 2 + (tile == 4)``
    (0 where nothing was placed). The draws come from ``generator`` (CPU).
    """
    n = board.shape[0]
    device = board.device
    flat = board.reshape(n, NUM_CELLS).clone()
    empty = (flat == 0).cpu()
    if where is None:
        where = torch.ones(n, dtype=torch.bool)
    where = where.cpu() & empty.any(-1)
    weights = empty.float()
    weights[~empty.any(-1)] = 1.0  # multinomial needs a positive row; such boards are not changed
    cell = torch.multinomial(weights, 1, generator=generator).squeeze(-1)
    four = torch.rand(n, generator=generator) < FOUR_PROBABILITY
    rows = where.nonzero().flatten()
    flat[rows.to(device), cell[rows].to(device)] = (1 + four[rows].long()).to(device)
    chance = torch.where(where, cell * 2 + four.long(), 0)
    return flat.reshape(board.shape), chance.to(device)


def encode(board: torch.Tensor) -> torch.Tensor:
    """``[N, 256]`` float observation of boards of exponents ``[N, 4, 4]`` (plane-major one-hot)."""
    planes = torch.nn.functional.one_hot(board.long().clamp_max(NUM_PLANES - 1), NUM_PLANES)  # [N, 4, 4, 16]
    return planes.permute(0, 3, 1, 2).reshape(board.shape[0], OBS_SIZE).float()


class Game2048Env(BatchedGameEnv):
    """``N`` games of 2048 stepped together with vectorised torch ops.

    See the module docstring for the observation, reward, chance and mask
    conventions. :meth:`rand_action` draws legal moves only, so torchrl's
    ``check_env_specs`` and ``rollout()`` without a policy work.

    Args:
        num_envs: boards stepped together (the batch size).
        device: where the outputs live (the random draws are made on the CPU).
        seed: seed of the env's generator (spawns and :meth:`rand_action`);
            ``None`` seeds it from the system.
        max_steps: truncate a game after this many moves (``None``: never).
        reward_scale: factor applied to the merge reward (``score`` stays raw).
        max_tile: a game ends once a tile of this value is made (LightZero's
            default 65536); ``None`` plays on until no move is legal.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.game2048 import Game2048Env
        >>> env = Game2048Env(num_envs=2, seed=0)
        >>> td = env.reset()
        >>> td["observation"].shape, td["action_mask"].shape, (td["board"] > 0).flatten(1).sum(-1).tolist()
        (torch.Size([2, 256]), torch.Size([2, 4]), [2, 2])
        >>> td = env.set_board(torch.tensor([[[2, 2, 4, 0], [0] * 4, [0] * 4, [0] * 4]] * 2))
        >>> td["action_mask"][0].tolist()  # up cannot move the top row
        [False, True, True, True]
        >>> td["action"] = torch.nn.functional.one_hot(torch.tensor([3, 1]), 4)  # left, right
        >>> out = env.step(td)["next"]
        >>> out["reward"].squeeze(-1).tolist(), out["board"][0, 0, :2].tolist(), out["chance"].shape
        ([4.0, 4.0], [4, 4], torch.Size([2]))
    """

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu", seed: int | None = None,
                 max_steps: int | None = None, reward_scale: float = 1.0, max_tile: int | None = 2 ** 16) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}.")
        if max_tile is not None and (max_tile < 4 or max_tile & (max_tile - 1)):
            raise ValueError(f"max_tile must be a power of two >= 4 or None, got {max_tile}.")
        if not reward_scale > 0:
            raise ValueError(f"reward_scale must be > 0, got {reward_scale}.")
        self.max_steps = None if max_steps is None else int(max_steps)
        self.reward_scale = float(reward_scale)
        self.max_tile = None if max_tile is None else int(max_tile)
        super().__init__(num_envs, num_actions=NUM_ACTIONS, device=device)
        n = num_envs
        dev = self.device
        self.observation_spec = Composite(
            observation=Bounded(0.0, 1.0, shape=(n, OBS_SIZE), dtype=torch.float32, device=dev),
            action_mask=Binary(n=NUM_ACTIONS, shape=(n, NUM_ACTIONS), dtype=torch.bool, device=dev),
            chance=Categorical(NUM_CHANCE, shape=(n,), dtype=torch.int64, device=dev),
            board=Unbounded(shape=(n, SIZE, SIZE), dtype=torch.int64, device=dev),
            max_tile=Unbounded(shape=(n,), dtype=torch.int64, device=dev),
            score=Unbounded(shape=(n,), dtype=torch.float32, device=dev),
            shape=(n,),
            device=dev,
        )
        self.board = torch.zeros(n, SIZE, SIZE, dtype=torch.int64, device=dev)  # exponents
        self.legal = torch.zeros(n, NUM_ACTIONS, dtype=torch.bool, device=dev)
        self.chance = torch.zeros(n, dtype=torch.int64, device=dev)
        self.score = torch.zeros(n, dtype=torch.float32, device=dev)
        self.steps = torch.zeros(n, dtype=torch.int64, device=dev)
        self.game_over = torch.zeros(n, dtype=torch.bool, device=dev)
        self._set_seed(seed)

    # -- state ------------------------------------------------------------------
    def set_board(self, values: torch.Tensor) -> TensorDictBase:
        """Put boards of tile values ``[N, 4, 4]`` in play now (tests, analysis, openings).

        The games go on from these boards (step count and score kept); the
        returned tensordict is what :meth:`reset` would return for them.
        """
        values = torch.as_tensor(values).long().reshape(self.batch_size[0], SIZE, SIZE)
        self.board = to_exponents(values).to(self.device)
        self.chance = torch.zeros_like(self.chance)
        self.legal = legal_moves(self.board)
        self.game_over = self._finished()
        out = self._observation()
        flags = self.game_over.unsqueeze(-1)
        out.update({"done": flags.clone(), "terminated": flags.clone(), "truncated": torch.zeros_like(flags)})
        return out

    def _observation(self) -> TensorDict:
        values = to_values(self.board)
        return TensorDict(
            {"observation": encode(self.board), "action_mask": self.legal.clone(), "chance": self.chance.clone(),
             "board": values, "max_tile": values.flatten(1).amax(-1), "score": self.score.clone()},
            batch_size=self.batch_size, device=self.device,
        )

    def _finished(self) -> torch.Tensor:
        over = ~self.legal.any(-1)
        if self.max_tile is not None:
            over |= to_values(self.board).flatten(1).amax(-1) >= self.max_tile
        return over

    # -- EnvBase ----------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = self.reset_mask(tensordict)
        fresh = torch.where(mask.view(-1, 1, 1), 0, self.board)
        fresh, _ = spawn(fresh, self.rng, where=mask)
        fresh, chance = spawn(fresh, self.rng, where=mask)
        self.board = fresh
        self.chance = torch.where(mask, chance, self.chance)
        self.score[mask] = 0.0
        self.steps[mask] = 0
        self.legal = legal_moves(self.board)
        self.game_over = self._finished()
        out = self._observation()
        out.update(self.done_flags(self.game_over))
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        if action.ndim == 2 and action.shape[-1] == NUM_ACTIONS:
            action = action.argmax(-1)
        action = action.long().reshape(-1).to(self.device)
        if action.shape[0] != self.batch_size[0] or bool(((action < 0) | (action >= NUM_ACTIONS)).any()):
            raise ValueError(f"expected {self.batch_size[0]} actions in 0..3 (up, right, down, left), "
                             f"got {action.tolist()}.")
        if bool(self.game_over.any()):
            over = self.game_over.nonzero().flatten().tolist()
            raise ValueError(f"2048 boards {over} are finished: reset them before stepping.")
        rows = torch.arange(self.batch_size[0], device=self.device)
        illegal = ~self.legal[rows, action]
        if bool(illegal.any()):
            bad = illegal.nonzero().flatten().tolist()
            raise ValueError(
                f"illegal 2048 move: {ACTION_NAMES[int(action[bad[0]])]} does not change board {bad[0]} "
                f"(illegal moves on boards {bad}); pick an action where action_mask is True."
            )
        nxt, rewards, _ = all_moves(self.board)
        reward = rewards[rows, action].float()
        self.board, self.chance = spawn(nxt[rows, action], self.rng)
        self.score += reward
        self.steps += 1
        self.legal = legal_moves(self.board)
        terminated = self._finished()
        truncated = ~terminated & (self.steps >= self.max_steps if self.max_steps else torch.zeros_like(terminated))
        self.game_over = terminated | truncated
        out = self._observation()
        out.update({"reward": (reward * self.reward_scale).unsqueeze(-1),
                    "done": self.game_over.unsqueeze(-1).clone(), "terminated": terminated.unsqueeze(-1),
                    "truncated": truncated.unsqueeze(-1)})
        return out

    def legal_actions(self) -> torch.Tensor:
        return self.legal


def make_game2048_env(num_envs: int = 1, seed: int | None = 0, max_steps: int | None = None,
                      reward_scale: float = 1.0, max_tile: int | None = 2 ** 16,
                      device: str | torch.device = "cpu", episode_reward: bool = True) -> EnvBase:
    """A seeded :class:`Game2048Env`, with torchrl's ``RewardSum`` (``episode_reward``) like the project's other envs.

    Examples:
        >>> from torchrl_muzero.envs.game2048 import make_game2048_env
        >>> env = make_game2048_env(num_envs=3, seed=1, max_steps=50)
        >>> td = env.rollout(10, break_when_any_done=False)
        >>> td["next", "episode_reward"].shape, bool((td["next", "reward"] >= 0).all())
        (torch.Size([3, 10, 1]), True)
    """
    env = Game2048Env(num_envs, device=device, seed=seed, max_steps=max_steps, reward_scale=reward_scale,
                      max_tile=max_tile)
    if episode_reward:
        from torchrl.envs import RewardSum, TransformedEnv

        env = TransformedEnv(env, RewardSum())
    return env
