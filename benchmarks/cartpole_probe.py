"""Probe a CartPole run: how its greedy episodes end, its value against the real returns, stale targets.

The measurements of docs/cartpole.md ("What was wrong") came from these three probes:

    python benchmarks/cartpole_probe.py RUN_DIR                  # ckpt/last.pt and ckpt/buffer.pt
    python benchmarks/cartpole_probe.py RUN_DIR --model ckpt/model_v2000.pt

* episodes: greedy episodes of the model (the evaluation's search), how each ends (pole, cart out
  of bounds, truncation at 500), and the model's value against the discounted return obtained;
* V(x): the value of the rest state moved along the track, (x, 0, 0, 0);
* buffer: prioritized samples of start-like states (|obs| < 0.05) from the older and the newer half
  of the buffer, their value targets (bootstrapped by this model) and the model's predictions.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from torchrl_muzero.mcts import search
from torchrl_muzero.trainers.builders import build_buffer, mcts_config, model_from_checkpoint


def load_model(path: Path):
    model, cfg = model_from_checkpoint(path)
    return cfg, model


@torch.no_grad()
def values(model, obs: torch.Tensor) -> torch.Tensor:
    return model.value_support.decode(model.initial_inference(obs.float())[2])


@torch.no_grad()
def probe_episodes(cfg, model, episodes: int) -> None:
    envs = [gym.make("CartPole-v1") for _ in range(episodes)]
    obs = [env.reset(seed=1000 + i)[0] for i, env in enumerate(envs)]
    alive, ends = [True] * episodes, [None] * episodes
    seen = [[] for _ in range(episodes)]  # (x, predicted value) per step
    config = mcts_config(cfg, temperature=0.0)
    while any(alive):
        idx = [i for i in range(episodes) if alive[i]]
        o = torch.tensor(np.stack([obs[i] for i in idx]))
        v = values(model, o)
        action = search(model, o, config, add_noise=False).action
        for j, i in enumerate(idx):
            seen[i].append((float(obs[i][0]), float(v[j])))
            obs[i], _, terminated, truncated, _ = envs[i].step(int(action[j]))
            if terminated or truncated:
                alive[i] = False
                ends[i] = "truncated" if truncated else ("cart out" if abs(obs[i][0]) > 2.4 else "pole")
    g = cfg.mcts.discount
    rows = []  # (steps to the end, predicted, discounted return) where the return is known
    for steps, end in zip(seen, ends):
        T, ret = len(steps), 0.0
        returns = np.empty(T)
        for t in reversed(range(T)):
            ret = 1.0 + g * ret
            returns[t] = ret
        known = T if end != "truncated" else max(0, T - 300)
        rows += [(T - t, steps[t][1], returns[t]) for t in range(known)]
    print(f"greedy episodes: lengths {[len(s) for s in seen]}, ends {ends}")
    print(f"  cart x range per episode: {[(round(min(x for x, _ in s), 2), round(max(x for x, _ in s), 2)) for s in seen]}")
    rows = np.array(rows).reshape(-1, 3)
    for lo, hi in ((0, 10), (10, 30), (30, 60), (60, 100), (100, 10**9)):
        m = (rows[:, 0] > lo) & (rows[:, 0] <= hi)
        if m.any():
            print(f"  {lo:>3}-{hi if hi < 10**9 else 'inf':<4} steps before the end: n={int(m.sum()):5d}  "
                  f"value {rows[m, 1].mean():6.1f}  discounted return {rows[m, 2].mean():6.1f}")


def probe_track(model) -> None:
    xs = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0])
    obs = torch.zeros(len(xs), 4)
    obs[:, 0] = xs
    v = values(model, obs)
    print("V(x, 0, 0, 0): " + "  ".join(f"{x:+.1f}: {y:.0f}" for x, y in zip(xs.tolist(), v.tolist())))


def probe_buffer(cfg, model, path: Path, samples: int) -> None:
    buffer = build_buffer(cfg)
    buffer.load(path)
    torch.manual_seed(0)
    batch = buffer.sample(samples, model=model, target_model=model)
    obs = batch["observation"][:, 0]
    near = (obs.abs() < 0.05).all(-1)
    old = (buffer.write_count - batch["stamp"][:, 0]) > buffer.write_count / 2
    z, v = batch["target_value"][:, 0], values(model, obs)
    print(f"buffer: {len(buffer)} transitions; {int(near.sum())} of {samples} prioritized samples are start-like")
    for name, m in (("start-like, older half", near & old), ("start-like, newer half", near & ~old),
                    ("all others", ~near)):
        if m.any():
            print(f"  {name:24s} n={int(m.sum()):5d}  target {z[m].mean():6.1f}  prediction {v[m].mean():6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", default="ckpt/last.pt", help="checkpoint, relative to run_dir")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args()
    cfg, model = load_model(args.run_dir / args.model)
    probe_episodes(cfg, model, args.episodes)
    probe_track(model)
    if (args.run_dir / "ckpt" / "buffer.pt").exists():
        probe_buffer(cfg, model, args.run_dir / "ckpt" / "buffer.pt", args.samples)


if __name__ == "__main__":
    main()
