"""Tests of GameBuffer's frames: FrameStack, deduplicated CatFrames stacks, eviction of frame
history, bytes per Atari transition, and batches from a real torchrl collector."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from replay_cases import A, Episode, FakeSearchPolicy, ValueStub, make_buffer, reference
from torchrl_muzero.data import FrameStack, GameBuffer

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


@pytest.mark.parametrize("padding,capacity", [("same", 1000), ("constant", 1000), ("same", 70)])
def test_deduplicated_frames_rebuild_catframes_stacks(padding, capacity):
    from torchrl.collectors import Collector
    from torchrl.envs import SerialEnv

    env = SerialEnv(2, lambda: _pixel_env(padding, 0))
    env.set_seed(0)
    policy = FakeSearchPolicy()
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
    policy = FakeSearchPolicy(num_actions=2)
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
    buf = make_buffer(num_unroll_steps=3, td_steps=2, with_future_observations=True, target_model=model, alpha=0.6)
    buf.extend(torch.cat([Episode(1, [1.0] * 6).full(), Episode(2, [1.0] * 4, end="truncated").full()]))
    batch = buf.sample(16)
    out = MuZeroLoss(model, consistency_loss_weight=2.0)(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert buf.update_priority(batch).all()  # the loss left "priority" in the batch
    assert torch.allclose(buf._tree[batch["index"][:, 0]].float(), (out["priority"] + 1e-6) ** 0.6)
