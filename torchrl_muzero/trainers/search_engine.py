"""Which engine a run's searches use, found once at start (``SearchResult.engine``), for its log and summary."""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import nn

from torchrl_muzero.trainers.builders import algorithm, mcts_config
from torchrl_muzero.trainers.config import TrainConfig

__all__ = ["probe_search_engine"]


def probe_search_engine(cfg: TrainConfig, model: nn.Module, observation_shape: Sequence[int],
                        device: torch.device | str) -> str:
    """The engine (:data:`~torchrl_muzero.mcts.search.ENGINES`) the run's acting searches use on ``device``.

    One search of the algorithm's with ``cfg.mcts`` (2 simulations: the engine
    does not depend on their number) from a zero observation, with ``model``
    where the acting searches run (on a copy when that is another device).
    Eval mode, no root noise, a private generator: the model, the run's random
    streams and its results are untouched. A probe that fails says so in the
    answer; the run's own searches report a real problem.

    Examples:
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.trainers.config import load_config
        >>> from torchrl_muzero.trainers.search_engine import probe_search_engine
        >>> cfg = load_config({"mcts": {"backend": "torch"}})
        >>> probe_search_engine(cfg, MuZeroMLPModel((4,), 2), (4,), "cpu")
        'torch'
    """
    device = torch.device(device)
    was_training, probe = model.training, None
    try:
        here = next(model.parameters()).device
        probe = model if here.type == device.type else copy.deepcopy(model).to(device)
        device = next(probe.parameters()).device
        probe.eval()
        with torch.no_grad():
            result = algorithm(cfg).search_fn(
                probe, torch.zeros(1, *observation_shape, device=device), mcts_config(cfg, num_simulations=2),
                add_noise=False, generator=torch.Generator(device).manual_seed(0))
        return str(getattr(result, "engine", "unknown"))
    except Exception as err:  # informational only
        return f"unknown (probe failed: {type(err).__name__}: {err})"
    finally:
        if probe is model:
            model.train(was_training)
