"""Regression tests for the torchrl 0.14.1 weight-sync workarounds in ``torchrl_guards/``.

The AsyncEnvPool guards have theirs in ``test_torchrl_guards_env_pools.py``.

Each guarded test fails (or hangs, bounded by pytest-timeout) without its
guard; ``test_naive_live_tensors_tear`` shows the bug itself on the plain
torchrl path and is the canary that tells when the guards can be removed.
Collector workers are spawned processes (about 5-10 s to start on 2 cores);
every test shuts its collector down and checks that no child process is left.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.weight_update import MultiProcessWeightSyncScheme

from torchrl_muzero.torchrl_guards import (
    GuardedWeightSyncScheme,
    LockedPolicy,
    PolicyVersionMap,
    WeightPublishError,
    find_locked_policy,
    publish_weights,
    snapshot_weights,
)

TWIN_SIZE = 500_000  # elements per twin parameter (2 MB)
FORWARD_GAP_S = 0.002  # time between reading A and reading B in a forward


# ----------------------------------------------------------------- helpers
def _child_pids() -> set[int]:
    """Live (non-zombie) child processes of this process, the mp resource tracker excepted."""
    me = os.getpid()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) != me or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
        except (OSError, ValueError, IndexError):
            continue
        out.add(int(entry))
    return out


@pytest.fixture(autouse=True)
def no_leftover_processes():
    before = _child_pids()
    yield
    deadline = time.monotonic() + 15
    while (_child_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _child_pids() - before
    assert not left, f"child processes outlived the test: {sorted(left)}"


class Twin(nn.Module):
    """Two parameters the trainer always writes together (A == B in every published state)."""

    def __init__(self, n: int = TWIN_SIZE) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(n))
        self.b = nn.Parameter(torch.zeros(n))


class TwinPolicy(TensorDictModuleBase):
    """CartPole policy that records, per frame, whether it saw A != B (a torn forward)."""

    in_keys = ["observation"]
    out_keys = ["action", "torn", "seen"]

    def __init__(self) -> None:
        super().__init__()
        self.net = Twin()

    def forward(self, td):
        a = self.net.a.detach().clone()
        time.sleep(FORWARD_GAP_S)  # widen the window an update can land in
        b = self.net.b.detach()
        batch = td["observation"].shape[:-1]
        action = torch.zeros(*batch, 2, dtype=torch.int64)
        action[..., 0] = 1
        td["action"] = action
        td["torn"] = torch.full(batch, not torch.equal(a, b))
        td["seen"] = torch.full(batch, float(a[0]))  # which trainer step's weights were used
        return td


def make_twin_policy():
    return TwinPolicy()


def make_locked_twin_policy():
    policy = TwinPolicy()
    return LockedPolicy(policy, weights_module=policy.net)


def make_env():
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def train_step(trainer: Twin, k: int) -> None:
    with torch.no_grad():
        trainer.a.fill_(k)
        trainer.b.fill_(k)


# ------------------------------------------------------------------- unit
def test_snapshot_is_private_detached_contiguous_cpu():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    snap = snapshot_weights(model)
    live = TensorDict.from_module(model)
    assert set(snap.keys(True, True)) == set(live.keys(True, True))
    for key, value in snap.items(True, True):
        assert not value.requires_grad and value.device.type == "cpu" and value.is_contiguous()
        assert torch.equal(value, live[key])
        assert value.untyped_storage().data_ptr() != live[key].untyped_storage().data_ptr()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert not torch.equal(snap["0", "weight"], model[0].weight)  # later training does not leak in
    # a clone of params that require grad (bug 4) comes out detached
    assert not any(v.requires_grad for v in snapshot_weights(live.clone()).values(True, True))
    with pytest.raises(TypeError, match="nn.Module, a TensorDict"):
        snapshot_weights([1, 2])


def test_policy_version_map():
    versions = PolicyVersionMap(initial_train_iter=5)
    versions.record(1, 7)
    versions.record(2, 7)
    versions.record(3, 12)
    assert versions.latest_train_iter == 12
    got = versions.train_iters(torch.tensor([[0, 3], [2, 1]]))
    assert got.tolist() == [[5, 12], [7, 7]]
    with pytest.raises(KeyError, match="policy version 9 was never published"):
        versions.train_iters(torch.tensor([1, 9]))
    with pytest.raises(ValueError, match="versions must increase"):
        versions.record(3, 20)
    with pytest.raises(ValueError, match="train_iter must not decrease"):
        versions.record(4, 11)


def test_locked_policy_rejects_mismatched_weights_and_keeps_old_ones():
    policy = make_locked_twin_policy()
    good = snapshot_weights(Twin())
    policy.load_published_weights(good, version=3)
    assert policy.weights_version == 3
    with pytest.raises(KeyError, match="missing from the weights.*'b'"):
        policy.load_published_weights(TensorDict(a=torch.ones(TWIN_SIZE)), version=4)
    assert policy.weights_version == 3 and policy.policy.net.a.abs().sum() == 0
    td = policy(TensorDict(observation=torch.zeros(4)))
    assert td["policy_version"].item() == 3 and td["policy_version"].dtype == torch.int64


# ------------------------------------------------ (i) torn forwards, async
def _collect_while_training(collector, trainer, publish, publishes: int, deadline_s: float, stop_on_torn=False):
    """Train (rewrite A and B together) and publish between batches while the workers collect."""
    k = torn = frames = 0
    batches = []
    start = time.monotonic()
    for batch in collector:
        torn += int(batch["torn"].sum())
        frames += batch.numel()
        batches.append(batch)
        if k >= 5 * publishes or time.monotonic() - start > deadline_s or (stop_on_torn and torn):
            break
        for _ in range(5):
            k += 1
            train_step(trainer, k)
        publish(k)
    return torn, frames, batches, k


@pytest.mark.timeout(120)
def test_guarded_publish_never_tears_a_forward():
    trainer = Twin()
    versions = PolicyVersionMap(initial_train_iter=0)
    collector = MultiAsyncCollector(
        [make_env, make_env],
        policy_factory=make_locked_twin_policy,
        frames_per_batch=30,
        total_frames=-1,
        weight_sync_schemes={"policy": GuardedWeightSyncScheme(initial_weights=trainer)},
        track_policy_version=True,
    )
    try:
        torn, frames, batches, k = _collect_while_training(
            collector,
            trainer,
            lambda k: publish_weights(collector, trainer, 10.0, train_iter=k, version_map=versions),
            publishes=20,
            deadline_s=40,
        )
    finally:
        collector.shutdown()
    assert k >= 5 * 10, "too few publishes happened during collection"
    assert torn == 0, f"{torn} of {frames} forwards read A != B"
    data = torch.cat(batches)
    versions_seen = data["policy_version"].unique()
    assert len(versions_seen) >= 5, f"collection ran under too few weight versions: {versions_seen.tolist()}"
    # every frame is labelled with exactly the weights that produced its action
    produced_by = versions.train_iters(data["policy_version"])
    mislabelled = int((produced_by.float() != data["seen"]).sum())
    assert mislabelled == 0, f"{mislabelled} of {frames} frames carry a version that did not produce them"
    assert int(produced_by.max()) <= versions.latest_train_iter


@pytest.mark.timeout(120)
def test_naive_live_tensors_tear():
    """Canary for the torchrl bug itself (PR 4701): the plain path lets workers read live tensors.

    torchrl 0.14.1: workers alias the trainer's parameters, so forwards tear
    while the trainer trains. When this test fails (0 torn forwards), the
    installed torchrl has the fix and the snapshot guard can be retired.
    """
    trainer = Twin()
    collector = MultiAsyncCollector(
        [make_env, make_env],
        policy=trainer_policy(trainer),
        policy_factory=make_twin_policy,
        frames_per_batch=40,
        total_frames=-1,
        weight_sync_schemes={"policy": MultiProcessWeightSyncScheme()},
    )
    try:
        torn, frames, _, _ = _collect_while_training(
            collector,
            trainer,
            lambda k: collector.update_policy_weights_(),
            publishes=30,
            deadline_s=40,
            stop_on_torn=True,
        )
    finally:
        collector.shutdown()
    assert torn > 0, f"no torn forward in {frames} frames: torchrl no longer aliases the trainer's tensors"


def trainer_policy(trainer: Twin) -> TwinPolicy:
    policy = TwinPolicy()
    policy.net = trainer  # the trainer's live module
    return policy


# ---------------------------- (ii) requires-grad, (iv) versions, MCTSPolicy
def make_mcts_worker_policy():
    from torchrl.data import OneHot

    from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy

    model = _mcts_model()
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=4), OneHot(2))
    return LockedPolicy(policy, weights_module=model)


def _mcts_model():
    from torchrl_muzero.modules import MuZeroMLPModel

    return MuZeroMLPModel((4,), 2, latent_dim=16, hidden_dim=16, value_support_size=5, reward_support_size=5)


@pytest.mark.timeout(120)
def test_mcts_workers_versions_map_to_published_train_iters_and_requires_grad_publish_completes():
    torch.manual_seed(0)
    model = _mcts_model()  # the learner's model; its parameters require grad
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    versions = PolicyVersionMap(initial_train_iter=0)
    collector = MultiSyncCollector(
        [make_env, make_env],
        policy_factory=make_mcts_worker_policy,
        frames_per_batch=32,
        total_frames=-1,
        weight_sync_schemes={"policy": GuardedWeightSyncScheme(initial_weights=model, timeout_s=20.0)},
        track_policy_version=True,
    )
    train_iter = 0
    batches = iter(collector)  # one iterator: a second one loses the workers' shared buffers
    try:
        for i, batch in enumerate(batches):
            produced_by = versions.train_iters(batch["policy_version"])
            assert int(produced_by.max()) <= versions.latest_train_iter
            assert int(versions.train_iters(batch["next", "policy_version"]).max()) <= versions.latest_train_iter
            assert batch.numel() == 32 and batch["search_policy"].shape[-1] == 2
            if i == 6:
                break
            # a learner step, so the published weights really change
            loss = sum(p.square().sum() for p in model.parameters())
            optim.zero_grad()
            loss.backward()
            optim.step()
            train_iter += 1
            assert all(p.requires_grad for p in model.parameters())
            start = time.monotonic()
            if i % 2 == 0:
                # (ii) a clone of parameters that require grad: torchrl 0.14.1 hangs here
                weights = TensorDict.from_module(model).clone()
                assert any(v.requires_grad for v in weights.values(True, True))
                version = publish_weights(collector, weights, 20.0, train_iter=train_iter, version_map=versions)
            else:
                version = publish_weights(collector, model, 20.0, train_iter=train_iter, version_map=versions)
            assert time.monotonic() - start < 20
            assert version == versions.latest_version == i + 1
        # after a sync publish, the next batch runs the latest weights in both workers
        batch = next(batches)
        assert batch["policy_version"].unique().tolist() == [versions.latest_version]
        # the plain torchrl call with a requires-grad clone goes through the guarded scheme too
        collector.update_policy_weights_(TensorDict.from_module(model).clone())
    finally:
        collector.shutdown()


# ------------------------------------------------ (iii) failing workers
@pytest.mark.timeout(120)
def test_worker_failures_raise_naming_the_worker_instead_of_hanging():
    trainer = Twin()
    collector = MultiSyncCollector(
        [make_env, make_env],
        policy_factory=make_locked_twin_policy,
        frames_per_batch=8,
        total_frames=-1,
        weight_sync_schemes={"policy": GuardedWeightSyncScheme(initial_weights=trainer)},
    )
    batches = iter(collector)
    try:
        next(batches)
        # 1. mismatched keys: every worker fails to apply -> clear error, fast
        start = time.monotonic()
        with pytest.raises(WeightPublishError, match=r"worker 0 failed to apply.*missing from the weights") as err:
            publish_weights(collector, TensorDict(a=torch.ones(TWIN_SIZE)), timeout_s=10.0)
        assert "worker 1 failed to apply" in str(err.value)
        assert time.monotonic() - start < 10
        # ... and a valid update still goes through afterwards
        train_step(trainer, 1)
        assert publish_weights(collector, trainer, timeout_s=10.0) == 2

        # 2. a worker that does not answer (stopped): bounded by timeout_s, names it
        pid0 = collector.procs[0].pid
        os.kill(pid0, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(WeightPublishError, match=r"worker\(s\) \[0\] did not acknowledge .* 2.0s"):
                publish_weights(collector, trainer, timeout_s=2.0)
            assert time.monotonic() - start < 8
        finally:
            os.kill(pid0, signal.SIGCONT)
        # the late answer to the timed-out publish is skipped, not taken for this one
        train_step(trainer, 2)
        assert publish_weights(collector, trainer, timeout_s=10.0) == 4
        batch = next(batches)
        assert batch["seen"].eq(2).all()

        # 3. a dead worker: reported as dead, not waited for
        os.kill(collector.procs[1].pid, signal.SIGKILL)
        collector.procs[1].join(10)
        start = time.monotonic()
        with pytest.raises(WeightPublishError, match=r"worker 1 died"):
            publish_weights(collector, trainer, timeout_s=30.0)
        assert time.monotonic() - start < 10
    finally:
        collector.shutdown(raise_on_error=False)


@pytest.mark.timeout(120)
def test_deferred_publish_returns_at_once_and_wait_applied_gives_the_guarantee():
    """``publish_weights(wait=False)`` queues and returns; ``wait_applied`` waits, bounded, naming a silent worker."""
    trainer = Twin()
    scheme = GuardedWeightSyncScheme(initial_weights=trainer)
    collector = MultiSyncCollector(
        [make_env], policy_factory=make_locked_twin_policy, frames_per_batch=8, total_frames=-1,
        weight_sync_schemes={"policy": scheme},
    )
    batches = iter(collector)
    try:
        next(batches)
        # a stopped worker cannot acknowledge: a waiting publish would time out, a deferred one returns
        pid = collector.procs[0].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            train_step(trainer, 1)
            assert publish_weights(collector, trainer, timeout_s=2.0, wait=False) == 1
            assert scheme.pending_version == 1 and scheme.version == 0
            with pytest.raises(WeightPublishError, match=r"worker\(s\) \[0\] did not acknowledge weights version 1"):
                scheme.wait_applied(timeout_s=1.0)
            assert scheme.pending_version is None
        finally:
            os.kill(pid, signal.SIGCONT)
        # a publish first waits for the one before it (the staging buffer is reused)
        train_step(trainer, 2)
        assert publish_weights(collector, trainer, timeout_s=10.0, wait=False) == 2
        train_step(trainer, 3)
        assert publish_weights(collector, trainer, timeout_s=10.0, wait=False) == 3
        assert scheme.version == 2 and scheme.pending_version == 3
        scheme.wait_applied()
        assert scheme.version == 3 and scheme.pending_version is None
        scheme.wait_applied()  # nothing pending: returns at once
        assert next(batches)["seen"].eq(3).all()
        with pytest.raises(ValueError, match=r"publish_weights\(wait=False\) needs a GuardedWeightSyncScheme"):
            plain = type("C", (), {"_weight_sync_schemes": {"policy": MultiProcessWeightSyncScheme()}})()
            publish_weights(plain, trainer, wait=False)
    finally:
        collector.shutdown(raise_on_error=False)


def test_find_locked_policy_through_wrappers():
    locked = make_locked_twin_policy()

    class Wrapper(TensorDictModuleBase):
        in_keys, out_keys = locked.in_keys, locked.out_keys

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    assert find_locked_policy(locked) is locked
    assert find_locked_policy(Wrapper(locked)) is locked
    with pytest.raises(TypeError, match="contains 0"):
        find_locked_policy(make_twin_policy())
    with pytest.raises(TypeError, match="contains 2"):
        find_locked_policy(nn.ModuleList([locked, make_locked_twin_policy()]))


def test_worker_policy_must_be_locked():
    with pytest.raises(TypeError, match="must be, or contain exactly one, LockedPolicy"):
        collector = MultiSyncCollector(
            [make_env],
            policy_factory=make_twin_policy,
            frames_per_batch=8,
            total_frames=-1,
            weight_sync_schemes={"policy": GuardedWeightSyncScheme(initial_weights=Twin())},
        )
        collector.shutdown()


# ------------------------------------------------------------- bug 8: exit
_SCHEME_LEFT_TO_EXIT = """
import multiprocessing as mp
from torchrl.weight_update import MultiProcessWeightSyncScheme
from torchrl_muzero.torchrl_guards import GuardedWeightSyncScheme
scheme = {cls}()
scheme._instruction_queues = {{0: mp.get_context("spawn").Queue()}}  # what init_on_sender leaves
kept = [scheme]
kept.append(kept)  # a cycle: only the interpreter's exit collects it
print("script done", flush=True)
"""


def _run_scheme_left_to_exit(cls: str, exit_within_s: float, start_within_s: float = 120.0):
    """``(returncode or None if it did not exit, stdout)``: the script's exit is awaited for
    ``exit_within_s`` after it printed "script done" (the imports before that take seconds, many more
    on a loaded machine, and say nothing about the exit), then it is killed."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _SCHEME_LEFT_TO_EXIT.format(cls=cls)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        timer = threading.Timer(start_within_s, proc.kill)  # a script that never gets to print
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if "script done" in line:
                    break
        finally:
            timer.cancel()
        try:
            return proc.wait(timeout=exit_within_s), "".join(lines)
        except subprocess.TimeoutExpired:
            return None, "".join(lines)
    finally:
        proc.kill()
        proc.wait()


def test_canary_scheme_left_to_exit_hangs_the_process():
    # plain torchrl: __del__ -> shutdown -> queue.put starts a thread while the interpreter
    # finalizes, and the process never exits (it is killed 8 s after its last line; the guarded
    # scheme's script below exits within a second of it)
    rc, out = _run_scheme_left_to_exit("MultiProcessWeightSyncScheme", exit_within_s=8)
    assert "script done" in out
    assert rc is None, "torchrl's scheme no longer hangs at exit: guard 8 (GuardedWeightSyncScheme.__del__) can go"


def test_guarded_scheme_left_to_exit_lets_the_process_exit():
    rc, out = _run_scheme_left_to_exit("GuardedWeightSyncScheme", exit_within_s=60)
    assert rc == 0 and "script done" in out
