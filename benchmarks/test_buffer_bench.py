"""GameBuffer speed and size.

``test_sample``: one ``GameBuffer.sample(256)`` with its targets (K = 5,
td_steps = 5): priority draw, trajectory walk, frame-stack rebuild, n-step
value targets bootstrapped by one batched target-model call over every
bootstrap position (value reanalyze), and with ``reanalyze_ratio=1`` one
batched 50-simulation search over every unroll position of every sample
(policy reanalyze: up to 256 x 6 = 1536 roots). Two models:

* CartPole size: ``MuZeroMLPModel((4,), 2)``, latent 64, hidden 64,
  601-bin value / reward supports;
* Atari size: ``MuZeroResNetModel((4, 84, 84), 6)`` (defaults: 64 channels,
  strided stem, 601-bin supports), uint8 frames stacked by 4.

``test_sample_buffer_only`` times the same draw with no model (stored search
values bootstrap): what the buffer itself costs. ``test_extend`` times
storing one collector batch ``[8, 32]``; ``test_atari_bytes_per_transition``
reports the bytes a full Atari buffer holds per stored transition.

Run: python -m pytest benchmarks/test_buffer_bench.py --benchmark-only
     --benchmark-columns=mean,median,rounds
(figures in docs/performance_memory.md, "Replay buffer (GameBuffer)").
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.data import GameBuffer
from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.modules import MuZeroMLPModel, MuZeroResNetModel

B, K, TD = 256, 5, 5
N_ENV, T_CHUNK = 8, 32


class _Stream:
    """``N_ENV`` synthetic envs stepped like a torchrl collector: rollouts ``[N_ENV, T_CHUNK]``.

    Episodes of 50..400 steps, terminated or truncated at random; images are
    stacked by 4 with CatFrames' ``"same"`` padding at each reset.
    """

    def __init__(self, kind: str, seed: int = 0) -> None:
        self.kind = kind
        self.g = torch.Generator().manual_seed(seed)
        self.A = 2 if kind == "cartpole" else 6
        self.n_stack = 1 if kind == "cartpole" else 4
        self.next_traj = 0
        self.envs = [self._reset() for _ in range(N_ENV)]

    def _frame(self) -> torch.Tensor:
        if self.kind == "cartpole":
            return torch.randn(4, generator=self.g)
        return torch.randint(0, 256, (1, 84, 84), dtype=torch.uint8, generator=self.g)

    def _reset(self) -> dict:
        self.next_traj += 1
        f0 = self._frame()
        return {"traj": self.next_traj, "t": 0, "len": int(torch.randint(50, 400, (), generator=self.g)),
                "frames": [f0] * self.n_stack}

    def _obs(self, frames) -> torch.Tensor:
        return frames[0] if self.n_stack == 1 else torch.cat(frames, -3)

    def rollout(self) -> TensorDict:
        rows = []
        for i in range(N_ENV):
            env_rows = []
            for _ in range(T_CHUNK):
                env = self.envs[i]
                nxt = env["frames"][1:] + [self._frame()] if self.n_stack > 1 else [self._frame()]
                done = env["t"] + 1 >= env["len"]
                term = done and bool(torch.rand((), generator=self.g) < 0.5)
                env_rows.append({
                    "observation": self._obs(env["frames"]),
                    "next_observation": self._obs(nxt),
                    "traj": env["traj"], "done": done, "terminated": term, "truncated": done and not term,
                })
                if done:
                    self.envs[i] = self._reset()
                else:
                    env["frames"], env["t"] = nxt, env["t"] + 1
            rows.append(env_rows)
        n = N_ENV * T_CHUNK
        flat = [r for env_rows in rows for r in env_rows]

        def col(name, dtype=None):
            return torch.as_tensor([r[name] for r in flat], dtype=dtype).view(N_ENV, T_CHUNK, 1)

        return TensorDict({
            "observation": torch.stack([r["observation"] for r in flat]).view(N_ENV, T_CHUNK, *flat[0]["observation"].shape),
            ("next", "observation"): torch.stack([r["next_observation"] for r in flat]).view(
                N_ENV, T_CHUNK, *flat[0]["observation"].shape),
            "action": torch.randint(self.A, (N_ENV, T_CHUNK), generator=self.g),
            "search_policy": torch.softmax(torch.randn(N_ENV, T_CHUNK, self.A, generator=self.g), -1),
            "root_value": torch.randn(N_ENV, T_CHUNK, generator=self.g),
            "policy_version": torch.zeros(N_ENV, T_CHUNK, dtype=torch.long),
            ("collector", "traj_ids"): col("traj", torch.long).squeeze(-1),
            ("next", "reward"): torch.randn(n, 1, generator=self.g).view(N_ENV, T_CHUNK, 1),
            ("next", "done"): col("done", torch.bool),
            ("next", "terminated"): col("terminated", torch.bool),
            ("next", "truncated"): col("truncated", torch.bool),
        }, [N_ENV, T_CHUNK])


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "cartpole":
        return MuZeroMLPModel((4,), 2, latent_dim=64, hidden_dim=64, value_support_size=300,
                              reward_support_size=300, zero_init_heads=False).eval()
    return MuZeroResNetModel((4, 84, 84), 6, zero_init_heads=False).eval()


_SIZES = {"cartpole": (100_000, 80), "atari": (12_000, 40)}  # capacity, rollouts of 256 transitions
_CACHE: dict = {}


def _filled(kind: str) -> GameBuffer:
    if kind not in _CACHE:
        capacity, n_rollouts = _SIZES[kind]
        buf = GameBuffer(capacity, num_unroll_steps=K, td_steps=TD, discount=0.997,
                         frame_stack=1 if kind == "cartpole" else 4, seed=0)
        stream = _Stream(kind)
        for _ in range(n_rollouts):
            buf.extend(stream.rollout())
        _CACHE[kind] = buf
    return _CACHE[kind]


_ROUNDS = {("cartpole", 0.0): 20, ("cartpole", 1.0): 4, ("atari", 0.0): 3, ("atari", 1.0): 1}


@pytest.mark.parametrize("reanalyze_ratio", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["cartpole", "atari"])
def test_sample(benchmark, kind, reanalyze_ratio):
    buf = _filled(kind)
    model = _model(kind)
    buf.reanalyze_ratio = reanalyze_ratio
    buf.mcts_config = MCTSConfig(num_simulations=50)
    try:
        buf.sample(B, model=model, target_model=model) if kind == "cartpole" else None  # warm-up
        out = benchmark.pedantic(lambda: buf.sample(B, model=model, target_model=model),
                                 rounds=_ROUNDS[(kind, reanalyze_ratio)], iterations=1)
    finally:
        buf.reanalyze_ratio = 0.0
    assert out.batch_size == (B, K + 1)
    benchmark.extra_info["transitions"] = len(buf)
    benchmark.extra_info["samples_per_s"] = B / benchmark.stats.stats.mean


@pytest.mark.parametrize("kind", ["cartpole", "atari"])
def test_sample_buffer_only(benchmark, kind):
    buf = _filled(kind)
    buf.sample(B)
    out = benchmark.pedantic(lambda: buf.sample(B), rounds=20, iterations=1)
    assert out.batch_size == (B, K + 1)
    benchmark.extra_info["samples_per_s"] = B / benchmark.stats.stats.mean


@pytest.mark.parametrize("kind", ["cartpole", "atari"])
def test_extend(benchmark, kind):
    capacity = _SIZES[kind][0]
    buf = GameBuffer(capacity, num_unroll_steps=K, td_steps=TD, frame_stack=1 if kind == "cartpole" else 4, seed=0)
    stream = _Stream(kind, seed=1)
    rollouts = [stream.rollout() for _ in range(10)]
    it = iter(rollouts)
    benchmark.pedantic(lambda: buf.extend(next(it)), rounds=10, iterations=1)
    benchmark.extra_info["transitions_per_s"] = N_ENV * T_CHUNK / benchmark.stats.stats.mean


def test_atari_bytes_per_transition(benchmark):
    """A full Atari buffer: bytes held (frames, payload, links, trees) per stored transition."""
    stream = _Stream("atari", seed=2)
    rollouts = [stream.rollout() for _ in range(12)]
    capacity = 3000
    buf = GameBuffer(capacity, num_unroll_steps=K, td_steps=TD, frame_stack=4, seed=0)

    def fill():
        for r in rollouts:
            buf.extend(r)

    benchmark.pedantic(fill, rounds=1, iterations=1)
    frame = 84 * 84
    per_transition = buf.nbytes() / len(buf)
    benchmark.extra_info["bytes_per_transition"] = per_transition
    benchmark.extra_info["frames_per_transition"] = per_transition / frame
    benchmark.extra_info["rows_per_transition"] = buf.num_rows / len(buf)
    print(f"\nAtari: {per_transition:.0f} bytes per stored transition = {per_transition / frame:.4f} x one "
          f"84x84 uint8 frame ({buf.num_rows} rows of {capacity} in use, {len(buf)} transitions)")
    assert per_transition <= 1.05 * frame
