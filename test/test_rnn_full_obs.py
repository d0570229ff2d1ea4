"""``algo=muzero_rnn_full_obs``: the GRU model, the teacher-forced loss, the per-env acting GRU state."""
import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector

from torchrl_muzero.envs import make_env
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.acting_memory import ContextLatentMemory, RecurrentHiddenMemory, with_acting_memory
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel, RNNFullObsResNetModel
from torchrl_muzero.objectives.rnn_full_obs import RNNFullObsLoss
from torchrl_muzero.trainers import ConfigError, load_config
from torchrl_muzero.trainers.builders import build_model, build_policy
from torchrl_muzero.trainers.config import EnvConfig

CONFIG = MCTSConfig(num_simulations=5)
H = 6


def _model(**kwargs):
    torch.manual_seed(0)
    return RNNFullObsMLPModel((4,), 2, latent_dim=8, hidden_dim=16, rnn_hidden_size=H, zero_init_heads=False,
                              **kwargs).eval()


def _loss(model, weight=2.0):
    return RNNFullObsLoss(model, consistency_loss_weight=weight, projection_dim=8, projection_hidden_dim=8,
                          prediction_hidden_dim=8)


def _batch(B=6, K=3, A=2, obs_mask=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({
        "observation": torch.randn(B, K + 1, 4, generator=g),
        "observation_mask": torch.ones(B, K + 1, dtype=torch.bool) if obs_mask is None else obs_mask,
        "action": torch.randint(A, (B, K + 1), generator=g),
        "target_reward": torch.randn(B, K + 1, generator=g),
        "target_value": torch.randn(B, K + 1, generator=g),
        "target_policy": torch.softmax(torch.randn(B, K + 1, A, generator=g), -1),
        "mask": torch.ones(B, K + 1, dtype=torch.bool),
        "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
    }, batch_size=[B, K + 1])


# -- the loss: teacher forcing -----------------------------------------------------------------

def test_policy_and_value_do_not_depend_on_the_predicted_latent_where_the_observation_exists():
    model = _model().train()
    loss = _loss(model)
    obs_mask = torch.ones(6, 4, dtype=torch.bool)
    obs_mask[0, 2:] = False  # sample 0 has no observation at positions 2 and 3 (past a truncation)
    batch = _batch(obs_mask=obs_mask)
    inputs = loss._read_inputs(batch)
    unrolled = loss._unroll(inputs)
    predicted = unrolled["latents"]  # [B, latent] for k = 1..K
    heads = unrolled["policy_logits"][:, 1:].sum() + unrolled["value_logits"][:, 1:].sum()
    grads = torch.autograd.grad(heads, predicted, retain_graph=True)
    for k, grad in enumerate(grads, start=1):
        have = obs_mask[:, k]
        assert torch.equal(grad[have], torch.zeros_like(grad[have])), f"position {k} reads the predicted latent"
    # where no observation exists the predicted latent is what the heads read
    assert grads[1][0].abs().sum() > 0
    # the consistency term is what trains the predicted latent
    consistency = loss._consistency(predicted, inputs["observation"]).sum()
    c_grads = torch.autograd.grad(consistency, predicted)
    assert all(g[1:].abs().sum() > 0 for g in c_grads)


def test_the_latent_head_moves_only_the_consistency_term_when_every_observation_exists():
    model = _model().train()
    loss = _loss(model)
    batch = _batch()
    before = loss(batch.clone())
    with torch.no_grad():
        model.latent_head.weight.add_(torch.randn_like(model.latent_head.weight))
    after = loss(batch.clone())
    for key in ("loss_value", "loss_policy", "loss_reward"):
        assert torch.equal(before[key], after[key]), key
    assert not torch.equal(before["loss_consistency"], after["loss_consistency"])
    # the teacher-forced heads read h(o_{t+k}): changing a future observation changes the policy term
    changed = batch.clone()
    changed["observation"][:, 2] += 1.0
    assert not torch.equal(loss(changed)["loss_policy"], before["loss_policy"])


def test_the_loss_needs_the_future_observations():
    loss = _loss(_model())
    obs_mask = torch.zeros(6, 4, dtype=torch.bool)
    obs_mask[:, 0] = True
    with pytest.raises(ValueError, match="teacher forcing needs the future observations"):
        loss(_batch(obs_mask=obs_mask))
    from torchrl_muzero.algorithms import get_algorithm
    assert get_algorithm("muzero_rnn_full_obs").needs_future_observations(
        load_config({"algo": {"name": "muzero_rnn_full_obs"}, "loss": {"consistency_loss_weight": 0.0}}))


@pytest.mark.parametrize("kind", ["mlp", "resnet"])
def test_loss_decreases_on_a_fixed_batch(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model, batch = _model().train(), _batch(B=16)
    else:
        model = RNNFullObsResNetModel((3, 8, 8), 2, channels=8, downsample=False, value_support_size=5,
                                      reward_support_size=5, rnn_hidden_size=16)
        batch = _batch(B=8)
        batch["observation"] = torch.rand(8, 4, 3, 8, 8)
    loss = _loss(model)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-3)

    def total():
        out = loss(batch.clone())
        return sum(v for k, v in out.items() if k.startswith("loss_") and k != "loss_consistency")

    first = float(total().detach())
    for _ in range(40):
        optim.zero_grad()
        out = loss(batch.clone())
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        optim.step()
    assert float(total().detach()) < 0.8 * first


# -- acting: the per-env GRU state ---------------------------------------------------------------

def _rollout(policy, frames=120, num_envs=2, seed=0):
    env = with_acting_memory(make_env(EnvConfig(), num_envs=num_envs, seed=seed), policy)
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames,
                          auto_register_policy_transforms=False)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


