"""Replay storage: the single-owner ``GameBuffer`` and its pieces."""
from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.priority import PriorityTree
from torchrl_muzero.data.targets import ValueTargetPlan, plan_value_targets, reward_targets, value_targets
from torchrl_muzero.data.target_builders import MUZERO_SAMPLE_KEYS, TargetBuilder, TargetContext, ValuePrefixTargets
from torchrl_muzero.data.reanalyze import ReanalyzeSearch, muzero_reanalyze
from torchrl_muzero.data.replay_entries import EntriesHook, EntryReanalysis, ReplayEntry
from torchrl_muzero.data.replay_store import ReplayStore
from torchrl_muzero.data.game_buffer import GameBuffer

__all__ = [
    "EntriesHook",
    "EntryReanalysis",
    "FrameStack",
    "GameBuffer",
    "MUZERO_SAMPLE_KEYS",
    "PriorityTree",
    "ReanalyzeSearch",
    "ReplayEntry",
    "ReplayStore",
    "TargetBuilder",
    "TargetContext",
    "ValuePrefixTargets",
    "ValueTargetPlan",
    "muzero_reanalyze",
    "plan_value_targets",
    "reward_targets",
    "value_targets",
]
