"""What the hydra scripts of ``sota-implementations/`` share.

The typed schema (:class:`~torchrl_muzero.trainers.config.TrainConfig`) is
registered as hydra's ``base_config``: every key exists, so any dotted
override works, and OmegaConf checks the types; :func:`load_config` checks
the rest.

A bad input ends a script with one line on stderr, ``error: <what is wrong>``,
and exit status 2, before any folder, env or process is created
(``HYDRA_FULL_ERROR=1`` keeps the traceback for debugging):
:func:`preflight` checks the command line before hydra starts the job (hydra's
own errors come with a traceback hint and exit status 1), and
:func:`run_from_hydra` turns the trainers' start-up checks into the same line.
A run that ends on a fault exits non-zero too
(:data:`~torchrl_muzero.trainers.base.EXIT_CODES`).
"""
from __future__ import annotations

import difflib
import faulthandler
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Sequence

from hydra.core.config_store import ConfigStore

from torchrl_muzero.trainers.config import ConfigError, TrainConfig, check_key, load_config
from torchrl_muzero.trainers.config_checks import check_run_targets
from torchrl_muzero.trainers.exit_watchdog import arm_exit_watchdog
from torchrl_muzero.trainers.resume_config import resume_from_overrides

__all__ = ["register_base_config", "compose_config", "preflight", "run_from_hydra", "run_script", "USAGE_ERROR"]

#: exit status of a rejected start (bad key, value, path), as command-line tools use 2 for usage errors
USAGE_ERROR = 2


def register_base_config() -> None:
    ConfigStore.instance().store(name="base_config", node=TrainConfig)


def compose_config(config_dir: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Compose a script's config (``config.yaml`` + groups + overrides) outside ``@hydra.main``.

    With ``resume=RUN`` among the overrides, the result is what the script
    resumes with: the run's saved configuration plus the other overrides
    (:func:`~torchrl_muzero.trainers.resume_config.resume_from_overrides`).

    Examples:
        >>> from pathlib import Path
        >>> import torchrl_muzero
        >>> config_dir = Path(torchrl_muzero.__file__).parents[1] / "sota-implementations/muzero/config"
        >>> cfg = compose_config(config_dir, ["mcts.num_simulations=8"])
        >>> cfg.env.id, cfg.mcts.num_simulations
        ('CartPole-v1', 8)
    """
    from hydra import compose, initialize_config_dir

    register_base_config()
    config_dir = Path(config_dir).resolve()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        composed = compose(config_name="config", overrides=list(overrides))
    if composed.get("resume"):
        groups = [p.name for p in config_dir.iterdir() if p.is_dir()]
        return resume_from_overrides(composed, overrides, groups)
    return load_config(composed)


def _debugging() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def _exit_with(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_ERROR)


def _check_override_keys(config_dir: Path, overrides: Sequence[str]) -> None:
    """Unknown keys and config-group options, named as ``load_config`` names them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, parsed = OverridesParser.create(), []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except OverrideParseException as err:
            raise ConfigError(f"cannot parse the command-line override {text!r} (key=value): "
                              f"{str(err).splitlines()[0]}") from None
    groups = {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in config_dir.iterdir() if p.is_dir()}
    for override in parsed:
        key = override.key_or_group
        if key.startswith("hydra.") or key == "hydra":
            continue
        if key in groups:
            value = override.value()
            if isinstance(value, str) and value not in groups[key]:
                close = difflib.get_close_matches(value, groups[key], n=1)
                hint = f" Did you mean '{key}={close[0]}'?" if close else ""
                raise ConfigError(f"config group '{key}' has no option {value!r}.{hint} "
                                  f"Options: {', '.join(groups[key])}.")
            continue
        check_key(key)


def _one_line(err: BaseException) -> str:
    """Hydra's / OmegaConf's multi-line message (and its cause's) as one line that names the key."""
    cause = err.__cause__ or err.__context__
    text = str(cause if cause is not None and str(cause).strip() else err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    full_key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), None)
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type=",
                                                             "Set the environment variable"))]
    text = " ".join(lines) or type(err).__name__
    return f"config key '{full_key}': {text}" if full_key else text


