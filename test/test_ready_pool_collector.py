"""``env.pool=async``: :class:`ReadyStepCollector` steps the games of an AsyncEnvPool that are ready.

Toy games in a threading pool (no process start) for the collector's own
guarantees; one tiny Pong run through the async pipeline for the wiring.
"""
from __future__ import annotations

import functools
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase, RewardSum, StepCounter, TransformedEnv

from pipeline_utils import _is_resource_tracker, live_descendants, processes_with_marker, tiny_pong_overrides
from torchrl_muzero.trainers.ready_collector import ReadyStepCollector, split_ready_env
from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")


class ToyGame(EnvBase):
    """A deterministic game: observation ``[game, t, sum of actions]``, reward = action, ``length`` steps.

    ``delay`` seconds of sleep per step make a slow game (the sleep releases the GIL, as an emulator would).
    """

    def __init__(self, game: int = 0, delay: float = 0.0, length: int = 5) -> None:
        super().__init__(batch_size=())
        self.game, self.delay, self.length = game, delay, length
        self.observation_spec = Composite(observation=Unbounded(shape=(3,), dtype=torch.float32))
        self.action_spec = Categorical(3, shape=(), dtype=torch.int64)
        self.reward_spec = Unbounded(shape=(1,))
        self._t, self._total = 0, 0.0

    def _obs(self) -> torch.Tensor:
        return torch.tensor([self.game, self._t, self._total], dtype=torch.float32)

    def _reset(self, tensordict=None):
        self._t, self._total = 0, 0.0
        return TensorDict({"observation": self._obs(), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _step(self, tensordict):
        if self.delay:
            time.sleep(self.delay)
        action = int(tensordict["action"])
        self._t += 1
        self._total += action
        done = torch.tensor([self._t >= self.length])
        return TensorDict({"observation": self._obs(), "reward": torch.tensor([float(action)]),
                           "done": done, "terminated": done.clone()}, [])

    def _set_seed(self, seed):
        return seed


def _game(game: int, delay: float, length: int) -> EnvBase:
    return TransformedEnv(ToyGame(game, delay, length), RewardSum())


def _pool(delays, lengths=None) -> GuardedAsyncEnvPool:
    lengths = lengths or [5] * len(delays)
    return GuardedAsyncEnvPool([functools.partial(_game, i, d, n) for i, (d, n) in enumerate(zip(delays, lengths))],
                               backend="threading")


class _RulePolicy(TensorDictModuleBase):
    """A deterministic function of the observation (the same actions whoever steps the game)."""

    in_keys = ["observation"]
    out_keys = ["action"]

    def forward(self, td):
        obs = td["observation"]
        td["action"] = (obs[..., 0] + 2 * obs[..., 1] + obs[..., 2]).long() % 3
        return td


def _frames_per_game(batches) -> dict[int, list[TensorDict]]:
    out = defaultdict(list)
    for batch in batches:
        flat = batch.reshape(-1)
        for row in flat.unbind(0):
            out[int(row["observation"][0])].append(row)
    return out


def test_fast_games_step_more_than_the_slow_one():
    """Ready stepping: the fast games do many steps while the slow one does one; batch stepping: all equal."""
    delays = [0.2, 0.001, 0.001, 0.001]
    ready = ReadyStepCollector(TransformedEnv(_pool(delays)), _RulePolicy(), frames_per_batch=40, total_frames=80)
    try:
        counts = {g: len(rows) for g, rows in _frames_per_game(list(ready)).items()}
    finally:
        ready.shutdown()
    fast = [counts.get(g, 0) for g in (1, 2, 3)]
    assert counts.get(0, 0) * 4 <= min(fast), counts  # each of the slow game's steps lets the others go on
    assert sum(counts.values()) == 80

    batch_mode = Collector(TransformedEnv(_pool(delays)), _RulePolicy(), frames_per_batch=16, total_frames=32,
                           auto_register_policy_transforms=False)
    try:
        counts = {g: len(rows) for g, rows in _frames_per_game(list(batch_mode)).items()}
    finally:
        batch_mode.shutdown()
    assert counts == {0: 8, 1: 8, 2: 8, 3: 8}  # every step waits for the slow game


def _alone(game: int, length: int, steps: int) -> list[TensorDict]:
    """``steps`` frames of one game stepped by itself with the same policy (a torchrl rollout, reset at done)."""
    env = _game(game, 0.0, length)
    out = env.rollout(steps, _RulePolicy(), break_when_any_done=False)
    env.close()
    return list(out.unbind(0))


def test_each_game_plays_what_it_plays_alone():
    """Per game, the frames (across batches) are that game's own rollout: none lost, repeated or mixed."""
    delays, lengths = [0.03, 0.0, 0.01, 0.002], [4, 3, 6, 5]
    collector = ReadyStepCollector(TransformedEnv(_pool(delays, lengths)), _RulePolicy(), frames_per_batch=25,
                                   total_frames=100)
    try:
        batches = list(collector)
        in_flight = dict(collector._in_flight)
    finally:
        collector.shutdown()
    assert [b.shape for b in batches] == [torch.Size([25])] * 4
    per_game = _frames_per_game(batches)
    assert sum(len(v) for v in per_game.values()) == 100
    seen_traj: dict[int, int] = {}
    for game, rows in per_game.items():
        reference = _alone(game, lengths[game], len(rows))
        for t, (row, ref) in enumerate(zip(rows, reference)):
            for key in ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                        "episode_reward", ("next", "episode_reward")]:
                assert torch.equal(row[key], ref[key]), (game, t, key)
        # a new trajectory id at every reset, never shared with another game
        traj = torch.stack([r["collector", "traj_ids"] for r in rows])
        done = torch.stack([r["next", "done"].squeeze() for r in rows])
        changes = (traj[1:] != traj[:-1])
        assert torch.equal(changes, done[:-1]), game
        for tid in traj.unique().tolist():
            assert seen_traj.setdefault(tid, game) == game
    # the steps still in flight at the end are each game's next one (the carrier moved on)
    assert set(in_flight) <= set(range(4))


def test_acting_memory_follows_its_game():
    """muzero_context's latent: each game's root memory is what the policy wrote for that game's previous step."""
    from torchrl_muzero.data import GameBuffer
    from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
    from torchrl_muzero.mcts.acting_memory import ContextLatentMemory, with_acting_memory
    from torchrl_muzero.modules import MuZeroMLPModel

    torch.manual_seed(0)
    model = MuZeroMLPModel((3,), 3, latent_dim=8, hidden_dim=8).eval()
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=2), memory=ContextLatentMemory(3))
    lengths = [7, 4, 5]
    env = with_acting_memory(TransformedEnv(_pool([0.02, 0.0, 0.005], lengths)), policy)
    assert len(split_ready_env(env)[1]) == 1
    collector = ReadyStepCollector(env, policy, frames_per_batch=30, total_frames=90)
    buffer = GameBuffer(500, num_unroll_steps=2, td_steps=2, seed=0)
    try:
        batches = list(collector)
        for batch in batches:
            buffer.extend(batch)  # raises on a trajectory that does not continue where it stopped
    finally:
        collector.shutdown()
    assert len(buffer) > 0
    per_game = _frames_per_game(batches)
    assert len(per_game) == 3
    for game, rows in per_game.items():
        for t, row in enumerate(rows):
            step = int(row["observation"][1])  # the game's own clock: 0 at its episode start
            assert int(row["context_step"]) == step % 3, (game, t)
            if step % 3:
                prev = rows[t - 1]
                assert int(prev["observation"][0]) == game
                for key in ContextLatentMemory(3).keys:
                    assert torch.equal(row[key], prev["next", key]), (game, t, key)
            elif step == 0:
                assert not row["context_latent"].any()  # the primer's zeros after the reset


