"""The argument checks of :class:`~torchrl_muzero.data.GameBuffer`: its constructor's and :meth:`sample`'s.

Its own module because it is its own concept (what the buffer accepts, with the message naming
the argument), kept out of the buffer's orchestration of ``extend`` / ``sample``.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from torchrl_muzero.data.replay_entries import ROW_KEYS, ReplayEntry, check_replay_entries
from torchrl_muzero.data.target_builders import MUZERO_SAMPLE_KEYS, TargetBuilder

__all__ = ["VALUE_BOOTSTRAPS", "check_buffer_args", "check_extra_entries", "sample_models"]

#: the values of ``GameBuffer(value_bootstrap=...)``
VALUE_BOOTSTRAPS = ("auto", "model", "stored")


def check_buffer_args(*, capacity, num_unroll_steps, td_steps, discount, alpha, beta, beta_annealing_steps,
                      priority_eps, reanalyze_ratio, reanalyze_search, reanalyze_entries, value_bootstrap,
                      off_policy_correction, correction_age_scale) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming the first constructor argument out of its range."""
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 2:
        raise ValueError(f"capacity must be an integer >= 2, got {capacity!r}.")
    if not isinstance(num_unroll_steps, int) or num_unroll_steps < 0:
        raise ValueError(f"num_unroll_steps must be an integer >= 0, got {num_unroll_steps!r}.")
    if not isinstance(td_steps, int) or td_steps < 1:
        raise ValueError(f"td_steps must be an integer >= 1, got {td_steps!r}.")
    if not 0.0 <= float(discount) <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount!r}.")
    if float(alpha) < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}.")
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}.")
    if not isinstance(beta_annealing_steps, int) or beta_annealing_steps < 0:
        raise ValueError(f"beta_annealing_steps must be an integer >= 0, got {beta_annealing_steps!r}.")
    if not float(priority_eps) > 0:
        raise ValueError(f"priority_eps must be > 0, got {priority_eps!r}.")
    if not 0.0 <= float(reanalyze_ratio) <= 1.0:
        raise ValueError(f"reanalyze_ratio must be in [0, 1], got {reanalyze_ratio!r}.")
    if reanalyze_search is not None and not callable(reanalyze_search):
        raise TypeError(f"reanalyze_search must be callable, got {type(reanalyze_search).__name__}.")
    if reanalyze_entries is not None and not callable(reanalyze_entries):
        raise TypeError(f"reanalyze_entries must be callable, got {type(reanalyze_entries).__name__}.")
    if value_bootstrap not in VALUE_BOOTSTRAPS:
        raise ValueError(f"value_bootstrap must be one of {VALUE_BOOTSTRAPS}, got {value_bootstrap!r}.")
    if off_policy_correction and not (correction_age_scale is not None and float(correction_age_scale) > 0):
        raise ValueError(
            f"off_policy_correction needs correction_age_scale > 0 (policy versions per step of "
            f"horizon), got {correction_age_scale!r}."
        )


def check_extra_entries(extra_entries: Iterable[ReplayEntry] | None,
                        target_builders: tuple[TargetBuilder, ...]) -> tuple[ReplayEntry, ...]:
    """The checked ``extra_entries``: none may shadow a stored row's name nor a sample's key
    (the batch holds it under its key)."""
    taken = {key: "the stored rows" for key in ROW_KEYS}
    taken.update({key: "the MuZero targets" for key in MUZERO_SAMPLE_KEYS})
    taken.update({key: repr(b) for b in target_builders for key in b.out_keys})
    return check_replay_entries(extra_entries, taken)


def sample_models(buffer, batch_size: int, model: Any, target_model: Any, policy_version: int | None):
    """Check :meth:`GameBuffer.sample`'s arguments; return ``(model, target_model, reanalyzed roots)``.

    The models default to the buffer's; ``target_model`` is ``None`` when the stored search
    values bootstrap the returns (``value_bootstrap="stored"``).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if not buffer._tree.total() > 0:
        raise RuntimeError("GameBuffer.sample: no transition can be sampled yet (extend the buffer first).")
    if buffer.off_policy_correction and policy_version is None:
        raise ValueError("off_policy_correction: pass the current policy_version to sample().")
    model = model if model is not None else buffer.model
    target_model = target_model if target_model is not None else buffer.target_model
    if target_model is None:
        target_model = model
    if buffer.value_bootstrap == "stored":
        target_model = None
    elif buffer.value_bootstrap == "model" and target_model is None:
        raise ValueError("value_bootstrap='model' needs a target_model or model (to GameBuffer or sample()).")
    n_re = int(math.floor(buffer.reanalyze_ratio * batch_size + 0.5))
    if n_re > 0 and model is None:
        raise ValueError(
            f"reanalyze_ratio={buffer.reanalyze_ratio} needs a model: pass model= to GameBuffer or to sample()."
        )
    return model, target_model, n_re
