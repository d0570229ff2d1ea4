"""Atari envs (torchrl_muzero.envs.atari) and the Atari hydra configs.

Small and fast: at most two games per env, a few hundred steps, ALE's own
ROMs (offline). Pong has no lives; Breakout has 5 (life-loss tests).
"""
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("ale_py")

from tensordict.nn import TensorDictModuleBase  # noqa: E402
from torchrl.envs.utils import step_mdp  # noqa: E402

from pipeline_utils import live_descendants  # noqa: E402
from torchrl_muzero.envs import env_spaces, make_env  # noqa: E402
from torchrl_muzero.envs.atari import (  # noqa: E402
    ResizeFrame,
    make_atari_env,
    make_single_atari_env,
    max_agent_steps,
)
from torchrl_muzero.trainers.config import EnvConfig  # noqa: E402

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")


def _cfg(game="Pong", **kw):
    return EnvConfig(name=game, kind="atari", id=f"ALE/{game}-v5", **kw)


def _ale(single_env):
    """The ALE interface under a ``make_single_atari_env`` env."""
    return single_env.base_env._env.unwrapped.ale


def _area_resize(screen: torch.Tensor, size: int) -> torch.Tensor:
    """Reference resize, independent of ResizeFrame: [H, W] or [H, W, 3] -> [C, size, size] uint8."""
    x = screen.permute(2, 0, 1) if screen.ndim == 3 else screen[None]
    return torch.nn.functional.adaptive_avg_pool2d(x.float(), (size, size)).round().to(torch.uint8)


def _wait_no_children(timeout=10.0):
    deadline = time.monotonic() + timeout
    while live_descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    return live_descendants()


# ------------------------------------------------------------------------------------------ shapes and dtypes
def test_factory_builds_a_parallel_grayscale_env_the_model_can_read():
    from torchrl.envs import ParallelEnv

    env = make_env(_cfg(parallel=True), num_envs=2, seed=0)
    try:
        assert isinstance(env.base_env, ParallelEnv)
        spec = env.observation_spec["observation"]
        assert spec.shape == (2, 4, 96, 96) and spec.dtype == torch.uint8
        assert env_spaces(env) == ((4, 96, 96), 6)
        assert env.reward_spec.dtype == torch.float32
        td = env.rollout(6)
        assert td["observation"].shape == (2, 6, 4, 96, 96) and td["observation"].dtype == torch.uint8
        assert td["next", "reward"].dtype == torch.float32
        assert td["next", "episode_reward"].shape == (2, 6, 1)
        assert spec.is_in(td["next", "observation"][:, -1])
        # the two games are seeded differently: their no-op starts differ (or their screens do)
        assert not torch.equal(td["observation"][0], td["observation"][1])
    finally:
        env.close()
    assert _wait_no_children() == []


@pytest.mark.parametrize("grayscale,size,channels", [(True, 96, 1), (False, 84, 3)])
def test_observation_is_the_area_resized_screen_stacked_channels_first(grayscale, size, channels):
    env = make_atari_env(_cfg(grayscale=grayscale, screen_size=size), 2, parallel=False)
    try:
        spec = env.observation_spec["observation"]
        assert spec.shape == (2, 4 * channels, size, size) and spec.dtype == torch.uint8
        env.set_seed(0)
        td = env.reset()
        for _ in range(3):
            td = step_mdp(env.rand_step(td))
        obs = td["observation"]
        assert obs.shape == (2, 4 * channels, size, size) and obs.dtype == torch.uint8
        for i in range(2):
            ale = _ale(env.base_env._envs[i])
            screen = torch.from_numpy(ale.getScreenGrayscale() if grayscale else ale.getScreenRGB())
            assert torch.equal(obs[i, -channels:], _area_resize(screen, size))  # newest frame last, RGB in order
    finally:
        env.close()


