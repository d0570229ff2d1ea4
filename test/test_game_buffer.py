"""Tests of the replay storage: GameBuffer, its targets, frames and priority tree."""
from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from torchrl_muzero.data import FrameStack, GameBuffer, PriorityTree
from torchrl_muzero.data.targets import plan_value_targets, reward_targets, value_targets

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


# --------------------------------------------------------------------------- priority tree
def test_priority_tree_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    tree = PriorityTree(37, backend="torch")
    leaves = torch.zeros(37, dtype=torch.float64)
    for _ in range(20):
        idx = torch.randint(37, (5,), generator=g).unique()
        val = torch.rand(idx.numel(), generator=g, dtype=torch.float64) * (torch.rand(idx.numel(), generator=g) > 0.3)
        tree.update(idx, val)
        leaves[idx] = val
    assert math.isclose(tree.total(), float(leaves.sum()), rel_tol=1e-12)
    assert tree.min() == float(leaves[leaves > 0].min())
    mass = torch.rand(500, generator=g, dtype=torch.float64) * tree.total()
    expected = torch.searchsorted(torch.cumsum(leaves, 0), mass, right=True)
    assert torch.equal(tree.find(mass), expected)
    # rebuilding from leaves gives the same tree
    other = PriorityTree(37, backend="torch")
    other.load(leaves)
    assert torch.equal(other.find(mass), expected) and other.min() == tree.min()


