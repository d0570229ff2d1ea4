"""Tests of the GameBuffer seams: target builders, value prefixes, off-policy correction, reanalyze_search."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from torchrl_muzero.data import (
    MUZERO_SAMPLE_KEYS,
    GameBuffer,
    TargetBuilder,
    TargetContext,
    ValuePrefixTargets,
    muzero_reanalyze,
)

A = 3


def rollout(eid, rewards, *, end="terminal", version=0, root_value=None, action_mask=False):
    """One episode as a flat rollout; observations ``[eid * 1000 + t, t]``, actions ``t % A``."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    T = rewards.numel()
    t = torch.arange(T + 1, dtype=torch.float32)
    obs = torch.stack([eid * 1000 + t, t], -1)
    done = torch.zeros(T, 1, dtype=torch.bool)
    if end != "open":
        done[-1] = True
    terminated = done if end == "terminal" else torch.zeros_like(done)
    td = TensorDict(
        {
            "observation": obs[:-1],
            "action": torch.arange(T) % A,
            "search_policy": torch.full((T, A), 1.0 / A),
            "root_value": torch.zeros(T) if root_value is None else torch.as_tensor(root_value, dtype=torch.float32),
            "policy_version": torch.full((T,), version),
            ("collector", "traj_ids"): torch.full((T,), eid),
            ("next", "observation"): obs[1:],
            ("next", "reward"): rewards.unsqueeze(-1),
            ("next", "done"): done,
            ("next", "terminated"): terminated,
            ("next", "truncated"): done & ~terminated,
        },
        [T],
    )
    if action_mask:
        mask = torch.ones(T, A, dtype=torch.bool)
        mask[:, -1] = False
        td["action_mask"] = mask
        td["next", "action_mask"] = mask
    return td


