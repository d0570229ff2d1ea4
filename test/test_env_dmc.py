"""env=dmc: DeepMind Control Suite tasks from state (torchrl_muzero/envs/dmc.py) through the factory.

The specs, random float steps, action repeat, truncation at the time limit and the unknown-task message
of the real suite need dm-control (``pip install 'torchrl_muzero[dmc]'``) and are skipped without it; the
one-line errors of a missing dm-control and of an unknown task are checked either way (a missing or a
stand-in dm_control module).
"""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from torchrl_muzero.envs import env_action_space, make_env
from torchrl_muzero.envs.action_spaces import BoxActionSpace
from torchrl_muzero.envs.env_ids import check_env_id
from torchrl_muzero.modules import CategoricalSupport
from torchrl_muzero.trainers.config import ConfigError, EnvConfig, load_config
from torchrl_muzero.trainers.config_checks import check_run_targets
from torchrl_muzero.trainers.hydra_entry import compose_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "sota-implementations" / "muzero" / "muzero_async.py"
CONFIG_DIR = SCRIPT.parent / "config"
INSTALL = "pip install 'torchrl_muzero[dmc]'"


def _dmc(env_id: str = "cartpole-swingup", **kw) -> EnvConfig:
    return EnvConfig(name="dmc", kind="dmc", id=env_id, **kw)


def _one_line_error(call, error=ValueError) -> str:
    with pytest.raises(error) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    return message


# -- the config ------------------------------------------------------------------------------------------
def test_config_selects_a_dmc_task_and_its_supports_cover_the_returns():
    cfg = compose_config(CONFIG_DIR, ["env=dmc"])
    assert (cfg.env.kind, cfg.env.id, cfg.env.action_repeat, cfg.env.max_episode_steps) == (
        "dmc", "cartpole-swingup", 2, 0)
    # rewards are in [0, 1] per physics step: at most action_repeat per agent step
    assert CategoricalSupport(cfg.model.value_support_size).max_value > cfg.env.action_repeat / (1 - cfg.mcts.discount)
    assert CategoricalSupport(cfg.model.reward_support_size).max_value > cfg.env.action_repeat
    assert cfg.train.frames_per_batch % cfg.env.num_envs == 0
    other = compose_config(CONFIG_DIR, ["env=dmc", "env.id=walker-walk", "env.action_repeat=4"])
    assert (other.env.id, other.env.action_repeat) == ("walker-walk", 4)


def test_action_repeat_is_checked_in_one_line():
    message = _one_line_error(lambda: load_config({"env": {"kind": "dmc", "id": "cartpole-swingup",
                                                           "action_repeat": 0}}), ConfigError)
    assert message == "config key 'env.action_repeat' must be >= 1, got 0."
    message = _one_line_error(lambda: load_config({"env": {"kind": "dmcc"}}), ConfigError)
    assert "'env.kind'" in message and "'dmc'" in message


# -- a missing dm-control --------------------------------------------------------------------------------
def test_missing_dm_control_stops_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "dm_control", None)  # `import dm_control` raises ImportError
    message = _one_line_error(lambda: check_env_id("cartpole-swingup", "dmc"))
    assert message.startswith("env.kind='dmc' (env id 'cartpole-swingup') needs dm-control, which is not installed")
    assert message.endswith(f": {INSTALL}.")
    # at start, the trainers' check names the key
    cfg = load_config({"env": {"name": "dmc", "kind": "dmc", "id": "cartpole-swingup"}})
    message = _one_line_error(lambda: check_run_targets(cfg), ConfigError)
    assert message.startswith("config key 'env.id': env.kind='dmc'") and INSTALL in message
    # and so does the factory, before any env exists
    assert INSTALL in _one_line_error(lambda: make_env(_dmc(), num_envs=1))


