"""Action spaces: made from torchrl specs, encode / decode round trips, checks, and the one shared
index-or-one-hot reader, which must read every input exactly as each caller's own copy did."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Binary, Bounded, Categorical, MultiOneHot, OneHot, Unbounded

from torchrl_muzero.algorithms.registry import algorithms_for, check_action_space
from torchrl_muzero.envs import env_action_space, env_spaces, make_env
from torchrl_muzero.envs.action_spaces import (
    BoxActionSpace,
    DiscreteActionSpace,
    action_space_of,
    check_model_action_space,
    read_action_index,
)
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.trainers.config import ConfigError, EnvConfig

REPO = Path(__file__).resolve().parents[1]
REFUSAL = "the algorithms that support continuous actions: sampled_muzero, sampled_efficientzero, sampled_unizero"


# -- spaces from specs ----------------------------------------------------------------------------
def test_spaces_from_torchrl_specs():
    space = action_space_of(OneHot(4, dtype=torch.int64))
    assert space.is_discrete and space.kind == "discrete" and space.one_hot
    assert (space.num_actions, space.dim, space.dtype, tuple(space.shape)) == (4, None, torch.int64, (4,))
    space = action_space_of(Categorical(3))
    assert not space.one_hot and space.num_actions == 3 and tuple(space.shape) == ()
    assert tuple(action_space_of(Categorical(3, shape=(1,))).shape) == (1,)
    assert tuple(action_space_of(Categorical(3, shape=(5,))).shape) == ()  # a bare batched spec
    # with its batch dims known, a batch of one env is not a trailing index dimension
    assert tuple(action_space_of(Categorical(3, shape=(1,)), batch_dims=1).shape) == ()
    box = action_space_of(Bounded(-2.0, 2.0, shape=(1,)))
    assert not box.is_discrete and box.kind == "continuous" and box.num_actions is None and box.dim == 1
    assert box.low.tolist() == [-2.0] and box.high.tolist() == [2.0]
    low, high = torch.tensor([-1.0, 0.0]).expand(6, 2), torch.tensor([1.0, 3.0]).expand(6, 2)
    box = action_space_of(Bounded(low, high, shape=(6, 2)), batch_dims=1)
    assert box.dim == 2 and box.low.tolist() == [-1.0, 0.0] and box.high.tolist() == [1.0, 3.0]
    free = action_space_of(Unbounded(shape=(3,)))
    assert free.dim == 3 and free.low.isinf().all() and free.high.isinf().all()
    for spec in (Binary(3), MultiOneHot([2, 3]), Bounded(0, 4, shape=(), dtype=torch.int64)):
        with pytest.raises(ValueError, match="not supported"):
            action_space_of(spec)
    with pytest.raises(ValueError, match="OneHot action must have shape"):
        action_space_of(OneHot(3, shape=(2, 2, 3)), batch_dims=1)


def test_spaces_of_the_envs():
    cartpole = make_env(EnvConfig(), num_envs=2)
    space = env_action_space(cartpole)
    assert space.is_discrete and space.one_hot and space.num_actions == 2
    assert env_spaces(cartpole) == ((4,), 2)
    cartpole.close()
    board = make_env(EnvConfig(kind="board", id="TicTacToe"), num_envs=3)
    assert env_action_space(board).num_actions == 9 and env_spaces(board) == ((27,), 9)
    pendulum = make_env(EnvConfig(kind="gym", id="Pendulum-v1"), num_envs=2)  # a continuous env
    space = env_action_space(pendulum)
    assert not space.is_discrete and space.dim == 1 and tuple(space.shape) == (1,)
    assert space.low.tolist() == [-2.0] and space.high.tolist() == [2.0]
    with pytest.raises(ValueError, match="continuous"):
        env_spaces(pendulum)
    pendulum.close()


# -- encode / decode / validate ------------------------------------------------------------------
@pytest.mark.parametrize("one_hot,dtype,shape", [(True, torch.int64, None), (True, torch.bool, None),
                                                 (True, torch.float32, None), (False, torch.int64, ()),
                                                 (False, torch.int32, (1,))])
def test_discrete_round_trip(one_hot, dtype, shape):
    space = DiscreteActionSpace(5, one_hot=one_hot, dtype=dtype, shape=shape)
    index = torch.tensor([4, 0, 2, 2])
    env_action = space.encode(index)
    assert env_action.dtype == dtype
    assert tuple(env_action.shape) == (4, *space.shape)
    decoded = space.decode(env_action)
    assert decoded.dtype == torch.int64 and torch.equal(decoded, index)
    space.validate(decoded)


def test_box_round_trip():
    space = BoxActionSpace([-1.0, 0.0], [1.0, 3.0], shape=(2,))
    value = torch.tensor([[0.5, 2.0], [-1.0, 0.0]])
    assert torch.equal(space.decode(space.encode(value)), value)
    scalar = BoxActionSpace(-2.0, 2.0, shape=())
    assert scalar.encode(torch.tensor([[0.5], [1.5]])).shape == (2,)
    assert scalar.decode(torch.tensor([0.5, 1.5])).shape == (2, 1)
    space.validate(value)


def test_validate_errors_name_what_is_expected():
    space = DiscreteActionSpace(3)
    with pytest.raises(ValueError, match=r"^discrete actions must be integer indices \[\.\.\.\] in \[0, 3\), "
                                         r"got \(2,\) of dtype torch.float32\.$"):
        space.validate(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got values in \[-1, 2\]"):
        space.validate(torch.tensor([-1, 2]))
    mask = torch.tensor([[True, False, True], [True, True, False]])
    space.validate(torch.tensor([2, 1]), mask=mask)
    with pytest.raises(ValueError, match=r"1 of 2 actions are illegal under the action mask \(the first: action 2\)"):
        space.validate(torch.tensor([2, 2]), mask=mask)
    with pytest.raises(ValueError, match=r"action mask must have shape \[\.\.\., 3\] = \[2, 3\], got \(2, 2\)"):
        space.validate(torch.tensor([2, 1]), mask=mask[:, :2])
    with pytest.raises(ValueError, match=r"one-hot actions must have shape \[\.\.\., 3\]"):
        DiscreteActionSpace(3, one_hot=True).decode(torch.zeros(2, 4))
    box = BoxActionSpace(-2.0, 2.0, shape=(1,))
    with pytest.raises(ValueError, match=r"^continuous actions must be floats \[\.\.\., 1\], got \(2, 2\)"):
        box.validate(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"^continuous actions must be floats \[\.\.\., 1\], got \(2, 1\) of dtype torch.int64"):
        box.validate(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must lie in \[-2, 2\], got values in \[-3, 0\]"):
        box.validate(torch.tensor([[-3.0], [0.0]]))
    with pytest.raises(ValueError, match="finite"):
        box.validate(torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="no action mask"):
        box.validate(torch.zeros(1, 1), mask=torch.ones(1, 1, dtype=torch.bool))


# -- the shared reader reads as each caller's old copy did -------------------------------------
def _argmax(action):
    # the old copies called argmax on bool one-hots too, which torch refuses ("does not support bool
    # input"); the shared reader reads them as uint8: the result the copies meant
    return (action.to(torch.uint8) if action.dtype == torch.bool else action).argmax(-1)


def _old_model(action, A, B):  # modules/model.py, _RecurrentStep.forward
    if action.ndim == 2 and action.shape[-1] == A and action.shape[0] == B:
        action = _argmax(action)
    elif action.ndim == 2 and action.shape[-1] == 1:
        action = action.squeeze(-1)
    return action


def _old_loss(action, A, B, K1):  # objectives/unrolled.py, _read_inputs
    if action.ndim == 3 and action.shape[:2] == (B, K1) and action.shape[-1] == A and (
        action.dtype.is_floating_point or action.dtype == torch.bool or A > 1
    ):
        action = _argmax(action)
    elif action.shape == (B, K1, 1) and not action.dtype.is_floating_point:
        action = action.squeeze(-1)
    return action


def _old_rollout(action, A, m):  # data/rollout_reader.py, read_rollout (minus its own errors)
    if action.shape == (m, A) and A > 1:
        return _argmax(action)
    return action.squeeze(-1) if action.shape == (m, 1) else action


_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32)


def _inputs(lead, A):
    """Actions of every dtype and of shapes around the expected ones, values one-hot or indices."""
    shapes = {(*lead,), (*lead, 1), (*lead, A), (*lead, A + 1), (lead[0] + 1, *lead[1:], 1),
              (lead[0] + 1, *lead[1:], A), (*lead, 1, 1), (*lead[:-1],)}
    gen = torch.Generator().manual_seed(0)
    for shape, dtype in itertools.product(sorted(shapes), _DTYPES):
        values = torch.randint(0, max(A, 2), shape, generator=gen)
        yield values.to(dtype)
        if shape and shape[-1] == A:  # a proper one-hot too
            yield torch.nn.functional.one_hot(torch.randint(0, A, shape[:-1], generator=gen), A).to(dtype)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("A", [1, 2, 3])
def test_reader_matches_the_model_views_old_copy(A):
    B = 3
    for action in _inputs((B,), A):
        new = read_action_index(action, A, (B,), single="one_hot", squeeze_any_lead=True)
        assert _same(new, _old_model(action, A, B)), (tuple(action.shape), action.dtype)


@pytest.mark.parametrize("A", [1, 2, 3])
def test_reader_matches_the_losss_old_copy(A):
    B, K1 = 2, 3
    for action in _inputs((B, K1), A):
        new = read_action_index(action, A, (B, K1), single="by_dtype", squeeze_floats=False)
        assert _same(new, _old_loss(action, A, B, K1)), (tuple(action.shape), action.dtype)


@pytest.mark.parametrize("A", [1, 2, 3])
def test_reader_matches_the_rollout_readers_old_copy(A):
    m = 4
    for action in _inputs((m,), A):
        new = read_action_index(action, A, (m,), single="index")
        new = new.squeeze(-1) if new.shape == (m, 1) else new  # then read_rollout's _scalar_column
        assert _same(new, _old_rollout(action, A, m)), (tuple(action.shape), action.dtype)


def test_callers_keep_their_error_messages():
    from torchrl_muzero.data.rollout_reader import read_rollout

    model = MuZeroMLPModel((4,), 3, latent_dim=8, hidden_dim=8)
    latent = torch.rand(2, 8)
    td = TensorDict({"latent": latent, "action": torch.tensor([[0.0], [1.0]])}, [2])
    with pytest.raises(ValueError, match=r"integer actions of shape \[2\] \(one per latent\), got \(2,\) of dtype "
                                         r"torch.float32"):
        model.recurrent(td)
    td = TensorDict({"latent": latent, "action": torch.tensor([[0, 0, 1], [1, 0, 0]])}, [2])
    assert model.recurrent(td)["reward"].shape == (2,)

    def rollout(action):
        m = action.shape[0]
        return TensorDict({
            "observation": torch.zeros(m, 4), "action": action, "search_policy": torch.full((m, 3), 1 / 3),
            "root_value": torch.zeros(m), ("collector", "traj_ids"): torch.zeros(m, dtype=torch.long),
            ("next", "observation"): torch.zeros(m, 4), ("next", "reward"): torch.zeros(m, 1),
            ("next", "done"): torch.zeros(m, 1, dtype=torch.bool)}, [m])

    assert read_rollout(rollout(torch.tensor([[0.0, 1.0, 0.0]] * 2)), "observation", "cpu")["action"].tolist() == [1, 1]
    assert read_rollout(rollout(torch.tensor([[2], [0]])), "observation", "cpu")["action"].tolist() == [2, 0]
    with pytest.raises(ValueError, match="^rollout entry 'action' must hold integer indices or one-hot vectors, got floats.$"):
        read_rollout(rollout(torch.tensor([[2.0], [0.0]])), "observation", "cpu")
    with pytest.raises(ValueError, match=r"^rollout entry 'action' must hold one scalar per step \(\[\.\.\., 1\] or "
                                         r"\[\.\.\.\]\), got \(2, 2\)\.$"):
        read_rollout(rollout(torch.zeros(2, 2, dtype=torch.long)), "observation", "cpu")


# -- MCTSPolicy encodes through the space ----------------------------------------------------------
def _old_encode(action, spec, A):  # mcts/policy.py before: one-hot of the spec's dtype, or index
    if "OneHot" in type(spec).__name__:
        return torch.nn.functional.one_hot(action, A).to(spec.dtype)
    action = action.to(spec.dtype)
    return action.unsqueeze(-1) if spec.shape[-1:] == (1,) else action


@pytest.mark.parametrize("spec", [OneHot(3), OneHot(3, dtype=torch.int64), Categorical(3),
                                  Categorical(3, shape=(1,)), Categorical(3, dtype=torch.int32)],
                         ids=["onehot-bool", "onehot-long", "index", "index-1", "index-int32"])
def test_policy_encodes_as_before(spec):
    torch.manual_seed(0)
    model = MuZeroMLPModel((4,), 3, latent_dim=8, hidden_dim=8)
    td = TensorDict({"observation": torch.randn(6, 4)}, [6])
    out = MCTSPolicy(model, MCTSConfig(num_simulations=3), spec, generator=torch.Generator().manual_seed(0))(td)
    plain = MCTSPolicy(model, MCTSConfig(num_simulations=3), generator=torch.Generator().manual_seed(0))(td.clone())
    assert _same(out["action"], _old_encode(plain["action"], spec, 3))


def test_policy_refuses_an_action_space_its_model_does_not_take():
    model = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8)
    with pytest.raises(ValueError, match=r"^the action spec has 3 actions but the model has 2\.$"):
        MCTSPolicy(model, action_spec=Categorical(3))
    with pytest.raises(ValueError, match="the env's actions are continuous") as err:
        MCTSPolicy(model, action_spec=Bounded(-2.0, 2.0, shape=(1,)))
    assert REFUSAL in str(err.value) and "\n" not in str(err.value)
    check_model_action_space(DiscreteActionSpace(2, one_hot=True), model)


# -- a continuous env with a discrete-only algorithm: refused at start, in one line ------------------
def test_algorithms_say_which_action_kinds_they_support():
    from torchrl_muzero.algorithms import algorithm_names, get_algorithm

    kinds = {name: get_algorithm(name).action_kinds for name in algorithm_names()}
    continuous = {name for name, k in kinds.items() if "continuous" in k}
    assert continuous == {"sampled_muzero", "sampled_efficientzero", "sampled_unizero"}
    assert all("discrete" in k for k in kinds.values())
    assert algorithms_for("continuous") == REFUSAL
    check_action_space("muzero", DiscreteActionSpace(2, one_hot=True))


def test_sync_trainer_refuses_pendulum_before_anything_starts(tmp_path):
    from torchrl_muzero.trainers import SyncTrainer

    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        SyncTrainer({"run_dir": str(run_dir), "env": {"kind": "gym", "id": "Pendulum-v1", "num_envs": 2}})
    message = str(err.value)
    assert "\n" not in message
    assert message == ("config key 'algo.name' is 'muzero', which supports discrete actions only, but "
                       f"env.id='Pendulum-v1' has continuous actions (1 dim in [-2, 2]): {REFUSAL}.")
    assert not run_dir.exists()  # no run folder, model or process: the probe env was the only thing made


def test_script_refuses_pendulum_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    script = REPO / "sota-implementations" / "muzero" / "muzero_sync.py"
    proc = subprocess.run([sys.executable, str(script), "env.id=Pendulum-v1", f"run_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: config key 'algo.name' is 'muzero'"), output
    assert REFUSAL in lines[0]
    assert not (tmp_path / "run").exists()
