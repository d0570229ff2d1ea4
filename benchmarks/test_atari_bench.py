"""Pong (Atari) throughput and memory on CPU: pipeline, learner, replay buffer.

Three groups, all with the shipped Pong settings (``env=Pong``: ``ALE/Pong-v5``,
grayscale 96x96 stacked by 4, 6 actions, ``MuZeroResNetModel`` with 64
channels, 1 block, strided stem, 601-bin value and reward supports,
consistency loss on, K = 5, td_steps = 5) except where a case says otherwise:

* ``test_pong_pipeline``: real Pong, 50-simulation search with the default
  ResNet in the collector, ``SyncTrainer`` vs ``AsyncTrainer`` (one or two
  collector workers) at the same replay ratio, evaluation off, for a fixed
  number of env steps, torch on every core as a user's script runs (the
  async learner takes the cores its collectors leave, per update). What a
  2-core CPU cannot afford is changed and listed in ``PIPELINE_OVERRIDES``
  (learner batch 8, 80 frames per collect, training start, buffer capacity);
  ``CASES`` are replay ratios: the shipped 0.25 (learner-bound), 1/24 (each
  stage costs about the same on one core), 1/32 and collection alone; the
  collector's 8 envs, 50-simulation search and default ResNet are the
  shipped ones. A one-thread sync is run in two cases to show how each
  stage scales from one to two threads. Reports env steps/s and updates/s
  over ``run()`` (trainer construction excluded) and in the steady state
  (from the first update to the first update after the last batch: no
  start-up, no cold start, no drained budget), the replay ratio done, policy
  lag, the learner's busy fraction and its mean thread count.
* ``test_learner_step`` / ``test_learner_sample`` / ``test_loss_forward_backward``:
  one ``Learner.step()`` (sample with value reanalyze by the target model,
  loss, backward, clipped AdamW step, priorities back) on a ``GameBuffer``
  filled with synthetic uint8 frames; the sample alone; the loss
  forward + backward alone on a pre-drawn batch. Batch 256 (shipped) and 32,
  one torch thread (``benchmarks/conftest.py``); ``test_learner_step_batch8``:
  the pipeline cases' batch on one thread and on every core.
* ``test_atari_buffer_memory_100k``: ``GameBuffer(100_000, frame_stack=4)``
  filled with 100,000 synthetic 96x96 transitions (episodes of 200-400 steps);
  ``nbytes()`` per stored transition vs one frame and vs a naive 4-stack.

Run (figures in docs/performance_pipeline.md, "Pong", and docs/performance_memory.md, "Atari: 100k
transitions"; about 40 minutes on 2 cores):
    python -m pytest benchmarks/test_atari_bench.py --benchmark-only \
        --benchmark-columns=mean,median,min,max,rounds -s
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pipeline_harness import build_trainer, run_pipeline_benchmark
from tensordict import TensorDict

from torchrl_muzero.data import GameBuffer
from torchrl_muzero.trainers.builders import build_buffer, build_model
from torchrl_muzero.trainers.hydra_entry import compose_config
from torchrl_muzero.trainers.learner import Learner

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
OBS_SHAPE, NUM_ACTIONS, SIDE = (4, 96, 96), 6, 96  # Pong: 4 stacked grayscale 96x96 frames, 6 actions
FRAME_BYTES = SIDE * SIDE  # one uint8 96x96 frame: 9,216 bytes


def _pong_config(*overrides):
    """The shipped ``env=Pong`` config (hydra composition of the real script's), with overrides."""
    return compose_config(CONFIG_DIR, ["env=Pong", *overrides])


# ---------------------------------------------------------------------------- synthetic Pong-like data
class SyntheticAtari:
    """``n_envs`` fake Atari games stepped like a torchrl collector: rollouts ``[n_envs, T]``.

    Random uint8 96x96 frames, stacked by 4 with ``CatFrames``' ``"same"``
    padding at each reset; episodes of ``min_len..max_len`` steps, half
    terminated, half truncated; a fresh trajectory id at every reset.
    """

    def __init__(self, n_envs: int = 8, min_len: int = 200, max_len: int = 400, seed: int = 0) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.n, self.min_len, self.max_len = n_envs, min_len, max_len
        self.traj = torch.arange(n_envs)
        self.next_traj = n_envs
        self.t = torch.zeros(n_envs, dtype=torch.long)
        self.length = self._lengths(n_envs)
        self.stack = self._frames(n_envs).expand(n_envs, 4, SIDE, SIDE).clone()

    def _lengths(self, k: int) -> torch.Tensor:
        return torch.randint(self.min_len, self.max_len + 1, (k,), generator=self.g)

    def _frames(self, k: int) -> torch.Tensor:
        return torch.randint(0, 256, (k, 1, SIDE, SIDE), dtype=torch.uint8, generator=self.g)

    def rollout(self, T: int) -> TensorDict:
        n = self.n
        obs = torch.empty(n, T, *OBS_SHAPE, dtype=torch.uint8)
        nxt = torch.empty_like(obs)
        traj = torch.empty(n, T, dtype=torch.long)
        done = torch.zeros(n, T, 1, dtype=torch.bool)
        term = torch.zeros(n, T, 1, dtype=torch.bool)
        for s in range(T):
            obs[:, s] = self.stack
            traj[:, s] = self.traj
            new = torch.cat([self.stack[:, 1:], self._frames(n)], 1)
            nxt[:, s] = new
            self.t += 1
            d = self.t >= self.length
            done[:, s, 0] = d
            term[:, s, 0] = d & (torch.rand(n, generator=self.g) < 0.5)
            self.stack = new
            if bool(d.any()):
                idx = d.nonzero().squeeze(-1)
                k = idx.numel()
                self.stack[idx] = self._frames(k).expand(k, 4, SIDE, SIDE)
                self.t[idx] = 0
                self.length[idx] = self._lengths(k)
                self.traj[idx] = self.next_traj + torch.arange(k)
                self.next_traj += k
        return TensorDict({
            "observation": obs,
            ("next", "observation"): nxt,
            "action": torch.randint(NUM_ACTIONS, (n, T), generator=self.g),
            "search_policy": torch.softmax(torch.randn(n, T, NUM_ACTIONS, generator=self.g), -1),
            "root_value": torch.randn(n, T, generator=self.g),
            "policy_version": torch.zeros(n, T, dtype=torch.long),
            ("collector", "traj_ids"): traj,
            ("next", "reward"): torch.randint(-1, 2, (n, T, 1), generator=self.g).float(),
            ("next", "done"): done,
            ("next", "terminated"): term,
            ("next", "truncated"): done & ~term,
        }, [n, T])


# ---------------------------------------------------------------------------- a. pipeline
# What a 2-core CPU cannot afford, changed from env=Pong for every pipeline case (the collector's
# 8 envs, 50-simulation search and default ResNet are the shipped ones):
PIPELINE_OVERRIDES = [
    "device=cpu",
    "optim.batch_size=8",                      # shipped 256: ~20 s per update on one CPU thread
    "train.frames_per_batch=80",               # shipped 400: 10 search steps of the 8 envs per collect, so
                                               # that async's lead (2 queued batches) stays small in short runs
    "train.train_start_after_envsteps=400",    # shipped 2,000
    "buffer.capacity=20000",                   # shipped 1,000,000 (~9 GB); never full in these runs
    # evaluation off
    "eval.interval=1000000", "eval.num_episodes=1", "async_pipeline.num_evaluator_actors=0",
    "train.stop_return=0", "train.max_wall_time_s=0",
    "logger.progress_bar=false", "logger.backend=none",
]
CASES = {
    # the shipped replay ratio: the learner is the bottleneck on CPU
    "pong-rr0.25": ["train.replay_ratio=0.25", "train.total_env_steps=1200"],
    # collection and learning cost about the same when each has one core of this machine (one
    # update, batch 8, ~0.45 s on one thread; one env step of the 50-simulation collector ~19 ms)
    "pong-rr0.042": ["train.replay_ratio=0.041666666666666664", "train.total_env_steps=4800"],
    # collection costs more than learning
    "pong-rr0.031": ["train.replay_ratio=0.03125", "train.total_env_steps=3600"],
    # no updates at all: what collection alone sustains (the ceiling of env steps/s)
    "pong-collect-only": ["train.replay_ratio=0.0", "train.total_env_steps=2400"],
}
PIPELINES = {
    "sync": [],  # torch on every core, as the script runs
    "async": [],  # one collector worker (the default); the learner on the cores the collector leaves
    "async-2collectors": ["async_pipeline.num_collector_actors=2"],
    "sync-1thread": [],  # sync on one torch thread: how each stage scales from 1 to 2 threads
}


# a second collector only waits on back-pressure in the learner-bound case; the one-thread sync
# is run where it measures something (the balanced case, collection alone)
COMBOS = [(c, p) for c in CASES for p in PIPELINES
          if (c, p) != ("pong-rr0.25", "async-2collectors")
          and (p != "sync-1thread" or c in ("pong-rr0.042", "pong-collect-only"))]


@pytest.mark.parametrize("case,pipeline", COMBOS)
def test_pong_pipeline(benchmark, tmp_path, case, pipeline, all_cores):
    cfg = _pong_config(f"run_dir={tmp_path}", *PIPELINE_OVERRIDES, *CASES[case], *PIPELINES[pipeline])
    trainer = build_trainer(pipeline, cfg, threads=1 if pipeline == "sync-1thread" else None)
    info = run_pipeline_benchmark(benchmark, trainer)
    print(f"\n{pipeline} {case}: {info}")


# ---------------------------------------------------------------------------- b. learner
LEARNER_TRANSITIONS = 8 * 32 * 40  # 10,240 synthetic transitions in the learner's buffer
_LEARNERS: dict = {}


def _learner(batch_size: int) -> Learner:
    """A Learner exactly as the trainers build it for Pong (CPU), its buffer filled with synthetic frames."""
    if batch_size not in _LEARNERS:
        cfg = _pong_config(f"optim.batch_size={batch_size}", "buffer.capacity=12000", "device=cpu")
        torch.manual_seed(0)
        model = build_model(cfg, OBS_SHAPE, NUM_ACTIONS)
        buffer = build_buffer(cfg)
        stream = SyntheticAtari(seed=1)
        for _ in range(LEARNER_TRANSITIONS // (8 * 32)):
            buffer.extend(stream.rollout(32))
        _LEARNERS[batch_size] = Learner(model, buffer, cfg, torch.device("cpu"))
    return _LEARNERS[batch_size]


_LEARNER_ROUNDS = {256: 3, 32: 10}


@pytest.mark.parametrize("batch_size", [32, 256])
def test_learner_step(benchmark, batch_size):
    """One ``Learner.step()``: sample + value reanalyze (target model) + loss + backward + AdamW + priorities."""
    learner = _learner(batch_size)
    metrics = benchmark.pedantic(learner.step, rounds=_LEARNER_ROUNDS[batch_size], iterations=1, warmup_rounds=1)
    assert metrics["loss"] == metrics["loss"]
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(updates_per_s=round(1 / median, 3), samples_per_s=round(batch_size / median, 1),
                                transitions=len(learner.buffer), torch_threads=torch.get_num_threads())
    print(f"\nLearner.step batch {batch_size}: median {median:.3f} s = {1 / median:.3f} updates/s")


@pytest.mark.parametrize("threads", ["1", "all"])
def test_learner_step_batch8(benchmark, threads, all_cores):
    """``Learner.step()`` at the pipeline benchmark's batch (8) on one thread and on every core."""
    n = 1 if threads == "1" else all_cores
    torch.set_num_threads(n)
    learner = _learner(8)
    metrics = benchmark.pedantic(learner.step, rounds=10, iterations=1, warmup_rounds=2)
    assert metrics["loss"] == metrics["loss"]
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(updates_per_s=round(1 / median, 3), torch_threads=n)
    print(f"\nLearner.step batch 8, {n} thread(s): median {median:.3f} s")


@pytest.mark.parametrize("batch_size", [32, 256])
def test_learner_sample(benchmark, batch_size):
    """``GameBuffer.sample`` as the learner calls it: targets bootstrapped by the target model."""
    learner = _learner(batch_size)
    learner.model.train()

    def draw():
        return learner.buffer.sample(batch_size, model=learner.model, target_model=learner.target_model)

    batch = benchmark.pedantic(draw, rounds=_LEARNER_ROUNDS[batch_size], iterations=1, warmup_rounds=1)
    assert batch.batch_size == (batch_size, learner.cfg.buffer.num_unroll_steps + 1)
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(samples_per_s=round(batch_size / median, 1))
    print(f"\nsample batch {batch_size}: median {median:.3f} s")


@pytest.mark.parametrize("batch_size", [32, 256])
def test_loss_forward_backward(benchmark, batch_size):
    """``MuZeroLoss`` forward + backward alone (no sampling, no optimizer step) on a pre-drawn batch."""
    learner = _learner(batch_size)
    learner.model.train()
    batch = learner.buffer.sample(batch_size, model=learner.model, target_model=learner.target_model)

    def fwd_bwd():
        learner.optimizer.zero_grad(set_to_none=True)
        out = learner.loss_module(batch)
        loss = sum(v for k, v in out.items() if k.startswith("loss_"))
        loss.backward()
        return float(loss.detach())

    loss = benchmark.pedantic(fwd_bwd, rounds=_LEARNER_ROUNDS[batch_size], iterations=1, warmup_rounds=1)
    assert loss == loss
    median = benchmark.stats.stats.median
    benchmark.extra_info.update(per_s=round(1 / median, 3))
    print(f"\nloss forward+backward batch {batch_size}: median {median:.3f} s")


# ---------------------------------------------------------------------------- c. memory
def test_atari_buffer_memory_100k(benchmark):
    """100,000 synthetic 96x96 transitions written to ``GameBuffer(100_000, frame_stack=4)``."""
    total, T, capacity = 100_000, 25, 100_000
    stream = SyntheticAtari(seed=2)
    buf = GameBuffer(capacity, num_unroll_steps=5, td_steps=5, frame_stack=4, seed=0)

    def fill():
        for _ in range(total // (stream.n * T)):
            buf.extend(stream.rollout(T))

    benchmark.pedantic(fill, rounds=1, iterations=1)
    nbytes = buf.nbytes()
    per = nbytes / len(buf)
    naive = 4 * FRAME_BYTES
    benchmark.extra_info.update(nbytes=nbytes, transitions=len(buf), rows=buf.num_rows,
                                bytes_per_transition=round(per, 1), frames_per_transition=round(per / FRAME_BYTES, 4),
                                vs_naive_4stack=round(per / naive, 4))
    print(f"\nGameBuffer(capacity={capacity}, frame_stack=4) after {total} transitions written: "
          f"{nbytes:,} bytes ({nbytes / 2**30:.3f} GiB), {len(buf)} transitions in {buf.num_rows} rows; "
          f"{per:,.0f} bytes per transition = {per / FRAME_BYTES:.4f} x one 96x96 frame ({FRAME_BYTES}) "
          f"= {per / naive:.4f} x a naive 4-stack ({naive}); naive obs + next obs stacks: {2 * naive}")
    assert per <= 1.05 * FRAME_BYTES
