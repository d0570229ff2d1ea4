"""The C++ kernel's rules (torchrl_muzero/csrc/rules.h, gumbel_rules.h) against the torch rules.

Trees are grown side by side: at every simulation the C++ descent
(``_cpp.cpp_select``) and the torch descent (``mcts.select.descend``) with
the same pair of rules must pick the same leaf, then both trees are expanded
with the same random step (rewards, values, prior logits with some ``-inf``
edges, per-edge discounts) by the C++ and the torch backup. pUCT and the
chance rule are bit-identical to torch; the Gumbel rules' completed Q goes
through ``exp`` and torch's reductions, so their scores may differ from
torch by a few ulps and only the choices are compared (random trees have no
near-ties of that size).
"""
from __future__ import annotations

import math
import zlib

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.backup import expand_and_backup
from torchrl_muzero.mcts.loop import cpp_rules_supported, run_search, start_tree
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.select import descend
from torchrl_muzero.mcts.tree import Tree, allocate_tree
from torchrl_muzero.modules.step import ModelStep

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None, reason=f"C++ tree kernel not built: {_cpp.tree_ops_unavailable_reason()}"
)

try:
    from torchrl_muzero.mcts.gumbel import GumbelInteriorRule, GumbelRootRule
    from torchrl_muzero.mcts.seq_halving import considered_visit_table
except ImportError:  # pragma: no cover - the Gumbel policy is optional for this file
    GumbelRootRule = GumbelInteriorRule = None
try:
    from torchrl_muzero.mcts.stochastic import ChanceRule, StochasticRule
except ImportError:  # pragma: no cover
    ChanceRule = StochasticRule = None

NEG_INF = -math.inf


def clone_tree(tree: Tree) -> Tree:
    out = Tree(**{k: v.clone() for k, v in tree.tensors().items()})
    out.extra = {k: v.clone() for k, v in tree.extra.items()}
    return out


def random_logits(g: torch.Generator, B: int, A: int, p_masked: float, first_slot: int = 0) -> torch.Tensor:
    """Random logits with some ``-inf`` edges; at least one finite edge at or after ``first_slot``."""
    logits = 1.5 * torch.randn(B, A, generator=g)
    masked = torch.rand(B, A, generator=g) < p_masked
    keep = torch.randint(first_slot, A, (B,), generator=g)
    masked[torch.arange(B), keep] = False
    return logits.masked_fill(masked, NEG_INF)


def new_tree(g, B, S, A, discount, embeddings=None, p_masked=0.3) -> Tree:
    tree = allocate_tree(B, S, A, torch.Size([1]), torch.device("cpu"), discount=discount)
    if embeddings is not None:
        tree.embeddings = embeddings
    logits = random_logits(g, B, A, p_masked)
    tree.root_legal.copy_(logits > NEG_INF)
    tree.children_logits[:, 0] = logits
    tree.children_prior[:, 0] = torch.softmax(logits, -1)
    tree.raw_value[:, 0] = torch.randn(B, generator=g)
    return tree


def grow(tree, root_rule, interior_rule, S, g, discounts=(0.997,), new_logits=None, on_expand=None):
    """Grow ``tree`` (C++) and a clone (torch) side by side; assert the same leaf at every simulation."""
    t_tree = clone_tree(tree)
    B, A = tree.batch_size, tree.num_actions
    choices = torch.tensor(discounts)
    for sim in range(S):
        n = sim + 1
        c_node, c_action = _cpp.cpp_select(tree, root_rule, interior_rule)
        t_node, t_action = descend(t_tree, root_rule, interior_rule)
        assert torch.equal(c_node, t_node) and torch.equal(c_action, t_action), f"simulation {sim}"
        reward = torch.randn(B, generator=g)
        value = torch.randn(B, generator=g)
        logits = new_logits(n, c_node, c_action) if new_logits is not None else random_logits(g, B, A, 0.3)
        edge_discount = choices[torch.randint(len(discounts), (B,), generator=g)]
        prior = torch.softmax(logits, -1)
        for tr in (tree, t_tree):
            tr.children_logits[:, n] = logits
            tr.raw_value[:, n] = value
            if on_expand is not None:
                on_expand(tr, n, c_node, c_action)
        _cpp.cpp_expand_and_backup(tree, n, c_node, c_action, reward, value, prior, edge_discount=edge_discount)
        expand_and_backup(t_tree, n, t_node, t_action, reward, value, prior, edge_discount=edge_discount)
    for name in ("visit_count", "children_index", "parent", "action_from_parent", "children_discount"):
        assert torch.equal(getattr(tree, name), getattr(t_tree, name)), name
    for name in ("value_sum", "min_q", "max_q"):
        assert torch.equal(getattr(tree, name), getattr(t_tree, name)), name
    return tree


