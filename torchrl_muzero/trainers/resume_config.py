"""Resume continues the saved run: its configuration is the base, the caller's keys are the changes.

``resume=RUN`` on a script's command line, or ``{"resume": RUN, ...}`` given to
a trainer, starts from the configuration the run saved (``RUN/config.json``,
else the one inside ``RUN/ckpt/last.pt``) and applies only the keys the caller
named: ``resume=RUN train.total_env_steps=200000`` extends a finished run with
every other setting as it was, as LightZero's and TorchRL's users expect
(repeating every override of the original command line is no longer needed;
repeating them is harmless).

Keys whose change would make the checkpoint not load, or would give its weights
another meaning (:data:`FROZEN_KEYS`: the algorithm, the model's kind and
sizes, the env id and what shapes its observations, the support sizes, the
consistency heads), may be repeated with their saved value but not changed:
the start is refused with one line naming the key, the saved value and the new
one. The list was measured: each key changed alone, for every algorithm, either
leaves ``load_state_dict`` working or not (``test/test_resume_config.py``
checks the list against the builders). Everything else (budgets, the logger,
the pipeline's processes, the device, the seed, search and optimizer settings)
may change.

A hydra group on a resume command line (``env=Pong``, ``algo=unizero``) only
confirms the saved run's choice: it is accepted when it names the same env
(``env.id``, ``env.kind``) or algorithm (``algo.name``), and then adds none of
its file's values (the saved ones, which may have been overridden, stand).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from torchrl_muzero.errors import ConfigError
from torchrl_muzero.trainers.config import ModelConfig, TrainConfig, load_config, plain_config

__all__ = ["FROZEN_KEYS", "saved_run_config", "check_frozen_keys", "check_resume_folder", "load_run_config", "resume_from_overrides"]

#: keys a resume may not change. Measured (every algorithm, each key changed alone): a different value
#: makes ``Learner.load_state_dict`` fail (model, loss or optimizer tensors of another shape or name),
#: except ``algo.num_heads`` (it loads, but splits the trained projections into other heads) and the
#: env's observation keys (the weights were trained on other inputs).
FROZEN_KEYS: tuple[str, ...] = (
    "algo.name",
    *(f"model.{f.name}" for f in dataclasses.fields(ModelConfig)),
    "env.id", "env.kind", "env.frame_stack", "env.screen_size", "env.grayscale",
    # EfficientZero-style SimSiam heads of the loss module (with consistency_loss_weight > 0)
    "loss.projection_dim", "loss.projection_hidden_dim", "loss.prediction_hidden_dim",
    "loss.consistency_loss_weight",  # only 0 <-> > 0: the heads exist or not (see _changes)
    # the algorithms' own network sizes
    "algo.lstm_hidden_size", "algo.chance_space_size", "algo.rnn_hidden_size",
    "algo.embed_dim", "algo.num_layers", "algo.num_heads", "algo.max_blocks", "algo.position", "algo.latent_norm",
)

# the keys a hydra group's choice stands for: the group is accepted on resume when they keep their saved values
_GROUP_IDENTITY = {"env": ("env.id", "env.kind"), "algo": ("algo.name",)}

_MISSING = object()

# run folders whose missing config.json was already reported (preflight and the job resolve the same run)
_noted_fallbacks: set[str] = set()


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def _set(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = tree.get(part)
        if not isinstance(child, dict):  # a malformed section: load_config names it
            child = tree[part] = {}
        tree = child
    tree[leaf] = value


def _leaves(tree: Mapping, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(dotted key, value)`` of every non-mapping value of a nested mapping."""
    for key, value in tree.items():
        if isinstance(value, Mapping):  # an empty section gives no key (it must not replace the saved one)
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_deep_copy(v) for v in tree]
    return tree


def _changes(key: str, saved: Any, new: Any) -> bool:
    """Whether ``saved -> new`` is a change that the checkpoint does not survive."""
    if key == "loss.consistency_loss_weight":  # only switching the consistency heads on or off
        return isinstance(saved, (int, float)) and isinstance(new, (int, float)) and (saved == 0) != (new == 0)
    return saved != new


def _checkpoint_state(folder: Path) -> dict:
    """``ckpt/last.pt``, read as ``check_run_targets`` reads it (same errors)."""
    from torchrl_muzero.trainers.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

    try:
        return load_checkpoint(latest_checkpoint(folder))
    except CheckpointError as err:
        raise ConfigError(f"config key 'resume': {err}") from None


