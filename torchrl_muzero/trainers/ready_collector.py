"""A collector that steps the games of an ``AsyncEnvPool`` that are ready: :class:`ReadyStepCollector`.

torchrl's ``Collector`` steps a batched env as one batch: every step waits
for its slowest game. Over an :class:`~torchrl.envs.AsyncEnvPool` this
collector instead loops on the pool's own asynchronous API:

    wait for the games whose step finished (``async_step_and_maybe_reset_recv``,
    ``min_get=min_ready``: at least that many, and every other one already done)
      -> one frame per finished step, a new trajectory id where the game reset
      -> run the policy on the batch of those games only
      -> send their actions (``async_step_and_maybe_reset_send(env_index=...)``)

so a fast game keeps stepping while a slow one is still in its step.

Why not torchrl 0.14.1's ``AsyncBatchedCollector``: it builds its own pool
from factories (no place for the guards of ``env_pools.py``), serves the
policy from a background thread that keeps stepping while the learner trains
(weights could land mid-collect and frames of one batch would mix versions
the driver did not choose), hands out transitions without
``("collector", "traj_ids")`` and leaves per-game acting state to the env's
transforms, which run on the whole batch. This collector keeps the
pipeline's contract instead:

* **Policy on ready games only, acting state per game.** The policy sees the
  rows of the ready games. The per-game state a policy carries (the
  :class:`~torchrl.envs.transforms.TensorDictPrimer` of its acting memory,
  :func:`~torchrl_muzero.mcts.acting_memory.with_acting_memory`) is kept in a
  carrier indexed by env index: the next step reads what the policy wrote at
  ``("next", key)`` for that game, and the primer's zeros after that game's
  reset. Other transforms must run inside the pool's games (their factories),
  where they see one game at a time; an outer transform other than a primer
  is refused at construction.
* **Weights at collect boundaries.** The policy runs only inside a collect
  (``next(iter(collector))``); games still stepping when a batch is full keep
  stepping with the actions already chosen, and their frames go into the
  next batch. Every frame keeps the policy output that chose its action, so a
  version the policy writes (``LockedPolicy``'s ``"policy_version"``) is the
  version that produced it.
* **Trajectories.** One step in flight per game, frames appended in the
  order the steps finish: each game's frames stay in time order across
  batches; trajectory ids come from torchrl's trajectory pool (shared by the
  workers of a multi-process collector) and change at every reset. A batch is
  a flat ``[frames_per_batch]`` TensorDict (frames beyond it are carried over,
  none lost or repeated), which :class:`~torchrl_muzero.data.GameBuffer`
  groups by trajectory id.

It subclasses torchrl's ``BaseCollector`` and takes the keyword arguments a
``MultiAsyncCollector`` / ``MultiSyncCollector`` worker passes to its
``collector_class``.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Callable, Iterator

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase
from torchrl.collectors import BaseCollector
from torchrl.collectors.utils import _TrajectoryPool
from torchrl.envs import AsyncEnvPool, EnvBase, TransformedEnv
from torchrl.envs.transforms import Compose, TensorDictPrimer
from torchrl.envs.utils import ExplorationType, set_exploration_type

__all__ = ["ReadyStepCollector", "steps_ready_games", "split_ready_env"]

_TRAJ_KEY = ("collector", "traj_ids")

# Arguments of the workers' collector_class call that this collector does not
# implement: refused unless they hold the value that means "off".
_UNSUPPORTED_OFF = {
    "reset_at_each_iter": (False, None),
    "split_trajs": (False, None),
    "replay_buffer": (None,),
    "trajs_per_batch": (None,),
    "init_random_frames": (None, 0, -1),
    "max_frames_per_traj": (None, -1, 0),
    "track_policy_version": (False, None),
    "compile_policy": (False, None),
    "cudagraph_policy": (False, None),
}


def split_ready_env(env: EnvBase) -> tuple[AsyncEnvPool, list[TensorDictPrimer]]:
    """The pool under ``env`` and the primers around it (the only outer transforms a ready collector runs).

    Examples:
        >>> import functools
        >>> from torchrl.envs import GymEnv, TransformedEnv
        >>> from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool
        >>> pool = GuardedAsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")] * 2, backend="threading")
        >>> split_ready_env(TransformedEnv(pool))[0] is pool
        True
        >>> pool.close()
    """
    primers: list[TensorDictPrimer] = []
    node = env
    while isinstance(node, TransformedEnv):
        transform = node.transform
        members = list(transform) if isinstance(transform, Compose) else [transform]
        for t in members:
            if isinstance(t, Compose):
                members.extend(t)
            elif isinstance(t, TensorDictPrimer):
                if t.random:
                    raise ValueError(f"ReadyStepCollector: the primer of {list(t.primers.keys())} draws random "
                                     "values at reset; only zero-reset primers (acting memory) are carried per game.")
                primers.append(t)
            else:
                raise ValueError(
                    f"ReadyStepCollector: the env has an outer {type(t).__name__} around its pool; only "
                    "TensorDictPrimer (acting memory) may wrap it: move the transform into the pool's env factories."
                )
        node = node.base_env
    if not isinstance(node, AsyncEnvPool):
        raise ValueError(f"ReadyStepCollector steps an AsyncEnvPool's games; the env's base is a {type(node).__name__}.")
    return node, primers


def steps_ready_games(cfg) -> bool:
    """Whether a run's collectors step the games that are ready (:class:`ReadyStepCollector`).

    True for ``env.pool=async`` (Atari) with more than one game per collector:
    :func:`~torchrl_muzero.envs.make_env` then builds the guarded
    ``AsyncEnvPool``; otherwise torchrl's ``Collector`` steps the batch.

    Examples:
        >>> from torchrl_muzero.trainers.config import load_config
        >>> steps_ready_games(load_config({"env": {"kind": "atari", "id": "ALE/Pong-v5", "pool": "async"}}))
        True
        >>> steps_ready_games(load_config({}))
        False
    """
    from torchrl_muzero.envs.env_ids import effective_pool

    return cfg.env.kind == "atari" and effective_pool(cfg.env) == "async" and cfg.env.num_envs > 1


def _env_ids(td: TensorDictBase, key: str) -> list[int]:
    """The ``env_index`` entry of a pool result as one int per row."""
    values = td.get(key)
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    out = []
    for v in values:
        while isinstance(v, (list, tuple)):
            v = v[0]
        out.append(int(v))
    return out


def _dense(td: TensorDictBase, drop: str) -> TensorDictBase:
    """A dense copy without the pool's non-tensor ``env_index`` (the pool's lazy stacks alias its slots)."""
    td = td.exclude(drop)
    if isinstance(td, LazyStackedTensorDict):
        return td.contiguous()  # one dense TensorDict (every game has the same shapes)
    return td.clone()


class ReadyStepCollector(BaseCollector):
    """Collect from an ``AsyncEnvPool`` by stepping the games that are ready, not the whole batch.

    Args:
        create_env_fn: the env (or a callable returning it): an
            ``AsyncEnvPool`` (e.g. ``GuardedAsyncEnvPool``), possibly inside
            ``TransformedEnv`` wrappers that hold only
            ``TensorDictPrimer`` transforms (see :func:`split_ready_env`).
        policy: a TensorDict module run on the ready games' rows.

    Keyword Args:
        frames_per_batch: frames per yielded batch (exact; a flat batch).
        total_frames: stop after this many frames (``-1``: never).
        policy_factory: builds the policy (instead of ``policy``), as in
            torchrl's collectors.
        min_ready: at least this many finished steps (or all in flight, if
            fewer) before the policy runs; every other step already finished
            is taken too. ``1`` acts as soon as any game is ready.
        traj_pool: torchrl's trajectory-id pool (a multi-process collector
            passes its shared one); a private one by default.
        postproc: applied to each batch before it is yielded.
        device / policy_device: where the policy runs (inputs moved there,
            outputs back to the CPU).
        exploration_type: set around each policy call.

    Other keyword arguments of torchrl's ``Collector`` (what the
    multi-process collectors pass to ``collector_class``) are accepted when
    they hold their default and refused otherwise.

    Examples:
        >>> import functools, torch
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool
        >>> pool = GuardedAsyncEnvPool([functools.partial(GymEnv, "CartPole-v1")] * 3, backend="threading")
        >>> def policy(td):
        ...     td["action"] = pool.full_action_spec["action"][0].zero().expand(td.shape[0], 2).clone()
        ...     td["action"][:, 0] = 1
        ...     return td
        >>> collector = ReadyStepCollector(pool, policy, frames_per_batch=10, total_frames=20)
        >>> [batch.shape for batch in collector]
        [torch.Size([10]), torch.Size([10])]
        >>> collector.shutdown()
    """

    _use_buffers = False  # a multi-process worker reads this: batches travel as copies

    def __init__(
        self,
        create_env_fn: EnvBase | Callable[[], EnvBase],
        policy: Callable[[TensorDictBase], TensorDictBase] | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_factory: Callable[[], Any] | None = None,
        min_ready: int = 1,
        traj_pool: _TrajectoryPool | None = None,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        device: torch.device | str | None = None,
        policy_device: torch.device | str | None = None,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        create_env_kwargs: dict | None = None,
        worker_idx: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pre_collect_hook=kwargs.pop("pre_collect_hook", None),
                         post_collect_hook=kwargs.pop("post_collect_hook", None))
        for name, value in kwargs.items():
            if name in _UNSUPPORTED_OFF and not any(value is off or value == off for off in _UNSUPPORTED_OFF[name]):
                raise ValueError(f"ReadyStepCollector: {name}={value!r} is not supported (allowed: "
                                 f"{_UNSUPPORTED_OFF[name][0]!r}).")
        if not isinstance(frames_per_batch, int) or frames_per_batch < 1:
            raise ValueError(f"ReadyStepCollector: frames_per_batch must be an integer >= 1, got {frames_per_batch!r}.")
        if not isinstance(min_ready, int) or min_ready < 1:
            raise ValueError(f"ReadyStepCollector: min_ready must be an integer >= 1, got {min_ready!r}.")
        env = create_env_fn if isinstance(create_env_fn, EnvBase) else create_env_fn(**(create_env_kwargs or {}))
        self.env = env
        self.pool, primers = split_ready_env(env)
        if policy is None:
            if policy_factory is None:
                raise TypeError("ReadyStepCollector: pass policy or policy_factory.")
            policy = policy_factory()
        elif policy_factory is not None:
            raise TypeError("ReadyStepCollector: policy and policy_factory are mutually exclusive.")
        self.policy = policy
        self.frames_per_batch = frames_per_batch
        self.requested_frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.min_ready = min_ready
        self.postproc = postproc
        self.exploration_type = exploration_type
        device = policy_device if policy_device is not None else device
        self.policy_device = None if device is None else torch.device(device)
        self._worker_idx = worker_idx
        self._traj_pool = traj_pool if traj_pool is not None else _TrajectoryPool()
        self._idx_key = getattr(self.pool, "_env_idx_key", "env_index")
        self.num_envs = self.pool.num_envs
        # per-game acting state: one unbatched zero row per primer entry (what the primer writes at reset)
        zeros = []
        for primer in primers:
            zero = primer.primers.zero()
            zeros.append(zero[(0,) * zero.batch_dims] if zero.batch_dims else zero)
        self._memory_zero = zeros[0].update(*zeros[1:]) if zeros else None
        self._memory_keys = [] if self._memory_zero is None else list(self._memory_zero.keys(True, True))
        # what a game's root carries from one step to the next (besides memory and trajectory id)
        spec_keys = [*self.pool.full_observation_spec.keys(True, True), *self.pool.full_done_spec.keys(True, True),
                     *self.pool.full_state_spec.keys(True, True)]
        self._root_keys = list(dict.fromkeys(k for k in spec_keys if k not in self.pool.action_keys))
        self._carrier: TensorDictBase | None = None  # [num_envs]: each game's next root
        self._ready: list[int] = []  # games whose root waits for an action
        self._in_flight: dict[int, None] = {}  # the games stepping an action (ordered set)
        self._acted: TensorDictBase | None = None  # [num_envs]: the policy row whose action each game steps
        self._carry: deque[TensorDictBase] = deque()  # finished frames beyond the last batch
        self._frames = 0
        self._iter = -1
        self.steps_per_game = torch.zeros(self.num_envs, dtype=torch.int64)  # env steps each game made

    # ------------------------------------------------------------------ stepping
    def _start(self) -> None:
        ids = list(range(self.num_envs))
        self.pool.async_reset_send(env_index=ids)
        roots = self.pool.async_reset_recv(min_get=self.num_envs)
        order = torch.tensor(_env_ids(roots, self._idx_key)).argsort()
        carrier = _dense(roots, self._idx_key)[order].select(*self._root_keys, strict=False)
        if self._memory_zero is not None:
            carrier.update(self._memory_zero.expand(self.num_envs).clone())
        carrier.set(_TRAJ_KEY, self._traj_pool.get_traj_and_increment(self.num_envs, device=torch.device("cpu")))
        self._carrier = carrier
        self._ready = ids

    def _act(self) -> None:
        """Run the policy on the ready games and send their actions."""
        ids = self._ready
        self._ready = []
        index = torch.tensor(ids)
        rows = self._carrier[index]
        if self.policy_device is not None:
            rows = rows.to(self.policy_device)
        with torch.no_grad(), set_exploration_type(self.exploration_type):
            out = self.policy(rows)
        if self.policy_device is not None and self.policy_device.type != "cpu":
            out = out.to("cpu")
        if self._acted is None:  # [num_envs] rows, one per game: written when it acts, read when its step ends
            self._acted = out[:1].expand(self.num_envs).clone()
        self._acted[index] = out
        self._in_flight.update(dict.fromkeys(ids))
        self.pool.async_step_and_maybe_reset_send(out, env_index=ids)

    def _finish(self) -> TensorDictBase:
        """Wait for finished steps; return their frames and put their games' next roots in the carrier."""
        transitions, roots = self.pool.async_step_and_maybe_reset_recv(
            min_get=min(self.min_ready, len(self._in_flight)))
        ids = _env_ids(transitions, self._idx_key)
        if _env_ids(roots, self._idx_key) != ids:
            raise RuntimeError("AsyncEnvPool returned its transitions and next roots in different orders.")
        transitions = _dense(transitions, self._idx_key)
        roots = _dense(roots, self._idx_key).select(*self._root_keys, strict=False)
        for game in ids:
            del self._in_flight[game]
        index = torch.tensor(ids)
        acted = self._acted[index]
        frames = acted.exclude("next")
        nxt = transitions.get("next")
        if "next" in acted.keys():  # what the policy wrote for the next step (its acting memory)
            nxt = acted.get("next").update(nxt)
        frames.set("next", nxt)
        done = nxt.get("done").reshape(len(ids), -1).any(-1)
        if self._memory_zero is not None:
            carried = nxt.select(*self._memory_keys, strict=False).clone()
            for key in self._memory_keys:  # the primer's step: keep the root's value unless the policy set one
                if key not in carried.keys(True, True):
                    carried.set(key, acted.get(key))
            if bool(done.any()):  # the primer's reset, for the games that reset only
                carried[done] = self._memory_zero.expand(int(done.sum())).clone()
            roots.update(carried)
        traj = acted.get(_TRAJ_KEY).clone()
        if bool(done.any()):
            traj[done] = self._traj_pool.get_traj_and_increment(int(done.sum()), device=traj.device).to(traj.dtype)
        roots.set(_TRAJ_KEY, traj)
        self._carrier[index] = roots.to(self._carrier.device)
        self.steps_per_game.index_add_(0, index, torch.ones(len(ids), dtype=torch.int64))
        self._ready.extend(ids)
        return frames

    def rollout(self) -> TensorDictBase:
        """One batch of exactly ``frames_per_batch`` frames (fewer if ``total_frames`` ends first)."""
        if self._carrier is None:
            self._start()
        budget = self.frames_per_batch
        if self.total_frames >= 0:
            budget = min(budget, self.total_frames - self._frames)
        chunks: list[TensorDictBase] = []
        have = 0
        while have < budget:
            if self._carry:
                chunk = self._carry.popleft()
            else:
                if self._ready:
                    self._act()
                chunk = self._finish()
            if have + chunk.shape[0] > budget:
                self._carry.appendleft(chunk[budget - have:])
                chunk = chunk[: budget - have]
            chunks.append(chunk)
            have += chunk.shape[0]
        return torch.cat(chunks, 0)

    # ------------------------------------------------------------------ BaseCollector
    def iterator(self) -> Iterator[TensorDictBase]:
        """Yield batches until ``total_frames`` (forever with ``-1``)."""
        while self.total_frames < 0 or self._frames < self.total_frames:
            self._iter += 1
            if self.pre_collect_hook is not None:
                self.pre_collect_hook()
            batch = self.rollout()
            self._frames += batch.numel()
            if self.postproc is not None:
                batch = self.postproc(batch)
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            yield batch

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Close the env (and its pool's workers); steps still in flight are dropped with it."""
        if not close_env:
            return
        # the pool first: an unguarded AsyncEnvPool reads closed while its workers run (bug 6d, env_pools.py)
        if not self.pool.is_closed:
            self.pool.close(raise_if_closed=False)
        if not self.env.is_closed:
            self.env.close(raise_if_closed=False)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the env (a pool of worker processes is seeded in its factories and raises here)."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def state_dict(self) -> OrderedDict:
        return OrderedDict(frames=self._frames, iter=self._iter, traj_pool=self._traj_pool.state_dict())

    def load_state_dict(self, state_dict: OrderedDict) -> None:
        self._frames, self._iter = int(state_dict["frames"]), int(state_dict["iter"])
        self._traj_pool.load_state_dict(state_dict["traj_pool"])

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
