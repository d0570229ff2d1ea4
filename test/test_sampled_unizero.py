"""``algo=sampled_unizero``: UniZero's world model with continuous action tokens, searched over sampled actions.

The model-level contract (a box's float action enters as a linear token, the KV-cached search equals the
training forward, discrete UniZero is untouched), the learner/tree agreement on ``log pi(a_k)``, acting
from a history window of float actions (and of env actions, never slots, for discrete K < A), and the
buffer rebuilding such a window. The registry's parametrized tests (test_algorithms.py) run it through
both scripts, the async pipeline's faults and resume; test_sampled_learning.py has it learn env=Reach.
"""
import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import Bounded

from torchrl_muzero.data import GameBuffer
from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
from torchrl_muzero.mcts.sampled import root_candidates, sampled_search
from torchrl_muzero.modules.sampled import SampledModel
from torchrl_muzero.modules.sampled_proposal import SampledProposal
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.objectives.sampled import SampledUniZeroLoss

SMALL = dict(embed_dim=16, num_heads=2, context_length=2, max_blocks=6, value_support_size=5,
             reward_support_size=5)


def _base(D: int | None, num_actions: int, seed: int = 0, **kwargs) -> UniZeroModel:
    torch.manual_seed(seed)
    return UniZeroModel((3,), num_actions, action_dim=D, **{**SMALL, **kwargs})


def _box_model(D: int = 1, K: int = 6, seed: int = 0) -> SampledModel:
    return SampledModel(_base(D, 2 * D, seed), BoxActionSpace(-2.0, 2.0, (D,)), SampledProposal(num_samples=K))


# -- the model ---------------------------------------------------------------------------------------------
def test_a_box_action_is_a_linear_token_and_discrete_keeps_its_table():
    box, discrete = _base(2, 4), _base(None, 3)
    assert isinstance(box.action_embedding, nn.Linear) and box.action_embedding.in_features == 2
    assert isinstance(discrete.action_embedding, nn.Embedding) and discrete.action_embedding.num_embeddings == 3
    assert box.fused_kernel_spec() is None  # the kernel looks actions up in a table
    assert discrete.action_dim is None and discrete.fused_kernel_spec() is not None
    assert "action_dim=2" in repr(box) and "action_dim" not in repr(discrete)
    with pytest.raises(ValueError, match=r"float actions \[3, 4, 2\]"):
        box(torch.zeros(3, 4, 16), torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="action_dim must be None"):
        _base(0, 2)


def test_discrete_unizero_builds_the_same_weights_as_before():
    """action_dim=None is the model of before the option existed: same modules, same draws, same state_dict keys
    (the golden curves and searches in test_golden_*.py pin its outputs)."""
    a, b = _base(None, 3, seed=5), _base(None, 3, seed=5)
    assert list(a.state_dict()) == list(b.state_dict())
    assert "action_embedding.weight" in a.state_dict() and a.action_embedding.weight.shape == (3, 16)