def saved_run_config(folder: str | Path) -> dict:
    """The configuration a run folder saved, as a nested dict: ``config.json``, else its checkpoint's.

    Every run writes ``config.json`` when it starts; each checkpoint carries the
    same configuration, which stands in when the file is missing. A
    ``config.json`` that cannot be read is an error (it may be a hand edit that
    went wrong): the message says to repair or delete it.

    Raises:
        ConfigError: one line naming ``resume``, the file and what to do.
    """
    folder = Path(folder)
    path = folder / "config.json"
    ckpt = folder / "ckpt" / "last.pt"
    if path.exists():
        try:
            saved = json.loads(path.read_text())
            if not isinstance(saved, dict):
                raise ValueError(f"it holds a JSON {type(saved).__name__}, not an object")
        except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            reason = (getattr(err, "strerror", None) or str(err)).splitlines()[0]
            raise ConfigError(f"config key 'resume': the run's saved configuration {str(path)!r} cannot be read "
                              f"({reason}); repair it, or delete it to resume with the configuration saved in "
                              f"{str(ckpt)!r}.") from None
        return saved
    saved = _checkpoint_state(folder).get("config")
    if not isinstance(saved, dict) or not saved:
        raise ConfigError(f"config key 'resume': {str(folder)!r} has no config.json and its checkpoint {str(ckpt)!r} "
                          "holds no configuration, so the run's settings are unknown; put the run's config.json "
                          "back, or start a new run (run_dir=...).")
    if str(folder) not in _noted_fallbacks:
        _noted_fallbacks.add(str(folder))
        print(f"torchrl_muzero: {str(path)!r} is missing; resuming with the configuration saved in {str(ckpt)!r}.")
    return saved


def check_frozen_keys(saved: Mapping, new: Mapping, folder: str | Path,
                      origins: Optional[Mapping[str, str]] = None) -> None:
    """Refuse a resume that changes a :data:`FROZEN_KEYS` key (or the buffer file's capacity).

    ``saved`` is the run's configuration, ``new`` the one the resume would use
    (nested dicts); a key missing from either (a config of an older version) is
    not compared. ``origins`` names the hydra group choice a value came from.
    """
    folder = Path(folder)
    origins = origins or {}
    for key in FROZEN_KEYS:
        old, value = _get(saved, key), _get(new, key)
        if old is _MISSING or value is _MISSING or not _changes(key, old, value):
            continue
        source = f", from {origins[key]}" if key in origins else ""
        raise ConfigError(
            f"config key '{key}' cannot change when resuming {str(folder)!r}: the run was made with "
            f"{key}={old!r} (this run: {value!r}{source}), and its checkpoint holds a model of that {key}; "
            f"drop the override to continue the run, or start a new run to change it.")
    old, value = _get(saved, "buffer.capacity"), _get(new, "buffer.capacity")
    buffer_file = folder / "ckpt" / "buffer.pt"
    if old is not _MISSING and value is not _MISSING and old != value and buffer_file.exists():
        raise ConfigError(
            f"config key 'buffer.capacity' cannot change when resuming {str(folder)!r}: {str(buffer_file)!r} holds "
            f"the replay buffer of buffer.capacity={old!r} (this run: {value!r}); drop the override, or delete that "
            "file to resume with an empty buffer of the new capacity.")


def check_resume_folder(target) -> Path:
    """The folder ``resume`` names, if it is an existing folder (else a ``ConfigError`` naming ``resume``)."""
    folder = Path(target)
    if not folder.exists():
        raise ConfigError(f"config key 'resume': the run folder {str(folder)!r} does not exist.")
    if not folder.is_dir():
        raise ConfigError(f"config key 'resume': {str(folder)!r} is not a folder (resume takes a run folder, the "
                          "one holding ckpt/last.pt).")
    return folder


def _holds_a_run(folder: Path) -> bool:
    return any((folder / name).exists() for name in ("config.json", "ckpt", "eval.csv", "summary.json"))


def _resolve_folder(target: Any) -> Path:
    return check_resume_folder(target)


