"""``GameBuffer``: the single-owner MuZero replay storage.

Layout
------
One *row* per stored observation, in a circular storage of ``capacity`` rows
(torchrl :class:`~torchrl.data.LazyTensorStorage` s: one for the frames, one
for the small per-step payload). A row holds

* the newest frame of its observation (the whole observation when
  ``frame_stack == 1``): stacks are rebuilt from the rows before it;
* when the row is a *step*, the transition leaving it: action, reward,
  search policy, search value, policy version (and the action mask /
  player to move when the env has them);
* links to the previous and next rows of its trajectory, so that chunks
  from different workers may interleave freely in storage.

Rows that end a stored trajectory hold only an observation: the terminal
observation of a terminated episode, the last observation of a truncated
one (the bootstrap state), or the newest observation of a trajectory still
running. When the next chunk of a running trajectory arrives its first step
is written into that row, so a running trajectory costs no extra row and a
finished episode exactly one.

A *segment* is the rows one ``extend`` writes for one trajectory; they are
contiguous in storage. When new rows overwrite the oldest ones, a segment
that is only partly overwritten is evicted whole. The rows after an evicted
one lose the frames their stacks need, and are not sampled as roots.

Targets
-------
See :meth:`GameBuffer.sample` and :mod:`torchrl_muzero.data.targets`; what
a MuZero variant adds to them comes from its target builders
(:mod:`torchrl_muzero.data.target_builders`).

Modules
-------
This file is the buffer's public face and the orchestration of
``extend`` / ``sample`` / ``update_priority``. The pieces live next to it:
:mod:`~torchrl_muzero.data.storage_rows` (row kinds, links, eviction, the
priority tree), :mod:`~torchrl_muzero.data.rollout_reader` (reading
rollouts, the stored payload), :mod:`~torchrl_muzero.data.replay_entries` (the
per-step entries an algorithm declares), :mod:`~torchrl_muzero.data.replay_store`
(the stored rows: the one interface sampling and checkpoints use),
:mod:`~torchrl_muzero.data.sample_batch` (a sample's targets from its roots),
:mod:`~torchrl_muzero.data.reanalyze` (fresh policy / value targets from the
current models),
:mod:`~torchrl_muzero.data.off_policy_correction`,
:mod:`~torchrl_muzero.data.buffer_args` (argument checks),
:mod:`~torchrl_muzero.data.target_builders` and
:mod:`~torchrl_muzero.data.buffer_state` (checkpoints).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from torchrl_muzero.data import buffer_state
from torchrl_muzero.data.buffer_args import check_buffer_args, check_extra_entries, sample_models
from torchrl_muzero.data.frames import FrameStack
from torchrl_muzero.data.priority import PriorityTree
from torchrl_muzero.data.reanalyze import ReanalyzeSearch
from torchrl_muzero.data.replay_entries import EntriesHook, ReplayEntry
from torchrl_muzero.data.replay_store import ReplayStore
from torchrl_muzero.data.root_history import check_root_memory
from torchrl_muzero.data.rollout_reader import RowSpec, check_continuations, episode_starts, read_rollout
from torchrl_muzero.data.storage_rows import STEP, RowTable
from torchrl_muzero.data.sample_batch import assemble_batch
from torchrl_muzero.data.target_builders import MUZERO_SAMPLE_KEYS, TargetBuilder, check_target_builders
from torchrl_muzero.envs.action_spaces import ActionSpace, as_action_space

__all__ = ["GameBuffer"]


class GameBuffer:
    """Prioritized MuZero replay with de-duplicated frames and reanalyzed targets.

    The driver process owns it alone: :meth:`extend` takes collector rollouts,
    :meth:`sample` returns learner batches with their targets, and
    :meth:`update_priority` writes the new priorities back.

    Args:
        capacity (int): rows of storage. A row is one transition, plus one
            row per finished episode for its last observation (a running
            trajectory's newest observation becomes the row of its next step).
            Oldest segments are evicted first, whole.

    Keyword Args:
        num_unroll_steps (int): ``K``. Defaults to 5.
        td_steps (int): ``n`` of the n-step value targets. Defaults to 5.
        discount (float): ``gamma`` of the value targets. Defaults to 0.997.
        two_player (bool): zero-sum, players alternate every move; rewards are
            the mover's and value targets take the view of the player to move.
        observation_key (NestedKey): the observation entry of the rollouts
            (``("next", observation_key)`` is read too). Defaults to
            ``"observation"``.
        frame_stack (int): ``N`` of the ``CatFrames`` that stacked the
            observations; 1 (default) stores observations as they are.
        frame_dim (int): the ``dim`` of that ``CatFrames`` (negative).
            Defaults to -3 (``[N * C, H, W]`` images).
        frame_padding (str) / frame_padding_value: the ``padding`` /
            ``padding_value`` of that ``CatFrames`` (``"same"`` default).
        alpha (float): priority exponent (0: uniform sampling). Defaults to 0.6.
        beta (float): initial importance-sampling exponent. Defaults to 0.4.
        beta_annealing_steps (int): number of :meth:`sample` calls over which
            beta rises linearly to 1; 0 (default) keeps it constant.
        priority_eps (float): added to priorities before ``** alpha``.
        reanalyze_ratio (float): fraction of each batch whose policy targets
            come from a fresh search with the current model. Defaults to 0.
        mcts_config (MCTSConfig): settings of the default reanalyze search
            (default: ``MCTSConfig(discount=discount)``).
        reanalyze_noise (bool): Dirichlet noise at the reanalyze roots, as
            during collection (LightZero does so). Defaults to True.
        reanalyze_search (callable, optional): the search that makes the
            reanalyzed policy targets, ``(model, observation [n, *obs],
            action_mask [n, A] | None, to_play [n] | None, add_noise,
            generator) -> policy [n, A]`` (see
            :mod:`torchrl_muzero.data.reanalyze`). Default: MuZero's search
            with ``mcts_config`` (:func:`~torchrl_muzero.data.muzero_reanalyze`).
        with_future_observations (bool): fill ``observation[:, 1:]`` (for the
            consistency loss). Defaults to False.
        model: the current model (policy reanalyze). Can be given to
            :meth:`sample` instead.
        target_model: the model whose value bootstraps the n-step returns
            (value reanalyze). Defaults to ``model``; with neither, the stored
            search values are used.
        value_bootstrap (str): ``"auto"`` (default: the target model when
            there is one, else the stored search values), ``"model"`` (the
            target model, an error without one) or ``"stored"`` (the stored
            root search values even when a model is given).
        off_policy_correction (bool): EfficientZero's off-policy correction:
            samples whose root is older (in policy versions, see
            ``sample(policy_version=...)``) use shorter n-step horizons,
            ``clip(n - floor(age / correction_age_scale), 1, n)`` (see
            :mod:`torchrl_muzero.data.off_policy_correction`). Defaults to
            False (plain n-step returns, as LightZero).
        correction_age_scale (float): policy versions per step of horizon
            lost; required with ``off_policy_correction``.
        root_memory (HistoryWindowMemory, optional): the acting memory of a
            policy that acts from history (UniZero). The target model's
            bootstrap values and the reanalyze searches then start from the
            root acting builds at that position: the current observation and
            the previous ``root_memory.context_length`` observations and
            actions of the same episode (fewer near its start, none across
            it; :mod:`~torchrl_muzero.data.root_history`). A custom
            ``reanalyze_search`` then gets that root as ``root=``. Default
            none: both see the observation alone.
        target_builders (list of TargetBuilder): add entries to every sample
            after the MuZero targets, e.g.
            :class:`~torchrl_muzero.data.ValuePrefixTargets` for EfficientZero
            (see :attr:`sample_keys`). Defaults to none.
        extra_entries (list of ReplayEntry): further per-step entries to read
            from every rollout (by key; shape and dtype must match), store,
            checkpoint and sample at the unrolled positions ``[B, K+1, *shape]``
            (:mod:`~torchrl_muzero.data.replay_entries`). Defaults to none.
        reanalyze_entries (callable, optional): ``(entries [B, K+1],
            EntryReanalysis) -> replacements | None``, called once per
            :meth:`sample` before the target builders; what it returns
            replaces the sampled ``extra_entries`` in that batch (the storage
            keeps the rollouts' values). Default none: the stored values.
        action_space (ActionSpace, optional): the env's action space
            (:func:`~torchrl_muzero.envs.action_spaces.action_space_of`). A
            :class:`~torchrl_muzero.envs.action_spaces.BoxActionSpace` makes
            the buffer store the rollouts' float env actions ``[D]`` per step
            (and sample them as ``[B, K+1, D]``); a discrete one (or an int)
            checks that the search policies have its number of actions.
            Default none: index or one-hot actions, as the rollouts hold them.
        device: where model inputs go and where sampled batches are put
            (default: model calls on the model's device, batches on the
            storage device).
        storage_device: device of the storage (default ``"cpu"``).
        seed (int, optional): seeds the sampling / padding-action generator.
        tree_backend (str): ``"auto"``, ``"cpp"`` or ``"torch"`` (see
            :class:`~torchrl_muzero.data.PriorityTree`).

    Rollout entries read by :meth:`extend` (``[envs, T]`` or flat): the
    observation and ``("next", observation)``, ``"action"`` (index or one-hot;
    floats ``[D]`` with a box ``action_space``),
    ``("next", "reward")``, ``("next", "done")`` / ``"terminated"`` /
    ``"truncated"``, ``("collector", "traj_ids")``, ``"search_policy"``
    ``[A]``, ``"root_value"``, and when present ``"policy_version"``,
    ``"action_mask"``, ``"to_play"`` (and their ``"next"`` counterparts),
    ``("collector", "mask")`` (rows where it is False are skipped), and the
    ``extra_entries``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.data import GameBuffer
        >>> T, A = 6, 2
        >>> obs = torch.arange(T + 1, dtype=torch.float32).unsqueeze(-1)
        >>> done = torch.zeros(T, 1, dtype=torch.bool); done[-1] = True
        >>> rollout = TensorDict({
        ...     "observation": obs[:-1],
        ...     "action": torch.zeros(T, dtype=torch.long),
        ...     "search_policy": torch.full((T, A), 0.5),
        ...     "root_value": torch.zeros(T),
        ...     ("collector", "traj_ids"): torch.zeros(T, dtype=torch.long),
        ...     ("next", "observation"): obs[1:],
        ...     ("next", "reward"): torch.ones(T, 1),
        ...     ("next", "done"): done, ("next", "terminated"): done,
        ... }, [T])
        >>> buffer = GameBuffer(100, num_unroll_steps=2, td_steps=3, discount=0.5, seed=0)
        >>> buffer.extend(rollout)
        6
        >>> batch = buffer.sample(4)
        >>> batch.batch_size
        torch.Size([4, 3])
        >>> # the root at t = 4 sees rewards 1, 1 then the terminal: 1 + 0.5 = 1.5
        >>> t = batch["observation"][:, 0, 0].long()
        >>> bool((batch["target_value"][t == 4, 0] == 1.5).all())
        True
        >>> written = buffer.update_priority(batch["index"], torch.rand(4), batch["stamp"])
        >>> bool(written.all())
        True
    """

    def __init__(
        self,
        capacity: int,
        *,
        num_unroll_steps: int = 5,
        td_steps: int = 5,
        discount: float = 0.997,
        two_player: bool = False,
        observation_key: Any = "observation",
        frame_stack: int = 1,
        frame_dim: int = -3,
        frame_padding: str = "same",
        frame_padding_value: float = 0,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_annealing_steps: int = 0,
        priority_eps: float = 1e-6,
        reanalyze_ratio: float = 0.0,
        mcts_config: Any = None,
        reanalyze_noise: bool = True,
        reanalyze_search: ReanalyzeSearch | None = None,
        with_future_observations: bool = False,
        model: Any = None,
        target_model: Any = None,
        value_bootstrap: str = "auto",
        off_policy_correction: bool = False,
        correction_age_scale: float | None = None,
        root_memory: Any = None,
        target_builders: Iterable[TargetBuilder] | None = None,
        extra_entries: Iterable[ReplayEntry] | None = None,
        reanalyze_entries: EntriesHook | None = None,
        action_space: ActionSpace | int | None = None,
        device: torch.device | str | None = None,
        storage_device: torch.device | str = "cpu",
        seed: int | None = None,
        tree_backend: str = "auto",
    ) -> None:
        check_buffer_args(capacity=capacity, num_unroll_steps=num_unroll_steps, td_steps=td_steps, discount=discount,
                          alpha=alpha, beta=beta, beta_annealing_steps=beta_annealing_steps,
                          priority_eps=priority_eps, reanalyze_ratio=reanalyze_ratio,
                          reanalyze_search=reanalyze_search, reanalyze_entries=reanalyze_entries,
                          value_bootstrap=value_bootstrap, off_policy_correction=off_policy_correction,
                          correction_age_scale=correction_age_scale)
        self.capacity = capacity
        self.num_unroll_steps = num_unroll_steps
        self.td_steps = td_steps
        self.discount = float(discount)
        self.two_player = bool(two_player)
        self.observation_key = observation_key
        self.frames = FrameStack(frame_stack, frame_dim, frame_padding, frame_padding_value)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.beta_annealing_steps = beta_annealing_steps
        self.priority_eps = float(priority_eps)
        self.reanalyze_ratio = float(reanalyze_ratio)
        self.mcts_config = mcts_config
        self.reanalyze_noise = bool(reanalyze_noise)
        self.reanalyze_search = reanalyze_search
        self.with_future_observations = bool(with_future_observations)
        self.model = model
        self.target_model = target_model
        self.value_bootstrap = value_bootstrap
        self.off_policy_correction = bool(off_policy_correction)
        self.correction_age_scale = None if correction_age_scale is None else float(correction_age_scale)
        self.root_memory = check_root_memory(root_memory, self.two_player)
        self.target_builders = check_target_builders(target_builders)
        self.extra_entries = check_extra_entries(extra_entries, self.target_builders)
        self.reanalyze_entries = reanalyze_entries
        self.action_space = None if action_space is None else as_action_space(action_space)
        self.device = None if device is None else torch.device(device)
        self.storage_device = torch.device(storage_device)
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(int(seed))
        else:
            self._generator.seed()

        rows = RowTable(capacity, num_frames=self.frames.num_frames, alpha=self.alpha,
                        priority_eps=self.priority_eps, tree_backend=tree_backend)
        #: the stored rows (frames, payloads, row table, layout, cursor): what sampling and checkpoints read
        self.store = ReplayStore(capacity, self.frames, rows, storage_device=self.storage_device,
                                 entries=self.extra_entries)
        self._num_samples = 0

    # ------------------------------------------------------------------ info
    @property
    def generator(self) -> torch.Generator:
        """The generator of root draws, padding actions and reanalyze noise (a checkpoint saves its state)."""
        return self._generator

    @property
    def action_dim(self) -> int | None:
        """``D`` of the stored float actions (a box ``action_space``); None: discrete indices."""
        space = self.action_space
        return None if space is None or space.is_discrete else space.dim

    @property
    def num_samples(self) -> int:
        """:meth:`sample` calls so far: the clock of beta annealing (a checkpoint saves it)."""
        return self._num_samples

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self._num_samples = int(value)

    # the store's row table, its priority tree and running trajectories, under their former names
    @property
    def _rows(self) -> RowTable:
        return self.store.rows

    @property
    def _tree(self) -> PriorityTree:
        return self._rows.tree

    @property
    def _open(self) -> dict[int, tuple[int, int]]:
        return self._rows.open

    def __len__(self) -> int:
        """Number of stored transitions (step rows)."""
        return self._rows.num_transitions()

    @property
    def num_rows(self) -> int:
        """Rows in use: transitions plus last observations."""
        return self._rows.num_alive()

    @property
    def num_sampleable(self) -> int:
        """Transitions that can be drawn as roots (their frame history is stored)."""
        return int((self._tree.leaves > 0).sum())

    @property
    def write_count(self) -> int:
        """Rows written since creation (the clock of the sample stamps)."""
        return self.store.cursor

    @property
    def current_beta(self) -> float:
        """The importance-sampling exponent the next :meth:`sample` uses."""
        if self.beta_annealing_steps <= 0:
            return self.beta
        frac = min(1.0, self._num_samples / self.beta_annealing_steps)
        return self.beta + (1.0 - self.beta) * frac

    @property
    def sample_keys(self) -> tuple:
        """Every entry a :meth:`sample` holds: the MuZero targets, the ``extra_entries``, the target builders' keys."""
        return (MUZERO_SAMPLE_KEYS + tuple(e.key for e in self.extra_entries)
                + tuple(k for b in self.target_builders for k in b.out_keys))

    def nbytes(self) -> int:
        """Bytes held by the storage, the bookkeeping and the priority trees."""
        return self.store.nbytes()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(transitions={len(self)}, rows={self.num_rows}/{self.capacity}, "
            f"K={self.num_unroll_steps}, td_steps={self.td_steps}, frames={self.frames}, "
            f"reanalyze_ratio={self.reanalyze_ratio})"
        )

    # ---------------------------------------------------------------- extend
    def extend(self, rollout: TensorDictBase) -> int:
        """Store a collector batch; returns the number of transitions read.

        Rows are grouped by ``("collector", "traj_ids")`` (keeping their order
        inside a trajectory), so batches ``[envs, T]``, flat batches and chunks
        of different workers interleaved in any order are all fine, as long as
        one trajectory's steps come in time order. A trajectory id seen before
        continues that trajectory: its first observation must be the
        ``("next", observation)`` of its previous chunk.
        """
        if not is_tensor_collection(rollout):
            raise TypeError(f"GameBuffer.extend expects a TensorDict rollout, got {type(rollout).__name__}.")
        if rollout.batch_dims == 0:
            raise ValueError("GameBuffer.extend expects a batched rollout ([T] or [envs, T]), got batch_size [].")
        m = rollout.batch_size.numel()
        if m == 0:
            return 0
        data = read_rollout(rollout, self.observation_key, self.storage_device, self.extra_entries,
                            self.action_space)
        m = data["m"]
        if m == 0:
            return 0
        store = self.store
        if store.spec is None:
            store.spec = RowSpec.of(data, self.frames, self.extra_entries, action_dim=self.action_dim)
        else:
            store.spec.check(data)
        spec = store.spec

        segments = self._rows.plan_segments(data["traj"], data["done"], data["terminated"])
        n_new = sum(s["n_rows"] for s in segments)
        if n_new > self.capacity:
            raise ValueError(
                f"this rollout needs {n_new} rows ({m} transitions plus last observations), more than the "
                f"buffer's capacity of {self.capacity}: extend with smaller batches or raise capacity."
            )

        newest_obs = self.frames.newest(data["obs"])
        check_continuations(segments, newest_obs, store.frame_storage, self.observation_key)
        fresh_start = episode_starts(segments, data["obs"], self.frames)

        # ---- from here on the buffer changes: the row bookkeeping first, then the tensors
        placed = self._rows.write_block(segments, store.cursor, fresh_start)
        store.cursor += n_new
        frame_buf = torch.empty((n_new, *spec.frame_shape), dtype=spec.obs_dtype)
        frame_buf[placed.step_pos] = newest_obs[placed.step_src].to(spec.obs_dtype)
        frame_buf[placed.final_pos] = self.frames.newest(data["next_obs"])[placed.final_src].to(spec.obs_dtype)
        payload = spec.empty_payload(n_new)
        spec.fill_payload(payload, placed.step_pos, data, placed.step_src, placed.final_pos, placed.final_src)
        store.frame_storage.set(placed.new_slots, frame_buf.to(self.storage_device))
        store.step_storage.set(placed.new_slots, payload.to(self.storage_device))
        if placed.tail_slots.numel():
            tail_payload = spec.empty_payload(placed.tail_slots.numel())
            spec.fill_payload(tail_payload, torch.arange(placed.tail_slots.numel()), data, placed.tail_src, None, None)
            store.step_storage.set(placed.tail_slots, tail_payload.to(self.storage_device))
        return m

    # ------------------------------------------------------------------ rows
    def __getitem__(self, index: Any) -> TensorDict:
        """Stored rows by slot: the rebuilt observation and the step payload.

        Holds ``"observation"``, ``"action"``, ``"reward"``, ``"search_policy"``,
        ``"root_value"``, ``"policy_version"``, ``"traj_id"``, ``"stamp"``
        (write time), ``"is_step"`` (False for last-observation rows),
        ``"alive"``, and the ``extra_entries``.
        """
        store = self.store
        if store.spec is None:
            raise IndexError("the GameBuffer is empty.")
        slots = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= min(self.capacity, store.cursor)):
            raise IndexError(f"row index out of range [0, {min(self.capacity, store.cursor)}).")
        rows = store.rows
        out = store.steps(slots).clone()
        out["observation"] = store.observations(slots)
        out["traj_id"] = rows.traj[slots].clone()
        out["stamp"] = rows.write_time[slots].clone()
        out["is_step"] = rows.kind[slots] == STEP
        out["alive"] = rows.alive[slots].clone()
        return out

    # ---------------------------------------------------------------- sample
    def sample(
        self, batch_size: int, *, model: Any = None, target_model: Any = None, policy_version: int | None = None
    ) -> TensorDict:
        """Draw ``batch_size`` roots (proportionally to priority) with their targets.

        Args:
            batch_size (int): ``B``.
            model: current model for policy reanalyze (default: ``self.model``).
            target_model: model whose value bootstraps the returns (default:
                ``self.target_model``, else ``model``; with neither, or with
                ``value_bootstrap="stored"``, the stored search values are
                used, and 0 where no search ran: the last observation of a
                truncated or running trajectory).
            policy_version (int, optional): the current policy version, from
                which the off-policy correction counts the age of the samples
                (required when it is on, ignored otherwise).

        Returns:
            a TensorDict of batch size ``[B, K+1]`` on ``device`` holding

            * ``"observation"`` ``[B, K+1, *obs_shape]``: column 0 the root;
              with ``with_future_observations`` column ``k`` is the observation
              at ``t+k`` (the terminal observation repeated after a terminal),
              otherwise columns ``1..K`` are zeros;
            * ``"observation_mask"`` (bool): column ``k`` holds an observation;
            * ``"action"`` (long): the action taken at ``t+k``; uniformly random
              where no step is stored (after an episode's end, last column's
              padding); with a box ``action_space``, the env's float actions
              ``[B, K+1, D]`` (padding uniform within the box's finite bounds,
              0 along unbounded dimensions);
            * ``"target_reward"``: reward of the transition into ``t+k`` (0 at
              ``k = 0`` and after a terminal);
            * ``"target_value"``: the n-step bootstrapped value (see
              :mod:`torchrl_muzero.data.targets`; with ``off_policy_correction``
              older samples use shorter horizons, see
              :mod:`torchrl_muzero.data.off_policy_correction`);
            * ``"target_policy"`` ``[B, K+1, A]``: the stored search policy, or a
              fresh search's for the first ``round(reanalyze_ratio * B)`` samples
              (zeros where ``policy_mask`` is False);
            * ``"mask"`` (bool): value / reward targets exist (inside the
              episode, and after a terminal where they are 0; False past a
              truncation or the newest stored step);
            * ``"policy_mask"`` (bool): a policy target exists (a step is stored);
            * ``"weight"``: importance weights ``(p_i / p_min) ** -beta`` with
              ``p_min`` the smallest priority *of the batch* (the largest weight
              is 1; the same in every column; read column 0);
            * ``"index"`` / ``"stamp"`` (long): the root rows and their write
              times (the same in every column), for :meth:`update_priority`;
            * ``"policy_version"`` (long): the version that searched the root;

            then the ``extra_entries`` ``[B, K+1, *shape]`` (each entry's
            default where ``policy_mask`` is False; replaced where a
            ``reanalyze_entries`` hook says so), then the entries of the
            ``target_builders`` (all listed by :attr:`sample_keys`).
        """
        model, target_model, n_re = sample_models(self, batch_size, model, target_model, policy_version)
        roots = self._tree.sample(batch_size, generator=self._generator)
        prio = self._tree[roots]
        beta = self.current_beta
        # Normalised by the batch's own smallest priority (as LightZero does), not the
        # buffer's: one near-zero priority anywhere in the buffer would otherwise
        # shrink every weight, and the loss scale would jump whenever it is sampled
        # or overwritten, which Adam's running statistics follow only slowly.
        weight = (prio / prio.min()).pow(-beta).float()
        self._num_samples += 1

        return assemble_batch(self, roots, weight, model=model, target_model=target_model, num_reanalyze=n_re,
                              policy_version=policy_version)

    # ------------------------------------------------------------ priorities
    def update_priority(self, index: Any, priority: Any = None, stamp: Any = None) -> torch.Tensor:
        """Write back new priorities for sampled roots, unless their row changed since.

        Args:
            index: ``[B]`` (or ``[B, K+1]``, column 0 is read) row ids from
                :meth:`sample`; or the sampled TensorDict itself, holding
                ``"index"``, ``"stamp"`` and ``"priority"`` (as
                ``MuZeroLoss`` leaves it).
            priority: ``[B]`` (or ``[B, K+1]``) non-negative priorities.
            stamp: ``[B]`` (or ``[B, K+1]``) the ``"stamp"`` of that sample.

        A row evicted, or overwritten by newer data, after the sample was drawn
        is left alone (LightZero's make_time / clear_time guard, per row).
        Returns a ``[B]`` bool tensor: True where the priority was written.
        """
        if is_tensor_collection(index):
            td = index
            for key in ("index", "stamp") + (("priority",) if priority is None else ()):
                if key not in td.keys():
                    raise KeyError(f"update_priority: the TensorDict has no {key!r} entry.")
            index, stamp = td["index"], td["stamp"]
            priority = td["priority"] if priority is None else priority
        if priority is None or stamp is None:
            raise ValueError("update_priority needs index, priority and stamp (the 'stamp' returned by sample).")

        return self._rows.update_priorities(index, priority, stamp)

    # ----------------------------------------------------------------- state
    def end_running_trajectories(self) -> int:
        """End every stored running trajectory as truncated; return how many.

        Call it when the collectors that produced them are gone (a resumed run
        starts new collectors whose trajectory ids begin again at 0): the
        newest observation of each becomes a truncation (bootstrap) row, and a
        later chunk with the same id starts a new trajectory instead of being
        checked against it.
        """
        return self._rows.end_running_trajectories()

    def state_dict(self) -> dict:
        """Everything needed to resume: storage, links, priorities, cursors, RNG.

        Models, the reanalyze search and the target builders are configuration,
        not state: they are not saved (see :mod:`torchrl_muzero.data.buffer_state`).
        """
        return buffer_state.buffer_state_dict(self)

    def load_state_dict(self, state: dict, *, _source: str = "state_dict") -> None:
        """Restore :meth:`state_dict`; raises ``ValueError`` if it does not fit this buffer."""
        buffer_state.load_buffer_state(self, state, _source)

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` to ``path`` (``torch.save``)."""
        buffer_state.save_buffer(self, path)

    def load(self, path: str | os.PathLike) -> None:
        """Resume from a file written by :meth:`save`.

        Raises ``FileNotFoundError`` if it is missing and ``ValueError``
        naming the file if it is unreadable, corrupt or made by a buffer of a
        different capacity / frame layout.
        """
        buffer_state.load_buffer_file(self, path)
