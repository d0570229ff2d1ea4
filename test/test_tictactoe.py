"""Tic-tac-toe: rules, the minimax opponent, the two-player search, targets, the trainers, learning."""
import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from pipeline_utils import live_descendants, tiny_config
from torchrl_muzero.data import GameBuffer
from torchrl_muzero.trainers.board_eval import evaluate_board, muzero_player, play_match
from torchrl_muzero.envs.board_opponents import (
    MinimaxPlayer,
    RandomPlayer,
    minimax_move_values,
    num_positions,
    position_value,
)
from torchrl_muzero.envs.tictactoe import LINES, TicTacToeEnv, legal_moves, observe, play, winner
from torchrl_muzero.mcts import MCTSConfig, search

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")


def _board(cells: str) -> torch.Tensor:
    """'XO.......' -> [1, 9] int8 board."""
    return torch.tensor([[".XO".index(c) for c in cells]], dtype=torch.int8)


def _step(env, td, cells):
    td["action"] = torch.nn.functional.one_hot(torch.as_tensor(cells), 9)
    return env.step(td)


# -- rules ------------------------------------------------------------------------
def test_env_specs_and_reset():
    env = TicTacToeEnv(num_envs=3, seed=0)
    check_env_specs(env)
    td = env.reset()
    assert td["observation"].shape == (3, 27) and td["action_mask"].all() and (td["to_play"] == 0).all()
    assert (td["observation"][:, 18:] == 1).all() and (td["observation"][:, :18] == 0).all()


@pytest.mark.parametrize("line", range(8))
def test_every_line_wins_for_the_player_who_completes_it(line):
    cells = LINES[line].tolist()
    others = [c for c in range(9) if c not in cells]
    moves = [cells[0], others[0], cells[1], others[1], cells[2]]  # X plays the line, O elsewhere
    env = TicTacToeEnv(num_envs=1)
    td = env.reset()
    for i, cell in enumerate(moves):
        out = _step(env, td, [cell])
        last = i == len(moves) - 1
        assert out["next", "done"].item() == last and out["next", "terminated"].item() == last
        assert out["next", "reward"].item() == (1.0 if last else 0.0)
        td = out["next"]
    assert winner(env.board).item() == 0


def test_o_wins_too_and_draws_end_with_reward_zero():
    env = TicTacToeEnv(num_envs=2)
    td = env.reset()
    seq0 = [0, 2, 1, 4, 8, 6]  # board 0: O wins on the anti-diagonal 2-4-6
    seq1 = [0, 1, 2, 4, 3, 5, 7, 6, 8]  # board 1: a draw
    for t in range(6):
        out = _step(env, td, [seq0[t], seq1[t]])
        assert out["next", "reward"].squeeze(-1).tolist() == [float(t == 5), 0.0]
        assert out["next", "done"].squeeze(-1).tolist() == [t == 5, False]
        td = out["next"]
    assert winner(env.board).tolist() == [1, -1]
    env1 = TicTacToeEnv(num_envs=1)
    td = env1.reset()
    for t, cell in enumerate(seq1):
        out = _step(env1, td, [cell])
        assert out["next", "reward"].item() == 0.0 and out["next", "done"].item() == (t == 8)
        td = out["next"]
    assert winner(env1.board).item() == -1 and not out["next", "action_mask"].any()


def test_masks_to_play_and_perspective_alternate():
    env = TicTacToeEnv(num_envs=1)
    td = env.reset()
    for t, cell in enumerate([4, 0, 8]):
        assert td["to_play"].item() == t % 2
        out = _step(env, td, [cell])
        nxt = out["next"]
        assert not nxt["action_mask"][0, cell] and int(nxt["action_mask"].sum()) == 8 - t
        td = nxt
    # after X4, O0, X8 it is O's move: own plane = {0}, opponent plane = {4, 8}, not the first player
    obs = td["observation"][0]
    assert obs[:9].nonzero().flatten().tolist() == [0]
    assert obs[9:18].nonzero().flatten().tolist() == [4, 8]
    assert (obs[18:] == 0).all() and td["to_play"].item() == 1


