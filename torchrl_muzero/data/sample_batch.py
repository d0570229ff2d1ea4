"""Turning sampled roots into a learner batch: the MuZero targets, reanalyze, the target builders.

:meth:`GameBuffer.sample <torchrl_muzero.data.GameBuffer.sample>` draws the
roots and their importance weights; :func:`assemble_batch` walks each root's
``K + n + 1`` rows, rebuilds every observation it needs once (roots, future
observations, bootstrap states and reanalyze roots share one de-duplicated
request; with a ``root_memory`` the history windows of the bootstrap states and
reanalyze roots too), computes the value / reward / policy targets and lets the buffer's
target builders add their entries. It reads the stored rows through
:attr:`GameBuffer.store <torchrl_muzero.data.GameBuffer.store>` (a
:class:`~torchrl_muzero.data.replay_store.ReplayStore`) and the buffer's
public settings, and changes nothing but the buffer's generator; it lives
apart from ``game_buffer.py`` because it is the one long piece of the
sampling path.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from torchrl_muzero.data.off_policy_correction import corrected_td_steps, shorten_horizon
from torchrl_muzero.data.reanalyze import bootstrap_values, reanalyze_policies, resolve_reanalyze_search
from torchrl_muzero.data.replay_entries import EntryReanalysis, batch_entries, replace_entries
from torchrl_muzero.data.root_history import history_window
from torchrl_muzero.data.target_builders import TargetContext
from torchrl_muzero.data.targets import plan_value_targets, reward_targets, value_targets

if TYPE_CHECKING:
    from torchrl_muzero.data.game_buffer import GameBuffer

__all__ = ["assemble_batch"]


def assemble_batch(
    buffer: GameBuffer,
    roots: torch.Tensor,
    weight: torch.Tensor,
    *,
    model: Any,
    target_model: Any,
    num_reanalyze: int,
    policy_version: int | None,
) -> TensorDict:
    """The batch of :meth:`GameBuffer.sample` for the drawn ``roots`` ``[B]`` (see its docstring).

    ``target_model`` is the resolved bootstrap model (``None``: the stored
    search values); the first ``num_reanalyze`` samples get reanalyzed policy
    targets from ``model``.
    """
    store = buffer.store
    spec = store.spec
    B, K, n, A = roots.numel(), buffer.num_unroll_steps, buffer.td_steps, spec.num_actions
    g = buffer.generator
    n_re = num_reanalyze
    J = K + n + 1
    slots, exists, terminal, is_step = store.rows.walk(roots, J)
    steps = store.steps(slots.reshape(-1)).reshape(B, J)
    plan = plan_value_targets(exists, terminal, K, n)
    if buffer.off_policy_correction:  # older roots bootstrap sooner (EfficientZero)
        horizon = corrected_td_steps(steps["policy_version"][:, 0].cpu(), policy_version, n, buffer.correction_age_scale)
        plan = shorten_horizon(plan, terminal, horizon)
    zero = torch.zeros(())
    rewards = torch.where(is_step, steps["reward"].cpu(), zero)
    step_k = is_step[:, : K + 1]
    head = steps[:, : K + 1]

    # observations needed: roots (+ future), bootstrap states, reanalyze roots; rebuilt once each
    end_slots = slots.gather(1, plan.end)
    need_boot = plan.bootstrap
    requests = [roots]
    if buffer.with_future_observations and K > 0:
        future_ok = (exists[:, 1 : K + 1] | plan.absorbing[:, 1:])
        requests.append(slots[:, 1 : K + 1][future_ok])
    use_model_value = target_model is not None
    memory = buffer.root_memory  # acting from history: the model-made targets start from the same window
    windows = {}
    if use_model_value:
        requests.append(end_slots[need_boot])
        if memory is not None:
            windows["boot"] = history_window(store.rows, end_slots[need_boot], memory.context_length)
            requests.append(windows["boot"][0].reshape(-1))
    re_pos = None
    if n_re > 0:
        re_pos = step_k.clone()
        re_pos[n_re:] = False
        requests.append(slots[:, : K + 1][re_pos])
        if memory is not None:
            windows["re"] = history_window(store.rows, slots[:, : K + 1][re_pos], memory.context_length)
            requests.append(windows["re"][0].reshape(-1))
    unique, inverse = torch.unique(torch.cat(requests), return_inverse=True)
    obs_unique = store.observations(unique)
    pieces = list(torch.split(inverse, [r.numel() for r in requests]))

    out_device = buffer.device if buffer.device is not None else buffer.storage_device
    obs = torch.zeros((B, K + 1, *spec.obs_shape), dtype=spec.obs_dtype, device=out_device)
    obs[:, 0] = obs_unique[pieces.pop(0)].to(out_device)
    obs_mask = torch.zeros(B, K + 1, dtype=torch.bool)
    obs_mask[:, 0] = True
    if buffer.with_future_observations and K > 0:
        idx = pieces.pop(0)
        fut = obs[:, 1:]
        fut[future_ok.to(out_device)] = obs_unique[idx].to(out_device)
        obs_mask[:, 1:] = future_ok

    # value targets
    if use_model_value:
        idx = pieces.pop(0)
        history = _history(buffer, windows["boot"], obs_unique[pieces.pop(0)]) if memory is not None else None
        boot_values = torch.zeros(B, K + 1)
        if idx.numel():
            boot_values[need_boot] = bootstrap_values(target_model, obs_unique[idx], buffer.device,
                                                      memory=memory, history=history)
    else:
        stored = steps["root_value"].cpu().gather(1, plan.end)
        boot_values = torch.where(is_step.gather(1, plan.end), stored, zero)
    target_value = value_targets(rewards, plan, boot_values, buffer.discount, n, buffer.two_player)
    target_reward = reward_targets(rewards, plan)

    # policy targets
    target_policy = torch.where(step_k.unsqueeze(-1), head["search_policy"].cpu(), zero)
    # the declared per-step entries as stored, at the unrolled positions like target_policy
    entries = batch_entries(head, step_k, buffer.extra_entries) if buffer.extra_entries else None
    re_obs = None  # the reanalyzed positions' observations (for a reanalyze_entries hook)
    if re_pos is not None and bool(re_pos.any()):
        idx = pieces.pop(0)
        history = _history(buffer, windows["re"], obs_unique[pieces.pop(0)]) if memory is not None else None
        mask = head["action_mask"].cpu()[re_pos] if spec.has_action_mask else None
        to_play = None
        if buffer.two_player:  # the search plays both sides when it gets players to move
            to_play = (
                head["to_play"].cpu()[re_pos] if spec.has_to_play
                else torch.zeros(int(re_pos.sum()), dtype=torch.long)
            )
        re_obs = obs_unique[idx]
        search = resolve_reanalyze_search(buffer.reanalyze_search, buffer.mcts_config, buffer.discount)
        stored = entries[re_pos] if entries is not None else None
        target_policy[re_pos] = reanalyze_policies(
            search, model, re_obs, mask, to_play, add_noise=buffer.reanalyze_noise,
            generator=g, num_actions=A, device=buffer.device, memory=memory, history=history, stored=stored,
        )

    if spec.action_dim is None:
        random_actions = torch.randint(A, (B, K + 1), generator=g)
        action = torch.where(step_k, head["action"].cpu(), random_actions)
    else:  # a box's float actions [B, K+1, D]
        padding = _padding_box_actions(buffer.action_space, (B, K + 1), g)
        action = torch.where(step_k.unsqueeze(-1), head["action"].cpu(), padding)
    mask = plan.inside | plan.absorbing
    stamp = store.rows.write_time[roots]
    expand = lambda x: x.unsqueeze(1).expand(B, K + 1).contiguous()  # noqa: E731
    out = TensorDict(
        {
            "observation": obs,
            "observation_mask": obs_mask,
            "action": action,
            "target_reward": target_reward,
            "target_value": target_value,
            "target_policy": target_policy,
            "mask": mask,
            "policy_mask": step_k.clone(),
            "weight": expand(weight),
            "index": expand(roots),
            "stamp": expand(stamp),
            "policy_version": expand(head["policy_version"][:, 0].cpu()),
        },
        batch_size=[B, K + 1],
    )
    if entries is not None:
        if buffer.reanalyze_entries is not None:
            reanalyzed = re_pos if re_obs is not None else torch.zeros_like(step_k)
            info = EntryReanalysis(model, reanalyzed, re_obs, out["policy_mask"], target_policy)
            entries = replace_entries(entries, buffer.reanalyze_entries(entries, info), buffer.extra_entries)
        out.update(entries)
    if buffer.target_builders:
        context = TargetContext(K, n, buffer.discount, buffer.two_player, rewards, plan, entries)
        for builder in buffer.target_builders:
            builder.build(out, context)
            missing = [key for key in builder.out_keys if key not in out.keys()]
            if missing:
                raise RuntimeError(f"{builder!r} did not write its out_keys {missing}.")
    return out.to(out_device)


def _padding_box_actions(space: Any, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Uniform actions ``[*shape, D]`` within a box's bounds (0 along a dimension that is unbounded), for the
    unrolled positions where no step is stored (their targets are masked: any action in the box will do)."""
    low, high = space.low.float(), space.high.float()
    finite = torch.isfinite(low) & torch.isfinite(high)
    low, high = torch.where(finite, low, 0.0), torch.where(finite, high, 0.0)
    return low + torch.rand((*shape, space.dim), generator=generator) * (high - low)


def _history(buffer: GameBuffer, window: tuple[torch.Tensor, torch.Tensor], observations: torch.Tensor) -> TensorDict:
    """The acting memory of ``window`` (:func:`history_window`'s slots and valid ``[M, L]``) from its rebuilt
    ``observations [M * L, *obs]`` and the stored actions of its rows."""
    slots, valid = window
    M, L = slots.shape
    actions = buffer.store.steps(slots.reshape(-1))["action"].cpu()
    actions = actions.reshape(M, L, *actions.shape[1:])  # indices [M, L], or a box's floats [M, L, D]
    # the memory acting would carry there, from the window's steps (the memory's own packing)
    return buffer.root_memory.memory_from_steps(observations.reshape(M, L, *observations.shape[1:]), actions,
                                                valid.sum(1))
