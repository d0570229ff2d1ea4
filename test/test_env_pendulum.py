"""env=Pendulum: gymnasium's Pendulum-v1 through the factory (a box action space), its config, and its
200-step time limit as a truncation that the replay buffer bootstraps (not a terminal)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from replay_cases import ValueStub
from torchrl_muzero.data import GameBuffer
from torchrl_muzero.envs import env_action_space, env_spaces, make_env
from torchrl_muzero.envs.action_spaces import BoxActionSpace
from torchrl_muzero.modules import CategoricalSupport
from torchrl_muzero.trainers.hydra_entry import compose_config

CONFIG_DIR = Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config"
MAX_COST = 16.2736044  # pi^2 + 0.1 * 8^2 + 0.001 * 2^2: Pendulum-v1's largest cost of one step
LIMIT = 200  # Pendulum-v1's max_episode_steps


@pytest.fixture(scope="module")
def cfg():
    return compose_config(CONFIG_DIR, ["env=Pendulum"])


def test_config_selects_pendulum_and_its_supports_cover_the_returns(cfg):
    assert (cfg.env.name, cfg.env.kind, cfg.env.id) == ("Pendulum", "gym", "Pendulum-v1")
    # the largest discounted cost (every step at the worst cost, forever) and one step's cost fit the supports
    assert CategoricalSupport(cfg.model.value_support_size).max_value > MAX_COST / (1 - cfg.mcts.discount)
    assert CategoricalSupport(cfg.model.reward_support_size).max_value > MAX_COST
    assert cfg.train.frames_per_batch % cfg.env.num_envs == 0


def test_specs_are_a_torque_box_and_three_floats(cfg):
    env = make_env(cfg.env, num_envs=2, seed=0)
    try:
        obs = env.observation_spec["observation"]
        assert obs.shape == (2, 3) and obs.dtype == torch.float32
        space = env_action_space(env)
        assert isinstance(space, BoxActionSpace)
        assert space.dim == 1 and tuple(space.shape) == (1,)
        assert space.low.tolist() == [-2.0] and space.high.tolist() == [2.0]
        with pytest.raises(ValueError, match="num_actions exists for discrete actions only"):
            env_spaces(env)
    finally:
        env.close()


def test_random_float_actions_step_through_the_factory(cfg):
    env = make_env(cfg.env, num_envs=2, seed=0)
    try:
        space = env_action_space(env)
        td = env.reset()
        g = torch.Generator().manual_seed(0)
        for _ in range(5):
            canonical = torch.rand(2, 1, generator=g) * 4 - 2  # [N, D] floats in the box
            space.validate(canonical)
            td["action"] = space.encode(canonical)
            td = env.step(td)
            reward = td["next", "reward"]
            assert reward.shape == (2, 1) and reward.dtype == torch.float32
            assert bool(((reward <= 0) & (reward >= -MAX_COST)).all())
            assert td["next", "observation"].dtype == torch.float32
            assert not bool(td["next", "done"].any())
            td = td["next"]
    finally:
        env.close()


def test_the_time_limit_is_a_truncation_not_a_termination(cfg):
    env = make_env(cfg.env, num_envs=1, seed=0)
    try:
        # 210 steps with random actions: the episode ends at step 200 and the env resets itself
        td = env.rollout(LIMIT + 10, break_when_any_done=False)[0]
    finally:
        env.close()
    done, truncated, terminated = (td["next", k].squeeze(-1) for k in ("done", "truncated", "terminated"))
    assert done.nonzero().squeeze(-1).tolist() == [LIMIT - 1]
    assert bool(truncated[LIMIT - 1]) and not bool(terminated.any())
    assert float(td["next", "episode_reward"][LIMIT - 1]) == pytest.approx(float(td["next", "reward"][:LIMIT].sum()))


class _RandomBoxSearch(nn.Module):
    """Uniform torques in [-2, 2] and what a search writes (root_value numbers the rows, for lookup)."""

    def __init__(self, slots: int = 4):
        super().__init__()
        self.slots, self.count = slots, 0

    def forward(self, td):
        b = td.batch_size
        n = b.numel()
        td["action"] = torch.rand(*b, 1) * 4 - 2
        td["search_policy"] = torch.full((*b, self.slots), 1.0 / self.slots)
        td["root_value"] = torch.arange(self.count, self.count + n, dtype=torch.float32).view(b)
        self.count += n
        return td


def _expected_targets(rewards, values, t, K, n, gamma, terminal):
    """By the book: ``z_p = sum_{i=p}^{e-1} g^(i-p) r_i + g^(e-p) v(o_e)``, ``e = min(p + n, T)``; a terminal
    end drops ``v(o_T)`` and its positions after T are 0, a truncated one bootstraps and has none after T."""
    T = len(rewards)
    out = []
    for k in range(K + 1):
        p = t + k
        if p > T:
            out.append(0.0)
            continue
        e = min(p + n, T)
        z = sum(gamma ** (i - p) * float(rewards[i]) for i in range(p, e))
        if not (terminal and e == T):
            z += gamma ** (e - p) * float(values[e])
        out.append(z)
    return out


@pytest.mark.parametrize("end", ["truncated", "terminated"])
def test_buffer_bootstraps_the_value_at_the_truncation(cfg, end):
    """A collected Pendulum episode through a box GameBuffer: at the 200-step truncation the value target
    bootstraps from the model's value of the last observation; the same rows marked terminated do not
    (the control: the env's flags, not the position, decide)."""
    from torchrl.collectors import Collector

    K, n, gamma = 3, 5, cfg.mcts.discount
    env = make_env(cfg.env, num_envs=1, seed=0)
    collector = Collector(env, _RandomBoxSearch(), frames_per_batch=LIMIT + 10, total_frames=LIMIT + 10,
                          auto_register_policy_transforms=False)
    try:
        data = next(iter(collector)).reshape(-1).clone()
    finally:
        collector.shutdown()  # closes the env too
    first = data[:LIMIT]  # the first episode: rows 0..199, ended by the time limit
    assert bool(first["next", "truncated"][-1]) and not bool(first["next", "terminated"].any())
    if end == "terminated":  # the same rows as if the episode had terminated at step 200
        data["next", "terminated"] = data["next", "done"].clone()
        data["next", "truncated"] = torch.zeros_like(data["next", "done"])
    buffer = GameBuffer(1000, num_unroll_steps=K, td_steps=n, discount=gamma, alpha=0.0, seed=0,
                        action_space=BoxActionSpace(-2.0, 2.0, (1,)))
    assert buffer.extend(data) == LIMIT + 10
    model = ValueStub(scale=1.0, shift=100.0)  # v(o) = cos(theta) + 100: never 0, different per observation
    model.observation_shape = torch.Size([3])
    batch = buffer.sample(3000, target_model=model)

    rewards = first["next", "reward"].squeeze(-1)
    observations = torch.cat([first["observation"], first["next", "observation"][-1:]])  # o_0 .. o_200
    values = observations[:, 0].double() + 100.0
    # the collector row of each sampled root (the collector may call the policy once before collecting)
    root = buffer[batch["index"][:, 0]]["root_value"].long() - int(data["root_value"][0])
    seen = set()
    for b in torch.nonzero(root < LIMIT).squeeze(-1).tolist():
        t = int(root[b])
        seen.add(t)
        expected = _expected_targets(rewards, values, t, K, n, gamma, terminal=end == "terminated")
        torch.testing.assert_close(batch["target_value"][b], torch.tensor(expected), atol=1e-4, rtol=1e-5)
    last_roots = set(range(LIMIT - n, LIMIT))
    assert last_roots <= seen  # the roots whose n-step return reaches the end were all checked

    # at the last observation o_200 (root 197 + 3 unroll steps) the target is v(o_200) alone when truncated,
    # 0 when terminated; one step earlier it is r_199 + g v(o_200), resp. the pure reward r_199
    b = int(torch.nonzero(root == LIMIT - K)[0])
    at_end, before = float(batch["target_value"][b, K]), float(batch["target_value"][b, K - 1])
    if end == "truncated":
        assert at_end == pytest.approx(float(values[LIMIT]), rel=1e-5) and at_end > 90
        assert before == pytest.approx(float(rewards[-1]) + gamma * float(values[LIMIT]), rel=1e-5)
        assert bool(batch["mask"][b].all())
    else:
        assert at_end == 0.0 and before == pytest.approx(float(rewards[-1]), rel=1e-5)