def test_illegal_moves_and_finished_boards_raise():
    env = TicTacToeEnv(num_envs=2)
    td = env.reset()
    td = _step(env, td, [4, 4])["next"]
    with pytest.raises(ValueError, match=r"illegal tic-tac-toe move: cell 4 of board 1 is occupied"):
        _step(env, td, [0, 4])
    with pytest.raises(ValueError, match="cells 0..8"):
        play(env.board, env.to_play, torch.tensor([9, 0]))


def test_partial_reset_and_batch_stepping():
    env = TicTacToeEnv(num_envs=3)
    td = env.reset()
    td = _step(env, td, [0, 1, 2])["next"]
    env.reset(TensorDict({"_reset": torch.tensor([[False], [True], [False]])}, [3]))
    assert env.board[1].eq(0).all() and env.board[0, 0] == 1 and env.board[2, 2] == 1
    assert env.to_play.tolist() == [1, 0, 1]
    # what a collector does: the board that finished starts over, the others play on
    env = TicTacToeEnv(num_envs=2)
    td = env.reset()
    for t, cells in enumerate([[0, 0], [3, 1], [1, 2], [4, 4], [2, 5]]):
        td["action"] = torch.nn.functional.one_hot(torch.tensor(cells), 9)
        out, td = env.step_and_maybe_reset(td)
    assert out["next", "done"].squeeze(-1).tolist() == [True, False]  # X completed 0-1-2 on board 0
    assert td["to_play"].tolist() == [0, 1] and td["action_mask"][0].all() and int(td["action_mask"][1].sum()) == 4


def test_random_openings_are_legal_positions_with_the_right_player_to_move():
    env = TicTacToeEnv(num_envs=200, seed=0, random_opening_moves=3)
    td = env.reset()
    stones = (env.board != 0).sum(-1)
    assert set(stones.tolist()) == {0, 1, 2, 3} and (winner(env.board) == -1).all()
    assert torch.equal(td["to_play"], stones % 2) and torch.equal(td["action_mask"], env.board == 0)
    assert torch.equal(td["observation"], observe(env.board, env.to_play))
    again = TicTacToeEnv(num_envs=200, seed=0, random_opening_moves=3)
    again.reset()
    assert torch.equal(again.board, env.board)  # seeded
    with pytest.raises(ValueError, match="random_opening_moves must be in 0..4"):
        TicTacToeEnv(random_opening_moves=5)


def test_rand_action_is_legal_and_seeded():
    a = TicTacToeEnv(num_envs=4, seed=3).rollout(30, break_when_any_done=False)
    b = TicTacToeEnv(num_envs=4, seed=3).rollout(30, break_when_any_done=False)
    assert torch.equal(a["action"], b["action"])
    assert bool((a["action"].bool() & a["action_mask"]).any(-1).all())  # every move was legal


# -- the opponents ------------------------------------------------------------------
def test_minimax_values():
    assert num_positions() == 5478
    assert position_value([0] * 9) == 0  # perfect play draws
    assert position_value(_board("XO.......")[0].tolist()) == 1  # X corner, O adjacent edge: X wins
    values = minimax_move_values(_board("XX.OO...."))[0].tolist()
    assert values[2] == 1 and values[6] == -1  # X wins at 2; X6 lets O win at 5
    assert values[0] == -2 and values[3] == -2  # occupied