def test_unizero_history_window_follows_its_game():
    """UniZero's history window (raw observations and actions): each game's window is its own last steps."""
    from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
    from torchrl_muzero.mcts.acting_memory import with_acting_memory
    from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
    from torchrl_muzero.modules.unizero import UniZeroModel

    torch.manual_seed(0)
    L = 2
    model = UniZeroModel((3,), 3, embed_dim=16, num_heads=2, context_length=L, max_blocks=6,
                         value_support_size=5, reward_support_size=5).eval()
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=2), memory=HistoryWindowMemory(L))
    env = with_acting_memory(TransformedEnv(_pool([0.02, 0.0, 0.005], [7, 4, 5])), policy)
    collector = ReadyStepCollector(env, policy, frames_per_batch=30, total_frames=60)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    per_game = _frames_per_game(batches)
    assert len(per_game) == 3
    for game, rows in per_game.items():
        for t, row in enumerate(rows):
            step = int(row["observation"][1])
            assert int(row["history_count"]) == min(step, L), (game, t)
            count = int(row["history_count"])
            if count:  # the window's real steps are this game's previous observations and actions
                window = row["history_observation"][L - count:]
                assert torch.equal(window, torch.stack([r["observation"] for r in rows[t - count:t]])), (game, t)
                assert torch.equal(row["history_action"][L - count:].long().flatten(),
                                   torch.stack([r["action"] for r in rows[t - count:t]]).long().flatten()), (game, t)


