"""2048: merge rules, rewards, the action mask, spawns, seeding, torchrl specs, rollouts, termination."""
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from torchrl_muzero.envs.game2048 import (
    NUM_CHANCE,
    OBS_SIZE,
    Game2048Env,
    all_moves,
    encode,
    legal_moves,
    make_game2048_env,
    slide_left,
    spawn,
    to_exponents,
    to_values,
)

UP, RIGHT, DOWN, LEFT = range(4)
STUCK = [[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2]]  # full, no equal neighbours


def _slide(row):
    out, reward = slide_left(to_exponents(torch.tensor([row])))
    return to_values(out)[0].tolist(), int(reward[0])


def _moves(board):
    nxt, reward, legal = all_moves(to_exponents(torch.tensor([board])))
    return to_values(nxt[0]), reward[0], legal[0]


def _step(env, td, actions):
    td["action"] = torch.nn.functional.one_hot(torch.as_tensor(actions), 4)
    return env.step(td)


# -- rules ------------------------------------------------------------------------
@pytest.mark.parametrize("row, expected, reward", [
    ([2, 2, 2, 2], [4, 4, 0, 0], 8),
    ([2, 2, 4, 0], [4, 4, 0, 0], 4),  # the new 4 does not merge again into 8
    ([4, 4, 4, 0], [8, 4, 0, 0], 8),  # the leftmost pair merges first
    ([0, 2, 0, 2], [4, 0, 0, 0], 4),
    ([2, 0, 0, 4], [2, 4, 0, 0], 0),
    ([8, 8, 16, 16], [16, 32, 0, 0], 48),
    ([2, 4, 8, 16], [2, 4, 8, 16], 0),
    ([0, 0, 0, 0], [0, 0, 0, 0], 0),
    ([4, 0, 4, 4], [8, 4, 0, 0], 8),
])
def test_slide_left_merge_rules(row, expected, reward):
    assert _slide(row) == (expected, reward)


def test_the_four_directions_and_their_rewards():
    board = [[2, 0, 0, 2], [2, 0, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0]]
    nxt, reward, legal = _moves(board)
    assert nxt[UP].tolist() == [[4, 0, 0, 2], [4, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert nxt[DOWN].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0], [4, 0, 0, 2]]
    assert nxt[LEFT].tolist() == [[4, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0]]
    assert nxt[RIGHT].tolist() == [[0, 0, 0, 4], [0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 0, 4]]
    assert reward.tolist() == [4, 4, 4, 4] and legal.all()


def test_action_mask_when_a_direction_cannot_move():
    top = [[2, 4, 8, 16], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]  # up and left/right do nothing, down does
    assert legal_moves(to_exponents(torch.tensor([top])))[0].tolist() == [False, False, True, False]
    left = [[2, 0, 0, 0], [4, 0, 0, 0], [8, 0, 0, 0], [16, 0, 0, 0]]  # packed left, no vertical pairs
    assert legal_moves(to_exponents(torch.tensor([left])))[0].tolist() == [False, True, False, False]
    assert not legal_moves(to_exponents(torch.tensor([STUCK])))[0].any()
    merge_only = [[2, 4, 2, 4], [2, 8, 16, 32], [64, 128, 256, 512], [1024, 2048, 4096, 8192]]  # full, one 2-over-2
    assert legal_moves(to_exponents(torch.tensor([merge_only])))[0].tolist() == [True, False, True, False]


def test_encode_is_lightzeros_plane_major_one_hot():
    board = to_exponents(torch.tensor([[[0, 2, 4, 8], [0] * 4, [0] * 4, [0, 0, 0, 2 ** 15]]]))
    obs = encode(board)
    assert obs.shape == (1, OBS_SIZE) and (obs.reshape(1, 16, 16).sum(1) == 1).all()
    planes = obs.reshape(16, 4, 4)
    assert planes[0, 0, 0] == 1 and planes[1, 0, 1] == 1 and planes[2, 0, 2] == 1 and planes[3, 0, 3] == 1
    assert planes[15, 3, 3] == 1 and planes[0].sum() == 12