@pytest.mark.parametrize("D", [1, 3])
def test_the_cached_search_of_float_actions_equals_the_training_forward(D):
    """A root window with float history actions, then two search steps: each node's policy, value and reward
    equal the full causal forward over the same tokens (the KV cache is exact for linear action tokens too)."""
    model = _base(D, 2 * D, seed=D)
    B, L = 3, 2
    obs = torch.randn(B, L + 3, 3)
    actions = torch.rand(B, L + 3, D) * 4 - 2
    root = model.search_root(obs[:, : L + 1], actions[:, :L])
    assert root.state["actions"].shape == (B, model.max_blocks, D)
    # the search's next latents are predicted: the forward gets the same latents
    latents = [model.encode(obs[:, t]) for t in range(L + 1)]
    child = model.search_step(root.state, actions[:, L])
    latents.append(model.node_latent(child.state))
    grandchild = model.search_step(child.state, actions[:, L + 1])
    latents.append(model.node_latent(grandchild.state))
    with torch.no_grad():
        out = model(torch.stack(latents, 1), actions)
    value = model.value_support.decode_fast
    torch.testing.assert_close(root.policy_logits, out["policy_logits"][:, L], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(child.value, value(out["value_logits"][:, L + 1]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grandchild.policy_logits, out["policy_logits"][:, L + 2], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grandchild.reward, model.reward_support.decode_fast(out["reward_logits"][:, L + 1]),
                               rtol=1e-4, atol=1e-4)


def test_a_deep_path_slides_its_context_with_float_actions():
    model = _base(1, 2)
    state = model.search_root(torch.randn(2, 3)).state
    for _ in range(8):  # past max_blocks = 6 latents: the rebuild slides to the last context_length steps
        step = model.search_step(state, torch.rand(2, 1))
        state = step.state
    assert torch.isfinite(step.value).all() and int(state["length"].max()) <= 2 * model.max_blocks - 1


# -- learner and tree --------------------------------------------------------------------------------------
@pytest.mark.parametrize("D", [1, 4])
def test_the_learners_log_prob_of_a_candidate_equals_the_trees(D):
    """The loss's policy term over stored candidates uses the tree's log pi(a_k) (same weights): a one-hot
    target on slot j at position 0 costs exactly -log pi(a_j) of the root the search drew them from."""
    model = _box_model(D=D, K=6, seed=D)
    obs = torch.randn(5, 3)
    out = sampled_search(model, obs, MCTSConfig(num_simulations=8, backend="torch"),
                         generator=torch.Generator().manual_seed(0))
    candidates = root_candidates(model, out)  # [5, 6, D]
    tree_log_prob = model.policy_distribution(model.search_root(obs).policy_logits).log_prob(candidates)
    B, K1, S, j = 5, 2, 6, 3
    target = torch.zeros(B, K1, S)
    target[:, 0, j] = 1.0
    policy_mask = torch.zeros(B, K1, dtype=torch.bool)
    policy_mask[:, 0] = True
    batch = TensorDict({
        "observation": obs[:, None].expand(B, K1, 3).clone(), "observation_mask": torch.ones(B, K1, dtype=torch.bool),
        "action": candidates[:, None, 0].expand(B, K1, D).clone(), "target_value": torch.zeros(B, K1),
        "target_reward": torch.zeros(B, K1), "target_policy": target, "mask": torch.ones(B, K1, dtype=torch.bool),
        "policy_mask": policy_mask, ("root", "candidates"): candidates[:, None].expand(B, K1, S, D).clone()}, [B])
    loss = SampledUniZeroLoss(model, reduction="none", policy_entropy_weight=0.0)
    learner = loss(batch)["loss_policy"] * K1  # UniZero averages a term over the K + 1 positions
    torch.testing.assert_close(learner, -tree_log_prob[:, j], rtol=1e-4, atol=1e-4)
    # and it trains: the policy term's gradient reaches the policy head and the linear action token
    loss = SampledUniZeroLoss(model)
    out = loss(batch)
    sum(v for k, v in out.items() if k.startswith("loss_")).backward()
    assert model.base.policy_head[-1].weight.grad.abs().sum() > 0
    assert model.base.action_embedding.weight.grad.abs().sum() > 0


def test_label_smoothing_is_over_the_k_slots_and_the_entropy_is_unizeros_term():
    model = _box_model(K=4)
    loss = SampledUniZeroLoss(model, policy_ls_eps_start=0.5, policy_ls_eps_end=0.5, policy_entropy_weight=0.1)
    assert loss.term_names() == ["latent", "reward", "policy", "entropy", "value"]  # no second entropy term
    target = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    captured = {}
    real = loss._policy_term

    def spy(inputs, logits, smoothed):
        captured["target"] = smoothed
        return real(inputs, logits, smoothed)

    loss._policy_term = spy
    loss._policy_and_entropy({"candidates": torch.zeros(1, 4, 1)}, torch.zeros(1, 2), target)
    torch.testing.assert_close(captured["target"], torch.tensor([[0.625, 0.125, 0.125, 0.125]]))
    with pytest.raises(ValueError, match="policy_loss must be"):
        SampledUniZeroLoss(model, policy_loss="l2")


# -- acting from history ----------------------------------------------------------------------------------
def test_a_box_history_window_holds_the_env_float_actions():
    model = _box_model(D=2, K=5)
    memory = HistoryWindowMemory(2)
    spec = memory.spec(model)
    assert spec["history_action"].shape == (2, 2) and spec["history_action"].dtype == torch.float32
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=6, backend="torch"), Bounded(-2.0, 2.0, shape=(2,)),
                        memory=memory, generator=torch.Generator().manual_seed(0))
    td = TensorDict({"observation": torch.randn(4, 3)}, [4])
    td.update(memory.zeros(4, model))
    for _ in range(3):
        td = policy(td)
        assert torch.equal(td["next", "history_action"][:, -1], td["action"])  # the env's action, not a slot
        td = TensorDict({"observation": torch.randn(4, 3),
                         **{k: td["next", k] for k in memory.keys}}, [4])
    assert td["history_count"].tolist() == [2, 2, 2, 2]
    # the buffer's rebuild of a window: float actions, zeros where no step exists
    rebuilt = memory.memory_from_steps(torch.randn(3, 2, 3), torch.ones(3, 2, 2), torch.tensor([0, 1, 2]))
    assert rebuilt["history_action"].dtype == torch.float32
    assert rebuilt["history_action"][:, :, 0].tolist() == [[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]]


