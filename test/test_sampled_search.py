"""Sampled MuZero's search and acting: the paper's semantics, slots vs env actions, both backends."""
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded

from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy, search
from torchrl_muzero.mcts.sampled import root_candidates, sampled_search
from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel
from torchrl_muzero.modules.policy_distribution import policy_distribution
from torchrl_muzero.modules.sampled import SampledModel
from torchrl_muzero.modules.sampled_proposal import SampledProposal
from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy
from torchrl_muzero.objectives.sampled import SampledMuZeroLoss

PENDULUM = BoxActionSpace(-2.0, 2.0, (1,))


def _box_model(D: int = 1, K: int = 6, seed: int = 0, cls=MuZeroMLPModel, **proposal) -> SampledModel:
    torch.manual_seed(seed)
    extra = {"lstm_hidden_size": 8} if cls is EfficientZeroMLPModel else {}
    base = cls((3,), 2 * D, latent_dim=16, hidden_dim=16, action_dim=D, zero_init_heads=False, **extra)
    return SampledModel(base, BoxActionSpace(-2.0, 2.0, (D,)), SampledProposal(num_samples=K, **proposal))


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_k_equal_a_without_replacement_gives_muzeros_visit_counts(backend):
    """K = A drawn without replacement: every action once, the prior is pi (the set is not random), so the
    tree is MuZero's with its slots permuted: the visits, mapped back to actions, are MuZero's."""
    torch.manual_seed(3)
    A = 5
    base = MuZeroMLPModel((4,), A, latent_dim=16, hidden_dim=16, zero_init_heads=False)
    base.fused_search_weights = lambda: None  # MuZero's tree on the same bookkeeping, not the fused kernel
    model = SampledModel(base, DiscreteActionSpace(A), SampledProposal(num_samples=A))
    obs = torch.randn(6, 4)
    cfg = MCTSConfig(num_simulations=30, backend=backend)
    plain = search(base, obs, cfg, add_noise=False, generator=torch.Generator().manual_seed(0))
    sampled = sampled_search(model, obs, cfg, add_noise=False, generator=torch.Generator().manual_seed(1))
    candidates = root_candidates(model, sampled)  # [B, A]: a permutation of the actions per row
    assert (candidates.sort(-1).values == torch.arange(A)).all()
    mapped = torch.zeros_like(plain.visit_counts).scatter_(1, candidates, sampled.visit_counts.to(plain.visit_counts.dtype))
    assert torch.equal(mapped, plain.visit_counts)
    assert sampled.engine == ("torch" if backend == "torch" else "cpp")


def test_the_uniform_option_is_not_muzero_at_k_equal_a():
    """LightZero's uniform 1/K prior does not reduce to MuZero at K = A (the paper's prior does: above)."""
    torch.manual_seed(3)
    A = 5
    base = MuZeroMLPModel((4,), A, latent_dim=16, hidden_dim=16, zero_init_heads=False)
    with torch.no_grad():
        base.prediction_head.bias[:A] = torch.tensor([3.0, 0.0, -1.0, -2.0, 0.5])  # a peaked policy
    base.fused_search_weights = lambda: None
    obs = torch.randn(6, 4)
    cfg = MCTSConfig(num_simulations=30, backend="torch")
    plain = search(base, obs, cfg, add_noise=False)
    uniform = SampledModel(base, DiscreteActionSpace(A), SampledProposal(num_samples=A, prior="uniform"))
    out = sampled_search(uniform, obs, cfg, add_noise=False, generator=torch.Generator().manual_seed(1))
    mapped = torch.zeros_like(plain.visit_counts).scatter_(
        1, root_candidates(uniform, out), out.visit_counts.to(plain.visit_counts.dtype))
    assert not torch.equal(mapped, plain.visit_counts)


@pytest.mark.parametrize("cls", [MuZeroMLPModel, EfficientZeroMLPModel])
def test_box_search_is_the_same_on_both_backends_and_reproducible(cls):
    model = _box_model(D=2, K=5, cls=cls)
    obs = torch.randn(4, 3)
    runs = [sampled_search(model, obs, MCTSConfig(num_simulations=20, backend=b),
                           generator=torch.Generator().manual_seed(7)) for b in ("torch", "auto", "auto")]
    for out in runs[1:]:
        assert torch.equal(out.visit_counts, runs[0].visit_counts)
        assert torch.equal(root_candidates(model, out), root_candidates(model, runs[0]))
    other = sampled_search(model, obs, MCTSConfig(num_simulations=20), generator=torch.Generator().manual_seed(8))
    assert not torch.equal(root_candidates(model, other), root_candidates(model, runs[0]))
    assert runs[0].visit_counts.sum(-1).eq(20).all()


