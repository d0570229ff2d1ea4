"""Environment factories (imported on first use: checking an env id needs no torchrl)."""
import importlib

_WHERE = {
    "make_env": "factory", "env_spaces": "factory", "env_action_space": "factory",
    "ActionSpace": "action_spaces", "DiscreteActionSpace": "action_spaces", "BoxActionSpace": "action_spaces",
    "action_space_of": "action_spaces",
    "check_env_id": "env_ids", "is_board_game": "env_ids", "BOARD_GAMES": "env_ids",
}

__all__ = list(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