def test_priority_tree_sampling_is_proportional_and_skips_zeros():
    tree = PriorityTree(6, backend="torch")
    tree.update(torch.tensor([0, 2, 5]), torch.tensor([1.0, 3.0, 0.0]))
    draws = tree.sample(20000, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(draws, minlength=6)
    assert counts[[1, 3, 4, 5]].sum() == 0
    assert abs(counts[2] / counts[0] - 3.0) < 0.2


@pytest.mark.skipif(
    PriorityTree(2).backend != "cpp", reason="torchrl's C++ segment trees do not import with this torch build"
)
def test_priority_tree_cpp_matches_torch():
    leaves = torch.rand(50, dtype=torch.float64) * (torch.rand(50) > 0.2)
    a, b = PriorityTree(50, backend="cpp"), PriorityTree(50, backend="torch")
    a.update(torch.arange(50), leaves)
    b.update(torch.arange(50), leaves)
    mass = torch.rand(100, dtype=torch.float64) * b.total() * 0.999
    assert (a.find(mass) == b.find(mass)).float().mean() > 0.95
    assert math.isclose(a.total(), b.total(), rel_tol=1e-5)


# --------------------------------------------------------------------------- pure targets
def test_value_targets_by_hand():
    # K = 2, n = 2, gamma = 0.5; positions 0..4; terminal at position 3
    exists = torch.tensor([[True, True, True, True, False]])
    terminal = torch.tensor([[False, False, False, True, False]])
    plan = plan_value_targets(exists, terminal, 2, 2)
    rewards = torch.tensor([[1.0, 2.0, 4.0, 0.0, 0.0]])
    boot = torch.tensor([[10.0, 99.0, 99.0]])  # v(pos 2) = 10; others end at the terminal
    z = value_targets(rewards, plan, boot, 0.5, 2)
    # z0 = 1 + .5 * 2 + .25 * 10 = 4.5 ; z1 = 2 + .5 * 4 = 4 (terminal) ; z2 = 4
    assert z.tolist() == [[4.5, 4.0, 4.0]]
    assert plan.bootstrap.tolist() == [[True, False, False]]
    assert reward_targets(rewards, plan).tolist() == [[0.0, 1.0, 2.0]]
    with pytest.raises(ValueError, match="rewards must be"):
        value_targets(rewards[:, :3], plan, boot, 0.5, 2)


# --------------------------------------------------------------------------- frames
def test_frame_stack_round_trip_and_errors():
    fs = FrameStack(3, dim=-1, padding="constant", padding_value=9)
    assert fs.frame_shape((2, 6)) == torch.Size([2, 2])
    frames = torch.arange(4 * 2 * 2).view(4, 2, 2)
    hist = frames[torch.tensor([[0, 0, 1]])]
    padded = torch.tensor([[True, False, False]])
    obs = fs.rebuild(hist, padded)
    expected = torch.cat([torch.full((2, 2), 9), frames[0], frames[1]], -1)
    assert torch.equal(obs[0], expected)
    assert torch.equal(fs.newest(obs)[0], frames[1])
    start = torch.cat([torch.full((1, 2, 4), 9), frames[2:3]], -1)
    assert fs.is_padded_start(start).tolist() == [True]
    assert fs.is_padded_start(obs).tolist() == [False]
    with pytest.raises(ValueError, match="not a multiple of frame_stack=3"):
        fs.frame_shape((2, 7))
    with pytest.raises(ValueError, match="negative"):
        FrameStack(4, dim=0)
    with pytest.raises(ValueError, match="padding"):
        FrameStack(4, padding="zeros")


# --------------------------------------------------------------------------- targets in the buffer
def _buffer(**kw):
    kw.setdefault("seed", 0)
    kw.setdefault("alpha", 0.0)
    return GameBuffer(kw.pop("capacity", 200), **kw)


def test_terminal_targets_by_hand():
    """Episode o0..o4, rewards 1, 2, 3, 4, terminated; K = 2, n = 3, gamma = 0.5, v(o_t) = 10 + t."""
    ep = Episode(0, [1.0, 2.0, 3.0, 4.0], end="terminal")
    model = ValueStub(scale=1.0, shift=10.0)  # observation[0] = t for eid 0
    buf = _buffer(num_unroll_steps=2, td_steps=3, discount=0.5, target_model=model)
    buf.extend(ep.full())
    batch = buf.sample(64)
    expected = {
        # t: (values, rewards, mask, policy_mask)
        0: ([1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 13, 2 + 0.5 * 3 + 0.25 * 4, 3 + 0.5 * 4], [0, 1, 2], [1, 1, 1], [1, 1, 1]),
        1: ([2 + 0.5 * 3 + 0.25 * 4, 3 + 0.5 * 4, 4], [0, 2, 3], [1, 1, 1], [1, 1, 1]),
        2: ([3 + 0.5 * 4, 4, 0], [0, 3, 4], [1, 1, 1], [1, 1, 0]),
        3: ([4, 0, 0], [0, 4, 0], [1, 1, 1], [1, 0, 0]),
    }
    seen = set()
    for b in range(64):
        t = int(batch["observation"][b, 0, 1])
        seen.add(t)
        values, rewards, mask, pmask = expected[t]
        torch.testing.assert_close(batch["target_value"][b], torch.tensor(values, dtype=torch.float32))
        assert batch["target_reward"][b].tolist() == rewards
        assert batch["mask"][b].tolist() == [bool(x) for x in mask]
        assert batch["policy_mask"][b].tolist() == [bool(x) for x in pmask]
    assert seen == {0, 1, 2, 3}
    # one batched model call for all bootstrap positions
    assert len(model.batch_sizes) == 1


def test_truncation_bootstraps_by_hand():
    """Same episode truncated at o4: the last observation bootstraps; past it nothing is known."""
    ep = Episode(0, [1.0, 2.0, 3.0, 4.0], end="truncated")
    model = ValueStub(scale=1.0, shift=10.0)
    buf = _buffer(num_unroll_steps=2, td_steps=3, discount=0.5, target_model=model)
    buf.extend(ep.full())
    batch = buf.sample(64)
    expected = {
        0: [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 13, 2 + 0.5 * 3 + 0.25 * 4 + 0.125 * 14, 3 + 0.5 * 4 + 0.25 * 14],
        1: [2 + 0.5 * 3 + 0.25 * 4 + 0.125 * 14, 3 + 0.5 * 4 + 0.25 * 14, 4 + 0.5 * 14],
        2: [3 + 0.5 * 4 + 0.25 * 14, 4 + 0.5 * 14, 14],
        3: [4 + 0.5 * 14, 14, 0],
    }
    masks = {0: [1, 1, 1], 1: [1, 1, 1], 2: [1, 1, 1], 3: [1, 1, 0]}
    for b in range(64):
        t = int(batch["observation"][b, 0, 1])
        torch.testing.assert_close(batch["target_value"][b], torch.tensor(expected[t], dtype=torch.float32))
        assert batch["mask"][b].tolist() == [bool(x) for x in masks[t]]


def test_td_steps_do_not_cross_into_the_next_episode():
    """Two episodes of one env in one rollout: the n-step return stops at the terminal."""
    ep1 = Episode(1, [1.0, 1.0], end="terminal")
    ep2 = Episode(2, [5.0, 5.0, 5.0], end="open")
    stub = ValueStub()
    buf = _buffer(num_unroll_steps=3, td_steps=4, discount=0.9, target_model=stub)
    buf.extend(torch.cat([ep1.full(), ep2.full()]))
    batch = buf.sample(100)
    seen = check_against_reference(batch, [ep1, ep2], 3, 4, 0.9, stub.value)
    assert {(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)} == seen
    t0 = batch["observation"][:, 0, 0] == 1000
    # by hand: root (ep1, t=0): 1 + 0.9 * 1 = 1.9 then 1, 0 (terminal), 0 (absorbing)
    assert torch.allclose(batch["target_value"][t0], torch.tensor([1.9, 1.0, 0.0, 0.0]))


def test_two_player_signs_by_hand():
    # player 0 moves at t = 0 and 2 and wins (mover's reward +1 at the last move)
    ep = Episode(0, [0.0, 0.0, 1.0], end="terminal", to_play=True)
    buf = _buffer(num_unroll_steps=2, td_steps=5, discount=1.0, two_player=True, target_model=ValueStub())
    buf.extend(ep.full())
    batch = buf.sample(40)
    expected = {0: [1.0, -1.0, 1.0], 1: [-1.0, 1.0, 0.0], 2: [1.0, 0.0, 0.0]}
    for b in range(40):
        t = int(batch["observation"][b, 0, 1])
        assert batch["target_value"][b].tolist() == expected[t]
    # truncated, with a bootstrap: rewards 1, 2; v(o2) = 12; gamma = 0.5
    ep = Episode(0, [1.0, 2.0], end="truncated", to_play=True)
    stub = ValueStub(scale=1.0, shift=10.0)
    buf = _buffer(num_unroll_steps=2, td_steps=5, discount=0.5, two_player=True, target_model=stub)
    buf.extend(ep.full())
    batch = buf.sample(40)
    expected = {0: [1 - 0.5 * 2 + 0.25 * 12, 2 - 0.5 * 12, 12.0], 1: [2 - 0.5 * 12, 12.0, 0.0]}
    for b in range(40):
        t = int(batch["observation"][b, 0, 1])
        assert batch["target_value"][b].tolist() == expected[t]
    check_against_reference(batch, [ep], 2, 5, 0.5, stub.value, two_player=True)


def test_stored_root_values_without_a_model():
    ep = Episode(3, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], end="terminal")
    buf = _buffer(num_unroll_steps=1, td_steps=2, discount=0.5)
    buf.extend(ep.full())
    batch = buf.sample(64)
    check_against_reference(batch, [ep], 1, 2, 0.5, lambda e, t: float(e.root_value[t]))


