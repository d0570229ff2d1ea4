"""Replay storage: the single-owner ``GameBuffer`` and its pieces."""
from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.priority import PriorityTree
from torchrl_muzero.data.targets import ValueTargetPlan, plan_value_targets, reward_targets, value_targets
from torchrl_muzero.data.game_buffer import GameBuffer

__all__ = [
    "FrameStack",
    "GameBuffer",
    "PriorityTree",
    "ValueTargetPlan",
    "plan_value_targets",
    "reward_targets",
    "value_targets",
]