def _resumed(explicit: Mapping[str, Any], origins: Mapping[str, str]) -> TrainConfig:
    """The saved configuration of ``explicit["resume"]`` with ``explicit``'s dotted keys applied, checked."""
    folder = _resolve_folder(explicit["resume"])
    saved = saved_run_config(folder)
    merged = _deep_copy(saved)
    merged.pop("hydra", None)
    for key, value in explicit.items():
        _set(merged, key, _deep_copy(value))
    check_frozen_keys(saved, merged, folder, origins)
    try:
        return load_config(merged)
    except ConfigError as err:
        try:
            load_config({k: v for k, v in saved.items() if k != "hydra"})
        except ConfigError as saved_err:  # the saved file itself does not load in this version
            raise ConfigError(f"config key 'resume': the configuration saved in {str(folder)!r} does not load in "
                              f"this version of torchrl_muzero: {saved_err} Edit {str(folder / 'config.json')!r} "
                              "or override the key.") from None
        raise err from None


def load_run_config(data: Any = None) -> TrainConfig:
    """A trainer's configuration: :func:`~torchrl_muzero.trainers.config.load_config`, resume-aware.

    With ``resume`` set in a mapping (a dict, a DictConfig), the run's saved
    configuration is the base and every key the mapping holds is applied to it
    (so ``{"resume": RUN, "train": {"total_env_steps": 10**6}}`` extends the
    run with all else unchanged). A :class:`TrainConfig` is taken as it is:
    all its keys count as given, and the trainer refuses one whose
    :data:`FROZEN_KEYS` differ from the checkpoint's.

    Examples:
        >>> from torchrl_muzero.trainers.resume_config import load_run_config
        >>> load_run_config({"mcts": {"num_simulations": 8}}).mcts.num_simulations  # no resume: load_config
        8
        >>> cfg = load_run_config({"resume": "runs/x", "train": {"total_env_steps": 10**6}})  # doctest: +SKIP
    """
    if isinstance(data, TrainConfig):
        return data
    data = plain_config(data)
    if not isinstance(data, Mapping) or not data.get("resume"):
        return load_config(data)
    explicit = {key: value for key, value in _leaves(data) if key != "hydra" and not key.startswith("hydra.")}
    return _resumed(explicit, {})


def resume_from_overrides(composed: Any, overrides: Sequence[str], groups: Iterable[str]) -> TrainConfig:
    """The configuration of a script started with ``resume=RUN``: the saved one plus the command line's keys.

    Args:
        composed: hydra's composition of the command line (a DictConfig or a
            nested dict); it supplies the typed value of each key named in
            ``overrides``, and what a group choice stands for.
        overrides: the command line's overrides (``key=value``, ``env=Pong``, ...).
        groups: the config groups' names (``env``, ``algo``, ...).

    Raises:
        ConfigError: one line: a frozen key or another env / algorithm, a group
            other than ``env`` / ``algo``, a ``~key`` deletion, or a bad value.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if hasattr(composed, "_content") or type(composed).__name__ == "DictConfig":
        from omegaconf import OmegaConf

        composed = OmegaConf.to_container(composed, resolve=True)
    groups = set(groups)
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise ConfigError(f"cannot parse the command-line overrides: {str(err).splitlines()[0]}") from None
    explicit: dict[str, Any] = {"resume": composed.get("resume")}
    origins: dict[str, str] = {}
    for override in parsed:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        if override.is_delete():
            raise ConfigError(f"'~{key}' removes a key, which a resume cannot do: the resumed run keeps its "
                              "saved configuration; override the key's value instead.")
        if key in groups:
            identity = _GROUP_IDENTITY.get(key)
            if identity is None:
                raise ConfigError(f"config group '{key}' cannot be chosen when resuming: the run keeps its saved "
                                  "configuration; override single keys instead (key=value).")
            for dotted in identity:
                if dotted not in explicit:  # a dotted override of the same key wins, as in hydra
                    explicit[dotted] = _get(composed, dotted)
                    origins[dotted] = f"{key}={override.value()}"
            continue
        value = override.value()
        dotted_keys = [k for k, _ in _leaves(value, f"{key}.")] if isinstance(value, Mapping) else [key]
        for dotted in dotted_keys:
            explicit[dotted] = _get(composed, dotted)
            origins.pop(dotted, None)
    explicit = {k: v for k, v in explicit.items() if v is not _MISSING}
    return _resumed(explicit, origins)