def test_root_noise_reaches_the_selection():
    """The Dirichlet noise is mixed into the prior the pUCT score reads (LightZero writes it into a field its
    C++ score never reads): with noise the visits move, without they do not."""
    model = _box_model(K=8, prior="uniform")
    obs = torch.randn(16, 3)
    cfg = MCTSConfig(num_simulations=16, dirichlet_fraction=0.5, backend="torch")

    def visits(noise: bool, seed: int):
        # the same candidates (same generator state at the root), noise drawn after them
        return sampled_search(model, obs, cfg, add_noise=noise, generator=torch.Generator().manual_seed(seed))

    quiet = visits(False, 0)
    noisy = visits(True, 0)
    assert torch.equal(root_candidates(model, quiet), root_candidates(model, noisy))
    assert not torch.equal(quiet.visit_counts, noisy.visit_counts)


class _PendulumLike:
    """A stand-in env batch: observations and the box action spec of Pendulum."""

    spec = Bounded(-2.0, 2.0, shape=(1,))


def test_mcts_policy_hands_the_env_box_actions_never_slot_ids():
    model = _box_model(K=6)
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=12), _PendulumLike.spec,
                        generator=torch.Generator().manual_seed(0))
    td = policy(TensorDict({"observation": torch.randn(9, 3)}, [9]))
    action, slot, candidates = td["action"], td["root", "slot"], td["root", "candidates"]
    assert action.dtype == torch.float32 and action.shape == (9, 1)
    assert bool((action.abs() < 2.0).all())
    assert torch.equal(action, candidates[torch.arange(9), slot])
    assert td["search_policy"].shape == (9, 6) and torch.allclose(td["search_policy"].sum(-1), torch.ones(9))
    # evaluation: the most visited root candidate
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    with set_exploration_type(ExplorationType.DETERMINISTIC):
        td = policy(TensorDict({"observation": torch.randn(9, 3)}, [9]))
    assert torch.equal(td["root", "slot"], td["root", "candidate_visits"].argmax(-1))


def test_discrete_k_below_a_acts_legal_env_actions():
    """TicTacToe-sized: 9 actions, K = 4 drawn among the legal ones; the env gets an action id, never a slot id."""
    torch.manual_seed(0)
    A, K = 9, 4
    base = MuZeroMLPModel((9,), A, latent_dim=16, hidden_dim=16, zero_init_heads=False)
    model = SampledModel(base, DiscreteActionSpace(A), SampledProposal(num_samples=K))
    from torchrl.data import Categorical

    policy = MCTSPolicy(model, MCTSConfig(num_simulations=10), Categorical(A),
                        generator=torch.Generator().manual_seed(0))
    legal = torch.rand(32, A) < 0.5
    legal[torch.arange(32), torch.randint(A, (32,))] = True
    legal[:4] = False
    legal[:4, :2] = True  # rows with fewer legal actions than K: the legal set, padded
    td = policy(TensorDict({"observation": torch.randn(32, 9), "action_mask": legal}, [32]))
    action, candidates = td["action"], td["root", "candidates"]
    assert bool(legal[torch.arange(32), action].all())
    assert bool((candidates == action[:, None]).any(-1).all())
    for row in range(32):
        real = candidates[row][td["root", "candidate_visits"][row] > 0]
        assert bool(legal[row, real].all())
    assert td["root", "candidate_visits"][:4, 2:].sum() == 0  # padding is never visited
    # the slots a row drew are distinct legal actions
    for row in range(4, 32):
        n = int(legal[row].sum())
        drawn = candidates[row][: min(K, n)]
        assert len(set(drawn.tolist())) == min(K, n) and bool(legal[row, drawn].all())


def test_a_model_built_for_another_box_is_refused_in_one_line():
    model = _box_model(K=4)
    with pytest.raises(ValueError) as err:
        MCTSPolicy(model, MCTSConfig(), Bounded(-1.0, 1.0, shape=(2,)))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("D", [1, 6])
