"""Regression tests for the AsyncEnvPool guards in ``torchrl_guards/env_pools.py`` (torchrl 0.14.1, bugs 6a-6d).

Each guard is shown necessary by building the same pool with that one guard
left out (the ``Without*`` classes below): the test then fails the way
torchrl 0.14.1 does. ``test_canary_*`` runs plain torchrl (no guard) in a
throw-away process group: it fails the day the installed torchrl fixes a bug,
naming the guard that can go.

Reference rollouts come from a ``SerialEnv`` of the same seeded factories and
a fixed policy, so "rewards and keys intact" means "identical to SerialEnv".
"""
from __future__ import annotations

import threading
import time
from functools import partial

import pytest
import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymEnv, RewardSum, SerialEnv, StepCounter, TransformedEnv

from pipeline_utils import live_descendants
from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool, asyncenvpool_bugs, asyncenvpool_is_fixed
from torchrl_muzero.torchrl_guards.env_pools import (
    ASYNCENVPOOL_BUGS,
    ClosedStateGuard,
    EnvIndexGuard,
    GuardedProcessorAsyncEnvPool,
    GuardedThreadingAsyncEnvPool,
    PartialResetGuard,
    ShmExchangeGuard,
    ShutdownGuard,
    child_seeds,
)


# ----------------------------------------------------- pools missing one guard
# Module level: the multiprocessing backend pickles its worker target by reference to the class.
def _without(cls, guard):
    return tuple(b for b in cls.__bases__ if b is not guard)


class ThreadingWithoutEnvIndexGuard(*_without(GuardedThreadingAsyncEnvPool, EnvIndexGuard)):
    pass


class ThreadingWithoutPartialResetGuard(*_without(GuardedThreadingAsyncEnvPool, PartialResetGuard)):
    pass


class ProcessesWithoutShmExchangeGuard(*_without(GuardedProcessorAsyncEnvPool, ShmExchangeGuard)):
    pass


class ProcessesWithoutPartialResetGuard(*_without(GuardedProcessorAsyncEnvPool, PartialResetGuard)):
    pass


class ProcessesWithoutClosedStateGuard(*_without(GuardedProcessorAsyncEnvPool, ClosedStateGuard)):
    pass


class ProcessesWithoutShutdownGuard(*_without(GuardedProcessorAsyncEnvPool, ShutdownGuard)):
    pass


