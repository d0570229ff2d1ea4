"""What the run will touch on this machine, checked before any folder, env or process exists.

:func:`check_run_targets` (called by the trainers before they create a
folder, an env or a process, and by the hydra scripts' preflight): the env
id, the device, the logger's package, the run folder, the resume target.
The ranges of the values themselves are checked before, when the config is
loaded (:mod:`~torchrl_muzero.trainers.config_ranges`).

Every error is a :class:`~torchrl_muzero.errors.ConfigError` whose message
names the key, the value and what is allowed; the hydra scripts print it as
one ``error: ...`` line and exit with status 2.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Optional

from torchrl_muzero.errors import ConfigError
from torchrl_muzero.trainers.config import config_to_dict
from torchrl_muzero.trainers.resume_config import _holds_a_run, check_frozen_keys, check_resume_folder

__all__ = ["check_resume_folder", "check_run_targets", "run_folder_of"]


# -- what the run will touch on this machine -----------------------------------------
def _check_device(name: str) -> None:
    match = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", name)
    if name == "auto" or (match and match.group(1) == "cpu"):
        return
    if match is None:
        raise ConfigError(f"config key 'device' must be auto, cpu, cuda, cuda:N or mps, got {name!r}.")
    import torch

    kind, index = match.group(1), match.group(2)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"config key 'device' is {name!r}, but CUDA is not available on this machine: "
                         "use device=cpu or device=auto.")
        if index is not None and int(index) >= torch.cuda.device_count():
            raise ConfigError(f"config key 'device' is {name!r}, but this machine has {torch.cuda.device_count()} "
                         f"CUDA device(s): use cuda:0 .. cuda:{torch.cuda.device_count() - 1}.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"config key 'device' is {name!r}, but MPS is not available on this machine.")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_folder_of(cfg) -> Optional[Path]:
    """The folder a run writes to: the resumed run's, else ``run_dir`` (None: the trainer picks one)."""
    target = cfg.resume or cfg.run_dir
    return Path(target) if target else None


def _check_writable(folder: Path, key: str) -> None:
    """The run folder can be created and written: probed (root ignores permission bits), then undone."""
    created = []  # the folders the probe makes, deepest first, removed again afterwards
    parent = folder
    while not parent.exists() and parent != parent.parent:
        created.append(parent)
        parent = parent.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".torchrl_muzero_write_probe_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"config key '{key}': the run folder {str(folder)!r} cannot be written "
                     f"({err.strerror or err}).") from None
    finally:
        for path in created:
            try:
                path.rmdir()
            except OSError:
                pass


def check_run_targets(cfg) -> Optional[dict]:
    """Check what the run will touch on this machine, before any folder, env or process exists.

    The env id (and ale-py for Atari), the device, GPU actors, the logger's
    package, the resume target (a run folder with a readable ``ckpt/last.pt``
    whose configuration has the same :data:`~torchrl_muzero.trainers.resume_config.FROZEN_KEYS`)
    and the run folder (writable; a fresh run does not reuse a folder that
    holds another run, so a rejected or mistaken start never overwrites it).
    The checkpoint's fit to the model is checked by the trainer, once the
    model is built, before it writes anything.

    Returns:
        the resume checkpoint's contents when ``cfg.resume`` is set (read once, here), else None.
    """
    from torchrl_muzero.envs.env_ids import check_env_id
    from torchrl_muzero.trainers.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

    try:
        check_env_id(cfg.env.id, cfg.env.kind)
    except ValueError as err:
        raise ConfigError(f"config key 'env.id': {err}") from None
    _check_device(cfg.device)
    for knob in ("collector_num_gpus", "evaluator_num_gpus"):
        value = getattr(cfg.async_pipeline, knob)
        if value > 0 and not _cuda_available():
            raise ConfigError(f"config key 'async_pipeline.{knob}' is {value}: GPU actors were asked for, but CUDA is "
                         "not available on this machine (use 0).")
    if cfg.async_pipeline.enabled and cfg.async_pipeline.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("config key 'async_pipeline.backend' is 'ray', which needs the ray package: "
                          "pip install torchrl_muzero[ray] (or use async_pipeline.backend=local).")
    backend = cfg.logger.backend
    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(backend)
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f"config key 'logger.backend' is {backend!r}, which needs the {package} package: "
                     f"pip install {package} (or use logger.backend=csv).")
    if cfg.resume:
        folder = check_resume_folder(cfg.resume)
        try:
            state = load_checkpoint(latest_checkpoint(folder))
        except CheckpointError as err:
            raise ConfigError(f"config key 'resume': {err}") from None
        # against the checkpoint's own configuration: the one its tensors were made with (a config given
        # whole, e.g. a TrainConfig, or a hand-edited config.json, may differ from it)
        saved = state.get("config")
        check_frozen_keys(saved if isinstance(saved, dict) else {}, config_to_dict(cfg), folder)
        _check_writable(folder, "resume")
        return state
    elif cfg.run_dir:
        folder = Path(cfg.run_dir)
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"config key 'run_dir': {str(folder)!r} is a file, not a folder.")
        if folder.is_dir() and _holds_a_run(folder):
            raise ConfigError(f"config key 'run_dir': {str(folder)!r} already holds a run; continue it with "
                         f"resume={folder} or choose another run_dir.")
        _check_writable(folder, "run_dir")
    return None

