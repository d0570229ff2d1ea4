"""UniZero's world model: the KV-cached search equals a full causal forward, causality, SimNorm, the context limit."""
from __future__ import annotations

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, search
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.modules.unizero import ResNetEncoder, SimNorm, UniZeroModel

OBS, A = (4,), 3
ATOL = 1e-5
# Decoded scalars: the supports' h^-1 (support.inverse_signed_hyperbolic, epsilon 1e-3) subtracts two
# numbers near 1 in float32 and turns a 1e-7 difference of logits into up to ~1e-4 of reward or value.
SCALAR_ATOL = 1e-3
POSITIONS = ["rope", "absolute"]


def make_model(position: str = "rope", seed: int = 0, **kwargs) -> UniZeroModel:
    torch.manual_seed(seed)
    kwargs = {"embed_dim": 16, "num_layers": 2, "num_heads": 2, "context_length": 3, "max_blocks": 12,
              "value_support_size": 5, "reward_support_size": 5, "encoder_hidden_dim": 16, **kwargs}
    model = UniZeroModel(OBS, A, position=position, **kwargs).eval()
    # GPT's 0.02 initialisation makes every output nearly constant; spread the weights so that
    # a wrong slot, position or mask would change the outputs by far more than the tolerance.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def history(B: int, K: int, missing: list[int], seed: int = 1):
    """A window of ``K`` past steps + the current observation per row, ``missing[b]`` absent at the start."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, K + 1, *OBS, generator=g)
    actions = torch.randint(A, (B, K), generator=g)
    valid = torch.arange(K + 1)[None] >= torch.tensor(missing)[:, None]
    return obs, actions, valid


@torch.no_grad()
def reference_steps(model: UniZeroModel, latents: list, actions: list, path: list[int]) -> list[dict]:
    """Full causal forwards (the training forward) along ``path`` from a root context, no cache.

    Applies the documented context rule: a step from a context of ``max_blocks``
    latents first keeps its last ``context_length + 1`` latents.
    """
    out = []
    for a in path:
        if len(latents) == model.max_blocks:
            keep = model.context_length + 1
            latents, actions = latents[-keep:], actions[len(actions) - (keep - 1):]
        actions = actions + [a]
        td = model(torch.stack(latents)[None], torch.tensor(actions)[None])
        z = td["next_latent"][0, -1]
        reward_logits = td["reward_logits"][0, -1]
        latents = latents + [z]
        # one dummy action closes the last block; causality keeps it out of z's outputs
        td = model(torch.stack(latents)[None], torch.tensor(actions + [0])[None])
        reward, value = model._decode(reward_logits, td["value_logits"][0, -1])
        out.append({"reward": reward, "value": value, "policy_logits": td["policy_logits"][0, -1], "latent": z})
    return out


def root_context(root_state, b: int) -> tuple[list, list]:
    n = (int(root_state["length"][b]) + 1) // 2
    return list(root_state["latents"][b, :n]), [int(x) for x in root_state["actions"][b, : n - 1]]


def path_to(tree, b: int, node: int) -> list[int]:
    path = []
    while node != 0:
        path.append(int(tree.action_from_parent[b, node]))
        node = int(tree.parent[b, node])
    return path[::-1]


def check_tree_against_full_forward(model, root, tree) -> int:
    """Every expanded node of every tree: the search's outputs == full forwards over root window + path."""
    checked = 0
    for b in range(tree.batch_size):
        latents, actions = root_context(root.state, b)
        for node in range(1, tree.num_nodes):
            path = path_to(tree, b, node)
            ref = reference_steps(model, latents, actions, path)[-1]
            parent = int(tree.parent[b, node])
            reward = tree.children_reward[b, parent, path[-1]]
            torch.testing.assert_close(reward, ref["reward"], atol=SCALAR_ATOL, rtol=0)
            torch.testing.assert_close(tree.raw_value[b, node], ref["value"], atol=SCALAR_ATOL, rtol=0)
            torch.testing.assert_close(tree.children_logits[b, node], ref["policy_logits"], atol=ATOL, rtol=0)
            state = tree.embeddings[b : b + 1, node]
            torch.testing.assert_close(UniZeroModel.node_latent(state)[0], ref["latent"], atol=ATOL, rtol=0)
            checked += 1
    return checked


# -- (a) cached incremental == full forward at every depth of a real search --------------------------