def test_minimax_never_loses_and_finds_forced_wins():
    scores = play_match(MinimaxPlayer(0), RandomPlayer(1), 400)
    assert (scores >= 0).all() and (scores > 0).float().mean() > 0.7
    assert (play_match(MinimaxPlayer(2), MinimaxPlayer(3), 100) == 0).all()

    # from X corner / O adjacent edge, X to move, X wins every game against perfect and random replies
    def from_position(opponent, n):
        board = _board("XO.......").repeat(n, 1)
        to_play = torch.zeros(n, dtype=torch.long)
        live = torch.ones(n, dtype=torch.bool)
        result = torch.zeros(n)
        me = MinimaxPlayer(4)
        while bool(live.any()):
            idx = live.nonzero().flatten()
            chooser = me if int(to_play[idx[0]]) == 0 else opponent
            new, reward, done = play(board[idx], to_play[idx], chooser(board[idx], to_play[idx]))
            board[idx] = new
            result[idx] += reward * (1 if int(to_play[idx[0]]) == 0 else -1)
            to_play[idx] = 1 - to_play[idx]
            live[idx[done]] = False
        return result

    assert (from_position(MinimaxPlayer(5), 50) == 1).all()
    assert (from_position(RandomPlayer(6), 50) == 1).all()


# -- the search with to_play ------------------------------------------------------------
class _OracleModel(torch.nn.Module):
    """A perfect tic-tac-toe 'model': latent = the board, exact dynamics, minimax values.

    Latent ``[B, 10]``: cells (0 empty, 1 X, 2 O) and the player to move;
    rewards are the mover's (1 for a winning move, -1 for an occupied cell,
    which ends the game); finished games are absorbing with value 0.
    Priors are uniform, or with ``prior=True`` peaked on the minimax moves
    (MCTS with mean backups and uniform priors needs many simulations to
    see every refutation, so a perfect value alone does not make 50
    simulations play perfectly).
    """

    observation_shape = (27,)
    num_actions = 9

    def __init__(self, prior: bool = False):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))
        self.prior = prior

    def _logits(self, latent):
        if not self.prior:
            return torch.zeros(len(latent), 9)
        board = latent[:, :9].to(torch.int8)
        values = minimax_move_values(board).float()
        live = (latent[:, 9] < 2) & (winner(board) == -1) & (board == 0).any(-1)
        return torch.where(live.unsqueeze(-1), 4.0 * values, 0.0)

    def check_observation(self, observation):
        pass

    def _value(self, latent):
        out = []
        for row in latent.long().tolist():
            board, done = row[:9], row[9] >= 2
            out.append(0.0 if done or winner(torch.tensor([board])).item() != -1 or all(board)
                       else float(position_value(board)))
        return torch.tensor(out)

    def initial_inference(self, observation):
        own, opp, first = observation[:, :9], observation[:, 9:18], observation[:, 18]
        mover = torch.where(first > 0, 0, 1)
        board = torch.where(own > 0, (mover + 1).unsqueeze(-1), torch.where(opp > 0, (2 - mover).unsqueeze(-1), 0))
        latent = torch.cat([board, mover.unsqueeze(-1)], -1).float()
        return latent, self._logits(latent), self._value(latent)

    def recurrent_inference_scalar(self, latent, action):
        board, mover = latent[:, :9].long(), latent[:, 9].long()
        over = (mover >= 2) | (winner(board) != -1) | (board != 0).all(-1)
        rows = torch.arange(len(latent))
        illegal = ~over & (board[rows, action] != 0)
        ok = ~over & ~illegal
        new = board.clone()
        reward = torch.zeros(len(latent))
        if bool(ok.any()):
            nb, r, _ = play(board[ok], mover[ok], action[ok])
            new[ok], reward[ok] = nb, r
        reward[illegal] = -1.0
        next_mover = torch.where(over | illegal, 2, 1 - mover.clamp_max(1))  # 2: absorbing
        next_latent = torch.cat([new, next_mover.unsqueeze(-1)], -1).float()
        return next_latent, reward, self._logits(next_latent), self._value(next_latent)