def test_only_primers_may_wrap_the_pool():
    pool = _pool([0.0, 0.0])
    try:
        with pytest.raises(ValueError, match=r"outer StepCounter around its pool; only TensorDictPrimer"):
            ReadyStepCollector(TransformedEnv(pool, StepCounter()), _RulePolicy(), frames_per_batch=4)
    finally:
        pool.close()
    with pytest.raises(ValueError, match="steps an AsyncEnvPool's games"):
        ReadyStepCollector(ToyGame(), _RulePolicy(), frames_per_batch=4)


def test_env_pool_async_with_ray_is_refused_at_config_check():
    from torchrl_muzero.trainers.config import ConfigError, load_config

    atari = {"kind": "atari", "id": "ALE/Pong-v5", "pool": "async"}
    with pytest.raises(ConfigError, match=r"^config key 'env.pool' is 'async' with async_pipeline.backend='ray'.*"
                                          r"allowed with backend=ray: env.pool=serial or parallel"):
        load_config({"env": atari, "async_pipeline": {"enabled": True, "backend": "ray"}})
    load_config({"env": atari, "async_pipeline": {"enabled": True, "backend": "local"}})
    load_config({"env": {**atari, "pool": "parallel"}, "async_pipeline": {"enabled": True, "backend": "ray"}})


@pytest.mark.slow  # Pong: two collector workers, each with a pool of two game processes
@pytest.mark.timeout(300)
def test_tiny_pong_async_pipeline_with_ready_stepping(tmp_path, monkeypatch):
    from torchrl_muzero.trainers import AsyncTrainer
    from torchrl_muzero.trainers.checkpoint import load_checkpoint
    from torchrl_muzero.trainers.hydra_entry import compose_config

    cfg = compose_config(CONFIG_DIR, [*tiny_pong_overrides(tmp_path), "env.pool=async"])
    # every process of the run inherits the marker: pool workers orphaned by a collector worker show up too
    marker = f"ready-pool-{tmp_path.name}"
    monkeypatch.setenv("TORCHRL_MUZERO_TEST_MARKER", marker)
    trainer = AsyncTrainer(cfg)
    shapes = []
    take = trainer._take_batch
    trainer._take_batch = lambda batch, budgets: (shapes.append(tuple(batch.shape)), take(batch, budgets))
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert summary["env_steps"] >= 192 and summary["train_iter"] > 0
    assert shapes and all(shape == (32,) for shape in shapes), shapes  # flat batches: ReadyStepCollector's
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == summary["train_iter"]
    assert not live_descendants()

    def leftovers():  # multiprocessing's resource tracker lives as long as this process, by design
        return [pid for pid in processes_with_marker(marker) if not _is_resource_tracker(pid)]

    deadline = time.monotonic() + 10.0
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers(), "game processes outlived the run"


class _Versioned(TensorDictModuleBase):
    """_RulePolicy that writes the version it acted with, as the trainers' policies do."""

    in_keys = ["observation"]
    out_keys = ["action", "policy_version"]

    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.rule = _RulePolicy()

    def forward(self, td):
        td = self.rule(td)
        td["policy_version"] = torch.full(td.shape, self.version, dtype=torch.long)
        return td


def test_frames_keep_the_version_that_chose_their_action():
    """Weights change between collects; a game still stepping then finishes with the action of the old version."""
    policy = _Versioned()
    # the fast games' 10 ms steps make 24 frames last longer than what is left of the slow game's step
    collector = ReadyStepCollector(TransformedEnv(_pool([0.05, 0.01, 0.01])), policy, frames_per_batch=12)
    batches = iter(collector)
    try:
        first = next(batches)
        assert first["policy_version"].eq(0).all()
        assert collector._in_flight, "the slow game should still be stepping at the end of the collect"
        stepping = sorted(collector._in_flight)
        finished = [int(g) for chunk in collector._carry for g in chunk["observation"][:, 0]]  # beyond the budget
        policy.version = 1  # the learner moved on between the collects
        second = torch.cat([next(batches), next(batches)])
    finally:
        collector.shutdown()
    old = second["policy_version"] == 0
    games = second["observation"][:, 0].long().tolist()
    # old-version frames: the finished steps carried over, then one per game that was stepping at the boundary
    assert sorted(g for g, o in zip(games, old.tolist()) if o) == sorted(finished + stepping)
    assert int(old.sum()) == len(finished) + len(stepping)
    assert second["policy_version"][~old].eq(1).all()