def assert_no_minus_inf_edge_expanded(tree: Tree):
    expanded = tree.children_index >= 0
    assert not (expanded & (tree.children_logits == NEG_INF)).any()
    assert not (expanded[:, 0] & ~tree.root_legal).any()


def seed(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def count_kernel_calls(monkeypatch) -> dict:
    """Count the loop's kernel calls (``run_search`` binds them with ``_cpp.bind_cpp_search``)."""
    calls = {"select": 0, "backup": 0}
    real = _cpp.bind_cpp_search

    def bind(*args):
        select, backup = real(*args)

        def counted_select():
            calls["select"] += 1
            return select()

        def counted_backup(*a, **k):
            calls["backup"] += 1
            return backup(*a, **k)

        return counted_select, counted_backup

    monkeypatch.setattr(_cpp, "bind_cpp_search", bind)
    return calls


# ----------------------------------------------------------------------------
# The kernel's Python API
# ----------------------------------------------------------------------------
def test_kernel_lists_its_rules_and_checks_names_and_params():
    roots, interiors = _cpp.cpp_rule_names()
    assert set(roots) >= {"puct", "gumbel_root"}
    assert set(interiors) >= {"puct", "chance", "stochastic", "gumbel_interior"}
    tree = new_tree(seed("api"), 2, 3, 4, 0.997)
    with pytest.raises(RuntimeError, match="unknown rule 'nope'"):
        _cpp.cpp_select(tree, ("nope", []), PUCT())
    with pytest.raises(RuntimeError, match="takes 2 parameters, got 1"):
        _cpp.cpp_select(tree, ("puct", [1.0]), PUCT())
    with pytest.raises(RuntimeError, match="cannot be used as the root rule"):
        _cpp.cpp_select(tree, ("chance", [1.0]), PUCT())
    with pytest.raises(RuntimeError, match=r"needs tree.extra\['gumbel'\]"):
        _cpp.cpp_select(tree, ("gumbel_root", [0.1, 50.0, 1.0]), PUCT())
    with pytest.raises(RuntimeError, match="edge_discount.*shape"):
        _cpp.cpp_expand_and_backup(tree, 1, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                                   torch.zeros(2), torch.zeros(2), torch.full((2, 4), 0.25),
                                   edge_discount=torch.ones(3))
    with pytest.raises(ValueError, match="no C\\+\\+ rule"):
        _cpp.cpp_rule_args(lambda tree, node, depth: node)


def test_cpp_rules_supported_reads_the_kernels_names():
    assert cpp_rules_supported(_OPS, PUCT(), PUCT(10.0, 2.0))  # different constants: each passes its own
    assert not cpp_rules_supported(None, PUCT(), PUCT())

    def torch_only(tree, node, depth):
        return node

    assert not cpp_rules_supported(_OPS, PUCT(), torch_only)
    if GumbelRootRule is not None:
        assert cpp_rules_supported(_OPS, GumbelRootRule(), GumbelInteriorRule())
        assert not cpp_rules_supported(_OPS, GumbelInteriorRule(), GumbelRootRule())  # wrong positions


# ----------------------------------------------------------------------------
# pUCT with per-edge discounts and -inf logits
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("B,S,A,discounts", [
    (5, 30, 4, (0.997,)),
    (7, 40, 6, (0.9, 1.0, 0.5)),
    (4, 25, 5, (-1.0, -0.95)),  # two-player style: negative edge discounts
    (6, 30, 3, (1.0, 0.0)),  # terminal-like edges
])
def test_puct_with_per_edge_discounts_matches_torch(B, S, A, discounts):
    g = seed("puct", B, S, A, discounts)
    tree = new_tree(g, B, S, A, discounts[0])
    root, interior = PUCT(), PUCT(pb_c_base=50.0, pb_c_init=1.0)  # different constants below the root
    tree = grow(tree, root, interior, S, g, discounts)
    assert_no_minus_inf_edge_expanded(tree)
    assert tree.visit_count[:, 0].tolist() == [S] * B


def test_minus_inf_logits_are_never_selected_even_with_the_largest_prior():
    tree = allocate_tree(1, 4, 3, torch.Size([1]), torch.device("cpu"))
    tree.visit_count[:, 0] = 1
    tree.children_prior[0, 0] = torch.tensor([0.1, 0.8, 0.1])  # noise may put mass on a masked edge
    tree.children_logits[0, 0] = torch.tensor([0.0, NEG_INF, 0.0])
    assert _cpp.cpp_select(tree, PUCT(), PUCT())[1].tolist() == [0]
    tree.children_logits[0, 0] = NEG_INF  # nothing selectable: action 0, as torch's argmax of -inf
    assert _cpp.cpp_select(tree, PUCT(), PUCT())[1].tolist() == descend(tree, PUCT(), PUCT())[1].tolist() == [0]


# ----------------------------------------------------------------------------
# Stochastic MuZero: chance rule at chance nodes, pUCT at decision nodes
# ----------------------------------------------------------------------------
needs_stochastic = pytest.mark.skipif(ChanceRule is None, reason="mcts.stochastic not importable")


def _alternating_tree(g, B, S, A, C):
    """Decision and chance nodes alternate (``is_chance`` in the node state); slots ``0..A-1`` are actions."""
    emb = TensorDict({"is_chance": torch.zeros(B, S + 1, dtype=torch.bool)}, batch_size=[B, S + 1])
    tree = new_tree(g, B, S, A + C, 0.997, embeddings=emb, p_masked=0.0)
    logits = random_logits(g, B, A, 0.3)
    logits = torch.cat([logits, torch.full((B, C), NEG_INF)], -1)  # a decision node: no chance slots
    tree.root_legal.copy_(logits > NEG_INF)
    tree.children_logits[:, 0] = logits
    tree.children_prior[:, 0] = torch.softmax(logits, -1)

    def new_logits(n, parent, action):
        child_is_chance = ~tree.embeddings["is_chance"][torch.arange(B), parent]
        decision = torch.cat([random_logits(g, B, A, 0.3), torch.full((B, C), NEG_INF)], -1)
        chance = torch.cat([torch.full((B, A), NEG_INF), random_logits(g, B, C, 0.3)], -1)
        new_logits.is_chance = child_is_chance
        return torch.where(child_is_chance.unsqueeze(-1), chance, decision)

    def on_expand(tr, n, parent, action):
        tr.embeddings["is_chance"][:, n] = new_logits.is_chance

    return tree, new_logits, on_expand


@needs_stochastic
@pytest.mark.parametrize("B,S,A,C", [(5, 40, 3, 4), (8, 30, 2, 6), (3, 50, 4, 2)])
def test_stochastic_rule_matches_torch(B, S, A, C):
    g = seed("stochastic", B, S, A, C)
    tree, new_logits, on_expand = _alternating_tree(g, B, S, A, C)
    interior = StochasticRule(PUCT(), ChanceRule(A))
    assert cpp_rules_supported(_OPS, PUCT(), interior)
    # decision-to-chance edges discount 1, chance-to-decision edges the search's
    tree = grow(tree, PUCT(), interior, S, g, (1.0, 0.997), new_logits=new_logits, on_expand=on_expand)
    assert_no_minus_inf_edge_expanded(tree)
    chance_nodes = tree.embeddings["is_chance"]
    assert chance_nodes.any() and (tree.visit_count[chance_nodes] > 0).all()


@needs_stochastic
def test_chance_rule_alone_skips_decision_slots_and_follows_the_prior():
    B, S, A, C = 4, 30, 2, 5
    g = seed("chance", B, S, A, C)
    tree = new_tree(g, B, S, A + C, 1.0, p_masked=0.0)
    tree = grow(tree, PUCT(), ChanceRule(A), S, g,
                new_logits=lambda n, p, a: torch.cat([torch.zeros(B, A), random_logits(g, B, C, 0.3)], -1))
    below_root = tree.children_index[:, 1:]
    assert not (below_root[..., :A] >= 0).any()  # the decision slots are never chance outcomes
    assert_no_minus_inf_edge_expanded(tree)


# ----------------------------------------------------------------------------
# Gumbel MuZero
# ----------------------------------------------------------------------------
needs_gumbel = pytest.mark.skipif(GumbelRootRule is None, reason="mcts.gumbel not importable")


def _gumbel_extra(g, tree: Tree, S: int, max_m: int):
    B, A = tree.batch_size, tree.num_actions
    legal = tree.root_legal
    num_considered = legal.sum(-1).clamp_max(max_m).long()
    tree.extra.update(
        gumbel=-torch.log(torch.empty(B, A).exponential_(1.0, generator=g)),
        num_considered=num_considered,
        considered_visits=considered_visit_table(max_m, S)[num_considered],
    )


@needs_gumbel
@pytest.mark.parametrize("B,S,A,max_m,rescale,discounts", [
    (6, 32, 5, 4, True, (0.997,)),
    (5, 40, 8, 8, True, (0.9, 1.0)),
    (4, 24, 3, 2, False, (0.997,)),
    (5, 30, 6, 16, True, (-1.0,)),  # two-player: the negated discount
])
def test_gumbel_rules_match_torch(B, S, A, max_m, rescale, discounts):
    g = seed("gumbel", B, S, A, max_m, rescale, discounts)
    tree = new_tree(g, B, S, A, discounts[0])
    _gumbel_extra(g, tree, S, max_m)
    params = (0.1, 50.0, rescale)
    tree = grow(tree, GumbelRootRule(*params), GumbelInteriorRule(*params), S, g, discounts)
    assert_no_minus_inf_edge_expanded(tree)
    visited = (tree.root_child_visits() > 0).sum(-1)
    assert (visited <= tree.extra["num_considered"]).all()


@needs_gumbel
def test_gumbel_search_backends_agree_and_use_the_kernel(monkeypatch):
    from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_search
    from torchrl_muzero.modules import MuZeroMLPModel

    torch.manual_seed(3)
    model = MuZeroMLPModel((4,), 5, latent_dim=8, hidden_dim=16, num_layers=2)
    obs = torch.randn(7, 4)
    mask = torch.rand(7, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    outs = {}
    calls = count_kernel_calls(monkeypatch)
    for backend in ("torch", "cpp"):
        cfg = GumbelMCTSConfig(num_simulations=20, max_num_considered_actions=4, backend=backend)
        outs[backend] = gumbel_search(model, obs, cfg, action_mask=mask, generator=torch.Generator().manual_seed(2))
    assert calls == {"select": 20, "backup": 20}  # the cpp search ran in C++
    assert torch.equal(outs["cpp"].visit_counts, outs["torch"].visit_counts)
    assert torch.equal(outs["cpp"].action, outs["torch"].action)


# ----------------------------------------------------------------------------
# A model step with its own discounts stays in C++
# ----------------------------------------------------------------------------
class DiscountingStep:
    """A random model whose steps return their own edge discount (as Stochastic MuZero's do)."""

    def __init__(self, A, seed_):
        self.A = A
        self.g = torch.Generator().manual_seed(seed_)

    def __call__(self, state, action):
        B = action.shape[0]
        g = self.g
        discount = torch.where(torch.rand(B, generator=g) < 0.5, 1.0, 0.9)
        return ModelStep(state, torch.randn(B, generator=g), random_logits(g, B, self.A, 0.2),
                         torch.randn(B, generator=g), discount)


def test_model_step_with_its_own_discount_runs_in_cpp_and_matches_torch(monkeypatch):
    B, S, A = 6, 30, 4
    g = torch.Generator().manual_seed(0)
    root = ModelStep(torch.zeros(B, 2), torch.zeros(B), random_logits(g, B, A, 0.2), torch.randn(B, generator=g))
    legal = root.policy_logits > NEG_INF
    trees = {}
    calls = count_kernel_calls(monkeypatch)
    for name, ops in (("torch", None), ("cpp", _OPS)):
        tree = start_tree(root, S, legal, 0.997)
        trees[name] = run_search(tree, DiscountingStep(A, 7), S, PUCT(), PUCT(), 0.997, ops=ops)
    assert calls == {"select": S, "backup": S}  # every backup ran in C++ (the loop no longer falls back)
    a, b = trees["cpp"], trees["torch"]
    for name in ("visit_count", "children_index", "children_discount", "value_sum", "min_q", "max_q"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert set(a.children_discount[a.children_index >= 0].tolist()) <= {1.0, torch.tensor(0.9).item()}


# ----------------------------------------------------------------------------
# The fused MLP search takes the rules the same way
# ----------------------------------------------------------------------------
def _mlp(A, seed_):
    from torchrl_muzero.modules import MuZeroMLPModel

    torch.manual_seed(seed_)
    return MuZeroMLPModel((5,), A, latent_dim=8, hidden_dim=16, num_layers=1, value_support_size=5,
                          reward_support_size=5, zero_init_heads=False).eval()


needs_fused = pytest.mark.skipif(_OPS is None or not hasattr(_OPS, "mlp_search"), reason="no fused search")


@needs_fused
def test_fused_search_by_rule_name_equals_the_version_1_call():
    B, S, A = 5, 20, 4
    model = _mlp(A, 0)
    root = model.search_root(torch.randn(B, 5))
    legal = torch.ones(B, A, dtype=torch.bool)
    legal[1, 2] = False
    tensors, reward_eps, value_eps = model.fused_search_weights()
    new, old = (start_tree(root, S, legal, 0.997) for _ in range(2))
    _cpp.cpp_mlp_search(new, tensors, reward_eps, value_eps, PUCT(), PUCT())
    _OPS.mlp_search(old.visit_count, old.value_sum, old.parent, old.action_from_parent, old.children_index,
                    old.children_prior, old.children_reward, old.min_q, old.max_q, old.root_legal,
                    old.embeddings, tensors, reward_eps, value_eps, 19652.0, 1.25, 0.997)
    for name in ("visit_count", "value_sum", "children_index", "children_prior", "min_q", "max_q", "embeddings"):
        assert torch.equal(getattr(new, name), getattr(old, name)), name
    # The new form also writes every node's logits and raw value, as the loop does.
    step = model.search_step(new.embeddings[:, 0], torch.zeros(B, dtype=torch.long))
    child = new.children_index[:, 0, 0].long()
    rows = torch.arange(B)[child > 0]
    torch.testing.assert_close(new.children_logits[rows, child[rows]], step.policy_logits[rows], atol=1e-4, rtol=0)
    assert new.raw_value[:, 1:].abs().sum() > 0


@needs_fused
@needs_gumbel
def test_fused_search_runs_the_gumbel_rules():
    B, S, A, max_m = 6, 16, 5, 3
    model = _mlp(A, 1)
    root = model.search_root(torch.randn(B, 5))
    legal = torch.ones(B, A, dtype=torch.bool)
    legal[0, :3] = False
    tree = start_tree(root, S, legal, 0.997)
    _gumbel_extra(torch.Generator().manual_seed(4), tree, S, max_m)
    fused = clone_tree(tree)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    rules = (GumbelRootRule(), GumbelInteriorRule())
    _cpp.cpp_mlp_search(fused, tensors, reward_eps, value_eps, *rules)
    assert fused.visit_count[:, 0].tolist() == [S] * B
    visited = (fused.root_child_visits() > 0).sum(-1)
    assert (visited == fused.extra["num_considered"]).all()  # S >= m: every considered action is visited
    assert_no_minus_inf_edge_expanded(fused)
    # The same rules in the per-simulation C++ loop around the torch model: the fused network
    # rounds differently from BLAS in the last bits, so compare the root visits only loosely.
    loop = run_search(tree, model.search_step, S, *rules, 0.997, ops=_OPS)
    agree = (loop.root_child_visits() == fused.root_child_visits()).all(-1).float().mean()
    assert agree >= 0.5