@pytest.mark.parametrize("L", [3, 5])
def test_acting_hidden_is_zero_every_L_steps_and_otherwise_the_gru_step_of_the_real_latent(L):
    """Replays the rollout by hand: hidden_t = 0 when t % L == 0 (t from the episode start, so also after a
    partial reset of one copy), else g(h(o_{t-1}), hidden_{t-1}, a_{t-1})'s hidden'."""
    model = _model()
    batch = _rollout(MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(0),
                                memory=RecurrentHiddenMemory(L)))
    done = batch["next", "done"].squeeze(-1)
    assert done.any(), "no episode ended: the reset path was not exercised"
    carried = 0
    with torch.no_grad():
        for env in range(batch.shape[0]):
            t, expected = 0, None
            for i in range(batch.shape[1]):
                row = batch[env, i]
                assert int(row["rnn_step"]) == t % L
                if t % L == 0:
                    assert torch.equal(row["rnn_hidden"], torch.zeros(H))
                    hidden = torch.zeros(1, H)
                else:
                    assert torch.allclose(row["rnn_hidden"], expected[0], atol=1e-6)
                    hidden = expected
                    carried += 1
                # the root the policy searched from: (h(o_t), hidden_t) with its prediction
                root = model.search_root(row["observation"][None], hidden=hidden)
                action = row["action"].reshape(1).long()  # make_env's CartPole takes action indices
                _, expected, _ = model.dynamics_hidden(model.encode(row["observation"][None]), hidden, action)
                assert torch.allclose(model.next_hidden(root.state, action), expected, atol=1e-6)
                t = 0 if bool(done[env, i]) else t + 1
    assert carried > 30


def test_the_search_does_not_write_the_memory_and_the_next_hidden_reads_the_real_latent():
    model = _model()
    policy = MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(0), memory=RecurrentHiddenMemory(4))
    B = 3
    memory = TensorDict({"rnn_hidden": torch.randn(B, H), "rnn_step": torch.tensor([0, 1, 3])}, [B])
    td = TensorDict({"observation": torch.randn(B, 4)}, [B]).update(memory.clone())
    out = policy(td)
    assert (out.select(*memory.keys()) == memory).all()  # the input memory is not written
    assert out["next", "rnn_step"].tolist() == [1, 2, 0]
    with torch.no_grad():
        hidden = memory["rnn_hidden"].clone()
        hidden[0] = 0  # step 0 of a window starts from zeros whatever was carried
        _, nxt, _ = model.dynamics_hidden(model.encode(td["observation"]), hidden, out["action"])
    assert torch.allclose(out["next", "rnn_hidden"][:2], nxt[:2], atol=1e-6)
    assert torch.equal(out["next", "rnn_hidden"][2], torch.zeros(H))  # the window of 4 ends: zeros next
    # the carried hidden changes the search's prior (it is read, not ignored)
    root_a = model.search_root(td["observation"], hidden=torch.zeros(B, H))
    root_b = model.search_root(td["observation"], hidden=memory["rnn_hidden"])
    assert not torch.allclose(root_a.policy_logits, root_b.policy_logits)