def test_resize_frame_averages_areas_and_rejects_bad_screens():
    blocks = torch.randint(0, 256, (48, 48), dtype=torch.uint8)
    screen = blocks.repeat_interleave(2, 0).repeat_interleave(2, 1)  # 96x96 of 2x2 blocks
    t = ResizeFrame(48)
    assert torch.equal(t._apply_transform(screen), blocks[None])
    batch = torch.stack([screen, 255 - screen])  # leading dims are kept
    assert torch.equal(t._apply_transform(batch)[1, 0], 255 - blocks)
    rgb = torch.stack([screen, screen // 2, screen // 3], -1)
    out = ResizeFrame(48, rgb=True)._apply_transform(rgb)
    assert torch.equal(out, torch.stack([blocks, blocks // 2, blocks // 3]))
    with pytest.raises(ValueError, match=r"\[\.\.\., H, W, 3\]"):
        ResizeFrame(48, rgb=True)._apply_transform(screen)
    with pytest.raises(ValueError, match="positive integer"):
        ResizeFrame(0)


# ------------------------------------------------------------------------------------------ ALE settings
def _actions_policy(action_index, num_actions=6):
    def policy(td):
        return td.set("action", torch.nn.functional.one_hot(torch.tensor(action_index), num_actions))

    return policy


def test_sticky_actions_are_ale_v5_repeat_probability():
    env = make_single_atari_env(_cfg(sticky_action_prob=0.25))
    assert _ale(env).getFloat("repeat_action_probability") == pytest.approx(0.25)
    env.close()

    def screens(prob, action):
        e = make_single_atari_env(_cfg(sticky_action_prob=prob, noop_max=0))
        e.set_seed(0)
        out = e.rollout(40, _actions_policy(action), break_when_any_done=False)["next", "observation"]
        e.close()
        return out

    # always sticky: the agent's actions never reach the game (NOOP repeats forever)
    assert torch.equal(screens(1.0, 2), screens(1.0, 3))
    # never sticky: paddle up and paddle down give different games
    assert not torch.equal(screens(0.0, 2), screens(0.0, 3))


def test_noop_starts_play_1_to_noop_max_noops_after_each_reset():
    env = make_single_atari_env(_cfg(noop_max=30))
    ale = _ale(env)
    frames = []
    env.set_seed(0)
    for _ in range(12):
        env.reset()
        frames.append(ale.getEpisodeFrameNumber())
    assert all(f % 4 == 0 and 4 <= f <= 120 for f in frames), frames  # 1..30 agent no-ops of 4 frames
    assert len(set(frames)) > 3, frames
    env.set_seed(0)
    again = []
    for _ in range(12):
        env.reset()
        again.append(ale.getEpisodeFrameNumber())
    assert again == frames  # drawn from the seeded env generator
    env.close()
    env = make_single_atari_env(_cfg(noop_max=0))
    env.reset()
    assert _ale(env).getEpisodeFrameNumber() == 0
    env.close()


def _play_breakout(training, steps, **kw):
    """Random Breakout play; yields (td after step, lives before, lives after, episode frame) per step."""
    torch.manual_seed(0)
    env = make_single_atari_env(_cfg("Breakout", **kw), training=training)
    ale = _ale(env)
    env.set_seed(0)
    td = env.reset()
    events = []
    try:
        for _ in range(steps):
            lives = ale.lives()
            td = env.rand_step(td)
            event = {"lives_before": lives, "lives_after": ale.lives(), "game_over": ale.game_over(),
                     "terminated": bool(td["next", "terminated"]), "truncated": bool(td["next", "truncated"])}
            events.append(event)
            if td["next", "done"]:
                last = td["next", "observation"][-1].clone()
                frame = ale.getEpisodeFrameNumber()
                td = env.reset()
                event["reset_kept_game"] = ale.getEpisodeFrameNumber() == frame and ale.lives() == event["lives_after"]
                event["reset_obs_is_last_screen"] = bool((td["observation"] == last).all())
            else:
                td = step_mdp(td)
    finally:
        env.close()
    return events


def test_life_loss_terminates_training_episodes_but_the_game_goes_on():
    events = _play_breakout(True, 400)
    life_losses = [e for e in events if e["lives_after"] < e["lives_before"] and not e["game_over"]]
    assert len(life_losses) >= 4
    assert all(e["terminated"] for e in life_losses)
    # the reset after a lost life continues the same game from its current screen
    assert all(e["reset_kept_game"] and e["reset_obs_is_last_screen"] for e in life_losses)
    # nothing else terminates, and a real game over resets the game
    others = [e for e in events if e["terminated"] and e not in life_losses]
    assert others and all(e["game_over"] and not e["reset_kept_game"] for e in others)


def test_evaluation_plays_whole_games():
    events = _play_breakout(False, 400)
    assert sum(e["lives_after"] < e["lives_before"] for e in events) >= 4
    done = [e for e in events if e["terminated"] or e["truncated"]]
    assert done and all(e["game_over"] for e in done)


def test_max_episode_steps_truncates_the_game_across_lives():
    assert max_agent_steps(_cfg()) == 27_000  # 0: 108,000 frames at frame skip 4
    assert max_agent_steps(_cfg(frame_skip=3)) == 36_000
    env = make_single_atari_env(_cfg(max_episode_steps=7))
    assert _ale(env).getInt("max_num_frames_per_episode") == 0  # ALE's own limit is off
    env.set_seed(0)
    td = env.rollout(16, break_when_any_done=False)
    env.close()
    assert td["next", "truncated"].squeeze(-1).nonzero().squeeze(-1).tolist() == [6, 13]
    assert not td["next", "terminated"].any()
    # training Breakout: lives end training episodes, the step limit counts the whole game
    events = _play_breakout(True, 70, max_episode_steps=60)
    ends = [i for i, e in enumerate(events) if e["terminated"] or e["truncated"]]
    assert any(events[i]["terminated"] for i in ends if i < 59)
    assert events[59]["truncated"] and not events[59]["game_over"]


def test_max_pooled_frame_skip_matches_a_manual_reference():
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = make_single_atari_env(_cfg(noop_max=0, sticky_action_prob=0.0), max_pool_frames=True)
    env.set_seed(0)
    td = env.rollout(30, _actions_policy(1), break_when_any_done=False)
    assert _ale(env).getEpisodeFrameNumber() == 120
    env.close()
    ref = gym.make("ALE/Pong-v5", obs_type="grayscale", frameskip=1, repeat_action_probability=0.0)
    ref.reset(seed=0)
    for _ in range(30):  # the ball is served around frame 60
        screens = [ref.step(1)[0] for _ in range(4)]
    ref.close()
    last = torch.from_numpy(screens[-1])
    pooled = torch.from_numpy(screens[-2]).maximum(last)
    assert not torch.equal(_area_resize(pooled, 96), _area_resize(last, 96))  # the moving ball shows
    assert torch.equal(td["next", "observation"][-1, -1:], _area_resize(pooled, 96))


# ------------------------------------------------------------------------------------------ errors
def test_clear_errors_for_bad_ids_and_settings():
    with pytest.raises(ValueError, match="unknown env id 'ALE/NotAGame-v5'"):
        make_env(_cfg("NotAGame"), num_envs=2)
    with pytest.raises(ValueError, match="needs an ALE env id"):
        make_atari_env(EnvConfig(kind="atari", id="CartPole-v1"), 1)
    with pytest.raises(ValueError, match="env.frame_stack"):
        make_atari_env(_cfg(frame_stack=0), 1)
    with pytest.raises(ValueError, match="env.sticky_action_prob"):
        make_atari_env(_cfg(sticky_action_prob=1.5), 1)
    with pytest.raises(ValueError, match="num_envs"):
        make_atari_env(_cfg(), 0)


# ------------------------------------------------------------------------------------------ replay
class _RandomSearchPolicy(torch.nn.Module):
    """Random actions; a fake search policy; root values that number the steps."""

    def __init__(self, num_actions):
        super().__init__()
        self.num_actions = num_actions
        self.count = 0

    def forward(self, td):
        b, a = td.batch_size, self.num_actions
        td["action"] = torch.nn.functional.one_hot(torch.randint(a, b), a)
        td["search_policy"] = torch.full((*b, a), 1.0 / a)
        td["root_value"] = torch.arange(self.count, self.count + b.numel(), dtype=torch.float32).view(b)
        self.count += b.numel()
        return td


def test_game_buffer_rebuilds_the_catframes_stacks_of_a_collector_rollout():
    from torchrl.collectors import Collector

    from torchrl_muzero.data import GameBuffer

    torch.manual_seed(0)
    env = make_atari_env(_cfg("Breakout"), 2, training=True, parallel=False)
    env.set_seed(0)
    collector = Collector(env, _RandomSearchPolicy(4), frames_per_batch=120, total_frames=240,
                          auto_register_policy_transforms=False)
    buf = GameBuffer(1000, num_unroll_steps=2, td_steps=3, frame_stack=4, alpha=0.0,
                     with_future_observations=True, seed=0)
    batches = []
    try:
        for batch in collector:
            batches.append(batch.reshape(-1).clone())
            buf.extend(batch)
    finally:
        collector.shutdown()
    data = torch.cat(batches)
    assert data["next", "terminated"].any()  # life-loss resets are in there
    by_id = {int(v): i for i, v in enumerate(data["root_value"])}
    rows = buf[torch.arange(buf.num_rows)]
    steps = rows["is_step"].nonzero().squeeze(-1).tolist()
    assert len(steps) == 240
    for r in steps:
        assert torch.equal(rows["observation"][r], data["observation"][by_id[int(rows["root_value"][r])]])
    sample = buf.sample(64)
    for b in range(64):
        i = by_id[int(rows["root_value"][int(sample["index"][b, 0])])]
        assert torch.equal(sample["observation"][b, 0], data["observation"][i])
        assert torch.equal(sample["observation"][b, 1], data["next", "observation"][i])


# ------------------------------------------------------------------------------------------ configs
def _compose(*overrides):
    from torchrl_muzero.trainers.hydra_entry import compose_config  # what the scripts' config gives

    return compose_config(CONFIG_DIR, overrides)


def test_hydra_pong_config_is_a_valid_atari_train_config():
    from torchrl_muzero.trainers.builders import build_model
    from torchrl_muzero.trainers.config import TrainConfig

    cfg = _compose("env=Pong")
    assert isinstance(cfg, TrainConfig)
    assert (cfg.env.kind, cfg.env.id, cfg.env.num_envs, cfg.env.screen_size, cfg.env.frame_stack) == (
        "atari", "ALE/Pong-v5", 8, 96, 4)
    assert (cfg.model.kind, cfg.model.value_support_size, cfg.model.reward_support_size) == ("resnet", 300, 300)
    assert (cfg.mcts.num_simulations, cfg.mcts.discount, cfg.buffer.td_steps, cfg.buffer.num_unroll_steps) == (
        50, 0.997, 5, 5)
    assert (cfg.optim.batch_size, cfg.train.replay_ratio, cfg.loss.consistency_loss_weight) == (256, 0.25, 2.0)
    assert (cfg.train.total_env_steps, cfg.eval.num_episodes) == (1_000_000, 3)
    # the trainer's probe: one env, the model built for its observation
    probe = make_env(cfg.env, num_envs=1, seed=0)
    try:
        obs_shape, num_actions = env_spaces(probe)
        obs = probe.reset()["observation"]
    finally:
        probe.close()
    assert (obs_shape, num_actions) == ((4, 96, 96), 6)
    cfg.model.channels = 8  # small for the test; the architecture is the config's
    model = build_model(cfg, obs_shape, num_actions)
    latent, policy_logits, value_logits = model.initial_inference(obs)
    assert policy_logits.shape == (1, 6) and value_logits.shape == (1, 601)

    generic = _compose("env=atari", "env.id=ALE/Breakout-v5")
    assert (generic.env.kind, generic.env.id, generic.model.kind) == ("atari", "ALE/Breakout-v5", "resnet")


def test_atari_configs_share_every_setting_but_the_game():
    def flat(cfg):
        from torchrl_muzero.trainers.config import config_to_dict

        d = config_to_dict(cfg)
        return {f"{k}.{kk}": vv for k, v in d.items() if isinstance(v, dict) for kk, vv in v.items()}

    pong, generic = flat(_compose("env=Pong")), flat(_compose("env=atari"))
    differ = sorted(k for k in pong if pong[k] != generic[k])
    assert differ == ["env.name", "train.stop_return"]


class _FixedPongPolicy(TensorDictModuleBase):
    """A deterministic function of the screen: equal screens give equal actions, so two pools can be compared."""

    in_keys = ["observation"]
    out_keys = ["action"]

    def __init__(self, num_actions):
        super().__init__()
        self.num_actions = num_actions

    def forward(self, td):
        obs = td["observation"]
        index = obs.flatten(-3).long().sum(-1) % self.num_actions
        td["action"] = torch.nn.functional.one_hot(index, self.num_actions)
        return td


def _pong_rollout(pool, frames, seed=0):
    from torchrl.collectors import Collector

    env = make_env(_cfg(pool=pool, max_episode_steps=120), num_envs=2, seed=seed)
    collector = Collector(env, policy=_FixedPongPolicy(env_spaces(env)[1]), frames_per_batch=frames,
                          total_frames=frames)
    try:
        return env, next(iter(collector))
    finally:
        collector.shutdown()  # closes the env too


@pytest.mark.slow  # 28 s at load 6 on 2 cores: two worker processes start and 800 Pong frames are stepped
@pytest.mark.timeout(180)
def test_env_pool_async_collects_the_games_serialenv_collects():
    """A Collector runs Pong through the guarded AsyncEnvPool: frames, rewards and outer-transform keys intact."""
    from torchrl_muzero.torchrl_guards import GuardedAsyncEnvPool

    env, batch = _pong_rollout("async", 400)
    assert isinstance(env.base_env, GuardedAsyncEnvPool) and env.base_env.resolved_exchange == "shm"
    _, reference = _pong_rollout("serial", 400)
    assert reference["next", "reward"].abs().sum() > 0, "no point scored: rewards are not exercised"
    assert reference["next", "truncated"].any(), "no game ended: resets are not exercised"
    for key in ["observation", ("next", "observation"), "action", ("next", "reward"), ("next", "done"),
                ("next", "truncated"), "episode_reward", ("next", "episode_reward"), ("collector", "traj_ids")]:
        assert torch.equal(batch[key], reference[key]), f"{key} differs from SerialEnv's"
    assert not _wait_no_children()


def test_env_pool_is_checked_at_start():
    from torchrl_muzero.trainers.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^config key 'env.pool' must be one of \('serial', 'parallel', 'async'\), "
                                          r"got 'asnyc'. Did you mean 'async'\?$"):
        load_config({"env": {"kind": "atari", "id": "ALE/Pong-v5", "pool": "asnyc"}})
    with pytest.raises(ConfigError, match="only Atari envs"):
        load_config({"env": {"pool": "async"}})  # CartPole
    assert load_config({"env": {"kind": "atari", "id": "ALE/Pong-v5", "pool": "async"}}).env.pool == "async"
    with pytest.raises(ValueError, match="pool must be one of"):
        make_atari_env(_cfg(), 2, pool="threads")