def test_interleaved_worker_chunks_match_the_reference():
    """Chunks of several trajectories, rows shuffled across them, fed over several extends."""
    g = torch.Generator().manual_seed(3)
    episodes = [
        Episode(1, torch.randn(9, generator=g).tolist(), end="terminal"),
        Episode(2, torch.randn(7, generator=g).tolist(), end="truncated"),
        Episode(3, torch.randn(12, generator=g).tolist(), end="open"),
        Episode(4, torch.randn(5, generator=g).tolist(), end="terminal"),
    ]
    cuts = {1: [0, 3, 6, 9], 2: [0, 4, 5, 7], 3: [0, 2, 8, 12], 4: [0, 5, 5, 5]}
    stub = ValueStub()
    buf = _buffer(num_unroll_steps=3, td_steps=3, discount=0.8, target_model=stub)
    for part in range(3):
        chunks = [ep.chunk(cuts[ep.eid][part], cuts[ep.eid][part + 1]) for ep in episodes]
        chunks = [c for c in chunks if c.numel()]
        flat = torch.cat(chunks)
        # interleave: a random permutation that keeps each trajectory's order
        keys = torch.rand(flat.numel(), generator=g)
        traj = flat["collector", "traj_ids"]
        perm = torch.argsort(keys)
        for tid in traj.unique():
            rows = (traj == tid).nonzero().squeeze(-1)
            pos = torch.sort((perm.argsort())[rows]).values  # positions these rows land on
            perm[pos] = rows
        buf.extend(flat[perm])
    assert len(buf) == sum(ep.T for ep in episodes)
    assert buf.num_rows == len(buf) + 4  # one last observation per trajectory
    batch = buf.sample(400)
    seen = check_against_reference(batch, episodes, 3, 3, 0.8, stub.value)
    assert len(seen) == len(buf)


def test_one_hot_actions_and_future_observations():
    ep = Episode(5, [1.0, 0.0, 2.0], end="terminal")
    buf = _buffer(num_unroll_steps=3, td_steps=1, with_future_observations=True)
    buf.extend(ep.full(one_hot=True))
    batch = buf.sample(30)
    for b in range(30):
        t = int(batch["observation"][b, 0, 1])
        for k in range(4):
            expect = ep.obs[min(t + k, ep.T)]  # the terminal observation repeats after the end
            assert torch.equal(batch["observation"][b, k], expect)
            assert bool(batch["observation_mask"][b, k])
            if t + k < ep.T:
                assert int(batch["action"][b, k]) == int(ep.actions[t + k])
    off = _buffer(num_unroll_steps=3, td_steps=1)
    off.extend(ep.full())
    batch = off.sample(5)
    assert batch["observation"][:, 1:].abs().sum() == 0
    assert batch["observation_mask"][:, 1:].sum() == 0


