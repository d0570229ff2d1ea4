"""Learner updates/s for algo=unizero on CartPole at batch 64, beside algo=muzero on the same data.

One ``Learner.step()`` exactly as the trainers build it (the shipped CartPole config plus ``algo=``,
``optim.batch_size=64``, CPU): sample with the value bootstrap by the target model, the algorithm's
loss, backward, clipped AdamW step, priorities back; on a ``GameBuffer`` filled with 10,240 synthetic
CartPole-shaped transitions (episodes of 20-200 steps). One torch thread (benchmarks/conftest.py) and
on every core (``all_cores``). muzero is the baseline measured in the same run: the ratio is the figure.

Run: python -m pytest benchmarks/test_unizero_learner_bench.py --benchmark-only
     --benchmark-columns=mean,median,rounds -s
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.trainers import load_config
from torchrl_muzero.trainers.builders import build_buffer, build_model
from torchrl_muzero.trainers.hydra_entry import compose_config
from torchrl_muzero.trainers.learner import Learner

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
N_ENVS, T, ROLLOUTS = 8, 32, 40  # 10,240 transitions
_LEARNERS: dict = {}


def _rollouts(seed: int = 0):
    """``ROLLOUTS`` batches ``[N_ENVS, T]`` of CartPole-shaped steps, episodes of 20-200 steps."""
    g = torch.Generator().manual_seed(seed)
    traj = torch.arange(N_ENVS)
    next_traj, t = N_ENVS, torch.zeros(N_ENVS, dtype=torch.long)
    length = torch.randint(20, 201, (N_ENVS,), generator=g)
    obs = torch.randn(N_ENVS, 4, generator=g)
    for _ in range(ROLLOUTS):
        o = torch.empty(N_ENVS, T, 4)
        nxt, tr, done = torch.empty_like(o), torch.empty(N_ENVS, T, dtype=torch.long), torch.zeros(N_ENVS, T, 1,
                                                                                                 dtype=torch.bool)
        for s in range(T):
            o[:, s], tr[:, s] = obs, traj
            obs = obs + 0.1 * torch.randn(N_ENVS, 4, generator=g)
            nxt[:, s] = obs
            t += 1
            d = t >= length
            done[:, s, 0] = d
            if bool(d.any()):
                idx = d.nonzero().squeeze(-1)
                obs[idx] = torch.randn(idx.numel(), 4, generator=g)
                t[idx] = 0
                length[idx] = torch.randint(20, 201, (idx.numel(),), generator=g)
                traj[idx] = next_traj + torch.arange(idx.numel())
                next_traj += idx.numel()
        yield TensorDict({
            "observation": o, ("next", "observation"): nxt,
            "action": torch.randint(2, (N_ENVS, T), generator=g),
            "search_policy": torch.softmax(torch.randn(N_ENVS, T, 2, generator=g), -1),
            "root_value": torch.randn(N_ENVS, T, generator=g),
            "policy_version": torch.zeros(N_ENVS, T, dtype=torch.long),
            ("collector", "traj_ids"): tr,
            ("next", "reward"): torch.ones(N_ENVS, T, 1),
            ("next", "done"): done, ("next", "terminated"): done, ("next", "truncated"): torch.zeros_like(done),
        }, [N_ENVS, T])


def _learner(algo: str) -> Learner:
    if algo not in _LEARNERS:
        cfg = load_config(compose_config(CONFIG_DIR, [f"algo={algo}", "optim.batch_size=64", "device=cpu"]))
        torch.manual_seed(0)
        buffer = build_buffer(cfg)
        for batch in _rollouts():
            buffer.extend(batch)
        _LEARNERS[algo] = Learner(build_model(cfg, (4,), 2), buffer, cfg, torch.device("cpu"))
    return _LEARNERS[algo]


@pytest.mark.parametrize("threads", ["1", "all"])
@pytest.mark.parametrize("algo", ["unizero", "muzero"])
def test_learner_step_batch64(benchmark, algo, threads, request):
    if threads == "all":
        request.getfixturevalue("all_cores")
    learner = _learner(algo)
    metrics = benchmark.pedantic(learner.step, rounds=10, iterations=1, warmup_rounds=2)
    assert metrics["loss"] == metrics["loss"]
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(updates_per_s=round(1 / median, 2), torch_threads=torch.get_num_threads())
    print(f"\n{algo} Learner.step batch 64, {torch.get_num_threads()} thread(s): {1 / median:.1f} updates/s")
