"""Atari environments with the standard MuZero / LightZero preprocessing.

:func:`make_atari_env` builds, for each of ``num_envs`` copies::

    ALE (gymnasium, ale-py)          sticky actions, frame skip, grayscale or RGB
      -> AtariGameWrapper            no-op starts, life loss as terminal (training),
                                     max episode length, optional max-pooling
      -> GymWrapper                  torchrl env: uint8 [H, W] "observation" (grayscale)
                                     or [H, W, 3] "pixels" (RGB, renamed "observation")
      -> ResizeFrame                 uint8 [C, S, S] (channels first, area-averaged)
      -> CatFrames(N, dim=-3)        uint8 [N * C, S, S], "same" padding at resets

then batches the copies (``SerialEnv``, ``ParallelEnv`` or a guarded
``AsyncEnvPool``) and adds ``RewardSum`` so that ``"episode_reward"`` is tracked.

Choices, and why
----------------

*Frame skip.* ALE does it (``gym.make(id, frameskip=frame_skip)``): one
``env.step`` repeats the action ``frame_skip`` emulator frames in C++ and sums
their rewards. This is the ALE v5 / Machado et al. (2018) protocol, and the
cheapest: the repeat loop runs in C++. ALE does *not* max-pool the
last two frames the way DQN's ``MaxAndSkip`` (and LightZero's wrapper) does;
max-pooling only hides sprites that flicker on alternate frames, which the
frame stack already sees. ``max_pool_frames=True`` gives DQN's behaviour
instead: ALE then steps single frames (``frameskip=1``) and the wrapper repeats
the action in Python, sums rewards and returns the pixel-wise max of the last
two frames (a few percent slower per agent step: torchrl's per-step overhead
dominates either way).

*Sticky actions.* ALE v5's own ``repeat_action_probability``
(``env_cfg.sticky_action_prob``, 0.25 by default as in Machado et al.), applied
by the emulator on every frame, in training and in evaluation.

*Grayscale / RGB.* ALE renders the grayscale screen itself
(``obs_type="grayscale"``), the cheapest way to get it; ``grayscale=False``
keeps RGB.

*Resize.* torchvision is not a dependency, so :class:`ResizeFrame` resizes
with ``torch.nn.functional.interpolate(mode="area")`` (an average over the
source pixels each target pixel covers, what OpenCV's ``INTER_AREA`` used by
the DQN wrappers does), rounds and returns uint8 in channels-first layout.

*No-op starts.* After every real reset of the game, a uniformly random number
in ``1..noop_max`` of NOOP actions (action 0), drawn from the ALE env's own
generator, so ``env.set_seed`` makes them reproducible. torchrl's
``NoopResetEnv`` is not used: it plays *random* actions (``rand_step``) rather
than NOOPs, draws ``0..noops-1`` of them from the global torch generator, and
would also run after the pseudo-resets of a lost life.

*Life loss.* With ``training=True`` and ``env_cfg.terminal_on_life_loss``, a
lost life ends the *training* episode as ``terminated`` (the value target
treats it as absorbing: the DQN / LightZero ``EpisodicLife`` trick), but the
emulator is not reset: the reset that follows returns the current screen and
the game continues with one life less; only a real game over (or the step
limit) resets the game. A real reset on every life loss would restart every
episode from the first life and full board, and the agent would never see the
later parts of a game. torchrl's ``EndOfLifeTransform`` only writes an extra
``"end-of-life"`` entry next to ``"done"``: it neither ends the episode nor
keeps the emulator running across a reset (a transform cannot keep the base
env from being reset), so it does not fit a replay buffer that reads
``("next", "terminated")``. Evaluation (``training=False``) plays whole games.
In training mode, ``"episode_reward"`` is thus the return of one life; Pong
has no lives, so there it is the game's return.

*Episode length.* ``env_cfg.max_episode_steps`` agent steps per *game*
(counted across lives; no-op steps excluded), then ``truncated``. 0 means
108,000 emulator frames as in MuZero / LightZero: ``108_000 // frame_skip``
agent steps (27,000 at frame skip 4). ALE's own frame limit is switched off so
the two do not race.

*Batching* (``pool``, ``env.pool`` in the config). ``"serial"``:
``SerialEnv``, the games in the caller's process (on 2 cores the fastest for
Pong, docs/performance_pipeline.md). ``"parallel"``: ``ParallelEnv``, one process per
game. ``"async"``: torchrl's ``AsyncEnvPool`` (multiprocessing backend,
shared-memory exchange), one process per game, through
:class:`~torchrl_muzero.torchrl_guards.GuardedAsyncEnvPool`, which
guards the three bugs torchrl 0.14.1 has in it (PR 4701: the collector crash
on ``env_index``, the shm exchange dropping outer-transform keys and rewards,
the shutdown spin). Its games are seeded in their factories with the seeds
``SerialEnv.set_seed(seed)`` would give them
(:func:`~torchrl_muzero.torchrl_guards.child_seeds`), so a seeded
async pool plays the same games as a seeded ``SerialEnv``. Each game of an
async pool sums its own rewards (``RewardSum`` inside the game, not around
the pool), so that
:class:`~torchrl_muzero.trainers.ready_collector.ReadyStepCollector`, which
the trainers use for ``env.pool=async``, can step whichever games are ready
with no per-step transform around the pool; under torchrl's ``Collector``
the pool steps all its games each step, as ``ParallelEnv`` does. A daemonic
process (such as the evaluator processes) may not start children: there
every pool is ``SerialEnv``.

Rewards are not clipped: MuZero learns values and rewards on a transformed
categorical support.
"""
from __future__ import annotations