def test_the_learners_log_prob_of_a_candidate_equals_the_trees(D):
    """The loss's policy term over stored candidates uses the same log pi(a_k) as the tree's policy at the root
    (same weights): a one-hot target on slot j costs exactly -log pi(a_j)."""
    model = _box_model(D=D, K=6, seed=D)
    obs = torch.randn(5, 3)
    out = sampled_search(model, obs, MCTSConfig(num_simulations=8), generator=torch.Generator().manual_seed(0))
    candidates = root_candidates(model, out)  # [5, 6, D]
    tree_log_prob = model.policy_distribution(model.search_root(obs).policy_logits).log_prob(candidates)  # [5, 6]
    B, K1, S, j = 5, 2, 6, 3
    target = torch.zeros(B, K1, S)
    target[:, 0, j] = 1.0
    policy_mask = torch.zeros(B, K1, dtype=torch.bool)
    policy_mask[:, 0] = True
    batch = TensorDict({
        "observation": obs[:, None].expand(B, K1, 3).clone(), "action": candidates[:, None, 0].expand(B, K1, D).clone(),
        "target_value": torch.zeros(B, K1), "target_reward": torch.zeros(B, K1), "target_policy": target,
        "mask": torch.ones(B, K1, dtype=torch.bool), "policy_mask": policy_mask,
        ("root", "candidates"): candidates[:, None].expand(B, K1, S, D).clone()}, [B])
    loss = SampledMuZeroLoss(model, reduction="none", policy_entropy_loss_weight=0.0)
    learner = loss(batch)["loss_policy"]
    torch.testing.assert_close(learner, -tree_log_prob[:, j], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(tree_log_prob).all()
    # and it trains: the gradient of the policy term reaches the policy head
    loss = SampledMuZeroLoss(model, policy_entropy_loss_weight=0.0)
    loss(batch)["loss_policy"].backward()
    assert model.base.prediction_head.weight.grad.abs().sum() > 0


def test_the_entropy_bonus_pushes_the_scale_up():
    model = _box_model(K=4, seed=1)
    B, K1, S = 8, 3, 4
    batch = TensorDict({
        "observation": torch.randn(B, K1, 3), "action": torch.rand(B, K1, 1) * 4 - 2,
        "target_value": torch.zeros(B, K1), "target_reward": torch.zeros(B, K1),
        "target_policy": torch.full((B, K1, S), 1 / S), "mask": torch.ones(B, K1, dtype=torch.bool),
        "policy_mask": torch.ones(B, K1, dtype=torch.bool), ("root", "candidates"): torch.rand(B, K1, S, 1) * 4 - 2},
        [B])
    loss = SampledMuZeroLoss(model, policy_entropy_loss_weight=1.0, value_loss_weight=0.0, reward_loss_weight=0.0,
                             policy_loss_weight=0.0)
    out = loss(batch)
    assert out["loss_policy_entropy"] < 0  # -H of a Gaussian squashed into [-2, 2] with scale ~1
    out["loss_policy_entropy"].backward()
    scale_bias = model.base.prediction_head.bias.grad[1]  # the scale's pre-softplus output (D = 1)
    assert scale_bias < 0  # descending the loss raises the scale: more entropy


def test_gumbel_over_the_sampled_candidates():
    """EfficientZero V2's search: Gumbel noise and Sequential Halving over the K sampled root candidates; the
    target is the improved policy over the slots, the action the halving winner (a candidate, in the box)."""
    from torchrl_muzero.algorithms import get_algorithm
    from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig
    from torchrl_muzero.trainers.config import load_config

    model = _box_model(K=8)
    cfg = GumbelMCTSConfig(num_simulations=16, max_num_considered_actions=4)
    obs = torch.randn(5, 3)
    out = sampled_search(model, obs, cfg, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(out.search_policy.sum(-1), torch.ones(5))
    assert out.visit_counts.sum(-1).eq(16).all()
    assert int((out.visit_counts[0] > 0).sum()) <= 4  # only the considered candidates are searched at the root
    assert bool((out.visit_counts.gather(1, out.action[:, None]) > 0).all())
    again = sampled_search(model, obs, cfg, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.action, out.action)
    policy = MCTSPolicy(model, cfg, _PendulumLike.spec, generator=torch.Generator().manual_seed(0))
    td = policy(TensorDict({"observation": obs}, [5]))
    assert bool((td["action"].abs() < 2.0).all()) and td["action"].shape == (5, 1)
    # through the registry: algo.sampled_search=gumbel gives this search config
    run = load_config({"algo": {"name": "sampled_muzero", "sampled_search": "gumbel", "max_num_considered_actions": 4}})
    assert isinstance(get_algorithm("sampled_muzero").search_config(run), GumbelMCTSConfig)


def test_reanalyze_stores_the_new_candidates_with_their_new_targets(tmp_path):
    """A reanalysed position's policy target is over freshly drawn candidates: the batch carries those
    candidates and their visits (normalised, the target), not the stored ones."""
    stored, batch, _ = _reanalysed_batch(tmp_path)
    mask = batch["policy_mask"].bool()
    visits = batch["root", "candidate_visits"][mask]
    torch.testing.assert_close(visits / visits.sum(-1, keepdim=True), batch["target_policy"][mask])
    # what acting drew: every reanalysed position drew anew
    assert not any(bool((c == stored).all(-1).all(-1).any()) for c in batch["root", "candidates"][mask])


def test_reanalyze_keep_candidates_searches_the_stored_ones_again(tmp_path):
    """algo.reanalyze_candidates=keep: a reanalysed position's target is a new search over its *stored*
    candidates (the batch carries them unchanged, with the new visits as its target)."""
    stored, batch, buffer = _reanalysed_batch(tmp_path, **{"algo.reanalyze_candidates": "keep",
                                                          "mcts.num_simulations": 16})
    assert buffer.reanalyze_search.reads_stored
    mask = batch["policy_mask"].bool()
    visits = batch["root", "candidate_visits"][mask]
    torch.testing.assert_close(visits / visits.sum(-1, keepdim=True), batch["target_policy"][mask])
    # every reanalysed position kept candidates acting stored (the same set, slot by slot)
    for c in batch["root", "candidates"][mask]:
        assert bool((c == stored).all(-1).all(-1).any())


def test_prior_at_given_candidates():
    """SampledProposal.prior_at: pi over a fixed stored set (paper), 1/K (uniform), padding and illegal -inf."""
    from torchrl_muzero.modules import CategoricalPolicy

    box = TanhNormalPolicy(torch.zeros(2, 1), torch.ones(2, 1), -2.0, 2.0)
    candidates = torch.tensor([[[0.0], [1.5], [-0.5]], [[0.1], [0.2], [0.3]]])
    logits = SampledProposal(num_samples=3).prior_at(box, candidates)
    torch.testing.assert_close(logits, box.log_prob(candidates))
    assert torch.equal(SampledProposal(num_samples=3, prior="uniform").prior_at(box, candidates), torch.zeros(2, 3))
    pi = CategoricalPolicy.from_logits(torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])))
    legal = torch.tensor([[True, True, False, True]])
    out = SampledProposal(num_samples=4).prior_at(pi, torch.tensor([[3, 2, 3, 0]]), legal=legal)
    assert torch.isinf(out[0, 1]) and torch.isinf(out[0, 2])  # illegal; a repeat (padding)
    torch.testing.assert_close(torch.softmax(out, -1)[0, [0, 3]], torch.tensor([0.2, 0.8]))
    with_replacement = SampledProposal(num_samples=4, replacement=True).prior_at(pi, torch.tensor([[3, 0, 3, 0]]))
    assert bool(torch.isfinite(with_replacement).all())  # repeats are real draws with replacement
    with pytest.raises(ValueError, match="candidates"):
        SampledProposal(num_samples=2).prior_at(box, candidates)


