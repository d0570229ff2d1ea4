"""Action spaces, the rest (issue 38): a model declares the space it was built for, MCTSPolicy checks it
against the env's in one line, and a GameBuffer told a box action space stores, saves, loads and samples
the env's float actions; discrete buffers (the default) behave, fail and save as before."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, OneHot

from torchrl_muzero.algorithms import get_algorithm
from torchrl_muzero.data import GameBuffer
from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace, action_space_of
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.trainers.builders import build_model
from torchrl_muzero.trainers.config import ConfigError, load_config

FIXTURE_BUFFER = Path(__file__).parent / "fixtures" / "checkpoint_v1" / "ckpt" / "buffer.pt"
D, S = 2, 3  # box dims, search slots


def _cfg():
    return load_config({"model": {"latent_dim": 8, "hidden_dim": 8}})


# -- a model declares its action space ----------------------------------------------------------------
def test_a_model_built_from_a_space_carries_it():
    space = action_space_of(OneHot(3))
    model = build_model(_cfg(), (4,), space)
    assert model.action_space is space and model.num_actions == 3
    again = get_algorithm("muzero").build_model(_cfg(), (4,), space)
    assert again.action_space is space


def test_an_int_still_builds_the_same_model():
    torch.manual_seed(0)
    by_int = build_model(_cfg(), (4,), 2)
    torch.manual_seed(0)
    by_space = build_model(_cfg(), (4,), DiscreteActionSpace(2, one_hot=True))
    assert by_int.num_actions == 2 and by_int.action_space.num_actions == 2 and by_int.action_space.is_discrete
    for a, b in zip(by_int.state_dict().values(), by_space.state_dict().values()):
        assert torch.equal(a, b)  # the space changes nothing the model holds
    with pytest.raises(TypeError, match="ActionSpace or a number of discrete actions"):
        build_model(_cfg(), (4,), 2.0)


def test_a_replaced_algorithm_wraps_its_builder_once():
    muzero = get_algorithm("muzero")
    copy = dataclasses.replace(muzero, name="muzero_copy")
    assert copy.build_model._builder is muzero.build_model._builder
    assert copy.build_model(_cfg(), (4,), 2).action_space.num_actions == 2


def test_a_discrete_algorithm_refuses_a_box_space_in_one_line():
    with pytest.raises(ConfigError) as err:
        build_model(_cfg(), (4,), BoxActionSpace(-1.0, 1.0, (2,)))
    assert "supports discrete actions only" in str(err.value) and "\n" not in str(err.value)


# -- MCTSPolicy checks the model's space against the env's ----------------------------------------------
def test_policy_refuses_a_model_built_for_another_space_in_one_line():
    model = build_model(_cfg(), (4,), action_space_of(OneHot(3)))
    MCTSPolicy(model, MCTSConfig(num_simulations=2), Categorical(3))  # the encoding does not matter
    with pytest.raises(ValueError, match=r"^the action spec has 2 actions but the model has 3\.$"):
        MCTSPolicy(model, MCTSConfig(num_simulations=2), OneHot(2))
    boxed = MuZeroMLPModel((4,), S, latent_dim=8, hidden_dim=8)
    boxed.action_space = BoxActionSpace(-1.0, 1.0, (D,))
    with pytest.raises(ValueError) as err:
        MCTSPolicy(boxed, MCTSConfig(num_simulations=2), OneHot(3))
    assert str(err.value) == ("the env's actions are discrete (3 actions, one-hot torch.bool), but MuZeroMLPModel "
                              "was built for continuous actions (2 dims in [-1, 1]).")
    with pytest.raises(ValueError) as err:
        MCTSPolicy(boxed, MCTSConfig(num_simulations=2), Bounded(-2.0, 2.0, shape=(D,)))
    assert str(err.value) == ("the env's actions are continuous (2 dims in [-2, 2]), but MuZeroMLPModel "
                              "was built for continuous actions (2 dims in [-1, 1]).")


# -- box actions in the buffer --------------------------------------------------------------------------
def _box_rollout(envs: int = 2, T: int = 6, seed: int = 0) -> TensorDict:
    """``[envs, T]`` steps; observation ``[traj, t]`` names the step, so values can be compared by index."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T + 1, dtype=torch.float32)
    obs = torch.stack([torch.stack([torch.full_like(t, e), t], -1) for e in range(envs)])  # [envs, T+1, 2]
    done = torch.zeros(envs, T, 1, dtype=torch.bool)
    done[:, -1] = True
    return TensorDict({
        "observation": obs[:, :-1],
        "action": torch.rand(envs, T, D, generator=g) * 2 - 1,
        "search_policy": torch.softmax(torch.randn(envs, T, S, generator=g), -1),
        "root_value": torch.randn(envs, T, generator=g),
        ("collector", "traj_ids"): torch.arange(envs).unsqueeze(-1).expand(envs, T).clone(),
        ("next", "observation"): obs[:, 1:],
        ("next", "reward"): torch.ones(envs, T, 1),
        ("next", "done"): done, ("next", "terminated"): done,
    }, [envs, T])