# --------------------------------------------------------------------------- reanalyze
def test_reanalyze_uses_the_model_in_one_batched_call():
    from torchrl_muzero.mcts import MCTSConfig
    from torchrl_muzero.modules import MuZeroMLPModel

    ep = Episode(1, [1.0] * 10, end="terminal")
    torch.manual_seed(0)
    m1 = MuZeroMLPModel((2,), A, latent_dim=8, hidden_dim=8, zero_init_heads=False)
    m2 = MuZeroMLPModel((2,), A, latent_dim=8, hidden_dim=8, zero_init_heads=False)
    cfg = MCTSConfig(num_simulations=8, dirichlet_fraction=0.0)

    def run(model, target, ratio):
        buf = _buffer(num_unroll_steps=2, td_steps=3, reanalyze_ratio=ratio, mcts_config=cfg,
                      reanalyze_noise=False, seed=4)
        buf.extend(ep.full())
        return buf.sample(16, model=model, target_model=target)

    stored = run(m1, m1, 0.0)
    fresh1, fresh2 = run(m1, m1, 1.0), run(m2, m1, 1.0)
    pm = stored["policy_mask"]
    assert torch.equal(stored["index"], fresh1["index"])  # same draws
    # ratio 0: the stored policies; ratio 1: search policies (visit fractions of 8 simulations)
    assert not torch.allclose(stored["target_policy"][pm], fresh1["target_policy"][pm])
    assert torch.allclose((fresh1["target_policy"][pm] * 8).round(), fresh1["target_policy"][pm] * 8, atol=1e-5)
    # another model, other targets
    assert not torch.equal(fresh1["target_policy"][pm], fresh2["target_policy"][pm])
    # value reanalyze: the bootstrap follows the target model
    other = run(m1, m2, 0.0)
    assert not torch.allclose(stored["target_value"], other["target_value"])
    torch.testing.assert_close(stored["target_reward"], other["target_reward"])

    # batched: one initial_inference for the bootstraps, one for the search roots
    calls = []
    original = m1.initial_inference

    def counting(obs):
        calls.append(obs.shape[0])
        return original(obs)

    m1.initial_inference = counting
    run(m1, m1, 0.5)
    assert len(calls) == 2, calls
    del m1.initial_inference


# --------------------------------------------------------------------------- priorities
def test_importance_weights_and_beta_annealing():
    ep = Episode(1, [0.0] * 4, end="terminal")
    buf = GameBuffer(50, num_unroll_steps=1, td_steps=1, alpha=1.0, beta=0.5, beta_annealing_steps=4,
                     priority_eps=1e-9, seed=0)
    buf.extend(ep.full())
    batch = buf.sample(4)
    rows = batch["index"][:, 0]
    stamp = batch["stamp"][:, 0]
    # give slot of t: priority t + 1
    by_t = {int(batch["observation"][b, 0, 1]): (int(rows[b]), int(stamp[b])) for b in range(4)}
    big = buf.sample(200)
    by_t.update({int(big["observation"][b, 0, 1]): (int(big["index"][b, 0]), int(big["stamp"][b, 0])) for b in range(200)})
    idx = torch.tensor([by_t[t][0] for t in range(4)])
    st = torch.tensor([by_t[t][1] for t in range(4)])
    assert buf.update_priority(idx, torch.tensor([1.0, 2.0, 3.0, 4.0]), st).all()
    assert buf.current_beta == pytest.approx(0.5 + 0.5 * 2 / 4)
    batch = buf.sample(300)
    t = batch["observation"][:, 0, 1]
    expected = ((t + 1) / 1.0) ** -0.75
    torch.testing.assert_close(batch["weight"][:, 0], expected.float())
    assert torch.equal(batch["weight"][:, 0], batch["weight"][:, 1])
    counts = torch.bincount(t.long(), minlength=4).float()
    assert counts[3] > counts[0] * 2  # proportional: 4 : 1 in expectation
    for _ in range(3):
        buf.sample(1)
    assert buf.current_beta == 1.0
    # weights are normalised by the batch's own smallest priority: the largest is always 1,
    # whatever the buffer's minimum (a lone sample of priority 4 weighs 1, not 1/4)
    for size in (1, 2, 7):
        w = buf.sample(size)["weight"][:, 0]
        assert w.max() == 1.0


def test_new_data_enters_with_max_priority():
    buf = GameBuffer(100, num_unroll_steps=1, td_steps=1, alpha=1.0, priority_eps=1e-9, seed=0)
    buf.extend(Episode(1, [0.0] * 3).full())
    batch = buf.sample(8)
    buf.update_priority(batch["index"], torch.full((8,), 5.0), batch["stamp"])
    buf.update_priority(batch["index"][:1], torch.full((1,), 2.0), batch["stamp"][:1])  # max now 5 elsewhere
    buf.extend(Episode(2, [0.0] * 3).full())
    batch = buf.sample(300)
    new = batch["observation"][:, 0, 0] >= 2000
    assert torch.allclose(buf._tree[batch["index"][new, 0]], torch.tensor(5.0, dtype=torch.float64))


