"""UniZero's replay targets see the history acting sees: bootstrap values and reanalyze roots.

UniZero acts from a window of the last ``context_length`` observations and
actions of the episode (HistoryWindowMemory). The buffer's n-step bootstrap
value (target model) and its reanalyze searches must start from that same
root, rebuilt from the stored episode: fewer steps near the episode's start,
none across an episode boundary. The reference here is acting itself: the
memory's root() stepped through each episode with advance(), as the policy does.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from pipeline_utils import tiny_config
from torchrl_muzero.algorithms import get_algorithm
from torchrl_muzero.data import GameBuffer, muzero_reanalyze
from torchrl_muzero.data.reanalyze import bootstrap_values
from torchrl_muzero.data.root_history import history_window
from torchrl_muzero.mcts.acting_memory import ContextLatentMemory
from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.trainers import load_config
from torchrl_muzero.trainers.builders import build_buffer

A, L = 3, 3


def _model(seed: int = 0) -> UniZeroModel:
    torch.manual_seed(seed)
    model = UniZeroModel((2,), A, embed_dim=16, num_heads=2, context_length=L, max_blocks=L + 3,
                         value_support_size=5, reward_support_size=5).eval()
    with torch.no_grad():  # an untrained value head says ~0 everywhere: make history change the value visibly
        model.value_head[-1].weight.normal_(0, 1.0)
    return model


def _episode(eid: int, T: int, *, end: str = "terminal") -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """One episode as a flat rollout with zero rewards; observation ``[eid, t / 10]`` (identifies the step)."""
    obs = torch.stack([torch.full((T + 1,), float(eid)), torch.arange(T + 1) / 10.0], -1)
    actions = (torch.arange(T) * (eid + 1)) % A
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[-1] = True
    terminated = done if end == "terminal" else torch.zeros_like(done)
    td = TensorDict({
        "observation": obs[:-1], "action": actions, "search_policy": torch.full((T, A), 1.0 / A),
        "root_value": torch.zeros(T), ("collector", "traj_ids"): torch.full((T,), eid),
        ("next", "observation"): obs[1:], ("next", "reward"): torch.zeros(T, 1),
        ("next", "done"): done, ("next", "terminated"): terminated, ("next", "truncated"): done & ~terminated,
    }, [T])
    return td, obs, actions


def _acting_roots(model, memory, obs, actions):
    """The roots the policy searches from at each step of one episode (memory reset at its start)."""
    mem = memory.zeros(1, model)
    roots = []
    for t in range(obs.shape[0]):
        root = memory.root(model, obs[t : t + 1], mem)
        roots.append(root)
        if t < actions.shape[0]:
            mem = memory.advance(model, root, actions[t : t + 1], mem)
    return roots


def _step(batch_obs):
    """(episode id, step) of observations ``[..., 2]``."""
    return batch_obs[..., 0].round().long(), (batch_obs[..., 1] * 10).round().long()


def _filled_buffer(target, episodes, **kw):
    """A buffer holding ``episodes`` and the values of acting's roots (``target``'s) at each of their steps."""
    kw = {**dict(num_unroll_steps=0, td_steps=2, discount=1.0, alpha=0.0, seed=0, tree_backend="torch",
                 target_model=target, root_memory=HistoryWindowMemory(L)), **kw}
    buf = GameBuffer(400, **kw)
    acting = {}
    for eid, T, end in episodes:
        td, obs, actions = _episode(eid, T, end=end)
        buf.extend(td)
        acting[eid] = [float(r.value) for r in _acting_roots(target, HistoryWindowMemory(L), obs, actions)]
    return buf, acting


@pytest.mark.parametrize("with_memory", [True, False])
def test_bootstrap_value_is_the_acting_roots_value_at_that_position(with_memory):
    """(a) + (c): with zero rewards and discount 1 the value target of root t is the bootstrap value at t + n.

    Episodes 0 and 1 are stored next to each other (1 right after 0's terminal row) and 2 after a truncation:
    a window that crossed into the previous episode would differ from acting's, which starts empty.
    """
    model, memory, n = _model(), HistoryWindowMemory(L), 2
    episodes = [(0, 9, "terminal"), (1, 7, "terminal"), (2, 6, "truncated")]
    buf, acting = _filled_buffer(model, episodes, td_steps=n, root_memory=memory if with_memory else None)
    batch = buf.sample(256)
    eid, t = _step(batch["observation"][:, 0])
    lengths = {e: T for e, T, _ in episodes}
    checked = 0
    for e, ti, value in zip(eid.tolist(), t.tolist(), batch["target_value"][:, 0].tolist()):
        s = ti + n
        if s >= lengths[e] and not (e == 2 and s == lengths[e]):  # after the terminal: 0, no bootstrap
            continue
        if with_memory:
            assert value == pytest.approx(acting[e][s], abs=1e-5), (e, ti)
        else:  # no memory: the observation alone (what every other algorithm keeps)
            alone = float(bootstrap_values(model, _episode(e, lengths[e])[1][s : s + 1]))
            assert value == pytest.approx(alone, abs=1e-6)
        checked += 1
    assert checked > 50
    if with_memory:  # the window matters for this model: the test would catch a history-blind value
        alone = bootstrap_values(model, _episode(0, 9)[1][5:6])
        assert abs(float(alone) - acting[0][5]) > 1e-3


def test_history_window_starts_empty_and_never_crosses_an_episode():
    """(b) + (c): the window of an episode's first row is empty, then grows to L, within its own episode."""
    model = _model()
    buf, _ = _filled_buffer(model, [(0, 5, "terminal"), (1, 6, "terminal")])
    rows = torch.arange(buf.num_rows)
    window, valid = history_window(buf._rows, rows, L)
    stored = buf[rows]
    eid, t = _step(stored["observation"])
    assert torch.equal(valid.sum(1), t.clamp(max=L))  # count = min(t, L): 0 at each episode's start
    for r in range(rows.numel()):
        real = window[r][valid[r]]
        assert torch.equal(_step(stored["observation"][real])[0], eid[r].expand(real.numel()))
        assert _step(stored["observation"][real])[1].tolist() == list(range(int(t[r]) - real.numel(), int(t[r])))


def test_bootstrap_value_with_an_empty_window_is_the_no_history_value():
    """(b): at an episode's start (count 0) the value is the observation's alone, as acting's first step."""
    model, memory = _model(), HistoryWindowMemory(L)
    obs = torch.randn(4, 2)
    empty = memory.memory_from_steps(torch.randn(4, L, 2), torch.randint(A, (4, L)), torch.zeros(4, dtype=torch.long))
    assert torch.count_nonzero(empty["history_observation"]) == 0  # zeroed like the primer's memory
    with_window = bootstrap_values(model, obs, memory=memory, history=empty)
    assert torch.allclose(with_window, bootstrap_values(model, obs), atol=1e-5)
    first = [float(_acting_roots(model, memory, o[None], torch.zeros(0, dtype=torch.long))[0].value) for o in obs]
    assert torch.allclose(with_window, torch.tensor(first), atol=1e-6)


def test_reanalyze_roots_are_the_acting_roots():
    """(d): the reanalyze search gets root= built from the window, equal to acting's root at that step."""
    model = _model()
    seen = []

    def recording_search(model_, observation, action_mask, to_play, add_noise, generator, root=None):
        seen.append((observation.clone(), root))
        return torch.full((observation.shape[0], A), 1.0 / A)

    buf, acting = _filled_buffer(model, [(0, 8, "terminal"), (1, 5, "terminal")], num_unroll_steps=2,
                                 reanalyze_ratio=1.0, reanalyze_search=recording_search, model=model,
                                 reanalyze_noise=False)
    buf.sample(32)
    (observation, root), = seen
    assert root is not None and root.value.shape == (observation.shape[0],)
    eid, t = _step(observation)
    expected = torch.tensor([acting[e][ti] for e, ti in zip(eid.tolist(), t.tolist())])
    assert torch.allclose(root.value, expected, atol=1e-5)
    assert torch.equal(root.state["length"], 2 * t.clamp(max=L) + 1)  # the window's tokens, then the root's latent


def test_default_reanalyze_search_starts_from_the_window_root():
    """(d) through muzero_reanalyze: its search is called with root=, and without it when there is no memory."""
    calls = []

    class Result:
        search_policy = torch.full((1, A), 1.0 / A)

    def fake_search(model, observation, config, action_mask=None, to_play=None, add_noise=True, generator=None,
                    **kw):
        calls.append(kw)
        return Result()

    reanalyze = muzero_reanalyze("settings", search=fake_search)
    reanalyze(None, torch.zeros(1, 2), None, None, False, None)
    reanalyze(None, torch.zeros(1, 2), None, None, False, None, root="the root")
    assert calls == [{}, {"root": "the root"}]


def test_only_unizero_buffers_rebuild_history(tmp_path):
    """The registry hands the window to UniZero's buffer only; other algorithms keep the observation alone."""
    for name in ("muzero", "efficientzero", "gumbel_muzero", "stochastic_muzero", "muzero_context",
                 "muzero_rnn_full_obs"):
        assert "root_memory" not in get_algorithm(name).buffer_kwargs(load_config(tiny_config(tmp_path)))
    cfg = load_config(tiny_config(tmp_path, **{"algo.name": "unizero", "algo.embed_dim": 16}))
    memory = build_buffer(cfg).root_memory
    assert isinstance(memory, HistoryWindowMemory) and memory.context_length == cfg.algo.context_length
    cfg = load_config(tiny_config(tmp_path, **{"algo.name": "unizero", "algo.embed_dim": 16,
                                               "algo.context_length": 0}))
    assert build_buffer(cfg).root_memory is None
    with pytest.raises(TypeError, match="rebuildable"):
        GameBuffer(10, root_memory=ContextLatentMemory(2))
    with pytest.raises(ValueError, match="one-player"):
        GameBuffer(10, root_memory=HistoryWindowMemory(2), two_player=True)


def test_bootstrap_reads_the_roots_value_without_building_the_root(monkeypatch):
    """The learner's bootstrap asks the memory for the root's value alone (``root_value``: UniZero skips
    the window's K/V cache); it is the acting root's value bit for bit."""
    model, memory = _model(), HistoryWindowMemory(L)
    assert model.kv_cache
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(6, 2, generator=g)
    history = memory.memory_from_steps(torch.randn(6, L, 2, generator=g), torch.randint(A, (6, L), generator=g),
                                       torch.tensor([0, 1, 2, 3, 3, 2]))
    expected = memory.root(model, obs, history).value.float()
    monkeypatch.setattr(HistoryWindowMemory, "root", lambda *args: pytest.fail("the bootstrap built the whole root"))
    assert torch.equal(bootstrap_values(model, obs, memory=memory, history=history), expected)