# ------------------------------------------------------------------ helpers
@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = set(live_descendants())
    yield
    deadline = time.monotonic() + 15
    while (set(live_descendants()) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = set(live_descendants()) - before
    assert not left, f"child processes outlived the test: {sorted(left)}"


def seeded_cartpole(seed):
    env = GymEnv("CartPole-v1")
    if seed is not None:
        env.set_seed(seed)
    return env


def _factories(n, seed=0):
    return [partial(seeded_cartpole, s) for s in child_seeds(seed, n)]


class PushLeft(TensorDictModuleBase):
    """Always action 0: CartPole episodes end after ~10 steps, at different steps in each env (partial resets)."""

    in_keys = ["observation"]
    out_keys = ["action"]

    def forward(self, td):
        action = torch.zeros(*td.batch_size, 2, dtype=torch.int64)
        action[..., 0] = 1
        td["action"] = action
        return td


def _outer(env):
    return TransformedEnv(env, Compose(StepCounter(), RewardSum()))


def _collect(env, frames):
    collector = Collector(env, policy=PushLeft(), frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()  # closes the env too
        env.close(raise_if_closed=False)


KEYS = ["observation", "action", "step_count", "episode_reward", ("next", "observation"), ("next", "reward"),
        ("next", "done"), ("next", "terminated"), ("next", "step_count"), ("next", "episode_reward")]


def _assert_same_rollout(batch, reference):
    for key in KEYS:
        assert key in batch.keys(True), f"{key} missing from the pool's batch"
        torch.testing.assert_close(batch[key], reference[key], msg=lambda m: f"{key}: {m}")


@pytest.fixture(scope="module")
def serial_reference():
    """40 frames of 2 seeded CartPoles under StepCounter + RewardSum, stepped by SerialEnv."""
    batch = _collect(_outer(SerialEnv(2, _factories(2))), 40)
    assert batch["next", "done"].sum() >= 2, "no episode ended: the partial resets are not exercised"
    return batch


# ------------------------------------------------------- 6a: env_index
def test_collector_runs_on_the_guarded_pool_and_matches_serialenv(serial_reference):
    batch = _collect(_outer(GuardedAsyncEnvPool(_factories(2), backend="threading")), 40)
    _assert_same_rollout(batch, serial_reference)


def test_without_env_index_guard_the_collector_crashes_on_its_first_batch():
    with pytest.raises(AttributeError, match="batch_size"):
        _collect(ThreadingWithoutEnvIndexGuard(_factories(2), backend="threading"), 8)


# ------------------------------------------------ 6b: partial resets
def test_without_partial_reset_guard_a_partial_reset_reaches_the_children():
    with pytest.raises(RuntimeError, match="Partial resets are not handled"):
        _collect(_outer(ThreadingWithoutPartialResetGuard(_factories(2), backend="threading")), 40)


def test_partial_reset_resets_only_the_masked_envs():
    env = _outer(GuardedAsyncEnvPool(_factories(2), backend="threading"))
    try:
        td = env.reset()
        for _ in range(3):
            td = env.rand_step(td)["next"]
        obs_0, obs_1 = td["observation"].clone().unbind(0)
        td.set("_reset", torch.tensor([[True], [False]]))
        out = env.reset(td)
        assert out["step_count"].flatten().tolist() == [0, 3]
        assert torch.equal(out["observation"][1], obs_1)  # env 1 was not reset
        assert not torch.equal(out["observation"][0], obs_0)  # env 0 was
    finally:
        env.close()


# ---------------------------------------------- 6b: the shm exchange
def _shm_pool(n=2):
    # one worker process for all envs: a process start costs 5-30 s on 2 busy cores
    pool = GuardedAsyncEnvPool(_factories(n), backend="multiprocessing", exchange="shm", envs_per_worker=n)
    assert pool.resolved_exchange == "shm"
    return pool


@pytest.mark.timeout(120)
def test_shm_pool_under_outer_transforms_and_a_collector_matches_serialenv(serial_reference):
    batch = _collect(_outer(_shm_pool()), 40)
    _assert_same_rollout(batch, serial_reference)
    assert torch.equal(batch["collector", "traj_ids"], serial_reference["collector", "traj_ids"])


@pytest.mark.timeout(120)
def test_shm_private_step_returns_rewards_and_the_public_results_keep_extra_keys():
    pool = _shm_pool()
    try:
        _check_private_step_and_extras(pool)
    finally:
        pool.close()


def _check_private_step_and_extras(pool):
    td = pool.reset().exclude("env_index")
    td.set("action", pool.full_action_spec["action"].rand())
    out = pool._step(td)  # torchrl 0.14.1: the worker fails to publish the reward
    assert out["reward"].tolist() == [[1.0], [1.0]] and "observation" in out.keys()
    td = pool.reset()
    td.set("action", pool.full_action_spec["action"].rand())
    td.set("outer_extra", torch.full((2, 1), 7.0))
    out = pool.step(td)
    assert out["outer_extra"].tolist() == [[7.0], [7.0]] and out["next", "reward"].tolist() == [[1.0], [1.0]]
    out, out_next = pool.step_and_maybe_reset(td)
    assert out["outer_extra"].tolist() == [[7.0], [7.0]] and out_next["outer_extra"].tolist() == [[7.0], [7.0]]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_shm_guard_outer_keys_are_refused():
    pool = ProcessesWithoutShmExchangeGuard(_factories(1), backend="multiprocessing", exchange="shm")
    with pytest.raises(KeyError, match="unsupported input at keys"):
        _collect(_outer(pool), 8)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_partial_reset_guard_the_shm_pool_restarts_envs_mid_episode(serial_reference):
    pool = ProcessesWithoutPartialResetGuard(_factories(2), backend="multiprocessing", exchange="shm",
                                             envs_per_worker=2)
    batch = _collect(_outer(pool), 40)
    # every env restarts whenever one is done: the observations leave SerialEnv's
    assert not torch.equal(batch["next", "observation"], serial_reference["next", "observation"])


# ------------------------------------------------ 6c: shutdown spin
@pytest.mark.timeout(60)
def test_shutdown_returns_when_a_result_queue_is_closed():
    pool = GuardedAsyncEnvPool(_factories(1), backend="multiprocessing", exchange="queue")
    pool.step_queue._reader.close()  # what the garbage collector can do before the pool's __del__
    thread = threading.Thread(target=pool.shutdown, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "shutdown is spinning on the closed queue"
    assert not any(worker.is_alive() for worker in pool.threads)


_SPIN_SCRIPT = """
import os, sys, threading
sys.path.insert(0, {testdir!r})
from test_torchrl_guards_env_pools import ProcessesWithoutShutdownGuard, _factories
pool = ProcessesWithoutShutdownGuard(_factories(1), backend="multiprocessing", exchange="queue")
pool.step_queue._reader.close()
thread = threading.Thread(target=pool.shutdown, daemon=True)
thread.start()
thread.join(5)
print("SPINNING" if thread.is_alive() else "RETURNED", flush=True)
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_shutdown_guard_shutdown_spins():
    """Run in its own process group, killed afterwards: the spinning thread cannot be stopped otherwise."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    code = _SPIN_SCRIPT.format(testdir=os.path.dirname(os.path.abspath(__file__)))
    # output to a file, not a pipe: the pool's worker inherits the pipe and keeps it open
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=100)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        text = out.read()
    assert "SPINNING" in text, f"torchrl's shutdown returned without the guard: {text!r}"


# ------------------------------------------------------------ seeds
def test_child_seeds_reproduce_serialenv_seeding():
    serial = SerialEnv(3, [partial(seeded_cartpole, None)] * 3)
    serial.set_seed(5)
    seeded = SerialEnv(3, [partial(seeded_cartpole, s) for s in child_seeds(5, 3)])
    try:
        assert torch.equal(serial.reset()["observation"], seeded.reset()["observation"])
    finally:
        serial.close()
        seeded.close()
    with pytest.raises(NotImplementedError, match="seed them in their factories"):
        GuardedProcessorAsyncEnvPool._set_seed(None, 0)


# ---------------------------------------------------------- 6d: is_closed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("guarded", [True, False])
def test_collector_shutdown_stops_the_pool_workers(guarded):
    """Bug 6d: torchrl's pool reads closed while its workers run, so Collector.shutdown leaves them running."""
    cls = GuardedProcessorAsyncEnvPool if guarded else ProcessesWithoutClosedStateGuard
    pool = cls(_factories(1), backend="multiprocessing")
    workers = list(pool.threads)
    # endless, as the trainers run it (a collector that reaches total_frames closes its env itself)
    collector = Collector(pool, policy=None, frames_per_batch=4, total_frames=-1)
    try:
        next(iter(collector))
        collector.shutdown()
        for worker in workers:
            worker.join(5.0)
        stopped = not any(worker.is_alive() for worker in workers)
    finally:
        pool.close()
    assert stopped is guarded, "Collector.shutdown left the pool's worker running" if guarded else "bug 6d gone?"


# ---------------------------------------------------------- canaries
@pytest.mark.slow  # ~10 s on a quiet 2-core machine, 65 s at load 7: five pools in a throw-away process
@pytest.mark.timeout(180)
def test_canary_asyncenvpool_bugs_still_in_torchrl():
    """Fails the day the installed torchrl fixes an AsyncEnvPool bug: its guard can then go."""
    import torchrl

    start = time.monotonic()
    fixed = asyncenvpool_bugs()
    assert set(fixed) == set(ASYNCENVPOOL_BUGS)
    assert time.monotonic() - start < 125
    guards = {
        "env_index": "EnvIndexGuard",
        "shm_outer_keys": "ShmExchangeGuard (extra keys)",
        "shm_private_step_reward": "ShmExchangeGuard (_step)",
        "partial_reset": "PartialResetGuard",
        "shutdown_closed_queue": "ShutdownGuard",
        "is_closed": "ClosedStateGuard",
    }
    gone = [f"{bug} (retire {guards[bug]})" for bug, ok in fixed.items() if ok]
    if torchrl.__version__.startswith("0.14.1"):
        assert not gone, f"torchrl 0.14.1 was expected to have every PR 4701 AsyncEnvPool bug, but fixes {gone}"
    elif gone:
        pytest.fail(f"torchrl {torchrl.__version__} fixes {gone}: remove those guards from env_pools.py")
    assert asyncenvpool_is_fixed() is all(fixed.values())


def test_probe_is_bounded_and_leaves_no_process():
    # a probe cut short by its timeout is killed with its whole process group
    start = time.monotonic()
    assert asyncenvpool_bugs.__wrapped__(timeout_s=0.5) == {bug: False for bug in ASYNCENVPOOL_BUGS}
    assert time.monotonic() - start < 5


def test_guarded_pool_picks_the_backend_class():
    pool = GuardedAsyncEnvPool(_factories(1), backend="threading")
    try:
        assert isinstance(pool, GuardedThreadingAsyncEnvPool)
        assert pool.reset()["observation"].shape == (1, 4)
    finally:
        pool.close()
    with pytest.raises(ValueError, match="backend must be 'threading' or 'multiprocessing', got 'asyncio'"):
        GuardedAsyncEnvPool(_factories(1), backend="asyncio")