def _box_buffer(**kwargs) -> GameBuffer:
    return GameBuffer(64, num_unroll_steps=3, td_steps=2, discount=0.9, seed=0,
                      action_space=BoxActionSpace(-1.0, 1.0, (D,)), **kwargs)


def _check_sample_by_index(sample: TensorDict, rollout: TensorDict) -> None:
    B, K1 = sample.batch_size
    action = sample["action"]
    assert action.shape == (B, K1, D) and action.dtype == torch.float32
    traj, t0 = sample["observation"][:, 0, 0].long(), sample["observation"][:, 0, 1].long()
    stored = sample["policy_mask"]
    assert bool(stored[:, 0].all())
    for b in range(B):
        for k in range(K1):
            if stored[b, k]:
                assert torch.equal(action[b, k], rollout["action"][traj[b], t0[b] + k]), (b, k)
                assert torch.equal(sample["target_policy"][b, k], rollout["search_policy"][traj[b], t0[b] + k])
    # where no step is stored the padding lies inside the box
    assert bool((action[~stored].abs() <= 1).all())


def test_box_rollout_round_trip_extend_sample_save_load(tmp_path):
    rollout = _box_rollout()
    buffer = _box_buffer()
    assert buffer.extend(rollout) == 12 and buffer.action_dim == D
    rows = buffer[torch.arange(buffer.num_rows)]
    assert rows["action"].shape == (buffer.num_rows, D) and rows["action"].dtype == torch.float32
    _check_sample_by_index(buffer.sample(16), rollout)

    buffer.save(tmp_path / "buffer.pt")
    assert buffer.state_dict()["shapes"]["action_dim"] == D
    loaded = _box_buffer()
    loaded.load(tmp_path / "buffer.pt")
    slots = torch.arange(buffer.num_rows)
    assert torch.equal(loaded[slots]["action"], buffer[slots]["action"])
    a, b = buffer.sample(8), loaded.sample(8)  # the generator came back too: the same draw
    assert torch.equal(a["action"], b["action"]) and torch.equal(a["index"], b["index"])
    _check_sample_by_index(b, rollout)
    # a continuing batch after the load lands in the same storage
    more = _box_rollout(seed=1)
    more["collector", "traj_ids"] += 2
    assert loaded.extend(more) == 12

    # a box file does not load into a discrete buffer, nor into a box of another size: one line each
    with pytest.raises(ValueError, match=r"stores continuous actions of 2 dims, this GameBuffer stores discrete "
                                         r"actions \(its action_space must match"):
        GameBuffer(64, num_unroll_steps=3, td_steps=2).load(tmp_path / "buffer.pt")
    with pytest.raises(ValueError, match="stores continuous actions of 2 dims, this GameBuffer stores continuous "
                                         "actions of 3 dims"):
        GameBuffer(64, num_unroll_steps=3, td_steps=2, action_space=BoxActionSpace(-1.0, 1.0, (3,))).load(
            tmp_path / "buffer.pt")