import functools
import multiprocessing

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import Bounded, Composite
from torchrl.envs import (
    CatFrames,
    EnvBase,
    GymWrapper,
    ParallelEnv,
    RenameTransform,
    RewardSum,
    SerialEnv,
    TransformedEnv,
)
from torchrl.envs.transforms import Compose, ObservationTransform

__all__ = ["make_atari_env", "make_single_atari_env", "AtariGameWrapper", "ResizeFrame", "DEFAULT_MAX_FRAMES", "POOLS"]

DEFAULT_MAX_FRAMES = 108_000  # emulator frames per game (MuZero / LightZero: 27,000 agent steps at frame skip 4)


# ------------------------------------------------------------------------------------------ gymnasium level
class AtariGameWrapper(gym.Wrapper):
    """Game-level Atari logic that torchrl transforms cannot express.

    Wraps an ALE gymnasium env (``ale_py.AtariEnv`` under ``gym.make``):

    * ``noop_max`` > 0: after each real reset, ``1..noop_max`` NOOP steps
      (uniform, from the env's seeded generator);
    * ``terminal_on_life_loss``: a lost life returns ``terminated=True``; the
      next ``reset()`` (without a seed) then keeps the game running and
      returns the current screen. Any other reset is a real one;
    * ``max_steps`` > 0: ``truncated=True`` after that many agent steps of a
      game (across lives, no-ops excluded);
    * ``frame_skip`` > 1 (only with ``max_pool=True``, the ALE env stepping
      single frames): repeat the action, sum rewards, max-pool the last two
      frames.

    ``info`` gains ``"life_lost"`` (bool) and ``"game_over"`` (bool).

    Examples:
        >>> import ale_py, gymnasium as gym
        >>> from torchrl_muzero.envs.atari import AtariGameWrapper
        >>> gym.register_envs(ale_py)
        >>> env = AtariGameWrapper(gym.make("ALE/Pong-v5", obs_type="grayscale"), noop_max=30, max_steps=3)
        >>> obs, info = env.reset(seed=0)
        >>> 4 <= info["episode_frame_number"] <= 4 * 30  # 1..30 no-ops of 4 frames
        True
        >>> [env.step(0)[3] for _ in range(3)]  # truncated after 3 agent steps
        [False, False, True]
        >>> env.close()
    """

    def __init__(self, env, *, noop_max: int = 30, terminal_on_life_loss: bool = False, max_steps: int = 0,
                 frame_skip: int = 1, max_pool: bool = False) -> None:
        super().__init__(env)
        if max_pool and frame_skip < 2:
            raise ValueError(f"max-pooling frames needs frame_skip >= 2, got frame_skip={frame_skip}.")
        if not max_pool and frame_skip != 1:
            raise ValueError(
                "AtariGameWrapper repeats actions only when it max-pools (max_pool=True); "
                f"otherwise let ALE skip frames (frameskip=...) and pass frame_skip=1, got frame_skip={frame_skip}."
            )
        self.noop_max = int(noop_max)
        self.terminal_on_life_loss = bool(terminal_on_life_loss)
        self.max_steps = int(max_steps)
        self.frame_skip = int(frame_skip)
        self.max_pool = bool(max_pool)
        if self.noop_max > 0:
            meanings = env.unwrapped.get_action_meanings()
            if meanings[0] != "NOOP":
                raise ValueError(
                    f"no-op starts need action 0 to be NOOP, but {env.spec.id if env.spec else env} "
                    f"starts its action set with {meanings[0]!r}: set noop_max=0."
                )
        self._ale = env.unwrapped.ale
        self._lives = 0
        self._steps = 0
        self._continue_game = False  # the last step lost a life and the game goes on
        self._last_obs = None

    # one agent step of the underlying env(s)
    def _act(self, action):
        if not self.max_pool:
            return self.env.step(action)
        total = 0.0
        prev = obs = None
        for _ in range(self.frame_skip):
            prev = obs
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            if terminated or truncated:
                break
        if prev is not None:
            obs = np.maximum(prev, obs)
        return obs, total, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        if self._continue_game and seed is None:
            self._continue_game = False
            self._lives = self._ale.lives()
            info = {"lives": self._lives, "life_lost": False, "game_over": False}
            return self._last_obs, info
        self._continue_game = False
        obs, info = self.env.reset(seed=seed, options=options)
        if self.noop_max > 0:
            for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
                obs, _, terminated, truncated, info = self._act(0)
                if terminated or truncated:
                    obs, info = self.env.reset()
        self._steps = 0
        self._lives = self._ale.lives()
        self._last_obs = obs
        return obs, {**info, "life_lost": False, "game_over": False}

    def step(self, action):
        obs, reward, terminated, truncated, info = self._act(action)
        self._steps += 1
        if self.max_steps and self._steps >= self.max_steps:
            truncated = True
        game_over = bool(terminated or truncated)
        lives = self._ale.lives()
        life_lost = lives < self._lives
        self._lives = lives
        if self.terminal_on_life_loss and life_lost and not game_over:
            terminated = True
            self._continue_game = True
        self._last_obs = obs
        return obs, reward, terminated, truncated, {**info, "life_lost": life_lost, "game_over": game_over}


