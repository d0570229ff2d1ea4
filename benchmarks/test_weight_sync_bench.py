"""Weight publishing to collector workers: an ~8M-parameter MLP to 2 workers.

``test_publish_guarded`` times the path the trainers use,
``torchrl_guards.publish_weights`` with ``GuardedWeightSyncScheme``: a private
snapshot of the trainer's weights (one shared buffer), sent to both workers,
copied into each worker's own parameters under the policy lock, acknowledged.
``test_snapshot_only`` times the snapshot alone. The two ``test_torchrl_plain_*``
cases time torchrl 0.14.1's own ``MultiProcessWeightSyncScheme`` for
comparison: ``live`` is ``update_policy_weights_()`` from the trainer's policy
(the workers alias the trainer's tensors: cheap, but unsafe), ``copy`` sends a
fresh detached copy each time (what a safe publish costs there).

Workers are idle between batches of a ``MultiSyncCollector`` while timed.

Run: python -m pytest benchmarks/test_weight_sync_bench.py --benchmark-only
     --benchmark-columns=mean,median,min,max,rounds
"""
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.collectors import MultiSyncCollector
from torchrl.weight_update import MultiProcessWeightSyncScheme

from torchrl_muzero.torchrl_guards import (
    GuardedWeightSyncScheme,
    LockedPolicy,
    publish_weights,
    snapshot_weights,
)

HIDDEN, LAYERS = 1024, 8
ROUNDS = 20


class BigMLPPolicy(TensorDictModuleBase):
    in_keys = ["observation"]
    out_keys = ["action"]

    def __init__(self):
        super().__init__()
        layers = [nn.Linear(4, HIDDEN)] + [nn.Linear(HIDDEN, HIDDEN) for _ in range(LAYERS)]
        self.net = nn.Sequential(*layers, nn.Linear(HIDDEN, 2))

    def forward(self, td):
        logits = self.net(td["observation"])
        td["action"] = torch.nn.functional.one_hot(logits.argmax(-1), 2)
        return td


def make_policy():
    return BigMLPPolicy()


def make_locked_policy():
    policy = BigMLPPolicy()
    return LockedPolicy(policy, weights_module=policy.net)


def make_env():
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def _num_params(module):
    return sum(p.numel() for p in module.parameters())


def _bump(model):
    with torch.no_grad():
        model[0].bias.add_(1.0)


@pytest.fixture(scope="module")
def trainer_policy():
    torch.manual_seed(0)
    policy = BigMLPPolicy()
    n = _num_params(policy.net)
    assert 7_000_000 < n < 9_000_000, n
    return policy


def _collector(**kwargs):
    collector = MultiSyncCollector([make_env, make_env], frames_per_batch=4, total_frames=-1, **kwargs)
    batches = iter(collector)
    next(batches)  # workers up and idle
    return collector, batches


def test_snapshot_only(benchmark, trainer_policy):
    model = trainer_policy.net
    benchmark.pedantic(lambda: snapshot_weights(model), rounds=ROUNDS, iterations=1, warmup_rounds=2)
    benchmark.extra_info["params"] = _num_params(model)


def test_publish_guarded(benchmark, trainer_policy):
    model = trainer_policy.net
    collector, batches = _collector(
        policy_factory=make_locked_policy,
        weight_sync_schemes={"policy": GuardedWeightSyncScheme(initial_weights=model)},
    )
    try:
        def publish():
            _bump(model)
            publish_weights(collector, model, timeout_s=60.0)

        benchmark.pedantic(publish, rounds=ROUNDS, iterations=1, warmup_rounds=2)
        next(batches)  # the workers still collect after the publishes
    finally:
        collector.shutdown()
    benchmark.extra_info["params"] = _num_params(model)
    benchmark.extra_info["workers"] = 2


@pytest.mark.parametrize("mode", ["live", "copy"])
def test_torchrl_plain(benchmark, trainer_policy, mode):
    collector, batches = _collector(
        policy=trainer_policy,
        policy_factory=make_policy,
        weight_sync_schemes={"policy": MultiProcessWeightSyncScheme()},
    )
    try:
        def publish():
            _bump(trainer_policy.net)
            if mode == "live":
                collector.update_policy_weights_()
            else:
                collector.update_policy_weights_(TensorDict.from_module(trainer_policy).data.clone())

        benchmark.pedantic(publish, rounds=ROUNDS, iterations=1, warmup_rounds=2)
        next(batches)
    finally:
        collector.shutdown()
    benchmark.extra_info["params"] = _num_params(trainer_policy.net)
    benchmark.extra_info["workers"] = 2