def test_stale_write_back_never_touches_foreign_rows():
    buf = GameBuffer(24, num_unroll_steps=1, td_steps=1, alpha=1.0, priority_eps=1e-9, seed=0)
    buf.extend(Episode(1, [0.0] * 10).full())
    buf.extend(Episode(2, [0.0] * 10).full())
    batch = buf.sample(32)
    # evict: 11 new rows overwrite episode 1's rows (and the rest of its segment)
    buf.extend(Episode(3, [0.0] * 10).full())
    before = buf._tree.leaves.clone()
    written = buf.update_priority(batch, torch.full((32,), 9.0))  # the sample's TensorDict form
    old = batch["observation"][:, 0, 0] < 2000
    assert old.any() and (~old).any()
    assert not written[old].any() and written[~old].all()
    after = buf._tree.leaves
    changed = (after != before).nonzero().squeeze(-1)
    ep2_rows = set(batch["index"][~old, 0].tolist())
    assert set(changed.tolist()) <= ep2_rows
    # no row of episode 3 (which took episode 1's slots) changed
    for slot in batch["index"][old, 0].tolist():
        assert after[slot] == before[slot]
    # the whole first segment is gone, only whole segments were evicted
    assert len(buf) == 20 and buf.num_rows == 22
    with pytest.raises(ValueError, match="finite"):
        buf.update_priority(batch["index"], torch.full((32,), float("nan")), batch["stamp"])
    with pytest.raises(ValueError, match="same length"):
        buf.update_priority(batch["index"], torch.ones(3), batch["stamp"])


def test_eviction_of_a_running_trajectory_keeps_the_rest_consistent():
    """Chunks of a long trajectory evicted from the front: the survivors still give exact targets."""
    ep = Episode(7, torch.arange(40, dtype=torch.float32).tolist(), end="open")
    stub = ValueStub()
    buf = GameBuffer(16, num_unroll_steps=2, td_steps=2, discount=0.9, alpha=0.0, seed=1, target_model=stub,
                     frame_stack=1)
    for t0 in range(0, 40, 5):
        buf.extend(ep.chunk(t0, t0 + 5))
        assert buf.num_rows <= 16
    batch = buf.sample(100)
    check_against_reference(batch, [ep], 2, 2, 0.9, stub.value)
    ts = set(batch["observation"][:, 0, 1].long().tolist())
    assert min(ts) >= 40 - 16 and max(ts) == 39


# --------------------------------------------------------------------------- frames through CatFrames
def _pixel_env(padding, seed):
    from torchrl.data import Bounded, Composite, OneHot, Unbounded
    from torchrl.envs import CatFrames, Compose, EnvBase, StepCounter, TransformedEnv

    class FakePixels(EnvBase):
        def __init__(self):
            super().__init__(batch_size=[])
            self.observation_spec = Composite(pixels=Bounded(0, 255, shape=(1, 6, 5), dtype=torch.uint8))
            self.action_spec = OneHot(A)
            self.reward_spec = Unbounded(shape=(1,))
            self.rng = torch.Generator().manual_seed(seed)

        def _frame(self):
            return torch.randint(0, 256, (1, 6, 5), dtype=torch.uint8, generator=self.rng)

        def _reset(self, td):
            return TensorDict({"pixels": self._frame()}, [])

        def _step(self, td):
            term = (torch.rand((), generator=self.rng) < 0.1).view(1)
            return TensorDict({"pixels": self._frame(), "reward": torch.randn(1, generator=self.rng),
                               "done": term, "terminated": term}, [])

        def _set_seed(self, s):
            return s

    return TransformedEnv(
        FakePixels(),
        Compose(StepCounter(13), CatFrames(N=4, dim=-3, in_keys=["pixels"], padding=padding, padding_value=7)),
    )


class _FakeSearchPolicy(nn.Module):
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


@pytest.mark.parametrize("padding,capacity", [("same", 1000), ("constant", 1000), ("same", 70)])
def test_deduplicated_frames_rebuild_catframes_stacks(padding, capacity):
    from torchrl.collectors import Collector
    from torchrl.envs import SerialEnv

    env = SerialEnv(2, lambda: _pixel_env(padding, 0))
    env.set_seed(0)
    policy = _FakeSearchPolicy()
    collector = Collector(env, policy, frames_per_batch=40, total_frames=160)
    buf = GameBuffer(capacity, num_unroll_steps=1, td_steps=1, observation_key="pixels", frame_stack=4,
                     frame_padding=padding, frame_padding_value=7, alpha=0.0, with_future_observations=True, seed=0)
    originals = []
    for batch in collector:
        originals.append(batch.reshape(-1).clone())
        buf.extend(batch)
    collector.shutdown()
    data = torch.cat(originals)
    by_id = {int(v): i for i, v in enumerate(data["root_value"])}
    rows = buf[torch.arange(min(capacity, buf.write_count))]
    if capacity < 160:
        assert buf.num_rows <= capacity < buf.write_count  # rows were evicted
        # every sampleable step rebuilds the exact CatFrames stack
        sampleable = buf._tree.leaves > 0
        for r in sampleable.nonzero().squeeze(-1).tolist():
            assert torch.equal(rows["observation"][r], data["pixels"][by_id[int(rows["root_value"][r])]])
        sample = buf.sample(100)
        for b in range(100):
            i = by_id[int(rows["root_value"][int(sample["index"][b, 0])])]
            assert torch.equal(sample["observation"][b, 0], data["pixels"][i])
            assert torch.equal(sample["observation"][b, 1], data["next", "pixels"][i])
        return
    assert len(buf) == 160
    # every stored step rebuilds the exact CatFrames stack, and so does its next observation
    steps = rows["is_step"]
    for r in steps.nonzero().squeeze(-1).tolist():
        i = by_id[int(rows["root_value"][r])]
        assert torch.equal(rows["observation"][r], data["pixels"][i])
    sample = buf.sample(200)
    for b in range(200):
        slot = int(sample["index"][b, 0])
        i = by_id[int(rows["root_value"][slot])]
        assert torch.equal(sample["observation"][b, 0], data["pixels"][i])
        assert torch.equal(sample["observation"][b, 1], data["next", "pixels"][i])
    # frames stored once: one row per transition, plus one per finished episode and running trajectory
    finished = int(data["next", "done"].sum())
    running = sum(int(not bool(b.reshape(2, -1)[e, -1]["next", "done"])) for b in originals[-1:] for e in range(2))
    assert buf.num_rows == len(buf) + finished + running