def preflight(config_dir: str | Path, argv: Sequence[str] | None = None) -> None:
    """Check a script's command line before hydra starts; on a bad input print one line and exit 2.

    Composes the config exactly as ``@hydra.main`` will (the same
    ``config.yaml``, groups and overrides), runs :func:`load_config` on it
    and :func:`~torchrl_muzero.trainers.config_checks.check_run_targets`
    (env id, device, run folder, resume target).
    Command lines with hydra's own flags (``--help``, ``--multirun``, ...)
    go to hydra unchecked here; :func:`run_from_hydra` checks each job.

    Examples:
        >>> from pathlib import Path
        >>> import torchrl_muzero
        >>> config_dir = Path(torchrl_muzero.__file__).parents[1] / "sota-implementations/muzero/config"
        >>> preflight(config_dir, ["train.replay_ratio=0.5"])  # fine: returns
        >>> preflight(config_dir, ["train.replay_ratio=-1"])  # doctest: +SKIP
        error: config key 'train.replay_ratio' must be >= 0, got -1.0.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg.startswith("-") for arg in argv) or _debugging():
        return
    config_dir = Path(config_dir)
    try:
        _check_override_keys(config_dir, argv)
        try:
            cfg = compose_config(config_dir, argv)
        except ConfigError:
            raise
        except Exception as err:  # hydra / omegaconf composition errors
            raise ConfigError(_one_line(err)) from None
        check_run_targets(cfg)  # before hydra creates its output folder
    except ConfigError as err:
        _exit_with(str(err))
    finally:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()  # @hydra.main initialises its own


#: the run folder of the last run :func:`run_from_hydra` finished (where :func:`run_script`'s watchdog reports)
_last_run_dir: str | None = None


def run_script(main: Callable[[], None]) -> None:
    """Call a script's ``@hydra.main`` function, then make sure the process ends.

    The scripts' ``__main__`` calls this instead of ``main()``: whichever way
    ``main`` ends (returns, ``sys.exit(status)``, an exception), the exit
    watchdog (:mod:`~torchrl_muzero.trainers.exit_watchdog`) is armed with the
    status the process is about to exit with, so a blocked interpreter exit
    cannot keep a finished run alive. Only for a process that ends after
    ``main``: never call it from a test or a notebook.

    Example (a script's last lines)::

        if __name__ == "__main__":
            preflight(Path(__file__).parent / "config")
            run_script(main)
    """
    # `kill -USR1 <pid>` prints every thread's stack to stderr (the run goes on): how to see where a
    # run that seems stuck is waiting, without a debugger (the tests' stop helper uses it on a hang)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    status = 1
    try:
        main()
        status = 0
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
        raise
    finally:
        arm_exit_watchdog(status, run_dir=_last_run_dir)


def run_from_hydra(cfg, trainer_cls) -> dict:
    """Validate a hydra config, default the run folder to hydra's output folder, and train.

    A bad input (a key, a value, a path, a checkpoint that does not fit)
    prints one ``error:`` line and exits 2; a run that ends on a fault or a
    signal exits with its :data:`~torchrl_muzero.trainers.base.EXIT_CODES`
    status.
    """
    from hydra.core.hydra_config import HydraConfig

    from torchrl_muzero.trainers.checkpoint import CheckpointError

    try:
        if not isinstance(cfg, TrainConfig) and cfg.get("resume"):
            # the saved run's configuration, changed by the command line's keys only
            hydra_cfg = HydraConfig.get()
            run_cfg = resume_from_overrides(cfg, list(hydra_cfg.overrides.task), hydra_cfg.runtime.choices.keys())
        else:  # a hydra config without resume, or a TrainConfig a caller built (taken as it is)
            run_cfg = load_config(cfg)
        if run_cfg.run_dir is None and run_cfg.resume is None:
            run_cfg.run_dir = HydraConfig.get().runtime.output_dir
        trainer = trainer_cls(run_cfg)
    except (ConfigError, CheckpointError) as err:
        if _debugging():
            raise
        _exit_with(str(err))
    summary = trainer.run()
    global _last_run_dir
    _last_run_dir = summary.get("run_dir")
    if summary["exit_code"]:
        sys.exit(summary["exit_code"])
    return summary
