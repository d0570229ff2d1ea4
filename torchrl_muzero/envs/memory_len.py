"""bsuite's ``memory_len`` as a batched torchrl env: remember a cue for ``L`` steps of noise.

The task that shows why acting from history matters (issue: UniZero and the
history-carrying baselines). An episode has ``memory_length + 1`` steps:

* step 0 shows the *cue*, ``num_bits`` random signs in ``{-1, +1}``;
* steps ``1 .. L-1`` show nothing but the time left and ``num_noise`` random
  signs redrawn every step (distractors);
* step ``L`` is the *query*: it names one bit (one-hot) and the action
  (``0`` for ``-1``, ``1`` for ``+1``) is scored ``+1`` when it repeats that
  bit's sign of the cue, ``-1`` otherwise; then the episode terminates.
  Actions before the query change nothing and earn 0.

A policy that sees only the current observation gets 0 on average (the
query carries no trace of the cue); one that remembers the cue gets 1.

``observation`` (float ``[N, 2 + 2 * num_bits + num_noise]``): time left
``1 - t / L``, the query flag, the query's one-hot bit index (zeros before
the query), the cue (zeros after step 0), the noise signs. As in bsuite the
cue and the query bit are drawn from the env's own seeded generator.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase

from torchrl_muzero.envs.batched_game import BatchedGameEnv

__all__ = ["MemoryLengthEnv", "make_memory_env"]


class MemoryLengthEnv(BatchedGameEnv):
    """``N`` copies of bsuite's ``memory_len`` stepped together (see the module docstring).

    Args:
        num_envs: copies stepped together (the batch size).
        memory_length: ``L``, the steps between the cue (step 0) and the query (step ``L``), >= 1.
        num_bits: bits of the cue; the query asks for one of them.
        num_noise: random-sign distractor entries redrawn every step.
        seed: seed of the env's generator (``None``: from the system).
        device: where the outputs live (draws are made on the CPU).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.memory_len import MemoryLengthEnv
        >>> env = MemoryLengthEnv(num_envs=2, memory_length=3, seed=0)
        >>> td = env.reset()
        >>> cue = td["observation"][:, 3]  # layout [time left, query, query bit, cue, noise, noise]
        >>> td["observation"].shape, bool((cue.abs() == 1).all())
        (torch.Size([2, 6]), True)
        >>> for _ in range(3):  # three steps of waiting
        ...     td = env.step(env.rand_action(td))["next"]
        >>> td["observation"][:, 1].tolist()  # the query is shown
        [1.0, 1.0]
        >>> td["action"] = torch.nn.functional.one_hot((cue > 0).long(), 2)  # repeat the cue
        >>> out = env.step(td)["next"]
        >>> out["reward"].squeeze(-1).tolist(), out["terminated"].squeeze(-1).tolist()
        ([1.0, 1.0], [True, True])
    """

    def __init__(self, num_envs: int = 1, memory_length: int = 10, num_bits: int = 1, num_noise: int = 2,
                 seed: int | None = None, device: str | torch.device = "cpu") -> None:
        for name, value, low in (("num_envs", num_envs, 1), ("memory_length", memory_length, 1),
                                 ("num_bits", num_bits, 1), ("num_noise", num_noise, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
        self.memory_length, self.num_bits, self.num_noise = memory_length, num_bits, num_noise
        super().__init__(num_envs, num_actions=2, device=device)
        n, dev = num_envs, self.device
        self.obs_size = 2 + 2 * num_bits + num_noise
        self.observation_spec = Composite(
            observation=Unbounded(shape=(n, self.obs_size), dtype=torch.float32, device=dev), shape=(n,), device=dev)
        self.t = torch.zeros(n, dtype=torch.int64)
        self.cue = torch.zeros(n, num_bits)
        self.query = torch.zeros(n, dtype=torch.int64)
        self._set_seed(seed)

    def _signs(self, *shape: int) -> torch.Tensor:
        return torch.randint(2, shape, generator=self.rng).float() * 2 - 1

    def _observation(self) -> TensorDict:
        n, L = self.batch_size[0], self.memory_length
        at_query = self.t == L
        obs = torch.zeros(n, self.obs_size)
        obs[:, 0] = 1.0 - self.t.float() / L
        obs[:, 1] = at_query.float()
        rows = at_query.nonzero().flatten()
        obs[rows, 2 + self.query[rows]] = 1.0
        first = self.t == 0
        obs[first, 2 + self.num_bits: 2 + 2 * self.num_bits] = self.cue[first]
        if self.num_noise:
            obs[:, 2 + 2 * self.num_bits:] = self._signs(n, self.num_noise)
        return TensorDict({"observation": obs.to(self.device)}, batch_size=self.batch_size, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = self.reset_mask(tensordict).cpu()
        n = int(mask.sum())
        self.t[mask] = 0
        self.cue[mask] = self._signs(n, self.num_bits)
        self.query[mask] = torch.randint(self.num_bits, (n,), generator=self.rng)
        out = self._observation()
        out.update(self.done_flags())
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self.read_actions(tensordict)
        n = self.batch_size[0]
        if bool((self.t > self.memory_length).any()):
            raise ValueError("memory_len episodes are finished: reset them before stepping.")
        at_query = self.t == self.memory_length
        rows = torch.arange(n)
        target = (self.cue[rows, self.query] > 0).long()
        reward = torch.where(at_query, torch.where(action == target, 1.0, -1.0), 0.0)
        self.t += 1
        out = self._observation()
        out.update({"reward": reward.unsqueeze(-1).to(self.device), **self.done_flags(at_query)})
        return out


def make_memory_env(num_envs: int = 1, memory_length: int = 10, seed: int | None = 0, num_bits: int = 1,
                    num_noise: int = 2, device: str | torch.device = "cpu") -> EnvBase:
    """A seeded :class:`MemoryLengthEnv` with torchrl's ``RewardSum`` (``episode_reward``), like the other envs.

    Examples:
        >>> from torchrl_muzero.envs.memory_len import make_memory_env
        >>> env = make_memory_env(num_envs=4, memory_length=5, seed=0)
        >>> td = env.rollout(12, break_when_any_done=False)
        >>> int(td["next", "done"].sum()), sorted(set(td["next", "reward"].flatten().tolist())) <= [-1.0, 0.0, 1.0]
        (8, True)
    """
    from torchrl.envs import RewardSum, TransformedEnv

    env = MemoryLengthEnv(num_envs, memory_length=memory_length, num_bits=num_bits, num_noise=num_noise,
                          seed=seed, device=device)
    return TransformedEnv(env, RewardSum())
