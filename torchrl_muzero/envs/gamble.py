"""A two-step gamble where a deterministic world model talks itself into a bad bet (Stochastic MuZero's point).

Each episode has two decisions:

* step 0, the *offer*: action 0 passes (the safe branch), action 1 bets;
* step 1, the *reply*. After a pass any reply earns ``safe_reward``. After a
  bet a fair coin (``win_probability``) is tossed and shown in the
  observation, and the reply is scored by this table; then the episode ends:

  ========  ===========  ===========
  coin      reply 0      reply 1
  ========  ===========  ===========
  won       +1           -1
  lost      -1.2         -1
  ========  ===========  ===========

The right reply is 0 after a win and 1 after a loss, so betting is worth
``p - (1 - p)`` (0 for a fair coin) to a player who replies well, and passing
is worth ``safe_reward`` (0.2): the optimal policy passes and scores 0.2.

Why a deterministic model bets. MuZero's dynamics map (offer, bet) to *one*
next latent; in its training data the reply that follows a bet is the right
one for the coin it saw, so at that blurred latent reply 0 is followed by +1
(the won games) and reply 1 by -1 (the lost ones). Searching through the blur,
the model can pick the won game's reply without the coin having been won: it
chooses its dice, values the bet at +1 and bets, and greedy play scores ~0.
Stochastic MuZero's afterstate after a bet is a chance node whose codes the
encoder learns from ``(o_0, o_1)``: the search averages the won and the lost
branch, values the bet at ~0 and passes (Antonoglou et al. 2022 make the
same argument for chance in planning; ``benchmarks/test_gamble_bench.py``
measures both).

``observation`` (float ``[N, 4]``): one-hot of the state (offer, passed, won,
lost). The coin is drawn from the env's own seeded generator.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase

from torchrl_muzero.envs.batched_game import BatchedGameEnv

__all__ = ["GambleEnv", "make_gamble_env", "play_gamble", "OFFER", "PASSED", "WON", "LOST"]

OFFER, PASSED, WON, LOST = range(4)
# reward of reply 0 / reply 1 in each state after the offer (PASSED's row is safe_reward for both)
_REPLY_REWARDS = {WON: (1.0, -1.0), LOST: (-1.2, -1.0)}


class GambleEnv(BatchedGameEnv):
    """``N`` copies of the two-step gamble stepped together (see the module docstring).

    Args:
        num_envs: copies stepped together (the batch size).
        safe_reward: what passing earns, in ``(-1, 1)``; the bet is worth ``2 * win_probability - 1``.
        win_probability: chance that the coin is won after a bet, in ``(0, 1)``.
        seed: seed of the env's generator (``None``: from the system).
        device: where the outputs live (draws are made on the CPU).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.gamble import GambleEnv, WON
        >>> env = GambleEnv(num_envs=4, seed=0)
        >>> td = env.reset()
        >>> td["observation"].argmax(-1).tolist()  # every game starts at the offer
        [0, 0, 0, 0]
        >>> td["action"] = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 1]), 2)  # one passes, three bet
        >>> td = env.step(td)["next"]
        >>> state = td["observation"].argmax(-1)
        >>> state[0].item(), set(state[1:].tolist()) <= {2, 3}  # passed; the bets show their coin
        (1, True)
        >>> right = (state != WON).long()  # reply 0 after a win, 1 otherwise
        >>> td["action"] = torch.nn.functional.one_hot(right, 2)
        >>> out = env.step(td)["next"]
        >>> out["reward"][0].item(), out["terminated"].all().item()
        (0.20000000298023224, True)
    """

    def __init__(self, num_envs: int = 1, safe_reward: float = 0.2, win_probability: float = 0.5,
                 seed: int | None = None, device: str | torch.device = "cpu") -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}.")
        if not -1.0 < float(safe_reward) < 1.0:
            raise ValueError(f"safe_reward must be in (-1, 1), got {safe_reward!r}.")
        if not 0.0 < float(win_probability) < 1.0:
            raise ValueError(f"win_probability must be in (0, 1), got {win_probability!r}.")
        self.safe_reward, self.win_probability = float(safe_reward), float(win_probability)
        super().__init__(num_envs, num_actions=2, device=device)
        n, dev = num_envs, self.device
        self.observation_spec = Composite(
            observation=Unbounded(shape=(n, 4), dtype=torch.float32, device=dev), shape=(n,), device=dev)
        self.state = torch.full((n,), OFFER, dtype=torch.int64)
        self.finished = torch.zeros(n, dtype=torch.bool)
        # reward[state, reply] for the reply step (the offer's row is unused: the offer pays 0)
        self.reply_rewards = torch.tensor([[0.0, 0.0], [self.safe_reward] * 2, list(_REPLY_REWARDS[WON]),
                                           list(_REPLY_REWARDS[LOST])])
        self._set_seed(seed)

    def _observation(self) -> TensorDict:
        obs = torch.nn.functional.one_hot(self.state, 4).float()
        return TensorDict({"observation": obs.to(self.device)}, batch_size=self.batch_size, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = self.reset_mask(tensordict).cpu()
        self.state[mask] = OFFER
        self.finished[mask] = False
        out = self._observation()
        out.update(self.done_flags())
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self.read_actions(tensordict)
        n = self.batch_size[0]
        if bool(self.finished.any()):
            raise ValueError("gamble episodes are finished: reset them before stepping.")
        at_offer = self.state == OFFER
        reward = torch.where(at_offer, 0.0, self.reply_rewards[self.state, action])
        won = torch.rand(n, generator=self.rng) < self.win_probability
        after_offer = torch.where(action == 0, PASSED, torch.where(won, WON, LOST))
        self.finished = ~at_offer
        self.state = torch.where(at_offer, after_offer, self.state)
        out = self._observation()
        out.update({"reward": reward.unsqueeze(-1).to(self.device), **self.done_flags(self.finished)})  # copies
        return out


def make_gamble_env(num_envs: int = 1, safe_reward: float = 0.2, win_probability: float = 0.5,
                    seed: int | None = 0, device: str | torch.device = "cpu") -> EnvBase:
    """A seeded :class:`GambleEnv` with torchrl's ``RewardSum`` (``episode_reward``), like the other envs.

    Examples:
        >>> from torchrl_muzero.envs.gamble import make_gamble_env
        >>> env = make_gamble_env(num_envs=4, seed=0)
        >>> td = env.rollout(8, break_when_any_done=False)  # random play: four episodes per game
        >>> int(td["next", "done"].sum())
        16
    """
    from torchrl.envs import RewardSum, TransformedEnv

    env = GambleEnv(num_envs, safe_reward=safe_reward, win_probability=win_probability, seed=seed, device=device)
    return TransformedEnv(env, RewardSum())


@torch.no_grad()
def play_gamble(policy, games: int = 512, safe_reward: float = 0.2, win_probability: float = 0.5,
                seed: int = 12_345) -> dict[str, float]:
    """How ``policy`` plays ``games`` gambles: how often it bets, what it scores, and what its search thinks.

    ``policy`` is a TensorDict module that reads ``"observation"`` (and
    ``"action_mask"`` where given) and writes ``"action"`` (one-hot or an
    index), such as :class:`~torchrl_muzero.mcts.MCTSPolicy`; run it in its
    deterministic mode for greedy play. A policy that also writes
    ``"root_value"`` (a search) is asked twice more at the offer with only one
    choice legal: ``bet_value`` / ``pass_value`` are the root values of those
    restricted searches (what the search believes betting and passing are
    worth), to compare with their true worth ``2 * win_probability - 1`` and
    ``safe_reward``.

    Returns:
        ``bet_fraction``, ``mean_return``, ``bet_value``, ``pass_value`` (the
        last two NaN for a policy without ``"root_value"``).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.gamble import WON, play_gamble
        >>> def cautious(td):  # passes, then replies 0
        ...     td["action"] = torch.zeros(td.shape[0], dtype=torch.long)
        ...     return td
        >>> report = play_gamble(cautious, games=8)
        >>> report["bet_fraction"], round(report["mean_return"], 3)
        (0.0, 0.2)
    """
    env = GambleEnv(games, safe_reward=safe_reward, win_probability=win_probability, seed=seed)

    def act(td: TensorDictBase) -> torch.Tensor:
        action = policy(td)["action"]
        return action.long().argmax(-1) if action.ndim == 2 else action.long().reshape(-1)

    td = env.reset()
    offer = td.clone()
    bet = act(td)
    td["action"] = torch.nn.functional.one_hot(bet, 2)
    td = env.step(td)["next"]
    reply = act(td)
    td["action"] = torch.nn.functional.one_hot(reply, 2)
    reward = env.step(td)["next", "reward"].reshape(-1)
    values = {}
    for name, choice in (("bet_value", 1), ("pass_value", 0)):
        masked = offer.clone()
        masked["action_mask"] = torch.nn.functional.one_hot(torch.full((games,), choice), 2).bool()
        out = policy(masked)
        values[name] = float(out["root_value"].mean()) if "root_value" in out.keys() else float("nan")
    return dict(bet_fraction=float(bet.float().mean()), mean_return=float(reward.mean()), **values)