@pytest.mark.parametrize("position", POSITIONS)
def test_search_nodes_equal_full_forward_at_every_depth(position):
    model = make_model(position)
    obs, actions, valid = history(4, 3, missing=[0, 1, 2, 3])  # ragged: 4, 3, 2, 1 latents
    root = model.search_root(obs, actions, valid)
    assert root.state["length"].tolist() == [7, 5, 3, 1]
    result = muzero_search(model, root, MCTSConfig(num_simulations=20, backend="torch"),
                           generator=torch.Generator().manual_seed(0))
    tree = result.tree
    depth = torch.zeros(tree.batch_size, tree.num_nodes, dtype=torch.long)
    for n in range(1, tree.num_nodes):
        depth[:, n] = depth.gather(1, tree.parent[:, n : n + 1].long().clamp_min(0))[:, 0] + 1
    assert int(depth.max()) >= 3  # several depths, in one batch at once
    assert int(tree.embeddings["length"].max()) < model.max_tokens  # no slide here: pure cache
    assert check_tree_against_full_forward(model, root, tree) == 4 * 20
    # the root itself: a full forward over each row's packed window
    for b in range(4):
        latents, acts = root_context(root.state, b)
        td = model(torch.stack(latents)[None], torch.tensor(acts + [0])[None])
        torch.testing.assert_close(root.policy_logits[b], td["policy_logits"][0, -1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", POSITIONS)
def test_root_window_packs_ragged_rows_to_position_zero(position):
    """A row with a short history gives the same root as that history alone in a batch of one."""
    model = make_model(position)
    obs, actions, valid = history(3, 3, missing=[0, 2, 3])
    root = model.search_root(obs, actions, valid)
    for b, missing in enumerate([0, 2, 3]):
        alone = model.search_root(obs[b : b + 1, missing:], actions[b : b + 1, missing:])
        torch.testing.assert_close(root.policy_logits[b], alone.policy_logits[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(root.value[b], alone.value[0], atol=SCALAR_ATOL, rtol=0)
        child = model.search_step(root.state[b : b + 1], torch.tensor([1]))
        child_alone = model.search_step(alone.state, torch.tensor([1]))
        torch.testing.assert_close(child.policy_logits, child_alone.policy_logits, atol=ATOL, rtol=0)


def test_single_observation_root_matches_initial_inference():
    model = make_model()
    obs = torch.randn(2, *OBS)
    root = model.search_root(obs)
    latent, policy_logits, value_logits = model.initial_inference(obs)
    torch.testing.assert_close(root.policy_logits, policy_logits)
    torch.testing.assert_close(root.value, model.value_support.decode(value_logits), atol=SCALAR_ATOL, rtol=0)
    torch.testing.assert_close(UniZeroModel.node_latent(root.state), latent)


# -- (b) causality ------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
def test_changing_later_tokens_leaves_earlier_outputs_unchanged(position):
    model = make_model(position)
    B, T = 2, 6
    latents = torch.softmax(torch.randn(B, T, 16), -1)
    actions = torch.randint(A, (B, T))
    base = model(latents, actions)
    for p in range(2 * T - 1):  # change every token after slot p
        lat2, act2 = latents.clone(), actions.clone()
        for s in range(p + 1, 2 * T):
            if s % 2 == 0:
                lat2[:, s // 2] = torch.softmax(torch.randn(B, 16), -1)
            else:
                act2[:, s // 2] = (act2[:, s // 2] + 1) % A
        out = model(lat2, act2)
        z_seen, a_seen = p // 2 + 1, (p + 1) // 2  # blocks whose latent / action slot is <= p
        for key in ("policy_logits", "value_logits"):
            torch.testing.assert_close(out[key][:, :z_seen], base[key][:, :z_seen], atol=1e-6, rtol=0)
        for key in ("reward_logits", "next_latent"):
            torch.testing.assert_close(out[key][:, :a_seen], base[key][:, :a_seen], atol=1e-6, rtol=0)
        if p < 2 * T - 2:  # the last latent slot changed: its outputs must see it
            assert not torch.allclose(out["policy_logits"][:, -1], base["policy_logits"][:, -1])


# -- (c) the training forward == the search path ------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
def test_training_forward_equals_search_path(position):
    model = make_model(position)
    missing = [0, 1, 3]
    obs, hist_actions, valid = history(3, 3, missing)
    root = model.search_root(obs, hist_actions, valid)
    steps, state = [root], root.state
    path = torch.tensor([[0, 2, 1], [1, 1, 0], [2, 0, 2], [0, 0, 1]])  # [depth, B]
    for a in path:
        steps.append(model.search_step(state, a))
        state = steps[-1].state
    n = (state["length"] + 1) // 2  # latents per row (ragged, right-padded)
    T = int(n.max())
    actions = state["actions"][:, :T].clamp_min(0)  # closes each row's last block with a dummy action
    out = model(state["latents"][:, :T], actions)
    rows = torch.arange(3)
    n_root = n - len(path)
    for d, step in enumerate(steps):
        t = n_root - 1 + d  # block of the depth-d node's latent
        torch.testing.assert_close(out["policy_logits"][rows, t], step.policy_logits, atol=ATOL, rtol=0)
        value = model.value_support.decode(out["value_logits"][rows, t])
        torch.testing.assert_close(value, step.value, atol=SCALAR_ATOL, rtol=0)
        if d:
            reward = model.reward_support.decode(out["reward_logits"][rows, t - 1])
            torch.testing.assert_close(reward, step.reward, atol=SCALAR_ATOL, rtol=0)
            torch.testing.assert_close(out["next_latent"][rows, t - 1], state["latents"][rows, t], atol=ATOL, rtol=0)


def test_unroll_trains_end_to_end():
    model = make_model().train()
    out = model.unroll(torch.randn(2, 5, *OBS), torch.randint(A, (2, 5)))
    assert out.batch_size == torch.Size([2, 5]) and out["latent"].shape == (2, 5, 16)
    loss = sum(out[k].pow(2).mean() for k in ("policy_logits", "value_logits", "reward_logits", "next_latent"))
    loss.backward()
    assert model.encoder.net[0].weight.grad is not None
    assert model.action_embedding.weight.grad.abs().sum() > 0


# -- (d) SimNorm -------------------------------------------------------------------------------------


def test_simnorm_groups_sum_to_one_at_encoder_and_predicted_latent():
    model = make_model(simnorm_dim=4)
    z = model.encode(torch.randn(5, *OBS))
    torch.testing.assert_close(z.view(5, 4, 4).sum(-1), torch.ones(5, 4))
    assert (z >= 0).all()
    out = model(torch.softmax(torch.randn(2, 3, 16), -1), torch.randint(A, (2, 3)))
    torch.testing.assert_close(out["next_latent"].view(2, 3, 4, 4).sum(-1), torch.ones(2, 3, 4))
    x = torch.randn(3, 7, 12)
    torch.testing.assert_close(SimNorm(3)(x).view(3, 7, 4, 3).sum(-1), torch.ones(3, 7, 4))
    with pytest.raises(ValueError, match="divisible"):
        SimNorm(5)(x)


def test_layernorm_option():
    model = UniZeroModel(OBS, A, embed_dim=16, latent_norm="layernorm", value_support_size=5, reward_support_size=5)
    z = model.encode(torch.randn(5, *OBS))
    torch.testing.assert_close(z.mean(-1), torch.zeros(5), atol=1e-5, rtol=0)
    out = model(z[:, None], torch.zeros(5, 1, dtype=torch.long))
    torch.testing.assert_close(out["next_latent"].mean(-1), torch.zeros(5, 1), atol=1e-5, rtol=0)


# -- (e) the context limit -----------------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kv_cache", [True, False])
def test_context_limit_rebuilds_exactly_from_raw_tokens(position, kv_cache):
    model = make_model(position, context_length=2, max_blocks=4, kv_cache=kv_cache)
    obs, hist_actions, valid = history(2, 2, missing=[0, 2])  # 3 and 1 latents
    root = model.search_root(obs, hist_actions, valid)
    path = [[0, 1], [2, 2], [1, 0], [0, 0], [2, 1], [1, 2], [0, 1]]
    state, lengths = root.state, []
    steps = []
    for a in path:
        step = model.search_step(state, torch.tensor(a))
        steps.append(step)
        state = step.state
        lengths.append(state["length"].tolist())
        assert int(state["length"].max()) <= model.max_tokens
    # 4 latents (7 tokens) fill a context: row 0 slides at its 2nd step, row 1 at its 4th
    assert lengths[:4] == [[7, 3], [7, 5], [7, 7], [7, 7]]
    for b in range(2):
        latents, actions = root_context(root.state, b)
        ref = reference_steps(model, latents, actions, [a[b] for a in path])
        for step, r in zip(steps, ref):
            torch.testing.assert_close(step.policy_logits[b], r["policy_logits"], atol=ATOL, rtol=0)
            torch.testing.assert_close(step.value[b], r["value"], atol=SCALAR_ATOL, rtol=0)
            torch.testing.assert_close(step.reward[b], r["reward"], atol=SCALAR_ATOL, rtol=0)
            torch.testing.assert_close(UniZeroModel.node_latent(step.state)[b], r["latent"], atol=ATOL, rtol=0)


def test_context_limit_in_a_real_search_is_exact():
    model = make_model("rope", context_length=1, max_blocks=3)
    obs, hist_actions, valid = history(2, 1, missing=[0, 1])
    root = model.search_root(obs, hist_actions, valid)
    result = muzero_search(model, root, MCTSConfig(num_simulations=12, backend="torch"),
                           generator=torch.Generator().manual_seed(0))
    assert result.visit_counts.sum(-1).tolist() == [12, 12]
    tree, length = result.tree, result.tree.embeddings["length"]
    parent_length = length.gather(1, tree.parent.long().clamp_min(0))
    assert (length[:, 1:] < parent_length[:, 1:] + 2).any()  # some expansions slid their context
    assert check_tree_against_full_forward(model, root, tree) == 2 * 12


def test_context_limit_error_option_raises_clearly():
    model = make_model(context_length=2, max_blocks=4, on_overflow="error")
    obs, hist_actions, _ = history(1, 2, missing=[0])
    state = model.search_root(obs, hist_actions).state  # 3 latents
    state = model.search_step(state, torch.tensor([0])).state  # 4 latents: full
    with pytest.raises(RuntimeError, match="max_blocks=4"):
        model.search_step(state, torch.tensor([0]))


def test_bad_windows_raise():
    model = make_model(context_length=2)
    obs, hist_actions, valid = history(2, 2, missing=[0, 1])
    with pytest.raises(ValueError, match="prefix"):
        model.search_root(obs, hist_actions, valid.flip(1))
    obs3, act3, _ = history(1, 3, missing=[0])
    with pytest.raises(ValueError, match="context_length"):
        model.search_root(obs3, act3)
    with pytest.raises(ValueError, match="needs actions"):
        model.search_root(obs)
    with pytest.raises(TypeError, match="TensorDict"):
        model.search_step(torch.zeros(2, 16), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="max_blocks"):
        UniZeroModel(OBS, A, context_length=4, max_blocks=5)


# -- (f) the search runs on it --------------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITIONS)
def test_muzero_search_runs_and_kv_cache_does_not_change_visits(position):
    config = MCTSConfig(num_simulations=25, backend="torch")
    obs, hist_actions, valid = history(3, 3, missing=[0, 1, 3])
    visits = []
    for kv_cache in (True, False):
        model = make_model(position, kv_cache=kv_cache)
        root = model.search_root(obs, hist_actions, valid)
        result = muzero_search(model, root, config, generator=torch.Generator().manual_seed(3))
        assert result.visit_counts.sum(-1).tolist() == [25, 25, 25]
        visits.append((result.visit_counts, result.tree.raw_value))
    assert torch.equal(visits[0][0], visits[1][0])
    torch.testing.assert_close(visits[0][1], visits[1][1], atol=SCALAR_ATOL, rtol=0)


def test_search_from_observations_and_frames():
    model = make_model()
    out = search(model, torch.randn(2, *OBS), MCTSConfig(num_simulations=6, backend="torch"))
    assert out.visit_counts.sum(-1).tolist() == [6, 6]
    torch.manual_seed(0)
    frames = UniZeroModel((3, 16, 16), 4, embed_dim=16, max_blocks=6, context_length=2, value_support_size=5,
                          reward_support_size=5, encoder=ResNetEncoder((3, 16, 16), 16, channels=4)).eval()
    root = frames.search_root(torch.rand(2, 3, 3, 16, 16) * 255, torch.randint(4, (2, 2)))
    result = muzero_search(frames, root, MCTSConfig(num_simulations=5, backend="torch"))
    assert result.visit_counts.sum(-1).tolist() == [5, 5]


def test_tensordict_sequence_view_equals_unroll():
    from tensordict import TensorDict

    model = make_model()
    obs, actions = torch.randn(2, 4, *OBS), torch.randint(A, (2, 4))
    td = model.sequence(TensorDict({"observation": obs, "action": actions}, [2, 4]))
    out = model.unroll(obs, actions)
    for key in ("latent", "policy_logits", "value_logits", "reward_logits", "next_latent"):
        torch.testing.assert_close(td[key], out[key])
    assert not any(k.startswith("sequence.") for k in model.state_dict())  # no second copy of the weights