# -- spawns -------------------------------------------------------------------
def test_spawn_probabilities_and_uniform_empty_cells():
    n = 40000
    board = torch.zeros(n, 4, 4, dtype=torch.long)
    board[:, 0, :] = 3  # top row full: 12 empty cells
    gen = torch.Generator().manual_seed(0)
    new, chance = spawn(board, gen)
    placed = (new != board).flatten(1)
    assert (placed.sum(-1) == 1).all() and not placed[:, :4].any()
    cell = placed.float().argmax(-1)
    tile = new.flatten(1)[torch.arange(n), cell]
    four = (tile == 2).float().mean().item()
    assert abs(four - 0.1) < 0.01 and set(tile.unique().tolist()) == {1, 2}
    counts = torch.bincount(cell, minlength=16)[4:].float() / n
    assert (counts - 1 / 12).abs().max() < 0.01
    assert torch.equal(chance, cell * 2 + (tile == 2).long()) and int(chance.max()) < NUM_CHANCE


def test_spawn_leaves_full_or_unselected_boards_alone():
    board = to_exponents(torch.tensor([STUCK, [[0] * 4] * 4]))
    new, chance = spawn(board, torch.Generator().manual_seed(1), where=torch.tensor([True, False]))
    assert torch.equal(new, board) and chance.tolist() == [0, 0]


def test_step_reports_the_chance_outcome():
    env = Game2048Env(num_envs=64, seed=3)
    td = env.reset()
    for _ in range(5):
        before = env.board.clone()
        action = env.rand_action(td)["action"].argmax(-1)
        moved = all_moves(before)[0][torch.arange(64), action]
        td = _step(env, td, action)["next"]
        cell, four = td["chance"] // 2, td["chance"] % 2
        flat = moved.flatten(1)
        assert (flat[torch.arange(64), cell] == 0).all()  # the tile landed on an empty cell
        spawned = env.board.flatten(1) - flat
        expected = torch.zeros_like(spawned)
        expected[torch.arange(64), cell] = 1 + four
        assert torch.equal(spawned, expected)


# -- the env --------------------------------------------------------------------
def test_env_specs_reset_and_reward():
    env = Game2048Env(num_envs=3, seed=0)
    check_env_specs(env)
    td = env.reset()
    assert td["observation"].shape == (3, OBS_SIZE) and td["action_mask"].any(-1).all()
    assert ((td["board"] > 0).flatten(1).sum(-1) == 2).all() and (td["score"] == 0).all()
    board = [[2, 2, 4, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 8, 8]]
    td = env.set_board(torch.tensor([board] * 3))
    assert td["max_tile"].tolist() == [8, 8, 8]
    out = _step(env, td, [LEFT, RIGHT, DOWN])["next"]
    assert out["reward"].squeeze(-1).tolist() == [20.0, 20.0, 0.0]
    assert out["score"].tolist() == [20.0, 20.0, 0.0] and out["max_tile"].tolist() == [16, 16, 8]
    assert not out["done"].any()