@pytest.mark.parametrize("cells, to_play, expected", [
    ("XX.OO....", 0, 2),  # X takes the win at 2 (O threatens 5)
    ("XX..O....", 1, 2),  # O must block at 2
    ("OO.XX...X", 1, 2),  # O wins at 2 rather than blocking at 5
])
def test_search_with_to_play_wins_and_blocks_with_a_perfect_model(cells, to_play, expected):
    board = _board(cells)
    tp = torch.tensor([to_play])
    out = search(_OracleModel(), observe(board, tp), MCTSConfig(num_simulations=50, discount=1.0, temperature=0),
                 action_mask=legal_moves(board), to_play=tp, add_noise=False)
    assert out.action.item() == expected, out.visit_counts
    # the match runner's MuZero player (board -> observation, mask, to_play) makes the same choice
    player = muzero_player(_OracleModel(), MCTSConfig(num_simulations=50, discount=1.0, temperature=0))
    assert player(board, tp).item() == expected


def test_perfect_model_plays_perfectly_through_the_match_runner():
    scores, stats = evaluate_board(_OracleModel(prior=True), MCTSConfig(num_simulations=25, discount=1.0, temperature=0),
                                   50)
    assert len(scores) == 100 and stats["eval/vs_random/loss"] == 0.0 and stats["eval/vs_minimax/loss"] == 0.0


# -- value targets: the mover's view ---------------------------------------------------------
def _random_games(n, seed=0):
    """Complete random games as one flat rollout, with the winner of each game."""
    gen = torch.Generator().manual_seed(seed)
    parts, winners = [], []
    for g in range(n):
        board = torch.zeros(1, 9, dtype=torch.int8)
        to_play = torch.zeros(1, dtype=torch.long)
        rows = []
        while True:
            cell = torch.multinomial(legal_moves(board).float(), 1, generator=gen).flatten()
            new, reward, done = play(board, to_play, cell)
            rows.append(dict(obs=observe(board, to_play)[0], mask=legal_moves(board)[0], tp=to_play.clone()[0],
                             action=cell[0], reward=reward[0], done=done[0],
                             next_obs=observe(new, 1 - to_play)[0], next_mask=legal_moves(new)[0]))
            board, to_play = new, 1 - to_play
            if bool(done):
                break
        winners.append(int(winner(board)))
        T = len(rows)
        done = torch.stack([r["done"] for r in rows]).unsqueeze(-1)
        parts.append(TensorDict({
            "observation": torch.stack([r["obs"] for r in rows]),
            "action_mask": torch.stack([r["mask"] for r in rows]),
            "to_play": torch.stack([r["tp"] for r in rows]),
            "action": torch.stack([r["action"] for r in rows]),
            "search_policy": torch.full((T, 9), 1 / 9),
            "root_value": torch.zeros(T),
            "policy_version": torch.full((T,), g),
            ("collector", "traj_ids"): torch.full((T,), g),
            ("next", "observation"): torch.stack([r["next_obs"] for r in rows]),
            ("next", "action_mask"): torch.stack([r["next_mask"] for r in rows]),
            ("next", "reward"): torch.stack([r["reward"] for r in rows]).unsqueeze(-1),
            ("next", "done"): done, ("next", "terminated"): done.clone(),
            ("next", "truncated"): torch.zeros_like(done),
        }, [T]))
    return torch.cat(parts), winners


def test_two_player_value_targets_are_the_outcome_for_the_player_to_move():
    rollout, winners = _random_games(60)
    buffer = GameBuffer(5000, num_unroll_steps=3, td_steps=9, discount=1.0, two_player=True, seed=0)
    buffer.extend(rollout)
    batch = buffer.sample(256)
    game = batch["policy_version"].reshape(256, -1)[:, 0]
    mover_is_x = batch["observation"][:, 0, 18] > 0
    w = torch.tensor(winners)[game]
    expected = torch.where(w == -1, 0.0, torch.where((w == 0) == mover_is_x, 1.0, -1.0))
    assert torch.equal(batch["target_value"][:, 0], expected)
    # one ply later the view flips (where position 1 exists and is not terminal)
    assert {-1.0, 0.0, 1.0} >= set(batch["target_value"][:, 1].tolist())


