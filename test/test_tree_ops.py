"""The C++ tree kernel (torchrl_muzero/csrc/) against a loop transcription of its pUCT contract.

The transcription below works on numpy float32 scalars so every operation
rounds to float32 in the same order as the kernel; trees are grown by random
simulations (random priors, rewards, values, root masks, one- and two-player
discounts held per edge in ``children_discount``) and the kernel must pick the
same leaves at every simulation and end with the same statistics. (The other
rules, per-edge discounts that differ and ``-inf`` logits:
test/test_cpp_rules.py.) When the plain-torch search path
(``mcts/select.py`` / ``mcts/backup.py``) is importable it is held to the same
visit counts.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.tree import Tree, allocate_tree

_OPS = _cpp.load_tree_ops()
requires_ext = pytest.mark.skipif(
    _OPS is None, reason=f"C++ tree kernel not built: {_cpp.tree_ops_unavailable_reason()}"
)

try:
    from torchrl_muzero.mcts.backup import expand_and_backup as torch_expand_and_backup
    from torchrl_muzero.mcts.select import select_leaves as torch_select_leaves
except ImportError:  # the torch path is optional for this file
    torch_select_leaves = torch_expand_and_backup = None

f32 = np.float32
PB_C_BASE, PB_C_INIT = 19652.0, 1.25
RULE = PUCT(PB_C_BASE, PB_C_INIT)


# ----------------------------------------------------------------------------
# Loop transcription of the contract (float32 scalars, same operation order).
# ----------------------------------------------------------------------------
def ref_select(t: dict, pb_c_base: float, pb_c_init: float):
    vc, vs, ci = t["visit_count"], t["value_sum"], t["children_index"]
    cp, cr, legal = t["children_prior"], t["children_reward"], t["root_legal"]
    cd, lg = t["children_discount"], t["children_logits"]
    base, init = f32(pb_c_base), f32(pb_c_init)
    B, _, A = ci.shape
    nodes, actions = [], []
    for b in range(B):
        minq = t["min_q"][b]
        delta = t["max_q"][b] - minq
        node = 0
        while True:
            pv = f32(vc[b, node])
            # log in double then rounded: the correctly rounded float log, as libm's logf gives.
            pb_c = init + f32(math.log((pv + base + f32(1.0)) / base))
            sqrt_n = np.sqrt(pv)
            best, best_score = 0, f32(-np.inf)
            for a in range(A):
                if (node == 0 and not legal[b, a]) or not lg[b, node, a] > -np.inf:
                    continue
                child = ci[b, node, a]
                q_norm, child_visits = f32(0.0), f32(0.0)
                if child >= 0:
                    cv = f32(vc[b, child])
                    q = cr[b, node, a] + cd[b, node, a] * (vs[b, child] / cv)
                    if delta > f32(1e-8):
                        q_norm = (q - minq) / delta
                    child_visits = cv
                u = cp[b, node, a] * sqrt_n / (f32(1.0) + child_visits) * pb_c
                score = q_norm + u
                if score > best_score:
                    best, best_score = a, score
            nxt = ci[b, node, best]
            if nxt < 0:
                break
            node = int(nxt)
        nodes.append(node)
        actions.append(best)
    return nodes, actions


def ref_expand_and_backup(t: dict, n: int, leaf_node, leaf_action, reward, value, prior):
    vc, vs, par, afp = t["visit_count"], t["value_sum"], t["parent"], t["action_from_parent"]
    ci, cp, cr, cd = t["children_index"], t["children_prior"], t["children_reward"], t["children_discount"]
    for b in range(vc.shape[0]):
        leaf, act = int(leaf_node[b]), int(leaf_action[b])
        ci[b, leaf, act] = n
        par[b, n] = leaf
        afp[b, n] = act
        cr[b, leaf, act] = reward[b]
        cp[b, n, :] = prior[b, :]
        G = f32(value[b])
        node = n
        vs[b, n] += G
        vc[b, n] += 1
        while node != 0:
            p, a = int(par[b, node]), int(afp[b, node])
            r, disc = cr[b, p, a], cd[b, p, a]
            q = r + disc * (vs[b, node] / f32(vc[b, node]))
            t["min_q"][b] = min(t["min_q"][b], q)
            t["max_q"][b] = max(t["max_q"][b], q)
            G = r + disc * G
            vs[b, p] += G
            vc[b, p] += 1
            node = p


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------
def clone_tree(tree: Tree) -> Tree:
    return Tree(**{k: v.clone() for k, v in tree.tensors().items()})


def as_numpy(tree: Tree) -> dict:
    # Views sharing memory with the tree: the reference mutates the tensors in place.
    return {k: v.numpy() for k, v in tree.tensors().items() if k != "embeddings"}


def assert_trees_equal(a: Tree, b: Tree, exact_floats: bool = True):
    for name, x in a.tensors().items():
        y = getattr(b, name)
        if exact_floats or not x.is_floating_point():
            assert torch.equal(x, y), f"{name} differs"
        else:
            torch.testing.assert_close(x, y, msg=f"{name} differs")


def random_prior(g: torch.Generator, B: int, A: int, kind: str) -> torch.Tensor:
    if kind == "uniform":  # exact ties: exercises the first-maximum rule
        return torch.full((B, A), 1.0 / A)
    return torch.softmax(2.0 * torch.randn(B, A, generator=g), -1)


def new_tree(
    g: torch.Generator, B: int, num_sims: int, A: int, masked: bool, prior_kind: str, discount: float
) -> Tree:
    tree = allocate_tree(B, num_sims, A, torch.Size([1]), torch.device("cpu"), discount=discount)
    if masked:
        legal = torch.rand(B, A, generator=g) < 0.6
        legal[torch.arange(B), torch.randint(A, (B,), generator=g)] = True  # at least one legal
        if B > 1:
            legal[0] = False  # a row with nothing legal: the kernel falls back to action 0
        tree.root_legal.copy_(legal)
    tree.children_prior[:, 0] = random_prior(g, B, A, prior_kind)
    return tree


def random_step(g: torch.Generator, B: int, A: int, prior_kind: str, scale: float):
    if prior_kind == "uniform":
        reward = torch.zeros(B)
        value = torch.randint(-1, 2, (B,), generator=g).float()  # few distinct values: more ties
    else:
        reward = scale * torch.randn(B, generator=g)
        value = scale * torch.randn(B, generator=g)
    return reward, value, random_prior(g, B, A, prior_kind)


CASES = [
    # B, num_sims, A, discount, masked, prior kind, value scale
    (1, 40, 2, 0.997, False, "random", 1.0),
    (7, 30, 6, 0.997, True, "random", 1.0),
    (5, 30, 6, -1.0, False, "random", 1.0),  # two-player zero-sum
    (9, 25, 3, -0.95, True, "random", 10.0),
    (6, 30, 4, 1.0, True, "uniform", 1.0),
    (4, 20, 5, -1.0, False, "uniform", 1.0),
    (33, 50, 6, 0.997, True, "random", 100.0),
]


# ----------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------
def test_loader_never_raises():
    mod = _cpp.load_tree_ops()
    reason = _cpp.tree_ops_unavailable_reason()
    assert (mod is None) == (reason is not None)
    assert _cpp.load_tree_ops() is mod  # cached


@requires_ext
@pytest.mark.parametrize("B,num_sims,A,discount,masked,prior_kind,scale", CASES)
def test_matches_loop_reference(B, num_sims, A, discount, masked, prior_kind, scale):
    g = torch.Generator().manual_seed(zlib.crc32(repr((B, num_sims, A, discount, prior_kind)).encode()))
    tree = new_tree(g, B, num_sims, A, masked, prior_kind, discount)
    ref_tree = clone_tree(tree)
    ref = as_numpy(ref_tree)
    for sim in range(num_sims):
        n = sim + 1
        leaf_node, leaf_action = _cpp.cpp_select(tree, RULE, RULE)
        assert leaf_node.dtype == leaf_action.dtype == torch.int64
        ref_node, ref_action = ref_select(ref, PB_C_BASE, PB_C_INIT)
        assert leaf_node.tolist() == ref_node, f"simulation {sim}"
        assert leaf_action.tolist() == ref_action, f"simulation {sim}"
        reward, value, prior = random_step(g, B, A, prior_kind, scale)
        _cpp.cpp_expand_and_backup(tree, n, leaf_node, leaf_action, reward, value, prior)
        ref_expand_and_backup(ref, n, ref_node, ref_action, reward.numpy(), value.numpy(), prior.numpy())
        assert_trees_equal(tree, ref_tree)
    assert tree.visit_count[:, 0].tolist() == [num_sims] * B
    if masked:  # illegal root edges were never expanded (the all-illegal row 0 excepted)
        illegal = ~tree.root_legal[1:]
        assert (tree.children_index[1:, 0][illegal] == -1).all()


@requires_ext
@pytest.mark.skipif(torch_select_leaves is None, reason="plain-torch select/backup not importable")
@pytest.mark.parametrize("B,num_sims,A,discount,masked,prior_kind,scale", CASES)
def test_matches_torch_path(B, num_sims, A, discount, masked, prior_kind, scale):
    g = torch.Generator().manual_seed(zlib.crc32(repr((B, A, discount, prior_kind, "torch")).encode()))
    tree = new_tree(g, B, num_sims, A, masked, prior_kind, discount)
    t_tree = clone_tree(tree)
    for sim in range(num_sims):
        n = sim + 1
        leaf_node, leaf_action = _cpp.cpp_select(tree, RULE, RULE)
        t_node, t_action = torch_select_leaves(t_tree, PB_C_BASE, PB_C_INIT, discount)
        assert torch.equal(leaf_node, t_node.long()), f"simulation {sim}"
        assert torch.equal(leaf_action, t_action.long()), f"simulation {sim}"
        reward, value, prior = random_step(g, B, A, prior_kind, scale)
        _cpp.cpp_expand_and_backup(tree, n, leaf_node, leaf_action, reward, value, prior)
        torch_expand_and_backup(t_tree, n, t_node, t_action, reward, value, prior, discount)
    assert_trees_equal(tree, t_tree, exact_floats=False)


@requires_ext
def test_first_simulation_and_all_illegal_row():
    tree = allocate_tree(3, 4, 3, torch.Size([1]), torch.device("cpu"))
    tree.children_prior[:, 0] = torch.tensor([0.2, 0.5, 0.3])
    tree.root_legal.copy_(torch.tensor([[True, True, True], [False, False, True], [False, False, False]]))
    node, action = _cpp.cpp_select(tree, RULE, RULE)
    # Root unvisited: every score is 0, so the first legal action wins (0 if none is legal).
    assert node.tolist() == [0, 0, 0]
    assert action.tolist() == [0, 2, 0]
    tree.visit_count[:, 0] = 1  # now the prior decides
    node, action = _cpp.cpp_select(tree, RULE, RULE)
    assert action.tolist() == [1, 2, 0]


@requires_ext
def test_two_level_backup_values():
    # Hand-checked two-player backup: signs flip through the negative discount.
    tree = allocate_tree(1, 2, 2, torch.Size([1]), torch.device("cpu"), discount=-1.0)
    tree.children_prior[:, 0] = torch.tensor([1.0, 0.0])
    one = lambda x: torch.tensor([x], dtype=torch.float32)  # noqa: E731
    prior = torch.tensor([[0.0, 1.0]])
    _cpp.cpp_expand_and_backup(tree, 1, torch.tensor([0]), torch.tensor([0]), one(0.5), one(2.0), prior)
    # node1: V=2; root: G = 0.5 - 2 = -1.5; edge q = 0.5 - 2 = -1.5
    assert tree.value_sum[0].tolist()[:2] == [-1.5, 2.0]
    assert tree.min_q.item() == tree.max_q.item() == -1.5
    _cpp.cpp_expand_and_backup(tree, 2, torch.tensor([1]), torch.tensor([1]), one(1.0), one(3.0), prior)
    # node2: V=3; node1: G = 1 - 3 = -2, sum 0, visits 2; root: G = 0.5 + 2 = 2.5, sum 1.0
    assert tree.visit_count[0].tolist() == [2, 2, 1]
    assert tree.value_sum[0].tolist() == [1.0, 0.0, 3.0]
    # q(node1->node2) = 1 - 3 = -2; q(root->node1) = 0.5 - 0/2 = 0.5
    assert tree.min_q.item() == -2.0 and tree.max_q.item() == 0.5
    assert tree.parent[0].tolist() == [-1, 0, 1]
    assert tree.action_from_parent[0].tolist() == [-1, 0, 1]
    assert tree.children_index[0].tolist() == [[1, -1], [-1, 2], [-1, -1]]


@requires_ext
def test_bad_inputs_raise_and_leave_tree_untouched():
    B, A = 2, 3
    tree = allocate_tree(B, 5, A, torch.Size([1]), torch.device("cpu"))
    zeros, prior = torch.zeros(B), torch.full((B, A), 1 / A)
    leaf = torch.zeros(B, dtype=torch.long)

    def eb(tree=tree, n=1, node=leaf, action=leaf, reward=zeros, value=zeros, prior=prior):
        _cpp.cpp_expand_and_backup(tree, n, node, action, reward, value, prior)

    before = clone_tree(tree)
    with pytest.raises(RuntimeError, match="node_index"):
        eb(n=0)
    with pytest.raises(RuntimeError, match="node_index"):
        eb(n=6)
    with pytest.raises(RuntimeError, match="leaf_action"):
        eb(action=torch.tensor([0, A]))
    with pytest.raises(RuntimeError, match="leaf_node"):
        eb(node=torch.tensor([0, 1]))  # node 1 is the one being created
    with pytest.raises(RuntimeError, match="leaf_node.*Long"):
        eb(node=leaf.int())
    with pytest.raises(RuntimeError, match="prior.*shape"):
        eb(prior=torch.full((B, A + 1), 0.25))
    with pytest.raises(RuntimeError, match="reward.*Float"):
        eb(reward=zeros.double())
    with pytest.raises(RuntimeError, match="prior.*contiguous"):
        eb(prior=torch.full((A, B), 1 / A).t())
    assert_trees_equal(tree, before)

    eb()
    with pytest.raises(RuntimeError, match="already expanded"):
        eb(n=2)

    bad = clone_tree(tree)
    bad.visit_count = bad.visit_count.long()
    with pytest.raises(RuntimeError, match="visit_count.*Int"):
        _cpp.cpp_select(bad, RULE, RULE)
    bad = clone_tree(tree)
    bad.root_legal = bad.root_legal[:, :2].contiguous()
    with pytest.raises(RuntimeError, match="root_legal.*shape"):
        _cpp.cpp_select(bad, RULE, RULE)
    bad = clone_tree(tree)
    bad.children_index[1, 0, 0] = 0  # root is its own child: a cycle
    bad.visit_count[1, 0] = 1
    bad.children_prior[1, 0] = torch.tensor([1.0, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="cycle"):
        _cpp.cpp_select(bad, RULE, RULE)