# ------------------------------------------------------------------------------------------ torchrl level
class ResizeFrame(ObservationTransform):
    """Resize uint8 screens to ``size x size``, channels first, with torch only.

    Input ``[..., H, W]`` (grayscale, ``rgb=False``) or ``[..., H, W, 3]``
    (``rgb=True``); output uint8 ``[..., C, size, size]`` with ``C`` 1 or 3.
    Pixels are area averages (``interpolate(mode="area")``), rounded.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.atari import ResizeFrame
        >>> t = ResizeFrame(84, rgb=True)
        >>> t._apply_transform(torch.full((210, 160, 3), 7, dtype=torch.uint8)).shape
        torch.Size([3, 84, 84])
    """

    def __init__(self, size: int, rgb: bool = False, in_keys=("observation",), out_keys=None) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"ResizeFrame size must be a positive integer, got {size!r}.")
        in_keys = list(in_keys)
        super().__init__(in_keys=in_keys, out_keys=list(out_keys) if out_keys is not None else in_keys)
        self.size = size
        self.rgb = bool(rgb)

    def _frame_dims(self) -> int:
        return 3 if self.rgb else 2

    def _apply_transform(self, obs: torch.Tensor) -> torch.Tensor:
        nd = self._frame_dims()
        if obs.ndim < nd or (self.rgb and obs.shape[-1] != 3):
            expected = "[..., H, W, 3]" if self.rgb else "[..., H, W]"
            raise ValueError(f"ResizeFrame expects {expected} screens, got shape {tuple(obs.shape)}.")
        lead = obs.shape[:-nd]
        x = obs.reshape(-1, *obs.shape[-nd:])
        x = x.permute(0, 3, 1, 2) if self.rgb else x.unsqueeze(1)  # [B, C, H, W]
        if tuple(x.shape[-2:]) != (self.size, self.size):
            x = torch.nn.functional.interpolate(x.float(), size=(self.size, self.size), mode="area")
            x = x.round_().clamp_(0, 255)
        x = x.to(torch.uint8)
        return x.reshape(*lead, *x.shape[1:])

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        nd = self._frame_dims()
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            spec = observation_spec[in_key]
            lead = spec.shape[:-nd]
            channels = 3 if self.rgb else 1
            observation_spec[out_key] = Bounded(
                low=0, high=255, shape=(*lead, channels, self.size, self.size), dtype=torch.uint8, device=spec.device
            )
        return observation_spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, rgb={self.rgb}, in_keys={self.in_keys})"