# -- the trainers ---------------------------------------------------------------------------
def _board_config(tmp_path, **overrides):
    return tiny_config(tmp_path, **{"env.name": "TicTacToe", "env.kind": "board", "env.id": "TicTacToe",
                                    "mcts.discount": 1.0, "buffer.td_steps": 9, "eval.num_episodes": 6,
                                    "loss.consistency_loss_weight": 0.0, **overrides})


@pytest.mark.parametrize("trainer", ["sync", "async"])
def test_trainers_self_play_and_score_against_both_opponents(tmp_path, trainer):
    from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer

    cls = SyncTrainer if trainer == "sync" else AsyncTrainer
    t = cls(_board_config(tmp_path))
    assert t.buffer.two_player and t.num_actions == 9 and t.observation_shape == (27,)
    summary = t.run()
    assert summary["status"] == "ok", summary
    rows = (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]
    assert rows and all(-1.0 <= float(r.split(",")[4]) <= 1.0 for r in rows)
    for opponent in ("vs_random", "vs_minimax"):
        for outcome in ("win", "draw", "loss"):
            assert (tmp_path / "logs" / "scalars" / "eval" / opponent / f"{outcome}.csv").exists()
    assert not live_descendants()


# -- learning ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_self_play_learns_to_beat_the_random_player(tmp_path):
    """25,600 env steps (~2,400 updates) of the shipped env=TicTacToe config against the same model
    untrained (200 games each).

    Untrained (zero-initialised heads: uniform priors, zero values, so the
    search alone plays): loses ~40 % of its games against the random player
    and every game against minimax. The budget is env steps, not seconds: the
    sync trainer is deterministic given the seed, so the result does not depend
    on the machine's load (the test needs neither the machine alone nor a fixed
    wall time). Measured at this budget, seeds 0 / 1 / 2 / 3: losses against
    random 0.405 -> 0.195 / 0.235 / 0.205 / 0.17, gains 0.29 / 0.17 / 0.21 /
    0.29 (~48 s each on one quiet core); 19,200 steps fail seed 0.
    """
    from torchrl_muzero.trainers.board_eval import load_run_model
    from torchrl_muzero.trainers import SyncTrainer
    from torchrl_muzero.trainers.builders import build_model, mcts_config
    from torchrl_muzero.trainers.hydra_entry import compose_config

    cfg = compose_config(CONFIG_DIR, ["env=TicTacToe", f"run_dir={tmp_path}", "logger.progress_bar=false",
                                      "train.total_env_steps=25600", "train.max_wall_time_s=900",
                                      "eval.interval=100000"])
    mcts = mcts_config(cfg, temperature=0.0)
    torch.manual_seed(0)
    untrained_scores, untrained = evaluate_board(build_model(cfg, (27,), 9), mcts, 200, seed=1)
    summary = SyncTrainer(cfg).run()
    assert summary["status"] == "ok", summary
    model, _ = load_run_model(tmp_path)
    trained_scores, trained = evaluate_board(model, mcts, 200, seed=1)
    gain = sum(trained_scores) / len(trained_scores) - sum(untrained_scores) / len(untrained_scores)
    print(json.dumps({"untrained": untrained, "trained": trained, "gain": gain, "env_steps": summary["env_steps"],
                      "updates": summary["train_iter"]}))
    assert untrained["eval/vs_random/loss"] > 0.2, untrained
    assert summary["env_steps"] == 25600, summary  # the budget, not the wall clock, ended the run
    assert trained["eval/vs_random/loss"] <= 0.6 * untrained["eval/vs_random/loss"], (untrained, trained)
    assert gain >= 0.15, (untrained, trained)
