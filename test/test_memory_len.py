"""bsuite's memory_len as a batched torchrl env (torchrl_muzero/envs/memory_len.py) and env=MemoryLen."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrl.envs.utils import check_env_specs

from torchrl_muzero.envs import make_env
from torchrl_muzero.envs.memory_len import MemoryLengthEnv, make_memory_env
from torchrl_muzero.trainers.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _play(env, choose, episodes_per_env=50):
    """Mean episode return of ``choose(observation, remembered_cue) -> action [N]`` over whole episodes."""
    n, L = env.batch_size[0], env.memory_length
    returns = []
    for _ in range(episodes_per_env):
        td = env.reset()
        cue = td["observation"][:, 2 + env.num_bits: 2 + 2 * env.num_bits].clone()
        total = torch.zeros(n)
        for t in range(L + 1):
            td["action"] = torch.nn.functional.one_hot(choose(td["observation"], cue), 2)
            td = env.step(td)
            total += td["next", "reward"].squeeze(-1)
            done = td["next", "done"].squeeze(-1)
            assert bool(done.all()) == (t == L) and bool(done.any()) == (t == L)
            td = td["next"]
        returns.append(total)
    return torch.cat(returns)


@pytest.mark.parametrize("num_bits", [1, 3])
def test_remembering_the_cue_scores_one_and_the_current_observation_alone_scores_nothing(num_bits):
    env = MemoryLengthEnv(num_envs=64, memory_length=4, num_bits=num_bits, seed=0)

    def remember(obs, cue):
        bit = obs[:, 2: 2 + num_bits].argmax(-1)  # the query's bit (shown at the query step)
        return (cue.gather(1, bit[:, None]).squeeze(1) > 0).long()

    def memoryless(obs, cue):  # the best a policy of the current observation can do is a guess
        return (obs[:, 2: 2 + num_bits].argmax(-1) % 2).long()

    assert bool((_play(env, remember) == 1).all())
    mean = float(_play(env, memoryless).mean())
    assert abs(mean) < 0.08, mean
    only_at_query = _play(env, lambda obs, cue: torch.ones(obs.shape[0], dtype=torch.long), 5)
    assert set(only_at_query.tolist()) <= {-1.0, 1.0}  # one reward per episode, at the query


def test_the_cue_and_noise_are_seeded_and_resets_are_partial():
    a, b = MemoryLengthEnv(4, 3, seed=5), MemoryLengthEnv(4, 3, seed=5)
    assert torch.equal(a.reset()["observation"], b.reset()["observation"])
    check_env_specs(make_memory_env(3, 2, seed=0))
    env = make_memory_env(num_envs=2, memory_length=3, seed=0)
    td = env.rollout(9, break_when_any_done=False)  # 4-step episodes: partial resets by the rollout
    time_left = td["observation"][..., 0]
    assert torch.allclose(time_left[0], torch.tensor([1, 2 / 3, 1 / 3, 0, 1, 2 / 3, 1 / 3, 0, 1]))


def test_bad_arguments_name_the_key():
    with pytest.raises(ValueError, match="memory_length must be an integer >= 1, got 0"):
        MemoryLengthEnv(2, memory_length=0)
    env = MemoryLengthEnv(2, 1, seed=0)
    td = env.reset()
    td["action"] = torch.tensor([0, 2])
    with pytest.raises(ValueError, match=r"actions in \{0, 1\}"):
        env.step(td)
    with pytest.raises(Exception, match="env.memory_length"):
        load_config({"env": {"kind": "game", "id": "memory_len", "memory_length": 0}})


def test_env_memorylen_builds_from_the_config_and_the_sync_script_runs(tmp_path):
    cfg = load_config({"env": {"kind": "game", "id": "memory_len", "memory_length": 6, "num_envs": 4}})
    env = make_env(cfg.env)
    assert env.reset()["observation"].shape == (4, 6)
    proc = subprocess.run(
        [sys.executable, str(REPO / "sota-implementations/muzero/muzero_sync.py"), "env=MemoryLen",
         "algo=muzero_context", f"run_dir={tmp_path / 'run'}", "env.memory_length=3", "train.total_env_steps=256",
         "train.train_start_after_envsteps=128", "train.frames_per_batch=64", "mcts.num_simulations=4",
         "eval.interval=5", "eval.num_episodes=2", "logger.progress_bar=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "run" / "eval.csv").read_text().count("\n") >= 2