def test_reward_scale_scales_reward_not_score():
    env = Game2048Env(num_envs=1, seed=0, reward_scale=0.01)
    td = env.set_board(torch.tensor([[[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4]]))
    out = _step(env, td, [LEFT])["next"]
    assert out["reward"].item() == pytest.approx(0.04) and out["score"].item() == 4.0


def test_illegal_moves_and_finished_boards_raise():
    env = Game2048Env(num_envs=1, seed=0)
    td = env.set_board(torch.tensor([[[2, 4, 8, 16], [0] * 4, [0] * 4, [0] * 4]]))
    with pytest.raises(ValueError, match="illegal 2048 move: up"):
        _step(env, td, [UP])
    td = env.set_board(torch.tensor([STUCK]))
    assert td["done"].item() and td["terminated"].item() and not td["action_mask"].any()
    with pytest.raises(ValueError, match="finished"):
        _step(env, td, [LEFT])


def test_terminates_when_stuck():
    # one move left: the pair of 2s merges into a 4, then the new tile fills the only empty cell.
    board = [[2, 2, 8, 16], [8, 16, 32, 64], [16, 32, 64, 128], [32, 64, 128, 256]]
    env = Game2048Env(num_envs=1, seed=0)
    td = env.set_board(torch.tensor([board]))
    assert td["action_mask"][0].tolist() == [False, True, False, True]
    out = _step(env, td, [LEFT])["next"]
    # [4, 8, 16, t] with t = 2 or 4: no equal neighbours anywhere, so no move is left
    assert out["reward"].item() == 4.0
    row = out["board"][0, 0].tolist()
    assert row[:3] == [4, 8, 16] and row[3] in (2, 4)
    assert out["terminated"].item() and out["done"].item() and not out["truncated"].item()
    assert not out["action_mask"].any()


def test_max_tile_ends_the_game():
    env = Game2048Env(num_envs=1, seed=0, max_tile=16)
    td = env.set_board(torch.tensor([[[8, 8, 0, 0], [0] * 4, [0] * 4, [0] * 4]]))
    out = _step(env, td, [LEFT])["next"]
    assert out["terminated"].item() and out["max_tile"].item() == 16


def test_max_steps_truncates_and_rollout_auto_resets():
    env = Game2048Env(num_envs=4, seed=0, max_steps=5)
    td = env.rollout(12, break_when_any_done=False)
    assert td.shape == (4, 12)
    trunc = td["next", "truncated"].squeeze(-1)
    assert trunc[:, 4].all() and trunc[:, 9].all() and trunc.sum() == 8
    assert not td["next", "terminated"].any()
    # after each truncation the next step starts from a fresh two-tile board
    assert ((td["board"][:, 5] > 0).flatten(1).sum(-1) == 2).all()
    assert (td["score"][:, 5] == 0).all()


def test_same_seed_same_games_other_seed_other_games():
    def play(seed):
        env = make_game2048_env(num_envs=8, seed=seed, max_steps=200)
        return env.rollout(60, break_when_any_done=False)

    a, b, c = play(7), play(7), play(8)
    assert torch.equal(a["next", "board"], b["next", "board"]) and torch.equal(a["action"], b["action"])
    assert torch.equal(a["next", "chance"], b["next", "chance"])
    assert not torch.equal(a["next", "board"], c["next", "board"])
    env = Game2048Env(num_envs=2)
    env.set_seed(7)
    first = env.reset()["board"]
    env.set_seed(7)
    assert torch.equal(env.reset()["board"], first)


def test_random_policy_rollout_plays_games_to_the_end():
    env = make_game2048_env(num_envs=16, seed=0)
    td = env.rollout(400, break_when_any_done=False)
    done = td["next", "done"].squeeze(-1)
    assert done.any(), "random play should lose some games of 2048 within 400 moves"
    term = td["next", "terminated"].squeeze(-1)
    assert not td["next", "action_mask"][term].any()  # a terminal board has no legal move
    taken = td["action"].argmax(-1)
    assert td["action_mask"].gather(-1, taken.unsqueeze(-1)).all()  # only legal moves were played
    ended = td["next", "score"][done]
    returns = td["next", "episode_reward"].squeeze(-1)[done]
    assert torch.allclose(ended, returns) and (td["next", "max_tile"][done] >= 8).all()


def test_batch_rows_are_independent():
    env = Game2048Env(num_envs=2, seed=0)
    boards = torch.tensor([STUCK, [[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4]])
    td = env.set_board(boards)
    assert td["done"].squeeze(-1).tolist() == [True, False]
    td["_reset"] = torch.tensor([[True], [False]])  # what a collector passes: the last step's output plus _reset
    td = env.reset(td)
    assert td["board"][1].tolist() == boards[1].tolist()  # the unfinished game is untouched
    assert (td["board"][0] > 0).sum() == 2 and not td["done"].any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_envs"):
        Game2048Env(num_envs=0)
    with pytest.raises(ValueError, match="max_steps"):
        Game2048Env(max_steps=0)
    with pytest.raises(ValueError, match="max_tile"):
        Game2048Env(max_tile=100)
    with pytest.raises(ValueError, match="reward_scale"):
        Game2048Env(reward_scale=0.0)
