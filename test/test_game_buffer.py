"""Tests of the replay storage: GameBuffer's targets, reanalyze, priorities, state, bad input.

Frames, CatFrames and a real collector: test_game_buffer_frames.py; shared cases: replay_cases.py."""
from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from replay_cases import A, Episode, ValueStub, check_against_reference, make_buffer
from torchrl_muzero.data import GameBuffer, PriorityTree
from torchrl_muzero.data.targets import plan_value_targets, reward_targets, value_targets

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


# --------------------------------------------------------------------------- targets in the buffer

def test_terminal_targets_by_hand():
    """Episode o0..o4, rewards 1, 2, 3, 4, terminated; K = 2, n = 3, gamma = 0.5, v(o_t) = 10 + t."""
    ep = Episode(0, [1.0, 2.0, 3.0, 4.0], end="terminal")
    model = ValueStub(scale=1.0, shift=10.0)  # observation[0] = t for eid 0
    buf = make_buffer(num_unroll_steps=2, td_steps=3, discount=0.5, target_model=model)
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
    buf = make_buffer(num_unroll_steps=2, td_steps=3, discount=0.5, target_model=model)
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
    buf = make_buffer(num_unroll_steps=3, td_steps=4, discount=0.9, target_model=stub)
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
    buf = make_buffer(num_unroll_steps=2, td_steps=5, discount=1.0, two_player=True, target_model=ValueStub())
    buf.extend(ep.full())
    batch = buf.sample(40)
    expected = {0: [1.0, -1.0, 1.0], 1: [-1.0, 1.0, 0.0], 2: [1.0, 0.0, 0.0]}
    for b in range(40):
        t = int(batch["observation"][b, 0, 1])
        assert batch["target_value"][b].tolist() == expected[t]
    # truncated, with a bootstrap: rewards 1, 2; v(o2) = 12; gamma = 0.5
    ep = Episode(0, [1.0, 2.0], end="truncated", to_play=True)
    stub = ValueStub(scale=1.0, shift=10.0)
    buf = make_buffer(num_unroll_steps=2, td_steps=5, discount=0.5, two_player=True, target_model=stub)
    buf.extend(ep.full())
    batch = buf.sample(40)
    expected = {0: [1 - 0.5 * 2 + 0.25 * 12, 2 - 0.5 * 12, 12.0], 1: [2 - 0.5 * 12, 12.0, 0.0]}
    for b in range(40):
        t = int(batch["observation"][b, 0, 1])
        assert batch["target_value"][b].tolist() == expected[t]
    check_against_reference(batch, [ep], 2, 5, 0.5, stub.value, two_player=True)


def test_stored_root_values_without_a_model():
    ep = Episode(3, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], end="terminal")
    buf = make_buffer(num_unroll_steps=1, td_steps=2, discount=0.5)
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
    buf = make_buffer(num_unroll_steps=3, td_steps=3, discount=0.8, target_model=stub)
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
    buf = make_buffer(num_unroll_steps=3, td_steps=1, with_future_observations=True)
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
    off = make_buffer(num_unroll_steps=3, td_steps=1)
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
        buf = make_buffer(num_unroll_steps=2, td_steps=3, reanalyze_ratio=ratio, mcts_config=cfg,
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


# --------------------------------------------------------------------------- state
def test_save_load_resumes_exactly(tmp_path):
    ep1, ep2 = Episode(1, [1.0] * 8, end="open"), Episode(2, [2.0] * 5, end="terminal")
    buf = make_buffer(num_unroll_steps=2, td_steps=2, alpha=0.6, seed=3)
    buf.extend(torch.cat([ep1.chunk(0, 4), ep2.full()]))
    batch = buf.sample(8)
    buf.update_priority(batch["index"], torch.rand(8), batch["stamp"])
    path = tmp_path / "buffer.pt"
    buf.save(path)
    other = make_buffer(num_unroll_steps=2, td_steps=2, alpha=0.6, seed=99)
    other.load(path)
    a, b = buf.sample(16), other.sample(16)
    assert (a == b).all()
    # a resumed buffer continues the running trajectory
    buf.extend(ep1.chunk(4, 8))
    other.extend(ep1.chunk(4, 8))
    assert (buf.sample(16) == other.sample(16)).all()
    assert len(other) == 13


def test_load_rejects_corrupt_and_mismatched_files(tmp_path):
    buf = make_buffer(capacity=50)
    buf.extend(Episode(1, [1.0] * 3).full())
    good = tmp_path / "good.pt"
    buf.save(good)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt.pt"):
        make_buffer(capacity=50).load(corrupt)
    with pytest.raises(ValueError, match=r"good.pt.*capacity: saved 50 vs buffer 60"):
        make_buffer(capacity=60).load(good)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt.*not a GameBuffer"):
        make_buffer(capacity=50).load(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        make_buffer(capacity=50).load(tmp_path / "missing.pt")


# --------------------------------------------------------------------------- bad input
def test_clear_errors_on_bad_input():
    ep = Episode(1, [1.0] * 3)
    with pytest.raises(ValueError, match="capacity"):
        GameBuffer(0)
    with pytest.raises(ValueError, match="td_steps"):
        GameBuffer(10, td_steps=0)
    with pytest.raises(ValueError, match="reanalyze_ratio"):
        GameBuffer(10, reanalyze_ratio=1.5)
    buf = make_buffer()
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
        make_buffer(capacity=5).extend(Episode(4, [1.0] * 6).full())
    with pytest.raises(ValueError, match="needs a model"):
        b2 = make_buffer(reanalyze_ratio=0.5)
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