def _check_cfg(env_cfg) -> None:
    def positive(name, minimum=1):
        v = getattr(env_cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ValueError(f"env.{name} must be an integer >= {minimum} for Atari envs, got {v!r}.")

    positive("frame_skip")
    positive("frame_stack")
    positive("screen_size", 8)
    positive("noop_max", 0)
    positive("max_episode_steps", 0)
    if not 0.0 <= float(env_cfg.sticky_action_prob) <= 1.0:
        raise ValueError(f"env.sticky_action_prob must be in [0, 1], got {env_cfg.sticky_action_prob!r}.")


def max_agent_steps(env_cfg) -> int:
    """Agent steps per game: ``env_cfg.max_episode_steps``, or 108,000 frames' worth when it is 0."""
    return env_cfg.max_episode_steps or DEFAULT_MAX_FRAMES // env_cfg.frame_skip


def make_single_atari_env(env_cfg, training: bool = True, max_pool_frames: bool = False) -> EnvBase:
    """One (unbatched) preprocessed Atari env: observation uint8 ``[frame_stack * C, S, S]``.

    This is what each worker of :func:`make_atari_env` runs; no ``RewardSum``.
    """
    try:
        import ale_py
    except ImportError as err:  # pragma: no cover - ale-py is a core dependency
        raise ValueError(f"env id {env_cfg.id!r} needs ale-py: pip install 'ale-py>=0.10' (a dependency of torchrl_muzero: reinstall it).") from err
    gym.register_envs(ale_py)
    _check_cfg(env_cfg)
    try:
        spec = gym.spec(env_cfg.id)
    except gym.error.Error as err:
        raise ValueError(f"unknown env id {env_cfg.id!r}: gymnasium has no such environment ({err}).") from err
    entry = spec.entry_point
    if not (entry is ale_py.AtariEnv or (isinstance(entry, str) and entry.startswith("ale_py"))):
        raise ValueError(
            f"env.kind='atari' needs an ALE env id (such as 'ALE/Pong-v5'), got {env_cfg.id!r} "
            f"(entry point {entry!r}); use env.kind='gym' for other gymnasium envs."
        )
    genv = gym.make(
        env_cfg.id,
        obs_type="grayscale" if env_cfg.grayscale else "rgb",
        frameskip=1 if max_pool_frames else env_cfg.frame_skip,
        repeat_action_probability=float(env_cfg.sticky_action_prob),
        full_action_space=False,
        max_num_frames_per_episode=0,  # no ALE limit: AtariGameWrapper counts agent steps
        max_episode_steps=None,
        disable_env_checker=True,
    )
    genv = AtariGameWrapper(
        genv,
        noop_max=env_cfg.noop_max,
        terminal_on_life_loss=bool(training and env_cfg.terminal_on_life_loss),
        max_steps=max_agent_steps(env_cfg),
        frame_skip=env_cfg.frame_skip if max_pool_frames and env_cfg.frame_skip > 1 else 1,
        max_pool=bool(max_pool_frames and env_cfg.frame_skip > 1),
    )
    env = GymWrapper(genv)
    transforms = []
    keys = list(env.observation_spec.keys())
    if keys != ["observation"]:  # GymWrapper names RGB screens "pixels"
        if len(keys) != 1:
            raise ValueError(f"expected one screen entry from {env_cfg.id!r}, got observation keys {keys}.")
        transforms.append(RenameTransform(in_keys=keys, out_keys=["observation"]))
    transforms.append(ResizeFrame(env_cfg.screen_size, rgb=not env_cfg.grayscale))
    if env_cfg.frame_stack > 1:
        transforms.append(CatFrames(N=env_cfg.frame_stack, dim=-3, in_keys=["observation"], padding="same"))
    return TransformedEnv(env, Compose(*transforms))


POOLS = ("serial", "parallel", "async")


def _seeded_single_atari_env(env_cfg, training: bool, max_pool_frames: bool, seed: int | None) -> EnvBase:
    # RewardSum runs inside each game of an async pool: a collector that steps the ready games
    # (ReadyStepCollector) runs no per-step transform around the pool, which sees one game at a time
    env = TransformedEnv(make_single_atari_env(env_cfg, training, max_pool_frames), RewardSum())
    if seed is not None:
        env.set_seed(seed)
    return env


def make_atari_env(env_cfg, num_envs: int, training: bool = True, *, parallel: bool | None = None,
                   max_pool_frames: bool = False, pool: str | None = None, seed: int | None = None) -> EnvBase:
    """A batch of ``num_envs`` preprocessed Atari games (see the module docstring for every choice).

    Args:
        env_cfg (EnvConfig): ``id`` (an ALE id such as ``"ALE/Pong-v5"``),
            ``frame_skip``, ``frame_stack``, ``screen_size``, ``grayscale``,
            ``noop_max``, ``sticky_action_prob``, ``terminal_on_life_loss``,
            ``max_episode_steps`` (0: 108,000 frames).
        num_envs (int): batch size.
        training (bool): training envs end the episode at a lost life (when
            ``env_cfg.terminal_on_life_loss``); evaluation envs play whole games.

    Keyword Args:
        parallel (bool, optional): ``True``: ``ParallelEnv`` (one process per
            game), ``False``: ``SerialEnv`` (in-process). Default: parallel when
            ``num_envs > 1`` and the current process may start children (not
            daemonic). Ignored when ``pool`` is given.
        max_pool_frames (bool): DQN-style frame skipping in Python with a
            max-pool of the last two frames, instead of ALE's own frame skip.
        pool (str, optional): ``"serial"``, ``"parallel"`` or ``"async"``
            (the guarded ``AsyncEnvPool``, see the module docstring);
            overrides ``parallel``.
        seed (int, optional): with ``pool="async"``, seeds the games in their
            factories (a pool of worker processes cannot be seeded later:
            ``env.set_seed`` raises); the other pools are seeded with
            ``env.set_seed(seed)`` and take ``None`` here.

    Returns:
        a ``TransformedEnv`` of batch size ``[num_envs]`` with ``RewardSum``:
        ``"observation"`` uint8 ``[num_envs, frame_stack * C, S, S]``
        (``C`` = 1 grayscale, 3 RGB), one-hot actions over the game's minimal
        action set, float32 rewards, ``"episode_reward"``.

    Examples:
        >>> from torchrl_muzero.envs.atari import make_atari_env
        >>> from torchrl_muzero.trainers.config import EnvConfig
        >>> env = make_atari_env(EnvConfig(kind="atari", id="ALE/Pong-v5"), 2, parallel=False)
        >>> env.observation_spec["observation"].shape, env.observation_spec["observation"].dtype
        (torch.Size([2, 4, 96, 96]), torch.uint8)
        >>> env.reset()["observation"].shape
        torch.Size([2, 4, 96, 96])
        >>> env.close()
    """
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}.")
    _check_cfg(env_cfg)
    if pool is None:
        if parallel is None:
            parallel = num_envs > 1 and not multiprocessing.current_process().daemon
        pool = "parallel" if parallel else "serial"
    if pool not in POOLS:
        raise ValueError(f"make_atari_env: pool must be one of {POOLS}, got {pool!r}.")
    if pool != "serial" and multiprocessing.current_process().daemon:
        raise ValueError(
            f"make_atari_env(pool={pool!r}) cannot start env processes from a daemonic process; use pool='serial'."
        )
    if seed is not None and pool != "async":
        raise ValueError("make_atari_env(seed=...) is for pool='async'; seed the other pools with env.set_seed(seed).")
    if pool == "async":
        from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool, child_seeds

        factories = [functools.partial(_seeded_single_atari_env, env_cfg, training, max_pool_frames, s)
                     for s in child_seeds(seed, num_envs)]
        # each game sums its own rewards (see _seeded_single_atari_env): no transform outside the pool
        return TransformedEnv(GuardedAsyncEnvPool(factories, backend="multiprocessing", exchange="shm"))
    factory = functools.partial(make_single_atari_env, env_cfg, training, max_pool_frames)
    env = ParallelEnv(num_envs, factory) if pool == "parallel" else SerialEnv(num_envs, factory)
    return TransformedEnv(env, RewardSum())
