"""Compose your own MuZero training loop from torchrl_muzero's pieces.

Everything here is a plain TorchRL / PyTorch object: a MuZero model, an
``MCTSPolicy`` that a torchrl ``Collector`` runs, the ``GameBuffer`` replay
storage and the ``MuZeroLoss`` ``LossModule``. The trainers in
``torchrl_muzero.trainers`` do the same with checkpoints, logging and an
async pipeline on top.

    python docs/compose_your_own.py            # ~1-2 minutes on 2 CPU cores
"""
import argparse

import torch
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.data import GameBuffer
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.objectives import MuZeroLoss


def main(total_frames: int = 6_144, seed: int = 0) -> float:
    torch.manual_seed(seed)
    env = TransformedEnv(SerialEnv(8, lambda: GymEnv("CartPole-v1")), RewardSum())
    env.set_seed(seed)
    model = MuZeroMLPModel(observation_shape=(4,), num_actions=2, latent_dim=64, hidden_dim=64)
    search = MCTSConfig(num_simulations=16, discount=0.97)
    policy = MCTSPolicy(model, search, env.action_spec)
    collector = Collector(env, policy, frames_per_batch=256, total_frames=total_frames,
                          auto_register_policy_transforms=False)
    buffer = GameBuffer(50_000, num_unroll_steps=5, td_steps=10, discount=0.97, seed=seed)
    loss_fn = MuZeroLoss(model)
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=3e-3)

    returns, frames = [], 0
    for batch in collector:
        buffer.extend(batch)
        done = batch["next", "done"].squeeze(-1)
        returns += batch["next", "episode_reward"].squeeze(-1)[done].tolist()
        for _ in range(batch.numel() // 4):  # replay ratio 0.25
            sample = buffer.sample(128, model=model)
            losses = loss_fn(sample)
            loss = sum(v for k, v in losses.items() if k.startswith("loss_"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            buffer.update_priority(sample["index"], losses["priority"], sample["stamp"])
        frames += batch.numel()
        recent = returns[-10:]
        print(f"{frames} frames: mean return of the last {len(recent)} episodes {sum(recent) / max(len(recent), 1):.1f}")
    collector.shutdown()

    with set_exploration_type(ExplorationType.DETERMINISTIC):  # greedy search, no root noise
        rollout = env.rollout(500, policy, break_when_any_done=False)
    greedy = rollout["next", "episode_reward"].max(1).values.mean().item()
    print(f"greedy evaluation, mean return: {greedy:.1f}")
    return greedy


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=6_144)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.frames, args.seed)
