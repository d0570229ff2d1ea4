"""DeepMind Control Suite tasks from state (``env.kind='dmc'``, ``env.id='<domain>-<task>'``).

Each task runs through torchrl's :class:`~torchrl.envs.libs.dm_control.DMControlEnv`
with this preprocessing:

* *Observation.* The task's observation dict (``position``, ``velocity``,
  ...: dm_control's own order) is flattened key by key and concatenated into
  one float32 ``"observation"`` vector (torchrl's ``FlattenObservation``,
  ``CatTensors``, ``DoubleToFloat``); the reward is float32 too, and the
  action spec a float32 box (dm_control's float64 actions are cast back on
  the way in).
* *Action repeat.* Each agent step applies its action ``env.action_repeat``
  times (2 by default, the usual setting for state-based DMC) and sums the
  rewards (the env's own ``frame_skip`` loop, which stops at an episode's end).
* *Episode end.* The suite's time limit (1,000 physics steps for nearly every
  task: 500 agent steps at action repeat 2) is a *truncation*:
  ``truncated=True, terminated=False``, so the replay buffer bootstraps the
  value target there. ``env.max_episode_steps > 0`` truncates sooner, in agent
  steps (torchrl's ``StepCounter``).

dm-control is an optional extra (``pip install 'torchrl_muzero[dmc]'``);
nothing here imports it, nor torchrl, before a task is checked or built.
"""
from __future__ import annotations

import difflib
import functools
import warnings
from typing import Any

__all__ = ["DMC_INSTALL", "split_dmc_id", "check_dmc_id", "make_dmc_env", "make_single_dmc_env"]

#: what a missing dm-control asks the user to run
DMC_INSTALL = "pip install 'torchrl_muzero[dmc]'"


def split_dmc_id(env_id: str) -> tuple[str, str]:
    """``'<domain>-<task>'`` -> ``(domain, task)``; ``ValueError`` (one line) when there is no ``-``.

    Domain and task names hold underscores but never a dash, so the first
    dash splits them.

    Examples:
        >>> from torchrl_muzero.envs.dmc import split_dmc_id
        >>> split_dmc_id("cartpole-swingup")
        ('cartpole', 'swingup')
        >>> split_dmc_id("ball_in_cup-catch")
        ('ball_in_cup', 'catch')
        >>> split_dmc_id("cartpole")
        Traceback (most recent call last):
        ...
        ValueError: a DeepMind Control env id is '<domain>-<task>' (such as 'cartpole-swingup'), got 'cartpole'.
    """
    domain, sep, task = env_id.partition("-")
    if not (sep and domain and task):
        raise ValueError(f"a DeepMind Control env id is '<domain>-<task>' (such as 'cartpole-swingup'), "
                         f"got {env_id!r}.")
    return domain, task


def _suite(env_id: str) -> Any:
    """dm_control's ``suite`` module, or a one-line ``ValueError`` saying how to install it."""
    try:
        # dm_control probes its OpenGL backends on import; on a machine without a display GLFW warns
        # about the missing X11 DISPLAY. State observations never render: that warning is noise here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*The DISPLAY environment variable is missing")
            from dm_control import suite
    except ImportError as err:  # dm_control itself, or one of its own dependencies (mujoco)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"env.kind='dmc' (env id {env_id!r}) needs dm-control, which is not installed "
                         f"({reason}): {DMC_INSTALL}.") from err
    return suite


def _task_names(suite: Any) -> list[str]:
    return [f"{domain}-{task}" for domain, task in suite.ALL_TASKS]