@pytest.mark.parametrize("kind", ["mlp", "resnet"])
def test_search_visit_counts_sum_to_num_simulations(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        model, obs = _model(), torch.randn(3, 4)
    else:
        model = RNNFullObsResNetModel((3, 8, 8), 4, channels=8, downsample=False, value_support_size=5,
                                      reward_support_size=5, rnn_hidden_size=16).eval()
        obs = torch.rand(3, 3, 8, 8)
    config = MCTSConfig(num_simulations=7)
    policy = MCTSPolicy(model, config, memory=RecurrentHiddenMemory(3))
    from torchrl_muzero.mcts import search
    root = model.search_root(obs, hidden=torch.randn(3, model.rnn_hidden_size))
    result = search(model, obs, config, root=root)
    assert result.visit_counts.sum(-1).tolist() == [7, 7, 7]
    td = policy(TensorDict({"observation": obs}, [3]).update(policy.memory.zeros(3)))
    assert torch.allclose(td["search_policy"].sum(-1), torch.ones(3))
    assert td["next", "rnn_hidden"].shape == (3, model.rnn_hidden_size)


# -- config: the keys change behaviour (LightZero's context_length is swallowed) -------------------

def test_context_length_init_and_rnn_hidden_size_change_behaviour():
    def policy_for(**algo):
        cfg = load_config({"algo": {"name": "muzero_rnn_full_obs", **algo}, "model": {"latent_dim": 8,
                                                                                       "hidden_dim": 8}})
        model = build_model(cfg, (4,), 2)
        return cfg, model, build_policy(cfg, model, None, generator=torch.Generator().manual_seed(0))

    _, model, two = policy_for(context_length_init=2)
    _, _, five = policy_for(context_length_init=5)
    assert model.rnn_hidden_size == 64 and policy_for(rnn_hidden_size=12)[1].gru.hidden_size == 12
    steps = {}
    for name, policy in (("two", two), ("five", five)):
        batch = _rollout(policy, frames=40)
        steps[name] = batch["rnn_step"][0, :6].tolist()
    assert steps["two"][:4] == [0, 1, 0, 1] and steps["five"][:6] == [0, 1, 2, 3, 4, 0]
    # LightZero's context_length-style key is not silently swallowed (here it is UniZero's window: an error)
    with pytest.raises(ConfigError, match="'algo.context_length' .* is a setting of unizero"):
        load_config({"algo": {"name": "muzero_rnn_full_obs", "context_length": 7}})
    with pytest.raises(ConfigError, match="rnn_hidden_size"):
        load_config({"algo": {"name": "muzero", "rnn_hidden_size": 32}})
    load_config({"algo": {"name": "muzero_context", "context_length_init": 2}})  # both algorithms read it


def test_memory_and_model_refuse_a_mismatch_with_one_clear_line():
    with pytest.raises(TypeError, match="carries a GRU state"):
        MCTSPolicy(MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8), CONFIG,
                   memory=RecurrentHiddenMemory(2)).memory.zeros(2)
    with pytest.raises(ValueError, match="context_length_init must be an integer >= 1"):
        RecurrentHiddenMemory(0)
    with pytest.raises(NotImplementedError, match="GRU state"):
        _model().recurrent_inference(torch.zeros(2, 8), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="rolls a latent tensor"):
        ContextLatentMemory(2).bind(_model()).zeros(2)