def roots_of(batch):
    """(episode id, time step) of each sampled root."""
    obs = batch["observation"][:, 0]
    return (obs[:, 0] // 1000).long(), obs[:, 1].long()


def buffer(**kw):
    kw.setdefault("num_unroll_steps", 7)
    kw.setdefault("td_steps", 2)
    kw.setdefault("discount", 1.0)
    kw.setdefault("alpha", 0.0)
    kw.setdefault("seed", 0)
    kw.setdefault("tree_backend", "torch")
    return GameBuffer(200, **kw)


# --------------------------------------------------------------------------- value prefix
def test_value_prefix_of_all_ones_resets_at_1_h_plus_1_2h_plus_1():
    K, H = 8, 3
    buf = buffer(num_unroll_steps=K, target_builders=[ValuePrefixTargets(H)])
    buf.extend(rollout(0, [1.0] * 30))
    batch = buf.sample(64)
    _, t = roots_of(batch)
    inside = t + K <= 30
    assert bool(inside.any())
    expect = torch.tensor([0.0, 1, 2, 3, 1, 2, 3, 1, 2])  # [0, 1..H, 1..H, ...]
    prefix = batch["target_value_prefix"]
    assert prefix.shape == (64, K + 1)
    assert torch.equal(prefix[inside], expect.expand(int(inside.sum()), -1))
    # the sums restart exactly at positions 1, H + 1, 2H + 1
    resets = (prefix[inside][0, 1:] == 1.0).nonzero().squeeze(-1) + 1
    assert resets.tolist() == [1, H + 1, 2 * H + 1]


def test_value_prefix_matrix_and_direct_build():
    builder = ValuePrefixTargets(lstm_horizon_len=2)
    m = builder.prefix_matrix(6).long()
    assert m.tolist() == [
        [0, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    batch = TensorDict({"target_reward": torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])}, [1, 6])
    builder.build(batch, None)
    assert batch["target_value_prefix"].tolist() == [[0.0, 1.0, 3.0, 3.0, 7.0, 5.0]]
    with pytest.raises(ValueError, match="lstm_horizon_len"):
        ValuePrefixTargets(0)


def test_value_prefix_after_a_terminal_and_past_a_truncation():
    K, H = 6, 3
    buf = buffer(num_unroll_steps=K, target_builders=[ValuePrefixTargets(H)])
    buf.extend(rollout(1, [1.0, 2.0, 4.0, 8.0], end="terminal"))
    buf.extend(rollout(2, [1.0, 2.0, 4.0, 8.0], end="truncated"))
    batch = buf.sample(64)
    eid, t = roots_of(batch)
    prefix, mask = batch["target_value_prefix"], batch["mask"]
    for b in range(64):
        # the root at t = 2 sees rewards 4, 8 then the end of its episode
        if int(t[b]) != 2:
            continue
        assert batch["target_reward"][b].tolist() == [0.0, 4.0, 8.0, 0.0, 0.0, 0.0, 0.0]
        # flat after the terminal / truncation inside the first LSTM segment, 0 after the next reset
        assert prefix[b].tolist() == [0.0, 4.0, 12.0, 12.0, 0.0, 0.0, 0.0]
        if int(eid[b]) == 1:  # terminated: the absorbing positions are targets
            assert mask[b].all()
        else:  # truncated: nothing is known past the last observation
            assert mask[b].tolist() == [True, True, True, False, False, False, False]
    assert set(t.tolist()) >= {2}


# --------------------------------------------------------------------------- builder seam
class _Doubled(TargetBuilder):
    """Twice the value target (a builder reading the batch and the context)."""

    out_keys = ("doubled_value", "horizon")

    def __init__(self):
        self.contexts = []

    def build(self, batch, context):
        self.contexts.append(context)
        batch["doubled_value"] = 2 * batch["target_value"]
        batch["horizon"] = (context.plan.end - torch.arange(batch.shape[1])).clamp_min(0)


def test_builder_keys_are_listed_and_sampled():
    doubled = _Doubled()
    buf = buffer(num_unroll_steps=2, td_steps=3, target_builders=[ValuePrefixTargets(2), doubled])
    assert buf.sample_keys == MUZERO_SAMPLE_KEYS + ("target_value_prefix", "doubled_value", "horizon")
    assert buffer().sample_keys == MUZERO_SAMPLE_KEYS
    buf.extend(rollout(0, [1.0] * 10))
    batch = buf.sample(8)
    assert set(batch.keys()) == set(buf.sample_keys)
    torch.testing.assert_close(batch["doubled_value"], 2 * batch["target_value"])
    ctx = doubled.contexts[0]
    assert isinstance(ctx, TargetContext)
    assert (ctx.num_unroll_steps, ctx.td_steps, ctx.discount, ctx.two_player) == (2, 3, 1.0, False)
    assert ctx.rewards.shape == (8, 2 + 3 + 1)


def test_builders_are_checked():
    with pytest.raises(ValueError, match="target_value"):

        class Clash(TargetBuilder):
            out_keys = ("target_value",)

        buffer(target_builders=[Clash()])
    with pytest.raises(ValueError, match="target_value_prefix"):
        buffer(target_builders=[ValuePrefixTargets(2), ValuePrefixTargets(3)])
    with pytest.raises(TypeError):
        buffer(target_builders=[lambda batch, ctx: None])

    class Lazy(TargetBuilder):
        out_keys = ("never_written",)

        def build(self, batch, context):
            pass

    buf = buffer(target_builders=[Lazy()])
    buf.extend(rollout(0, [1.0] * 4))
    with pytest.raises(RuntimeError, match="never_written"):
        buf.sample(2)


# --------------------------------------------------------------------------- off-policy correction
REWARDS = [1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1e6, 1e7]


def _corrected(**kw):
    """A fresh episode (version 100) and an old one (version 70), rewards 10^t, root values t + 0.5."""
    buf = buffer(num_unroll_steps=0, td_steps=4, **kw)
    values = [t + 0.5 for t in range(len(REWARDS))]
    buf.extend(rollout(1, REWARDS, end="open", version=100, root_value=values))
    buf.extend(rollout(2, REWARDS, end="open", version=70, root_value=values))
    return buf


def test_off_policy_correction_uses_fewer_rewards_for_older_roots():
    # n = 4, one step shorter every 10 versions: age 0 -> 4 rewards, age 30 -> 1 reward
    buf = _corrected(off_policy_correction=True, correction_age_scale=10.0)
    batch = buf.sample(200, policy_version=100)
    eid, t = roots_of(batch)
    z = batch["target_value"][:, 0]
    for b in range(200):
        tb = int(t[b])
        if tb + 4 >= len(REWARDS):
            continue  # the stored data ends first: no correction shows
        if int(eid[b]) == 1:  # fresh: r_t + .. + r_{t+3} + v(t+4), all stored search values
            assert float(z[b]) == sum(REWARDS[tb : tb + 4]) + (tb + 4 + 0.5)
        else:  # old: r_t + v(t+1)
            assert float(z[b]) == REWARDS[tb] + (tb + 1 + 0.5)
    assert {1, 2} <= set(eid[t + 4 < len(REWARDS)].tolist())
    # one exact number each: the roots at t = 1
    fresh = (eid == 1) & (t == 1)
    old = (eid == 2) & (t == 1)
    assert bool(fresh.any()) and bool(old.any())
    assert float(z[fresh][0]) == 10 + 100 + 1000 + 10000 + 5.5
    assert float(z[old][0]) == 10 + 2.5


def test_off_policy_correction_off_and_intermediate_ages():
    plain = _corrected().sample(100)
    eid, t = roots_of(plain)
    sel = (t == 1)
    assert torch.all(plain["target_value"][sel, 0] == 10 + 100 + 1000 + 10000 + 5.5)  # both ages: 4 rewards
    # current version 85: ages 0 (clipped from -15) and 15 -> horizons 4 and 3
    batch = _corrected(off_policy_correction=True, correction_age_scale=10.0).sample(100, policy_version=85)
    eid, t = roots_of(batch)
    z = batch["target_value"][:, 0]
    assert torch.all(z[(eid == 1) & (t == 1)] == 10 + 100 + 1000 + 10000 + 5.5)
    assert torch.all(z[(eid == 2) & (t == 1)] == 10 + 100 + 1000 + 4.5)
    with pytest.raises(ValueError, match="policy_version"):
        _corrected(off_policy_correction=True, correction_age_scale=10.0).sample(4)
    with pytest.raises(ValueError, match="correction_age_scale"):
        buffer(off_policy_correction=True)


class _ValueStub(nn.Module):
    """initial_inference's value is ``observation[:, 1] * 0.25`` (time step / 4), decoded exactly."""

    class _First:
        @staticmethod
        def decode(logits):
            return logits[..., 0]

    value_support = _First()

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def initial_inference(self, obs):
        value = obs[:, 1] * 0.25
        return None, None, value.unsqueeze(-1)


def test_off_policy_correction_bootstraps_from_the_target_model_or_the_stored_values():
    stub = _ValueStub()
    buf = _corrected(off_policy_correction=True, correction_age_scale=10.0, target_model=stub)
    batch = buf.sample(100, policy_version=100)
    eid, t = roots_of(batch)
    z = batch["target_value"][:, 0]
    assert torch.all(z[(eid == 2) & (t == 1)] == 10 + 2 * 0.25)  # v(t+1) from the model
    assert torch.all(z[(eid == 1) & (t == 1)] == 10 + 100 + 1000 + 10000 + 5 * 0.25)
    stored = _corrected(off_policy_correction=True, correction_age_scale=10.0, target_model=stub,
                        value_bootstrap="stored")
    batch = stored.sample(100, policy_version=100)
    eid, t = roots_of(batch)
    assert torch.all(batch["target_value"][(eid == 2) & (t == 1), 0] == 10 + 2.5)
    with pytest.raises(ValueError, match="value_bootstrap='model'"):
        _corrected(value_bootstrap="model").sample(4)


# --------------------------------------------------------------------------- reanalyze_search
def test_custom_reanalyze_search_gets_the_inputs_and_fills_the_policy_targets(tmp_path):
    calls = []

    def last_legal_action(model, observation, action_mask, to_play, add_noise, generator):
        calls.append(dict(obs=observation.shape, mask=None if action_mask is None else action_mask.shape,
                          to_play=to_play, add_noise=add_noise, generator=generator, model=model))
        policy = torch.zeros(observation.shape[0], A)
        policy[:, 1] = 1.0  # the last legal action (action 2 is masked)
        return policy

    model = _ValueStub()
    K = 2
    buf = buffer(num_unroll_steps=K, reanalyze_ratio=0.5, reanalyze_search=last_legal_action, model=model,
                 reanalyze_noise=False)
    buf.extend(rollout(0, [1.0] * 12, action_mask=True))
    batch = buf.sample(8)
    assert len(calls) == 1
    call = calls[0]
    n = int(batch["policy_mask"][:4].sum())  # round(0.5 * 8) = 4 reanalyzed samples
    assert call["obs"] == (n, 2) and call["mask"] == (n, A)
    assert call["to_play"] is None and call["add_noise"] is False and call["model"] is model
    assert isinstance(call["generator"], torch.Generator)
    reanalyzed = batch["policy_mask"].clone()
    reanalyzed[4:] = False
    stored = batch["policy_mask"] & ~reanalyzed
    assert torch.equal(batch["target_policy"][reanalyzed], torch.tensor([0.0, 1.0, 0.0]).expand(n, A))
    assert torch.allclose(batch["target_policy"][stored], torch.full((int(stored.sum()), A), 1.0 / A))
    # the callable is configuration, not state: the checkpoint holds tensors and plain containers only
    buf.save(tmp_path / "buffer.pt")
    other = buffer(num_unroll_steps=K)
    other.load(tmp_path / "buffer.pt")
    assert len(other) == len(buf)


def test_reanalyze_search_output_shape_is_checked():
    buf = buffer(num_unroll_steps=1, reanalyze_ratio=1.0, model=_ValueStub(),
                 reanalyze_search=lambda m, o, mask, tp, noise, g: torch.zeros(o.shape[0], A + 1))
    buf.extend(rollout(0, [1.0] * 5))
    with pytest.raises(ValueError, match="num_actions"):
        buf.sample(2)
    with pytest.raises(TypeError, match="callable"):
        buffer(reanalyze_search="search")


def test_muzero_reanalyze_wraps_a_muzero_style_search():
    seen = {}

    class Result:
        search_policy = torch.tensor([[0.25, 0.75, 0.0]])

    def fake_search(model, observation, config, action_mask=None, to_play=None, add_noise=True, generator=None):
        seen.update(config=config, add_noise=add_noise, to_play=to_play)
        return Result()

    reanalyze = muzero_reanalyze("settings", search=fake_search)
    out = reanalyze(None, torch.zeros(1, 2), None, torch.zeros(1, dtype=torch.long), False, None)
    assert out.tolist() == [[0.25, 0.75, 0.0]]
    assert seen["config"] == "settings" and seen["add_noise"] is False and seen["to_play"].tolist() == [0]
