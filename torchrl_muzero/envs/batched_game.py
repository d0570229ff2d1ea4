"""What the games implemented here share: ``N`` copies stepped together with torch ops, one seeded generator.

2048, tic-tac-toe, bsuite's memory_len and the gamble are batched torchrl envs
written in torch (no Python loop over games). Each keeps its own rules and
observation; this base holds the rest once: the one-hot action spec, the
reward and done specs, the generator behind every random draw (seeded by
``set_seed``), partial resets' masks and uniformly random *legal* actions
(so torchrl's ``check_env_specs`` and ``rollout()`` without a policy work).
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, OneHot, Unbounded
from torchrl.envs import EnvBase

__all__ = ["BatchedGameEnv"]


class BatchedGameEnv(EnvBase):
    """Base class of ``num_envs`` games with ``num_actions`` one-hot moves stepped together.

    Subclasses set ``observation_spec``, implement ``_reset`` / ``_step`` and,
    when some moves can be illegal, :meth:`legal_actions`; they call
    ``self._set_seed(seed)`` once their state exists.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Composite, Unbounded
        >>> from torchrl_muzero.envs.batched_game import BatchedGameEnv
        >>> class Coin(BatchedGameEnv):  # guess a coin: +1 when right
        ...     def __init__(self, n, seed=None):
        ...         super().__init__(n, num_actions=2)
        ...         self.observation_spec = Composite(observation=Unbounded(shape=(n, 1)), shape=(n,))
        ...         self._set_seed(seed)
        ...     def _reset(self, td=None, **kwargs):
        ...         return TensorDict({"observation": torch.zeros(self.batch_size[0], 1), **self.done_flags()},
        ...                           batch_size=self.batch_size)
        ...     def _step(self, td):
        ...         coin = torch.randint(2, self.batch_size, generator=self.rng)
        ...         reward = (td["action"].argmax(-1) == coin).float().unsqueeze(-1) * 2 - 1
        ...         return TensorDict({"observation": torch.zeros(self.batch_size[0], 1), "reward": reward,
        ...                            **self.done_flags(torch.ones(self.batch_size, dtype=torch.bool))},
        ...                           batch_size=self.batch_size)
        >>> env = Coin(4, seed=0)
        >>> td = env.rollout(3, break_when_any_done=False)  # random actions from the env's own generator
        >>> td["next", "reward"].abs().eq(1).all().item(), int(td["next", "done"].sum())
        (True, 12)
    """

    batch_locked = True

    def __init__(self, num_envs: int, num_actions: int, device: str | torch.device = "cpu") -> None:
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        n, dev = num_envs, self.device
        self.num_actions = int(num_actions)
        self.action_spec = OneHot(self.num_actions, shape=(n, self.num_actions), dtype=torch.int64, device=dev)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32, device=dev)
        flag = Categorical(2, shape=(n, 1), dtype=torch.bool, device=dev)
        self.done_spec = Composite(done=flag.clone(), terminated=flag.clone(), truncated=flag.clone(),
                                   shape=(n,), device=dev)
        self.rng = torch.Generator()  # every draw of the game (spawns, coins, cues, rand_action); on the CPU

    def legal_actions(self) -> torch.Tensor | None:
        """``[N, num_actions]`` bool of the moves legal now (``None``: every move is); finished games may be
        all False. Games with illegal moves override it."""
        return None

    def reset_mask(self, tensordict: TensorDictBase | None) -> torch.Tensor:
        """``[N]`` bool on the env's device: the games a (partial) reset restarts (all of them without
        ``"_reset"``)."""
        if tensordict is not None and "_reset" in tensordict.keys():
            return tensordict.get("_reset").reshape(self.batch_size).to(self.device)
        return torch.ones(self.batch_size, dtype=torch.bool, device=self.device)

    def read_actions(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The ``"action"`` of ``tensordict`` (one-hot ``[N, A]`` or indices ``[N]``) as ``[N]`` long indices on
        the CPU; a ``ValueError`` that names the allowed values if there are not ``N`` of them in range."""
        action = tensordict.get("action")
        if action.ndim == 2 and action.shape[-1] == self.num_actions:
            action = action.long().argmax(-1)
        action = action.long().reshape(-1).cpu()
        n, allowed = self.batch_size[0], ("{0, 1}" if self.num_actions == 2 else f"0..{self.num_actions - 1}")
        if action.shape[0] != n or bool(((action < 0) | (action >= self.num_actions)).any()):
            raise ValueError(f"expected {n} actions in {allowed}, got {action.tolist()}.")
        return action

    def done_flags(self, terminated: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``done`` / ``terminated`` (copies of ``terminated``, ``[N]`` bool, none by default) and a False
        ``truncated``, each ``[N, 1]`` on the env's device."""
        if terminated is None:
            terminated = torch.zeros(self.batch_size, dtype=torch.bool)
        flags = terminated.reshape(*self.batch_size, 1).to(self.device)
        return {"done": flags.clone(), "terminated": flags.clone(), "truncated": torch.zeros_like(flags)}

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Uniformly random legal moves (one-hot), drawn from the env's generator, written into ``tensordict``."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        legal = self.legal_actions()
        if legal is None:
            legal = torch.ones(*self.batch_size, self.num_actions)
        legal = legal.float().cpu()
        legal[legal.sum(-1) == 0] = 1.0  # finished games: anything (they must be reset)
        moves = torch.multinomial(legal, 1, generator=self.rng).squeeze(-1)
        tensordict.set("action", torch.nn.functional.one_hot(moves, self.num_actions).to(self.device))
        return tensordict

    def _set_seed(self, seed: int | None):
        if seed is None:
            self.rng.seed()
        else:
            self.rng.manual_seed(int(seed))
        return seed