def test_a_scalar_box_stores_one_dim():
    rollout = _box_rollout()
    rollout["action"] = rollout["action"][..., 0]  # Bounded(shape=()): one float per step
    buffer = GameBuffer(64, num_unroll_steps=1, td_steps=2, seed=0, action_space=BoxActionSpace(-1.0, 1.0, ()))
    buffer.extend(rollout)
    assert buffer.sample(4)["action"].shape == (4, 2, 1)


def test_box_buffer_refuses_actions_that_are_not_the_box_in_one_line():
    buffer = _box_buffer()
    indices = _box_rollout()
    indices["action"] = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^rollout entry 'action' must hold the box's float actions \[\.\.\., 2\] "
                                         r"\(2 dims in \[-1, 1\]\), got \(12,\) torch.int64 after flattening\.$"):
        buffer.extend(indices)
    wide = _box_rollout()
    wide["action"] = torch.zeros(2, 6, 3)
    with pytest.raises(ValueError, match=r"got \(12, 3\) torch.float32"):
        buffer.extend(wide)
    assert len(buffer) == 0
    # a box buffer takes a root memory (sampled UniZero's history of float actions: test_sampled_unizero.py)


# -- discrete buffers: as before ------------------------------------------------------------------------
def test_float_actions_into_a_discrete_buffer_fail_as_before():
    for actions in (torch.rand(2, 6), torch.rand(2, 6, D)):
        rollout = _box_rollout()
        rollout["action"] = actions
        messages = []
        for space in (None, DiscreteActionSpace(S)):
            with pytest.raises(ValueError) as err:
                GameBuffer(64, action_space=space).extend(rollout)
            messages.append(str(err.value))
        assert messages[0] == messages[1]
    assert messages[0] == "rollout entry 'action' must hold one scalar per step ([..., 1] or [...]), got (12, 2)."
    rollout = _box_rollout()
    rollout["action"] = torch.rand(2, 6)
    with pytest.raises(ValueError, match=r"^rollout entry 'action' must hold integer indices or one-hot vectors, "
                                         r"got floats\.$"):
        GameBuffer(64).extend(rollout)


def test_a_discrete_space_checks_the_number_of_actions():
    rollout = _box_rollout()
    rollout["action"] = torch.zeros(2, 6, dtype=torch.long)
    # the space's count decodes and checks the actions (the search policy may be over fewer slots: a sampled
    # model searches K of its A actions)
    rollout["action"] = torch.full((2, 6), 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^rollout actions must lie in \[0, 4\), got \[4, 4\]\.$"):
        GameBuffer(64, action_space=4).extend(rollout)
    rollout["action"] = torch.full((2, 6), 3, dtype=torch.long)
    assert GameBuffer(64, action_space=4).extend(rollout) == 12
    rollout["action"] = torch.zeros(2, 6, dtype=torch.long)
    buffer = GameBuffer(64, action_space=DiscreteActionSpace(S, one_hot=True))
    assert buffer.extend(rollout) == 12
    assert "action_dim" not in buffer.state_dict()["shapes"]  # a discrete buffer saves what it saved before
    assert buffer[torch.arange(3)]["action"].dtype == torch.int64


def test_the_buffer_file_from_before_still_loads():
    state = torch.load(FIXTURE_BUFFER, weights_only=True)
    layout = state["layout"]
    kwargs = dict(frame_stack=layout["frame_stack"], frame_dim=layout["frame_dim"],
                  frame_padding=layout["frame_padding"], frame_padding_value=layout["frame_padding_value"])
    for space in (None, state["shapes"]["num_actions"]):
        buffer = GameBuffer(layout["capacity"], action_space=space, **kwargs)
        buffer.load(FIXTURE_BUFFER)
        assert len(buffer) > 0 and buffer.sample(4)["action"].dtype == torch.int64
    with pytest.raises(ValueError, match="stores discrete actions, this GameBuffer stores continuous actions of 2"):
        GameBuffer(layout["capacity"], action_space=BoxActionSpace(-1.0, 1.0, (D,)), **kwargs).load(FIXTURE_BUFFER)