def test_missing_dm_control_stops_the_script_in_one_line(tmp_path):
    """``muzero_async.py env=dmc`` without dm-control: one ``error:`` line naming the key and the extra, exit 2."""
    fake = tmp_path / "no_dmc"  # a dm_control that fails to import, as when the dmc extra is missing
    (fake / "dm_control").mkdir(parents=True)
    (fake / "dm_control" / "__init__.py").write_text("raise ImportError('No module named dm_control')\n")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = f"{fake}{os.pathsep}{env.get('PYTHONPATH', '')}"
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, str(SCRIPT), "env=dmc"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: config key 'env.id': env.kind='dmc' (env id 'cartpole-swingup') needs dm-control, "
                     f"which is not installed (No module named dm_control): {INSTALL}."], proc.stderr
    assert not any(work.iterdir())  # stopped before hydra made its outputs/ folder


# -- an unknown task -------------------------------------------------------------------------------------
def test_unknown_task_lists_the_known_ones_in_one_line(monkeypatch):
    """Against a stand-in suite (runs without dm-control): the message's shape."""
    suite = types.SimpleNamespace(ALL_TASKS=(("cartpole", "swingup"), ("cartpole", "balance"), ("walker", "walk")))
    monkeypatch.setitem(sys.modules, "dm_control", types.SimpleNamespace(suite=suite))
    monkeypatch.setitem(sys.modules, "dm_control.suite", suite)
    check_env_id("walker-walk", "dmc")
    message = _one_line_error(lambda: check_env_id("cartpole-swingupp", "dmc"))
    assert message == ("unknown DeepMind Control task 'cartpole-swingupp' (did you mean cartpole-swingup or "
                       "cartpole-balance?): "
                       "env.kind='dmc' takes an env.id '<domain>-<task>', one of cartpole-swingup, "
                       "cartpole-balance, walker-walk.")
    message = _one_line_error(lambda: check_env_id("walker", "dmc"))  # no task part: unknown too
    assert message.startswith("unknown DeepMind Control task 'walker'") and "walker-walk" in message


def test_unknown_task_of_the_real_suite():
    suite = pytest.importorskip("dm_control.suite", exc_type=ImportError)
    message = _one_line_error(lambda: check_env_id("cheetah-walk", "dmc"))
    assert message.startswith("unknown DeepMind Control task 'cheetah-walk'")
    names = message.rsplit("one of ", 1)[1].rstrip(".").split(", ")
    assert names == [f"{d}-{t}" for d, t in suite.ALL_TASKS] and "cartpole-swingup" in names
    cfg = load_config({"env": {"name": "dmc", "kind": "dmc", "id": "cheetah-walk"}})
    assert _one_line_error(lambda: check_run_targets(cfg), ConfigError).startswith(
        "config key 'env.id': unknown DeepMind Control task 'cheetah-walk'")
    # a DMC id is not a gymnasium id, and the other way round
    assert "gymnasium has no such environment" in _one_line_error(lambda: check_env_id("cartpole-swingup", "gym"))
    assert "unknown DeepMind Control task 'CartPole-v1'" in _one_line_error(
        lambda: check_env_id("CartPole-v1", "dmc"))


# -- with dm-control -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dmc():
    return pytest.importorskip("dm_control.suite", exc_type=ImportError)


def test_specs_are_a_float32_vector_and_a_float32_box(dmc):
    env = make_env(_dmc(), num_envs=2, seed=0)
    try:
        obs = env.observation_spec["observation"]
        assert obs.shape == (2, 5) and obs.dtype == torch.float32  # cartpole: position 3 + velocity 2
        assert env.reward_spec.dtype == torch.float32
        space = env_action_space(env)
        assert isinstance(space, BoxActionSpace) and space.dtype == torch.float32
        assert tuple(space.shape) == (1,) and space.low.tolist() == [-1.0] and space.high.tolist() == [1.0]
        # the raw observation keys are gone: one vector is what the models read
        assert set(env.observation_spec.keys()) == {"observation", "episode_reward"}
        td = env.reset()
        g = torch.Generator().manual_seed(0)
        for _ in range(5):
            td["action"] = space.encode(torch.rand(2, 1, generator=g) * 2 - 1)
            td = env.step(td)
            assert td["next", "observation"].shape == (2, 5) and td["next", "observation"].dtype == torch.float32
            reward = td["next", "reward"]
            assert reward.dtype == torch.float32 and bool(((reward >= 0) & (reward <= 2)).all())
            td = td["next"]
    finally:
        env.close()