def test_discrete_k_below_a_remembers_env_actions_not_slots():
    """K = 3 slots of A = 7 actions: the history (and so the next root's window) holds the env's action,
    which a slot index would silently alias."""
    base = _base(None, 7)
    model = SampledModel(base, DiscreteActionSpace(7), SampledProposal(num_samples=3))
    memory = HistoryWindowMemory(2)
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=6, backend="torch"), memory=memory,
                        generator=torch.Generator().manual_seed(1))
    seen = set()
    td = TensorDict({"observation": torch.randn(16, 3)}, [16])
    td.update(memory.zeros(16, model))
    for _ in range(3):
        td = policy(td)
        action = td["action"].reshape(-1)
        assert torch.equal(td["next", "history_action"][:, -1], action)
        assert torch.equal(action, td["root", "candidates"][torch.arange(16), td["root", "slot"]])
        seen |= set(action.tolist())
        td = TensorDict({"observation": torch.randn(16, 3), **{k: td["next", k] for k in memory.keys}}, [16])
    assert max(seen) >= 3  # actions beyond the slot range were taken and remembered


def test_a_box_buffer_rebuilds_the_history_window_for_its_bootstrap_values():
    """GameBuffer(root_memory=...) with a box: the target model's bootstrap values start from the window of
    the stored float actions (before, a box buffer refused a root memory)."""
    model = _box_model(D=2, K=4)
    buffer = GameBuffer(64, num_unroll_steps=2, td_steps=2, discount=0.9, seed=0,
                        action_space=BoxActionSpace(-2.0, 2.0, (2,)), root_memory=HistoryWindowMemory(2))
    T = 8
    done = torch.zeros(1, T, 1, dtype=torch.bool)
    done[:, -1] = True
    obs = torch.randn(1, T + 1, 3)
    buffer.extend(TensorDict({
        "observation": obs[:, :-1], "action": torch.rand(1, T, 2) * 4 - 2,
        "search_policy": torch.full((1, T, 4), 0.25), "root_value": torch.zeros(1, T),
        ("collector", "traj_ids"): torch.zeros(1, T, dtype=torch.long), ("next", "observation"): obs[:, 1:],
        ("next", "reward"): torch.ones(1, T, 1), ("next", "done"): done, ("next", "terminated"): done}, [1, T]))
    batch = buffer.sample(6, model=model, target_model=model, policy_version=0)
    assert batch["action"].shape == (6, 3, 2) and torch.isfinite(batch["target_value"]).all()


# -- the registry's checks ---------------------------------------------------------------------------------
def test_the_registry_keeps_unizeros_and_the_families_checks():
    from torchrl_muzero.algorithms import get_algorithm
    from torchrl_muzero.trainers import ConfigError, load_config

    algo, box = get_algorithm("sampled_unizero"), BoxActionSpace(-2.0, 2.0, (1,))
    cfg = load_config({"algo": {"name": "sampled_unizero", "embed_dim": 16, "num_samples": 4}})
    model = algo.build_model(cfg, (3,), box)
    assert type(algo.build_loss(cfg, model)).__name__ == "SampledUniZeroLoss"
    assert algo.acting_memory(cfg).context_length == 4 and algo.buffer_kwargs(cfg)["root_memory"] is not None
    with pytest.raises(ConfigError, match=r"'algo.max_blocks' \(5\) must be >= buffer.num_unroll_steps"):
        algo.build_model(load_config({"algo": {"name": "sampled_unizero", "max_blocks": 5},
                                      "buffer": {"num_unroll_steps": 5}}), (3,), box)
    with pytest.raises(ConfigError, match="MLP networks only"):
        algo.build_model(load_config({"algo": {"name": "sampled_unizero"}, "model": {"kind": "resnet"}}), (3,), box)
    with pytest.raises(ConfigError, match="'algo.num_samples' is 4, more than the env's 2 discrete actions"):
        algo.build_model(cfg, (3,), DiscreteActionSpace(2))
    with pytest.raises(ConfigError, match="MuZero weight that algo=sampled_unizero does not read"):
        algo.build_loss(load_config({"algo": {"name": "sampled_unizero"}, "loss": {"value_loss_weight": 1.0}}),
                        model)