def _stacked_stream(T, seed=0, shape=(1, 3, 3)):
    """A CatFrames(N=4, dim=-3, padding="same") stack of T + 1 random frames (one episode)."""
    frames = torch.randint(0, 256, (T + 1, *shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return torch.cat([frames[(torch.arange(T + 1) - j).clamp_min(0)] for j in (3, 2, 1, 0)], 1)


def _pixel_chunk(stacks, t0, t1, traj, done_at_end=False):
    n = t1 - t0
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[-1] = done_at_end
    return TensorDict({
        "pixels": stacks[t0:t1], ("next", "pixels"): stacks[t0 + 1 : t1 + 1],
        "action": torch.zeros(n, dtype=torch.long), "search_policy": torch.full((n, 2), 0.5),
        "root_value": torch.arange(t0, t1, dtype=torch.float32), ("collector", "traj_ids"): torch.full((n,), traj),
        ("next", "reward"): torch.zeros(n, 1), ("next", "done"): done, ("next", "terminated"): done}, [n])


def test_rows_whose_frame_history_was_evicted_are_not_sampled():
    stacks = _stacked_stream(30)
    buf = GameBuffer(12, observation_key="pixels", frame_stack=4, num_unroll_steps=1, td_steps=1, alpha=0.0, seed=0)
    buf.extend(_pixel_chunk(stacks, 0, 5, traj=0))  # rows: t = 0..4 and the pending t = 5
    buf.extend(_pixel_chunk(stacks, 5, 10, traj=0))  # completes t = 5; rows t = 6..10
    assert len(buf) == 10 and buf.num_sampleable == 10
    buf.extend(_pixel_chunk(stacks, 10, 15, traj=0))  # 5 rows: overwrites t = 0..4; whole segment goes
    # t = 5 belonged to the first segment (its pending last row): evicted with it, so the
    # trajectory now starts at t = 6, whose stack needs t = 3..5: t = 6, 7, 8 cannot be roots
    rows = buf[torch.arange(12)]
    live = rows["alive"] & rows["is_step"]
    assert sorted(rows["root_value"][live].long().tolist()) == list(range(6, 15))
    sample = buf.sample(200)
    t = buf[sample["index"][:, 0]]["root_value"].long()
    assert set(t.tolist()) == set(range(9, 15))
    assert torch.equal(sample["observation"][:, 0], stacks[t])
    assert buf.num_sampleable == 6


def test_trajectory_continuing_after_its_stored_rows_were_evicted():
    a, b = _stacked_stream(12, seed=1), _stacked_stream(12, seed=2)
    buf = GameBuffer(20, observation_key="pixels", frame_stack=4, num_unroll_steps=1, td_steps=1, alpha=0.0, seed=0,
                     with_future_observations=True)
    buf.extend(_pixel_chunk(a, 0, 4, traj=0))  # 5 rows, A's newest observation t = 4 pending
    buf.extend(_pixel_chunk(b, 0, 9, traj=1))  # 10 rows
    buf.extend(_pixel_chunk(b, 9, 12, traj=1, done_at_end=True))  # 3 rows (first one completes B's t = 9)
    buf.extend(_pixel_chunk(b[:5], 0, 4, traj=2))  # 5 rows: A's segment (and its pending row) is evicted
    assert 0 not in buf._open
    buf.extend(_pixel_chunk(a, 4, 10, traj=0))  # A continues without its history: 7 rows
    rows = buf[torch.arange(20)]
    a_live = rows["alive"] & rows["is_step"] & (rows["traj_id"] == 0)
    assert sorted(rows["root_value"][a_live].long().tolist()) == list(range(4, 10))
    sample = buf.sample(300)
    got = buf[sample["index"][:, 0]]
    is_a = got["traj_id"] == 0
    t = got["root_value"].long()
    assert set(t[is_a].tolist()) == set(range(7, 10))  # t = 4, 5, 6 lack frames t = 1..3
    assert torch.equal(sample["observation"][is_a, 0], a[t[is_a]])
    assert torch.equal(sample["observation"][is_a, 1], a[t[is_a] + 1])


def test_bytes_per_atari_transition():
    """84x84 uint8 frames stacked by 4: at most 1.05 frames' bytes per stored transition."""
    T, n_env = 250, 4
    buf = GameBuffer(4 * (T + 1), observation_key="pixels", frame_stack=4, num_unroll_steps=5, td_steps=5, seed=0)
    frames = torch.randint(0, 256, (T + 1, 1, 84, 84), dtype=torch.uint8)
    stacks = torch.cat([frames[(torch.arange(T + 1) - j).clamp_min(0)] for j in (3, 2, 1, 0)], 1)
    for env in range(n_env):
        done = torch.zeros(T, 1, dtype=torch.bool)
        done[-1] = True
        buf.extend(TensorDict({
            "pixels": stacks[:-1], ("next", "pixels"): stacks[1:], "action": torch.zeros(T, dtype=torch.long),
            "search_policy": torch.full((T, 6), 1 / 6), "root_value": torch.arange(T, dtype=torch.float32),
            ("collector", "traj_ids"): torch.full((T,), env), ("next", "reward"): torch.zeros(T, 1),
            ("next", "done"): done, ("next", "terminated"): done}, [T]))
    assert len(buf) == 4 * T and buf.num_rows == buf.capacity  # full: one extra row per episode
    per_transition = buf.nbytes() / len(buf)
    assert per_transition <= 1.05 * 84 * 84, per_transition
    sample = buf.sample(16)
    t = buf[sample["index"][:, 0]]["root_value"].long()
    assert torch.equal(sample["observation"][:, 0], stacks[t])


# --------------------------------------------------------------------------- a real collector
def test_real_cartpole_collector_batches():
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(3, lambda: GymEnv("CartPole-v1"))
    env.set_seed(0)
    policy = _FakeSearchPolicy(num_actions=2)
    collector = Collector(env, policy, frames_per_batch=60, total_frames=240)
    buf = GameBuffer(1000, num_unroll_steps=3, td_steps=4, discount=0.9, alpha=0.0, seed=0,
                     with_future_observations=True)
    batches = []
    for batch in collector:
        assert batch.batch_size == (3, 20)
        batches.append(batch.reshape(-1).clone())
        buf.extend(batch)
    collector.shutdown()
    data = torch.cat(batches)
    assert len(buf) == 240
    by_id = {int(v): i for i, v in enumerate(data["root_value"])}
    out = buf.sample(128)
    rows = buf[out["index"][:, 0]]
    for b in range(128):
        i = by_id[int(rows["root_value"][b])]
        assert torch.equal(out["observation"][b, 0], data["observation"][i])
        if out["observation_mask"][b, 1]:
            assert torch.equal(out["observation"][b, 1], data["next", "observation"][i])
    assert (out["weight"] == 1).all()
    assert out["target_policy"][out["policy_mask"]].sum(-1).allclose(torch.ones(1))
    # value / reward targets against the reference, on trajectories rebuilt from the raw batches
    episodes = _episodes_from_rollouts(data)
    where = {}
    for ep in episodes:
        for t, i in enumerate(ep.rows):
            where[i] = (ep, t)
    stub = ValueStub(scale=1.0)
    batch = buf.sample(128, target_model=stub)
    for b in range(128):
        ep, t = where[by_id[int(buf[batch["index"][b, 0]]["root_value"])]]
        values, rewards, mask, pmask, _ = reference(ep, t, 3, 4, 0.9, lambda e, j: float(e.obs[j, 0]))
        torch.testing.assert_close(batch["target_value"][b], torch.tensor(values), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch["target_reward"][b], torch.tensor(rewards))
        assert batch["mask"][b].tolist() == mask and batch["policy_mask"][b].tolist() == pmask


class _Trajectory:
    """A trajectory rebuilt from raw collector rows, shaped like :class:`Episode` for ``reference``."""

    def __init__(self, data, rows):
        self.rows = rows.tolist()
        self.T = len(self.rows)
        self.rewards = data["next", "reward"][rows, 0]
        self.obs = torch.cat([data["observation"][rows], data["next", "observation"][rows[-1:]]])
        last = rows[-1]
        if bool(data["next", "terminated"][last]):
            self.end = "terminal"
        elif bool(data["next", "done"][last]):
            self.end = "truncated"
        else:
            self.end = "open"
        self.actions = data["action"][rows].argmax(-1)


def _episodes_from_rollouts(data):
    traj = data["collector", "traj_ids"]
    return [_Trajectory(data, (traj == tid).nonzero().squeeze(-1)) for tid in traj.unique().tolist()]


def test_samples_feed_muzero_loss():
    from torchrl_muzero.modules import MuZeroMLPModel

    try:
        from torchrl_muzero.objectives import MuZeroLoss
    except ImportError:  # pragma: no cover
        pytest.skip("MuZeroLoss not available")
    torch.manual_seed(0)
    model = MuZeroMLPModel((2,), A, latent_dim=8, hidden_dim=8)
    buf = _buffer(num_unroll_steps=3, td_steps=2, with_future_observations=True, target_model=model, alpha=0.6)
    buf.extend(torch.cat([Episode(1, [1.0] * 6).full(), Episode(2, [1.0] * 4, end="truncated").full()]))
    batch = buf.sample(16)
    out = MuZeroLoss(model, consistency_loss_weight=2.0)(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert buf.update_priority(batch).all()  # the loss left "priority" in the batch
    assert torch.allclose(buf._tree[batch["index"][:, 0]].float(), (out["priority"] + 1e-6) ** 0.6)


# --------------------------------------------------------------------------- state
def test_save_load_resumes_exactly(tmp_path):
    ep1, ep2 = Episode(1, [1.0] * 8, end="open"), Episode(2, [2.0] * 5, end="terminal")
    buf = _buffer(num_unroll_steps=2, td_steps=2, alpha=0.6, seed=3)
    buf.extend(torch.cat([ep1.chunk(0, 4), ep2.full()]))
    batch = buf.sample(8)
    buf.update_priority(batch["index"], torch.rand(8), batch["stamp"])
    path = tmp_path / "buffer.pt"
    buf.save(path)
    other = _buffer(num_unroll_steps=2, td_steps=2, alpha=0.6, seed=99)
    other.load(path)
    a, b = buf.sample(16), other.sample(16)
    assert (a == b).all()
    # a resumed buffer continues the running trajectory
    buf.extend(ep1.chunk(4, 8))
    other.extend(ep1.chunk(4, 8))
    assert (buf.sample(16) == other.sample(16)).all()
    assert len(other) == 13


def test_load_rejects_corrupt_and_mismatched_files(tmp_path):
    buf = _buffer(capacity=50)
    buf.extend(Episode(1, [1.0] * 3).full())
    good = tmp_path / "good.pt"
    buf.save(good)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt.pt"):
        _buffer(capacity=50).load(corrupt)
    with pytest.raises(ValueError, match=r"good.pt.*capacity: saved 50 vs buffer 60"):
        _buffer(capacity=60).load(good)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt.*not a GameBuffer"):
        _buffer(capacity=50).load(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        _buffer(capacity=50).load(tmp_path / "missing.pt")


# --------------------------------------------------------------------------- bad input
def test_clear_errors_on_bad_input():
    ep = Episode(1, [1.0] * 3)
    with pytest.raises(ValueError, match="capacity"):
        GameBuffer(0)
    with pytest.raises(ValueError, match="td_steps"):
        GameBuffer(10, td_steps=0)
    with pytest.raises(ValueError, match="reanalyze_ratio"):
        GameBuffer(10, reanalyze_ratio=1.5)
    buf = _buffer()
    with pytest.raises(RuntimeError, match="no transition"):
        buf.sample(4)
    with pytest.raises(KeyError, match="search_policy"):
        buf.extend(ep.full().exclude("search_policy"))
    with pytest.raises(KeyError, match="traj_ids"):
        buf.extend(ep.full().exclude(("collector", "traj_ids")))
    bad = ep.full()
    bad["action"] = torch.full((3,), A)
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 3\)"):
        buf.extend(bad)
    reused = torch.cat([ep.full(), Episode(2, [1.0] * 2, traj=1).full()])
    with pytest.raises(ValueError, match="trajectory id 1 has steps after its episode ended"):
        buf.extend(reused)
    buf.extend(Episode(3, [1.0] * 4, end="open").chunk(0, 2))
    with pytest.raises(ValueError, match="trajectory id 3 continues, but its first observation differs"):
        buf.extend(Episode(3, [1.0] * 4, end="open").chunk(1, 3))
    with pytest.raises(ValueError, match="more than the buffer's capacity"):
        _buffer(capacity=5).extend(Episode(4, [1.0] * 6).full())
    with pytest.raises(ValueError, match="needs a model"):
        b2 = _buffer(reanalyze_ratio=0.5)
        b2.extend(ep.full())
        b2.sample(4)
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0)


def test_end_running_trajectories_lets_ids_start_over():
    # a running trajectory (no done yet) is stored; new collectors reuse its id from scratch
    buf = GameBuffer(100, num_unroll_steps=1, td_steps=2, discount=1.0, seed=0)
    buf.extend(Episode(7, [1.0] * 6, end="open").chunk(0, 3))
    restarted = Episode(8, [1.0] * 6, end="terminal", traj=7).chunk(0, 6)  # other observations, same id
    with pytest.raises(ValueError, match="trajectory id 7 continues"):
        buf.extend(restarted.clone())
    assert buf.end_running_trajectories() == 1
    assert buf.end_running_trajectories() == 0
    assert buf.extend(restarted) == 6
    batch = buf.sample(64)
    assert torch.isfinite(batch["target_value"]).all()
    # roots of the first, cut trajectory (observations 7000 + t) end at the truncation row
    cut = batch["observation"][:, 0, 0] < 8000
    assert cut.any() and (~cut).any()