def test_observations_of_several_shapes_flatten_into_one_vector(dmc):
    from torchrl_muzero.envs.dmc import make_single_dmc_env

    # manipulator's arm_pos is [8, 2]: 44 floats in all (dm_control's flatten wrapper gives the same)
    env = make_single_dmc_env("manipulator-bring_ball")
    raw = dmc.load("manipulator", "bring_ball").observation_spec()
    assert env.observation_spec["observation"].shape == (sum(int(torch.tensor(s.shape).prod()) for s in raw.values()),)
    assert env.rollout(3)["next", "observation"].shape == (3, 44)


def test_action_repeat_steps_the_physics_twice_and_sums_the_rewards(dmc):
    from torchrl_muzero.envs.dmc import make_single_dmc_env

    twice, once = make_single_dmc_env("cartpole-swingup", 2), make_single_dmc_env("cartpole-swingup", 1)
    physics = twice.base_env._env.physics
    dt = twice.base_env._env.control_timestep()
    for env in (twice, once):
        env.set_seed(3)
    td2, td1 = twice.reset(), once.reset()
    assert torch.equal(td2["observation"], td1["observation"])  # the same start
    g = torch.Generator().manual_seed(0)
    for step in range(1, 4):
        action = torch.rand(1, generator=g) * 2 - 1
        td2["action"] = action.clone()
        out2 = twice.step(td2)["next"]
        total = 0.0
        for _ in range(2):
            td1["action"] = action.clone()
            out1 = once.step(td1)["next"]
            total += float(out1["reward"])
            td1 = out1
        assert physics.data.time == pytest.approx(2 * step * dt)  # 2 control steps per agent step
        assert float(out2["reward"]) == pytest.approx(total, rel=1e-6)
        torch.testing.assert_close(out2["observation"], out1["observation"])
        td2 = out2


@pytest.mark.parametrize("repeat,limit", [(2, 500), (4, 250)])
def test_the_time_limit_is_a_truncation_after_1000_physics_steps(dmc, repeat, limit):
    env = make_env(_dmc(action_repeat=repeat), num_envs=1, seed=0)
    try:
        td = env.rollout(limit + 5, break_when_any_done=False)[0]
    finally:
        env.close()
    done, truncated, terminated = (td["next", k].squeeze(-1) for k in ("done", "truncated", "terminated"))
    assert done.nonzero().squeeze(-1).tolist() == [limit - 1]
    assert bool(truncated[limit - 1]) and not bool(terminated.any())
    assert float(td["next", "episode_reward"][limit - 1]) == pytest.approx(
        float(td["next", "reward"][:limit].sum()), rel=1e-5)


def test_max_episode_steps_truncates_sooner(dmc):
    env = make_env(_dmc(max_episode_steps=25), num_envs=2, seed=0)
    try:
        td = env.rollout(60, break_when_any_done=False)
    finally:
        env.close()
    for e in range(2):
        done = td["next", "done"][e].squeeze(-1)
        assert done.nonzero().squeeze(-1).tolist() == [24, 49]
        assert bool(td["next", "truncated"][e, 24]) and not bool(td["next", "terminated"][e].any())


def test_seeded_batches_repeat(dmc):
    first, second = (make_env(_dmc(), num_envs=2, seed=5) for _ in range(2))
    try:
        a, b = first.reset()["observation"], second.reset()["observation"]
    finally:
        first.close()
        second.close()
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])  # same seed, same starts; the envs differ
