"""Hand-written trajectories and by-the-book targets shared by the GameBuffer tests.

Used by test_game_buffer.py (targets, priorities, state) and test_game_buffer_frames.py
(frame stacks, CatFrames, a real collector)."""
from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from torchrl_muzero.data import GameBuffer

A = 3


# --------------------------------------------------------------------------- helpers
class Episode:
    """A hand-written trajectory: observations ``[eid * 1000 + t, t]``."""

    def __init__(self, eid, rewards, end="terminal", traj=None, to_play=False):
        self.eid = eid
        self.traj = eid if traj is None else traj
        self.rewards = torch.as_tensor(rewards, dtype=torch.float32)
        self.T = len(rewards)
        self.end = end  # "terminal" | "truncated" | "open"
        t = torch.arange(self.T + 1, dtype=torch.float32)
        self.obs = torch.stack([eid * 1000 + t, t], -1)
        g = torch.Generator().manual_seed(eid)
        self.actions = torch.randint(A, (self.T,), generator=g)
        self.search_policy = torch.softmax(torch.randn(self.T, A, generator=g), -1)
        self.root_value = torch.randn(self.T, generator=g)
        self.to_play = (torch.arange(self.T + 1) % 2) if to_play else None

    def chunk(self, t0, t1, one_hot=False):
        n = t1 - t0
        done = torch.zeros(n, 1, dtype=torch.bool)
        term = torch.zeros(n, 1, dtype=torch.bool)
        trunc = torch.zeros(n, 1, dtype=torch.bool)
        if n and t1 == self.T and self.end != "open":
            done[-1] = True
            (term if self.end == "terminal" else trunc)[-1] = True
        action = self.actions[t0:t1]
        if one_hot:
            action = nn.functional.one_hot(action, A)
        td = TensorDict(
            {
                "observation": self.obs[t0:t1],
                "action": action,
                "search_policy": self.search_policy[t0:t1],
                "root_value": self.root_value[t0:t1],
                "policy_version": torch.full((n,), 7),
                ("collector", "traj_ids"): torch.full((n,), self.traj),
                ("next", "observation"): self.obs[t0 + 1 : t1 + 1],
                ("next", "reward"): self.rewards[t0:t1].unsqueeze(-1),
                ("next", "done"): done,
                ("next", "terminated"): term,
                ("next", "truncated"): trunc,
            },
            [n],
        )
        if self.to_play is not None:
            td["to_play"] = self.to_play[t0:t1]
            td["next", "to_play"] = self.to_play[t0 + 1 : t1 + 1]
        return td

    def full(self, **kw):
        return self.chunk(0, self.T, **kw)


def reference(ep, t, K, n, gamma, value_fn, two_player=False):
    """Targets of root ``t`` of ``ep``, by the book (plain loops)."""
    g = -gamma if two_player else gamma
    T = ep.T
    values, rewards, mask, pmask, actions = [], [], [], [], []
    for k in range(K + 1):
        p = t + k
        if p <= T:
            e = min(p + n, T)
            z = sum(g ** (i - p) * float(ep.rewards[i]) for i in range(p, e))
            if not (e == T and ep.end == "terminal"):
                z += g ** (e - p) * value_fn(ep, e)
            values.append(z)
            rewards.append(float(ep.rewards[p - 1]) if k >= 1 else 0.0)
            mask.append(True)
            pmask.append(p < T)
            actions.append(int(ep.actions[p]) if p < T else None)
        else:
            values.append(0.0)
            rewards.append(0.0)
            mask.append(ep.end == "terminal")
            pmask.append(False)
            actions.append(None)
    return values, rewards, mask, pmask, actions


class _FirstEntry:
    """A 'support' whose decode reads the first logit: the stub's value is exact."""

    @staticmethod
    def decode(logits):
        return logits[..., 0]


class ValueStub(nn.Module):
    """initial_inference's value is ``scale * observation[0] + shift``; counts its calls."""

    def __init__(self, scale=0.001, shift=0.0):
        super().__init__()
        self.observation_shape = torch.Size([2])
        self.num_actions = A
        self.value_support = _FirstEntry()
        self.scale, self.shift = scale, shift
        self.dummy = nn.Parameter(torch.zeros(()))
        self.batch_sizes = []

    def value(self, ep, t):
        return self.scale * float(ep.obs[t, 0]) + self.shift

    def initial_inference(self, obs):
        assert not torch.is_grad_enabled() and not self.training
        self.batch_sizes.append(obs.shape[0])
        b = obs.shape[0]
        v = (self.scale * obs[:, :1].double() + self.shift).float()
        return obs, torch.zeros(b, A), v


def check_against_reference(batch, episodes, K, n, gamma, value_fn, two_player=False, policy_stored=True):
    by_id = {ep.eid: ep for ep in episodes}
    seen = set()
    for b in range(batch.batch_size[0]):
        eid, t = int(batch["observation"][b, 0, 0]) // 1000, int(batch["observation"][b, 0, 1])
        ep = by_id[eid]
        seen.add((eid, t))
        values, rewards, mask, pmask, actions = reference(ep, t, K, n, gamma, value_fn, two_player)
        torch.testing.assert_close(batch["target_value"][b], torch.tensor(values), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch["target_reward"][b], torch.tensor(rewards))
        assert batch["mask"][b].tolist() == mask, (eid, t)
        assert batch["policy_mask"][b].tolist() == pmask, (eid, t)
        for k in range(K + 1):
            if actions[k] is not None:
                assert int(batch["action"][b, k]) == actions[k]
            else:
                assert 0 <= int(batch["action"][b, k]) < A
            if pmask[k] and policy_stored:
                torch.testing.assert_close(batch["target_policy"][b, k], ep.search_policy[t + k])
    return seen


def make_buffer(**kw):
    kw.setdefault("seed", 0)
    kw.setdefault("alpha", 0.0)
    return GameBuffer(kw.pop("capacity", 200), **kw)


class FakeSearchPolicy(nn.Module):
    """Random actions; writes a fake search policy and a root value that numbers the steps."""

    def __init__(self, num_actions=A):
        super().__init__()
        self.count = 0
        self.num_actions = num_actions

    def forward(self, td):
        b = td.batch_size
        n = b.numel()
        a = self.num_actions
        td["action"] = nn.functional.one_hot(torch.randint(a, b), a)
        td["search_policy"] = torch.full((*b, a), 1.0 / a)
        td["root_value"] = torch.arange(self.count, self.count + n, dtype=torch.float32).view(b)
        self.count += n
        return td

