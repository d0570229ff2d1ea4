"""The two-step gamble (torchrl_muzero/envs/gamble.py), env=Gamble, and the blurred model's over-optimism."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrl.data import OneHot
from torchrl.envs.utils import ExplorationType, check_env_specs, set_exploration_type

from tabular import TabularModel
from torchrl_muzero.envs import make_env
from torchrl_muzero.envs.gamble import LOST, OFFER, WON, GambleEnv, make_gamble_env, play_gamble
from torchrl_muzero.mcts import MCTSConfig, search
from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.builders import build_policy
from torchrl_muzero.trainers.config import load_config
from torchrl_muzero.trainers.hydra_entry import compose_config

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "sota-implementations" / "muzero" / "config")


def _play(env, bet: bool, reply, episodes: int = 20) -> torch.Tensor:
    """Returns of whole episodes: bet (or pass) at the offer, then ``reply(state) -> action``."""
    n = env.batch_size[0]
    out = []
    for _ in range(episodes):
        td = env.reset()
        td["action"] = torch.nn.functional.one_hot(torch.full((n,), int(bet)), 2)
        td = env.step(td)
        assert not td["next", "done"].any() and (td["next", "reward"] == 0).all()
        td = td["next"]
        td["action"] = torch.nn.functional.one_hot(reply(td["observation"].argmax(-1)), 2)
        td = env.step(td)
        assert td["next", "done"].all() and td["next", "terminated"].all()
        out.append(td["next", "reward"].squeeze(-1))
    return torch.cat(out)


def test_passing_earns_the_safe_reward_and_betting_is_worth_two_p_minus_one_with_the_right_reply():
    env = GambleEnv(num_envs=256, safe_reward=0.25, win_probability=0.5, seed=0)
    right = lambda state: (state != WON).long()  # noqa: E731  reply 0 after a win, 1 after a loss
    assert bool((_play(env, False, right) == 0.25).all())
    bets = _play(env, True, right)
    assert set(bets.tolist()) == {1.0, -1.0}
    assert abs(float(bets.mean())) < 0.04, float(bets.mean())  # a fair coin: 0
    # the wrong reply costs more after a loss (-1.2) and after a win (-1)
    wrong = _play(env, True, lambda state: (state == WON).long(), 2)
    assert set(wrong.tolist()) == {-1.0, -1.2000000476837158}
    biased = GambleEnv(num_envs=256, win_probability=0.8, seed=1)
    assert abs(float(_play(biased, True, right).mean()) - 0.6) < 0.05


def test_observations_show_the_state_and_resets_are_partial_and_seeded():
    a, b = GambleEnv(8, seed=3), GambleEnv(8, seed=3)
    for env in (a, b):
        td = env.reset()
        assert td["observation"].argmax(-1).eq(OFFER).all()
        td["action"] = torch.nn.functional.one_hot(torch.ones(8, dtype=torch.long), 2)
        env.coins = env.step(td)["next", "observation"].argmax(-1)
    assert torch.equal(a.coins, b.coins) and set(a.coins.tolist()) <= {WON, LOST}
    check_env_specs(make_gamble_env(3, seed=0))
    td = make_gamble_env(num_envs=2, seed=0).rollout(7, break_when_any_done=False)
    assert td["next", "terminated"][0].flatten().tolist() == [False, True] * 3 + [False]
    assert td["observation"][0, ::2].argmax(-1).eq(OFFER).all()  # each episode starts at the offer
    assert (td["next", "episode_reward"][..., 1::2, 0] == td["next", "reward"][..., 1::2, 0]).all()


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match=r"safe_reward must be in \(-1, 1\), got 1.5"):
        GambleEnv(2, safe_reward=1.5)
    with pytest.raises(ValueError, match=r"win_probability must be in \(0, 1\), got 0"):
        GambleEnv(2, win_probability=0)
    env = GambleEnv(2, seed=0)
    td = env.reset()
    td["action"] = torch.tensor([0, 2])
    with pytest.raises(ValueError, match=r"actions in \{0, 1\}"):
        env.step(td)
    with pytest.raises(Exception, match="env.win_probability"):
        load_config({"env": {"kind": "game", "id": "gamble", "win_probability": 1.0}})


def test_a_deterministic_model_of_the_data_values_the_bet_above_passing():
    """The mechanism behind benchmarks/test_gamble_bench.py, with the learned model replaced by the exact one a
    deterministic model converges to. In the data a bet is followed by the right reply for the coin, so one
    post-bet latent (BLUR) has reply 0 -> +1 (the won games) and reply 1 -> -1 (the lost ones), and its value is
    the bet's true worth 0; passing is worth 0.3 at every depth. The search, free to pick the won game's reply
    at BLUR, prefers the bet."""
    BLUR, END = 2, 3  # states of the tabular model: 0 offer, 1 passed, 2 blurred post-bet, 3 absorbing end
    transition = [[1, BLUR], [END, END], [END, END], [END, END]]
    reward = [[0.0, 0.0], [0.3, 0.3], [1.0, -1.0], [0.0, 0.0]]
    value = [0.3, 0.3, 0.0, 0.0]
    model = TabularModel(transition, reward, value=value)
    cfg = MCTSConfig(num_simulations=50, discount=1.0, dirichlet_fraction=0.0, temperature=0.0)
    out = search(model, torch.zeros(1, 1), cfg)
    assert int(out.action) == 1, out.visit_counts
    assert float(out.root_value) > 0.3 + 0.1, out.root_value  # the root believes the bet beats passing
    # with the coin's real consequences at BLUR (each reply's reward averaged over won and lost games,
    # what random replies teach) the same search passes: the optimism comes from the correlated replies
    averaged = TabularModel(transition, [[0.0, 0.0], [0.3, 0.3], [-0.1, -1.0], [0.0, 0.0]], value=value)
    assert int(search(averaged, torch.zeros(1, 1), cfg).action) == 0


def test_env_gamble_builds_from_the_config_and_the_sync_script_runs(tmp_path):
    cfg = load_config({"env": {"kind": "game", "id": "gamble", "num_envs": 4, "safe_reward": 0.1}})
    env = make_env(cfg.env)
    assert env.reset()["observation"].shape == (4, 4) and env.base_env.safe_reward == 0.1
    proc = subprocess.run(
        [sys.executable, str(REPO / "sota-implementations/muzero/muzero_sync.py"), "env=Gamble",
         "algo=stochastic_muzero", f"run_dir={tmp_path / 'run'}", "train.total_env_steps=256",
         "train.train_start_after_envsteps=128", "train.frames_per_batch=64", "mcts.num_simulations=4",
         "eval.interval=5", "eval.num_episodes=2", "logger.progress_bar=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "run" / "eval.csv").read_text().count("\n") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["muzero", "stochastic_muzero"])
def test_muzero_talks_itself_into_the_bet_and_stochastic_muzero_passes(tmp_path, algo):
    """Stochastic MuZero's point, learned: the shipped env=Gamble config, seed 0, sync pipeline, 10k env steps
    (~40 s each). MuZero's search values the bet above passing and bets; Stochastic MuZero's values it below
    and passes, scoring the optimum 0.2 (benchmarks/test_gamble_bench.py has five seeds of each)."""
    cfg = compose_config(CONFIG_DIR, ["env=Gamble", f"algo={algo}", "seed=0", f"run_dir={tmp_path / 'run'}",
                                      "logger.progress_bar=false"])
    trainer = SyncTrainer(cfg)
    assert trainer.run()["status"] == "ok"
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        report = play_gamble(build_policy(cfg, trainer.learner.model.eval(), OneHot(2), temperature=0.0))
    if algo == "muzero":
        assert report["bet_fraction"] > 0.9 and report["bet_value"] > report["pass_value"] + 0.2, report
        assert report["mean_return"] < 0.1, report
    else:
        assert report["bet_fraction"] < 0.1 and report["bet_value"] < report["pass_value"], report
        assert abs(report["mean_return"] - 0.2) < 0.02, report
