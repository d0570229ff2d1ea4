"""Declared replay entries (``GameBuffer(extra_entries=...)``): read, stored, sampled, saved, refreshed."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from replay_cases import A, Episode, ValueStub, make_buffer
from torchrl_muzero.data import GameBuffer, ReplayEntry, TargetBuilder, ValuePrefixTargets

CAND = ("root", "candidates")
VISITS = ("root", "candidate_visits")
ENTRIES = [ReplayEntry(CAND, (3, 2)), ReplayEntry(VISITS, (3,))]
FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v1" / "ckpt" / "buffer.pt"


def candidates(ep: Episode) -> torch.Tensor:
    """``[T, 3, 2]`` values that name their episode and step: ``eid * 1000 + 10 t + j``."""
    t = torch.arange(ep.T, dtype=torch.float32).view(-1, 1, 1)
    return ep.eid * 1000 + 10 * t + torch.arange(6, dtype=torch.float32).view(1, 3, 2)


def visits(ep: Episode) -> torch.Tensor:
    return torch.softmax(candidates(ep).sum(-1) / 1000, -1)


def chunk(ep: Episode, t0: int, t1: int) -> TensorDict:
    td = ep.chunk(t0, t1)
    td[CAND] = candidates(ep)[t0:t1]
    td[VISITS] = visits(ep)[t0:t1]
    return td


def entry_buffer(**kw) -> GameBuffer:
    kw.setdefault("num_unroll_steps", 3)
    kw.setdefault("td_steps", 2)
    kw.setdefault("extra_entries", ENTRIES)
    return make_buffer(**kw)


def roots(batch):
    obs = batch["observation"][:, 0]
    return (obs[:, 0] // 1000).long().tolist(), obs[:, 1].long().tolist()


def check_entries(batch, episodes, K, stored=None, sampled=None):
    """Each sampled position holds its step's rollout values, the default 0 where no step is stored.

    ``stored``: steps stored per episode id (default: all); ``sampled``: the entries to check (default: the
    batch's), with the positions of ``batch``."""
    by_id = {ep.eid: ep for ep in episodes}
    stored = stored or {}
    sampled = batch if sampled is None else sampled
    for b, (eid, t) in enumerate(zip(*roots(batch))):
        ep = by_id[eid]
        for k in range(K + 1):
            p = t + k
            if p < stored.get(eid, ep.T):
                assert bool(batch["policy_mask"][b, k])
                torch.testing.assert_close(sampled[CAND][b, k], candidates(ep)[p])
                torch.testing.assert_close(sampled[VISITS][b, k], visits(ep)[p])
            else:
                assert not bool(batch["policy_mask"][b, k])
                assert bool((sampled[CAND][b, k] == 0).all()) and bool((sampled[VISITS][b, k] == 0).all())


def test_entries_are_stored_and_sampled_at_the_unrolled_positions():
    K = 3
    ep1 = Episode(1, [1.0] * 9, end="open")  # two chunks: the second completes the row the first left open
    ep2 = Episode(2, [2.0] * 5, end="terminal")
    buf = entry_buffer(num_unroll_steps=K)
    masked = chunk(ep2, 0, 5)
    padding = chunk(ep2, 4, 5)
    padding[CAND] = torch.full((1, 3, 2), -7.0)  # a row the collector masks out: never stored
    masked = torch.cat([masked, padding])
    masked["collector", "mask"] = torch.tensor([True] * 5 + [False])
    buf.extend(chunk(ep1, 0, 4))
    buf.extend(masked)
    buf.extend(chunk(ep1, 4, 9))
    assert len(buf) == 14
    assert buf.sample_keys[-2:] == (CAND, VISITS)
    batch = buf.sample(200)
    assert batch[CAND].shape == (200, K + 1, 3, 2) and batch[CAND].dtype == torch.float32
    assert batch[VISITS].shape == (200, K + 1, 3)
    check_entries(batch, [ep1, ep2], K)
    assert len(set(zip(*roots(batch)))) == 14  # every root was drawn
    # stored rows hold them too (the last observations the default)
    rows = buf[torch.arange(buf.num_rows)]
    step = rows["is_step"]
    assert bool((rows[CAND][~step] == 0).all())
    assert not bool((rows[CAND] == -7.0).any())


def test_save_load_keeps_the_entries(tmp_path):
    ep1, ep2 = Episode(1, [1.0] * 8, end="open"), Episode(2, [2.0] * 5)
    buf = entry_buffer(alpha=0.6, seed=3)
    buf.extend(torch.cat([chunk(ep1, 0, 4), chunk(ep2, 0, 5)]))
    path = tmp_path / "buffer.pt"
    buf.save(path)
    assert torch.load(path, weights_only=True)["entries"][0] == {"key": ["root", "candidates"], "shape": [3, 2],
                                                                  "dtype": "float32"}
    other = entry_buffer(alpha=0.6, seed=99)
    other.load(path)
    a, b = buf.sample(16), other.sample(16)
    assert (a == b).all()
    check_entries(b, [ep1, ep2], 3, stored={1: 4})
    buf.extend(chunk(ep1, 4, 8))
    other.extend(chunk(ep1, 4, 8))
    assert (buf.sample(16) == other.sample(16)).all()


def _one_line(message: str) -> bool:
    return "\n" not in message and len(message) < 400


def test_a_file_without_the_declared_entries_is_refused_in_one_line(tmp_path):
    # decided: refused, not filled with defaults (stored steps would get candidates no search produced)
    plain = make_buffer(num_unroll_steps=3, td_steps=2)
    plain.extend(Episode(1, [1.0] * 4).full())
    path = tmp_path / "plain.pt"
    plain.save(path)
    assert "entries" not in torch.load(path, weights_only=True)  # the state of a buffer without them is unchanged
    declaring = entry_buffer()
    with pytest.raises(ValueError) as info:
        declaring.load(path)
    message = str(info.value)
    assert _one_line(message) and "plain.pt" in message and "stores the replay entries none" in message
    assert "('root', 'candidates') [3, 2] float32" in message
    assert len(declaring) == 0 and declaring.write_count == 0  # untouched
    # and the other way round: a file with entries into a buffer that does not declare them
    with_entries = entry_buffer()
    with_entries.extend(chunk(Episode(1, [1.0] * 4), 0, 4))
    with_entries.save(tmp_path / "entries.pt")
    with pytest.raises(ValueError, match=r"entries.pt' stores the replay entries \[\('root', 'candidates'\)"):
        make_buffer(num_unroll_steps=3, td_steps=2).load(tmp_path / "entries.pt")


def test_the_v1_fixture_still_loads_and_is_refused_by_a_declaring_buffer():
    layout = torch.load(FIXTURE, weights_only=True)["layout"]
    kw = dict(frame_stack=layout["frame_stack"], frame_dim=layout["frame_dim"], frame_padding=layout["frame_padding"],
              frame_padding_value=layout["frame_padding_value"], observation_key=layout["observation_key"])
    buf = GameBuffer(layout["capacity"], **kw)
    buf.load(FIXTURE)
    assert len(buf) > 0
    with pytest.raises(ValueError) as info:
        GameBuffer(layout["capacity"], extra_entries=ENTRIES, **kw).load(FIXTURE)
    assert _one_line(str(info.value)) and str(FIXTURE) in str(info.value)


def test_a_rollout_entry_of_the_wrong_shape_or_dtype_is_refused_in_one_line():
    ep = Episode(1, [1.0] * 4)
    buf = entry_buffer()
    bad = chunk(ep, 0, 4)
    bad[CAND] = torch.zeros(4, 3)
    with pytest.raises(ValueError) as info:
        buf.extend(bad)
    assert str(info.value) == ("rollout entry ('root', 'candidates') must hold [3, 2] float32 per step "
                               "(declared in extra_entries), got [3] float32.")
    bad = chunk(ep, 0, 4)
    bad[VISITS] = bad[VISITS].double()
    with pytest.raises(ValueError, match=r"'candidate_visits'\) must hold \[3\] float32 per step .*got \[3\] float64"):
        buf.extend(bad)
    with pytest.raises(KeyError, match=r"no \('root', 'candidate_visits'\) entry"):
        buf.extend(chunk(ep, 0, 4).exclude(VISITS))
    assert len(buf) == 0 and buf.write_count == 0  # nothing was stored
    assert buf.extend(chunk(ep, 0, 4)) == 4


def test_declarations_that_shadow_other_names_are_refused():
    with pytest.raises(ValueError, match="'action' would shadow 'action'"):
        GameBuffer(10, extra_entries=[ReplayEntry("action", ())])
    with pytest.raises(ValueError, match="'target_value'.*MuZero targets"):
        GameBuffer(10, extra_entries=[ReplayEntry(("target_value", "x"), ())])
    with pytest.raises(ValueError, match="'target_value_prefix'.*ValuePrefixTargets"):
        GameBuffer(10, extra_entries=[ReplayEntry("target_value_prefix", ())], target_builders=[ValuePrefixTargets(2)])
    with pytest.raises(ValueError, match="overlap"):
        GameBuffer(10, extra_entries=[ReplayEntry("root", ()), ReplayEntry(("root", "x"), ())])
    with pytest.raises(TypeError, match="ReplayEntry instances"):
        GameBuffer(10, extra_entries=[("root", "x")])
    with pytest.raises(ValueError, match="shape"):
        ReplayEntry("x", (-1,))


class VisitTotal(TargetBuilder):
    """Reads the declared entries from the context (as the batch holds them after the hook)."""

    out_keys = ("visit_total",)

    def build(self, batch, context):
        batch["visit_total"] = context.entries[VISITS].sum(-1)


def test_a_reanalyze_hook_replaces_the_sampled_entries_and_builders_see_them():
    K = 2
    ep = Episode(3, [1.0] * 8)
    seen = {}

    def hook(entries, info):
        seen["stored"] = entries.clone()
        seen["info"] = info
        fresh = entries[CAND].clone()
        # a fresh 'search' at the reanalyzed positions: candidates from their observations
        fresh[info.reanalyzed] = info.observation.sum(-1).view(-1, 1, 1).expand(-1, 3, 2)
        return {CAND: fresh, VISITS: entries[VISITS] * 2}

    def uniform(model, obs, mask, to_play, add_noise, generator):
        return torch.full((obs.shape[0], A), 1.0 / A)

    buf = entry_buffer(num_unroll_steps=K, reanalyze_ratio=0.5, reanalyze_search=uniform, model=ValueStub(),
                       reanalyze_entries=hook, target_builders=[VisitTotal()])
    buf.extend(chunk(ep, 0, 8))
    batch = buf.sample(8)
    check_entries(batch, [ep], K, sampled=seen["stored"])  # the hook got the stored values
    re = seen["info"].reanalyzed
    assert bool(re[:4].any()) and not bool(re[4:].any())  # the first round(0.5 * 8) samples
    root_sum = batch["observation"][:, 0].sum(-1)  # observations are [eid * 1000 + t, t]: + 2 per step
    for b in range(8):
        for k in range(K + 1):
            if re[b, k]:
                assert bool((batch[CAND][b, k] == root_sum[b] + 2 * k).all())
    unchanged = ~re
    torch.testing.assert_close(batch[CAND][unchanged], seen["stored"][CAND][unchanged])
    torch.testing.assert_close(batch[VISITS], seen["stored"][VISITS] * 2)
    torch.testing.assert_close(batch["visit_total"], batch[VISITS].sum(-1))
    # the storage keeps the rollout's values
    torch.testing.assert_close(buf[torch.arange(8)][VISITS], visits(ep))


def test_a_hook_returning_none_keeps_and_a_bad_replacement_is_refused():
    ep = Episode(4, [1.0] * 6)
    buf = entry_buffer(reanalyze_entries=lambda entries, info: None)
    buf.extend(chunk(ep, 0, 6))
    check_entries(buf.sample(16), [ep], 3)
    buf.reanalyze_entries = lambda entries, info: {VISITS: torch.zeros(16, 4)}
    with pytest.raises(ValueError, match=r"returned \('root', 'candidate_visits'\) as \[16, 4\] float32, "
                                         r"expected \[16, 4, 3\] float32"):
        buf.sample(16)
    buf.reanalyze_entries = lambda entries, info: {"other": torch.zeros(16, 4)}
    with pytest.raises(ValueError, match="'other', which is not a declared replay entry"):
        buf.sample(16)


def test_an_algorithm_declares_entries_through_buffer_kwargs(tmp_path):
    from pipeline_utils import tiny_config
    from torchrl_muzero.algorithms import get_algorithm, registry
    from torchrl_muzero.trainers import load_config
    from torchrl_muzero.trainers.builders import build_buffer

    algo = dataclasses.replace(get_algorithm("muzero"), name="muzero_with_entries",
                               buffer_kwargs=lambda cfg: {"extra_entries": ENTRIES})
    registry.register(algo)
    try:
        buf = build_buffer(load_config(tiny_config(tmp_path, **{"algo.name": "muzero_with_entries"})))
    finally:
        registry._REGISTRY.pop("muzero_with_entries")
    assert buf.extra_entries == tuple(ENTRIES)
    assert buf.sample_keys[-2:] == (CAND, VISITS)
