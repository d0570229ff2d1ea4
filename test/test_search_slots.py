"""Search slots vs env actions (issue 38): the slot map, the step's generator, the box-action consumer."""
import runpy
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.loop import CandidateActions, run_search, start_tree, step_with_generator
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.modules import ModelStep, MuZeroMLPModel

REPO = Path(__file__).resolve().parents[1]
OPS = _cpp.load_tree_ops()
BACKENDS = ["torch", pytest.param("cpp", marks=pytest.mark.skipif(OPS is None, reason="no C++ kernel"))]
B, S, SIMS = 3, 4, 12


def _ops(backend):
    return OPS if backend == "cpp" else None


def _tree_tensors(tree):
    return {k: v.clone() for k, v in tree.tensors().items()}


def _same(a, b):
    """Bit-for-bit equal tensors, or TensorDicts (node states) of such."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    keys = sorted(a.keys(True, True), key=str)
    return keys == sorted(b.keys(True, True), key=str) and all(torch.equal(a[k], b[k]) for k in keys)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_default_gives_the_same_tree(backend):
    """No slot map and an explicit identity map give the same tree, bit for bit, on both backends."""
    torch.manual_seed(0)
    model = MuZeroMLPModel((4,), S, latent_dim=8, hidden_dim=8)
    root = model.search_root(torch.randn(B, 4))
    legal = torch.ones(B, S, dtype=torch.bool)
    trees = []
    for slot_actions in (None, lambda states, slots: slots):
        tree = start_tree(root, SIMS, legal, 0.99, _ops(backend))
        run_search(tree, model.search_step, SIMS, PUCT(), PUCT(), 0.99, _ops(backend), slot_actions=slot_actions,
                   generator=torch.Generator().manual_seed(1))
        trees.append(_tree_tensors(tree))
    for key, value in trees[0].items():
        assert _same(value, trees[1][key]), key


class RecordingModel(torch.nn.Module):
    """Nodes carry S random 2-D candidates; the step records the actions it receives."""

    slot_actions = CandidateActions()

    def __init__(self, draw_with_generator: bool = False):
        super().__init__()
        self.received, self.generators = [], []
        self.draw_with_generator = draw_with_generator

    def _node(self, n, generator=None):
        candidates = torch.rand(n, S, 2, generator=generator)
        state = TensorDict(latent=torch.zeros(n, 3), candidate_actions=candidates, batch_size=[n])
        return ModelStep(state, torch.rand(n, generator=generator), torch.zeros(n, S), torch.rand(n, generator=generator))

    def search_root(self, n):
        return self._node(n)

    @step_with_generator
    def search_step(self, state, action, generator=None):
        self.received.append(action.clone())
        self.generators.append(generator)
        return self._node(action.shape[0], generator if self.draw_with_generator else None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_node_state_slot_map_hands_the_model_env_actions(backend):
    torch.manual_seed(0)
    model = RecordingModel()
    tree = start_tree(model.search_root(B), SIMS, torch.ones(B, S, dtype=torch.bool), 0.99, _ops(backend))
    run_search(tree, model.search_step, SIMS, PUCT(), PUCT(), 0.99, _ops(backend), slot_actions=model.slot_actions)
    rows = torch.arange(B)
    candidates = tree.embeddings["candidate_actions"]  # [B, N, S, 2]
    assert len(model.received) == SIMS
    for n in range(1, SIMS + 1):
        parent, slot = tree.parent[:, n].long(), tree.action_from_parent[:, n].long()
        expected = candidates[rows, parent][rows, slot]
        assert model.received[n - 1].dtype == torch.float32 and model.received[n - 1].shape == (B, 2)
        assert torch.equal(model.received[n - 1], expected)  # the chosen slot's candidate, not its id


def test_generator_reaches_only_a_step_that_asks_for_it():
    torch.manual_seed(0)
    model = RecordingModel()
    g = torch.Generator().manual_seed(3)
    tree = start_tree(model.search_root(B), 3, torch.ones(B, S, dtype=torch.bool), 0.99)
    run_search(tree, model.search_step, 3, PUCT(), PUCT(), 0.99, slot_actions=model.slot_actions, generator=g)
    assert all(received is g for received in model.generators)

    def plain_step(state, action):  # no flag: called with two arguments (a generator= would raise)
        return model._node(action.shape[0])

    tree = start_tree(model.search_root(B), 3, torch.ones(B, S, dtype=torch.bool), 0.99)
    run_search(tree, plain_step, 3, PUCT(), PUCT(), 0.99, slot_actions=model.slot_actions, generator=g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seeded_search_whose_step_draws_is_reproducible(backend):
    def searched(seed):
        torch.manual_seed(0)
        model = RecordingModel(draw_with_generator=True)
        tree = start_tree(model.search_root(B), SIMS, torch.ones(B, S, dtype=torch.bool), 0.99, _ops(backend))
        run_search(tree, model.search_step, SIMS, PUCT(), PUCT(), 0.99, _ops(backend),
                   slot_actions=model.slot_actions, generator=torch.Generator().manual_seed(seed))
        return tree

    a, b, c = searched(5), searched(5), searched(6)
    for key, value in _tree_tensors(a).items():
        assert _same(value, _tree_tensors(b)[key]), key
    # the expansions drew from the search's generator: another seed, other candidates
    assert not torch.equal(a.embeddings["candidate_actions"][:, 1:], c.embeddings["candidate_actions"][:, 1:])


@pytest.fixture(scope="module")
def box_example():
    return runpy.run_path(str(REPO / "docs" / "compose_box_actions.py"))


def test_box_actions_example_runs(box_example):
    out = box_example["main"](frames=32, seed=0)
    batch, sample, taken = out["batch"], out["sample"], out["taken"]
    S_ = box_example["S"]
    # the env got floats [2] within its bounds: the candidate of the searched slot
    action = batch["action"]
    assert action.dtype == torch.float32 and action.shape == (32, 2)
    assert bool((action.abs() <= 1).all())
    slot = batch["root", "slot"]
    assert torch.equal(action, batch["root", "candidates"][torch.arange(32), slot])
    assert batch["search_policy"].shape == (32, S_)
    assert torch.equal(batch["root", "candidate_visits"].sum(-1), torch.full((32,), 12.0))
    # the buffer's samples hold the declared entries and the taken actions come back through them
    assert sample["root", "candidates"].shape == (16, 4, S_, 2)
    assert sample["root", "candidate_visits"].shape == (16, 4, S_)
    stored = sample["policy_mask"]
    assert torch.equal(sample["root", "candidate_visits"][stored].sum(-1), torch.full((int(stored.sum()),), 12.0))
    assert taken.shape == (16, 4, 2) and bool((taken[stored].abs() <= 1).all())
    # the buffer stored the env's own float actions: each one taken is one of its root's candidates
    assert taken.dtype == torch.float32 and torch.equal(taken, sample["action"])
    is_candidate = (sample["root", "candidates"] == taken[:, :, None, :]).all(-1).any(-1)
    assert bool(is_candidate[stored].all())


def test_box_policy_is_greedy_and_reproducible(box_example):
    env = box_example["ReachEnv"]()
    env.set_seed(0)
    td = env.reset()

    def act(seed):
        torch.manual_seed(0)
        model = box_example["CandidateModel"]()
        policy = MCTSPolicy(model, MCTSConfig(num_simulations=10), env.action_spec,
                            generator=torch.Generator().manual_seed(seed))
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            return policy(td.clone())

    out, again = act(1), act(1)
    for key in ("action", "search_policy", ("root", "candidates"), ("root", "candidate_visits")):
        assert torch.equal(out[key], again[key]), key
    best = out["root", "candidate_visits"].argmax()
    assert torch.equal(out["action"], out["root", "candidates"][best])
    assert out["action"].shape == (2,)