def _reanalysed_batch(tmp_path, **keys):
    """A Pendulum-like sampled_muzero buffer, reanalyse ratio 1, filled by acting on 30 random observations:
    ``(what acting stored, the sampled batch, the buffer)``."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from pipeline_utils import tiny_config
    from torchrl_muzero.trainers.builders import build_buffer, build_model, build_policy
    from torchrl_muzero.trainers.config import load_config

    cfg = load_config(tiny_config(tmp_path, **{"algo.name": "sampled_muzero", "algo.num_samples": 4,
                                               "env.id": "Pendulum-v1", "env.name": "Pendulum",
                                               "buffer.reanalyze_ratio": 1.0, **keys}))
    model = build_model(cfg, (3,), PENDULUM)
    # not the buffer's seed 0: the same seed would draw the same candidates for the same observations, and
    # the tests could not tell
    policy = build_policy(cfg, model, Bounded(-2.0, 2.0, shape=(1,)), generator=torch.Generator().manual_seed(123))
    buffer = build_buffer(cfg, action_space=PENDULUM)
    T = 30
    obs = torch.randn(T + 1, 3)
    td = policy(TensorDict({"observation": obs[:-1]}, [T]))
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[-1] = True
    td.update({("collector", "traj_ids"): torch.zeros(T, dtype=torch.long), ("next", "observation"): obs[1:],
               ("next", "reward"): -torch.ones(T, 1), ("next", "done"): done, ("next", "terminated"): done})
    buffer.extend(td)
    batch = buffer.sample(8, model=model, target_model=model, policy_version=0)
    return td["root", "candidates"], batch, buffer
