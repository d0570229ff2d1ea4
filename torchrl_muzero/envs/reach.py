"""A one-dimensional reach: the smallest continuous-control task, for a learning test that runs in a minute.

Each step shows a target ``t`` drawn uniformly in ``[-1.5, 1.5]``; the action
``a`` is a float in ``[-2, 2]`` and the reward is ``-(a - t)^2``. An episode
is ``horizon`` steps (8 by default) and ends there (a termination: the task is
over). A uniformly random action scores about ``-2.1`` per step (``-16.7`` an
episode), the best constant action (0) ``-0.75`` per step (``-6``), a policy
that reads the target 0. Nothing is hidden and nothing is delayed: what it
tests is that the sampled family's search over drawn actions finds the good
ones and that the policy learns to draw them (``env=Reach algo=sampled_muzero``).

``observation`` (float ``[N, 2]``): the target and the fraction of the episode
gone. Targets are drawn from the env's own seeded generator.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

__all__ = ["ReachEnv", "make_reach_env"]


class ReachEnv(EnvBase):
    """``num_envs`` one-dimensional reaches stepped together (see the module docstring).

    Args:
        num_envs: copies stepped together (the batch size).
        horizon: steps per episode.
        seed: seed of the env's generator (``None``: from the system).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.reach import ReachEnv
        >>> env = ReachEnv(num_envs=3, seed=0)
        >>> td = env.reset()
        >>> td["action"] = td["observation"][:, :1].clone()  # act the target: reward 0
        >>> out = env.step(td)["next"]
        >>> out["reward"].abs().max().item(), out["done"].any().item()
        (0.0, False)
    """

    batch_locked = True

    def __init__(self, num_envs: int = 1, horizon: int = 8, seed: int | None = None) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}.")
        if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}.")
        super().__init__(batch_size=torch.Size([num_envs]))
        n = num_envs
        self.horizon = horizon
        self.observation_spec = Composite(observation=Unbounded(shape=(n, 2), dtype=torch.float32), shape=(n,))
        self.action_spec = Bounded(-2.0, 2.0, shape=(n, 1), dtype=torch.float32)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(n, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(), shape=(n,))
        self.rng = torch.Generator()
        self.target = torch.zeros(n)
        self.t = torch.zeros(n, dtype=torch.int64)
        self._set_seed(seed)

    def _draw(self, mask: torch.Tensor) -> None:
        fresh = torch.rand(self.batch_size, generator=self.rng) * 3.0 - 1.5
        self.target = torch.where(mask, fresh, self.target)

    def _observation(self, done: torch.Tensor) -> TensorDict:
        obs = torch.stack([self.target, self.t.float() / self.horizon], -1)
        flags = done.unsqueeze(-1)
        return TensorDict({"observation": obs, "done": flags.clone(), "terminated": flags.clone(),
                           "truncated": torch.zeros_like(flags)}, batch_size=self.batch_size)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = torch.ones(self.batch_size, dtype=torch.bool)
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict.get("_reset").reshape(self.batch_size)
        self.t = torch.where(mask, 0, self.t)
        self._draw(mask)
        return self._observation(torch.zeros(self.batch_size, dtype=torch.bool))

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action").reshape(self.batch_size[0], 1)[:, 0].float().clamp(-2.0, 2.0)
        reward = -(action - self.target) ** 2
        self.t = self.t + 1
        done = self.t >= self.horizon
        self._draw(torch.ones(self.batch_size, dtype=torch.bool))
        out = self._observation(done)
        out.set("reward", reward.unsqueeze(-1))
        return out

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            self.rng.seed()
        else:
            self.rng.manual_seed(int(seed))


def make_reach_env(num_envs: int = 1, horizon: int = 8, seed: int | None = 0) -> EnvBase:
    """A seeded :class:`ReachEnv` with torchrl's ``RewardSum`` (``episode_reward``), like the other envs.

    Examples:
        >>> from torchrl_muzero.envs.reach import make_reach_env
        >>> env = make_reach_env(num_envs=2, seed=0)
        >>> td = env.rollout(16, break_when_any_done=False)  # random actions: two episodes per env
        >>> int(td["next", "done"].sum()), bool(td["next", "reward"].max() <= 0)
        (4, True)
    """
    from torchrl.envs import RewardSum, TransformedEnv

    return TransformedEnv(ReachEnv(num_envs, horizon=horizon, seed=seed), RewardSum())