def check_dmc_id(env_id: str) -> None:
    """Raise a one-line ``ValueError`` unless dm-control is installed and has the task ``env_id``.

    A missing dm-control names the install command; an unknown task lists
    every ``domain-task`` name of the suite (``suite.ALL_TASKS``), the
    closest first.

    Examples:
        >>> from torchrl_muzero.envs.dmc import check_dmc_id
        >>> try:
        ...     check_dmc_id("cartpole-swingup")  # fine when dm-control is installed
        ... except ValueError as err:
        ...     assert "pip install 'torchrl_muzero[dmc]'" in str(err)
        >>> from torchrl_muzero.envs.dmc import DMC_INSTALL
        >>> try:
        ...     check_dmc_id("cartpole-swingupp")
        ... except ValueError as err:
        ...     message = str(err)
        >>> "(did you mean cartpole-swingup or" in message or DMC_INSTALL in message
        True
    """
    suite = _suite(env_id)
    names = _task_names(suite)
    if env_id in names:
        return
    close = difflib.get_close_matches(env_id, names, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise ValueError(f"unknown DeepMind Control task {env_id!r}{hint}: env.kind='dmc' takes an env.id "
                     f"'<domain>-<task>', one of {', '.join(names)}.")


def make_single_dmc_env(env_id: str, action_repeat: int = 2, max_episode_steps: int = 0) -> Any:
    """One (unbatched) DMC task with the module's preprocessing: a float32 ``"observation"`` vector.

    Args:
        env_id: ``'<domain>-<task>'`` (:func:`check_dmc_id`).
        action_repeat: physics control steps per agent step (rewards summed).
        max_episode_steps: agent steps before a truncation (0: the task's own time limit).

    Examples:
        >>> from torchrl_muzero.envs.dmc import make_single_dmc_env
        >>> try:
        ...     env = make_single_dmc_env("cartpole-swingup")
        ... except ValueError:  # dm-control is not installed
        ...     pass
        ... else:
        ...     assert env.observation_spec["observation"].shape == (5,)
    """
    if int(action_repeat) < 1:
        raise ValueError(f"env.action_repeat must be >= 1, got {action_repeat!r}.")
    if int(max_episode_steps) < 0:
        raise ValueError(f"env.max_episode_steps must be >= 0 (0: the task's own limit), got {max_episode_steps!r}.")
    check_dmc_id(env_id)
    from torchrl.envs import CatTensors, Compose, DoubleToFloat, FlattenObservation, StepCounter, TransformedEnv
    from torchrl.envs.libs.dm_control import DMControlEnv

    domain, task = split_dmc_id(env_id)
    # DMControlEnv's frame_skip is GymLikeEnv's own loop: the action is applied action_repeat times, the
    # rewards are summed, and the loop stops early when the episode ends inside it
    base = DMControlEnv(domain, task, frame_skip=int(action_repeat))
    keys = list(base.observation_spec.keys())  # dm_control's order, the one its flatten wrapper uses
    transforms = [
        # manipulator / stacker report [N, 2] / [N, 4] positions: one flat vector per key first
        FlattenObservation(-len(spec.shape), -1, in_keys=[key])
        for key, spec in base.observation_spec.items() if len(spec.shape) > 1
    ]
    transforms += [
        CatTensors(in_keys=keys, out_key="observation", del_keys=True, sort=False),
        # the models and the buffer work in float32; the physics takes float64 actions back
        DoubleToFloat(in_keys=["observation", "reward"], in_keys_inv=["action"]),
    ]
    if max_episode_steps:
        transforms.append(StepCounter(max_steps=int(max_episode_steps)))  # a truncation, as the time limit
    return TransformedEnv(base, Compose(*transforms))


def make_dmc_env(env_cfg: Any, num_envs: int) -> Any:
    """``num_envs`` copies of the task ``env_cfg.id`` stepped in-process (``SerialEnv``), unseeded.

    The caller seeds the batch (:func:`~torchrl_muzero.envs.make_env` does)
    and adds ``RewardSum``.

    Examples:
        >>> from torchrl_muzero.envs.dmc import make_dmc_env
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> try:
        ...     env = make_dmc_env(EnvConfig(kind="dmc", id="cartpole-swingup"), num_envs=2)
        ... except ValueError:  # dm-control is not installed
        ...     pass
        ... else:
        ...     assert tuple(env.observation_spec["observation"].shape) == (2, 5)
    """
    from torchrl.envs import SerialEnv

    check_dmc_id(env_cfg.id)  # one line before any env exists
    make_one = functools.partial(make_single_dmc_env, env_cfg.id, int(env_cfg.action_repeat),
                                 int(env_cfg.max_episode_steps))
    return SerialEnv(num_envs, make_one)
