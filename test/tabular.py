"""Hand-written tabular MuZero models with known optimal values, for search tests."""
from __future__ import annotations

import torch

from torchrl_muzero.modules import MuZeroModel


class TabularModel(MuZeroModel):
    """An exact model of a deterministic finite MDP.

    The latent is the one-hot of the state; dynamics follow ``transition[s, a]``
    and emit ``reward[s, a]`` exactly (as two-hot logits); prediction returns
    ``prior_logits[s]`` and ``value[s]``. Observations are state indices
    ``[B, 1]`` (float).
    """

    def __init__(self, transition, reward, value=None, prior_logits=None, support_size=20):
        transition = torch.as_tensor(transition, dtype=torch.long)
        S, A = transition.shape
        super().__init__((1,), A, support_size, support_size)
        self.register_buffer("transition", transition)
        self.register_buffer("reward_table", torch.as_tensor(reward, dtype=torch.float32))
        self.register_buffer(
            "value_table", torch.zeros(S) if value is None else torch.as_tensor(value, dtype=torch.float32)
        )
        self.register_buffer(
            "prior_table", torch.zeros(S, A) if prior_logits is None else torch.as_tensor(prior_logits, dtype=torch.float32)
        )
        self.num_states = S
        self._dummy = torch.nn.Parameter(torch.zeros(()))  # gives the model a device

    def _logits(self, support, x):
        return torch.log(support.encode(x) + 1e-12)

    def represent(self, observation):
        return torch.nn.functional.one_hot(observation[:, 0].long(), self.num_states).float()

    def dynamics(self, latent, action):
        state = latent.argmax(-1)
        nxt = self.transition[state, action]
        reward = self.reward_table[state, action]
        return torch.nn.functional.one_hot(nxt, self.num_states).float(), self._logits(self.reward_support, reward)

    def predict(self, latent):
        state = latent.argmax(-1)
        return self.prior_table[state], self._logits(self.value_support, self.value_table[state])


def optimal_values(transition, reward, discount, horizon=200, two_player=False):
    """Value iteration: V*(s) and Q*(s, a); two-player: negamax with the mover's rewards."""
    transition = torch.as_tensor(transition)
    reward = torch.as_tensor(reward, dtype=torch.float64)
    v = torch.zeros(transition.shape[0], dtype=torch.float64)
    sign = -1.0 if two_player else 1.0
    for _ in range(horizon):
        q = reward + sign * discount * v[transition]
        v = q.max(-1).values
    return v, q


def chain_with_trap():
    """State 0: action 0 -> +1 now then nothing; action 1 -> 0 now, then +3 one step later.

    States: 0 start, 1 after the 'greedy' action, 2 after the 'patient' one,
    3 absorbing terminal. Optimal with discount 1: action 1 (value 3).
    """
    T = [[1, 2], [3, 3], [3, 3], [3, 3]]
    R = [[1.0, 0.0], [0.0, 0.0], [3.0, 3.0], [0.0, 0.0]]
    return T, R


def random_tree_mdp(depth=4, branching=3, seed=0):
    """A full tree MDP with random rewards in [-1, 1], ending in an absorbing state."""
    g = torch.Generator().manual_seed(seed)
    n_internal = sum(branching**d for d in range(depth))
    S = n_internal + branching**depth + 1
    terminal = S - 1
    T = torch.full((S, branching), terminal, dtype=torch.long)
    R = torch.zeros(S, branching)
    for s in range(n_internal):
        for a in range(branching):
            T[s, a] = s * branching + a + 1
            R[s, a] = torch.rand((), generator=g) * 2 - 1
    return T, R


def nim(max_stones=8, take=(1, 2)):
    """Nim: take 1 or 2 stones; whoever takes the last stone gets +1 (the mover's reward).

    State = stones left; state 0 is terminal (absorbing, no reward). Taking
    more stones than are left takes them all.
    """
    S = max_stones + 1
    T = torch.zeros(S, len(take), dtype=torch.long)
    R = torch.zeros(S, len(take))
    for s in range(1, S):
        for i, k in enumerate(take):
            nxt = max(s - k, 0)
            T[s, i] = nxt
            R[s, i] = 1.0 if nxt == 0 else 0.0
    return T, R
