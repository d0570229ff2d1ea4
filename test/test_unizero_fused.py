"""The fused C++ UniZero search (csrc/unizero_net.h): its step against UniZeroModel.search_step, the
exactness of its per-node KV cache, whole searches against the torch path, and the fallback."""
import pytest
import torch
from kernel_threads import kernel_on_threads

from torchrl_muzero.mcts import MCTSConfig, _cpp
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.modules.unizero.fused import fused_search_step, fused_unizero_weights
from torchrl_muzero.modules.unizero.node_states import complete_node_states

_ops = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _ops is None or not hasattr(_ops, "unizero_search"), reason="C++ kernel with unizero_search not built"
)

A = 3
SIZES = dict(embed_dim=32, num_layers=2, num_heads=2, context_length=2, max_blocks=5,
             value_support_size=10, reward_support_size=10)


def _model(kv_cache=True, position="rope", latent_norm="simnorm", seed=0, **kw):
    torch.manual_seed(seed)
    model = UniZeroModel((4,), A, position=position, latent_norm=latent_norm, kv_cache=kv_cache,
                         **{**SIZES, **kw}).eval()
    with torch.no_grad():  # the GPT init (std 0.02) makes every head nearly constant: widen it
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    return model


def _root(model, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    K = model.context_length
    obs, actions = torch.randn(B, K + 1, 4, generator=g), torch.randint(A, (B, K), generator=g)
    valid = torch.ones(B, K + 1, dtype=torch.bool)
    valid[: B // 3, :K] = False  # some rows start an episode: ragged windows
    return model.search_root(obs, actions, valid)


def _close(a, b, what, atol=2e-5, rtol=2e-5):
    assert torch.allclose(a, b, atol=atol, rtol=rtol), (what, (a - b).abs().max().item())


def _full_reference(model, state):
    """A full causal forward over each row's whole context: (h at its last two slots, kv)."""
    B, L = state["length"].shape[0], int(state["length"].max())
    h, kv = model._full(state["latents"], state["actions"], L)
    rows = torch.arange(B)
    return h[rows, state["length"] - 2], h[rows, state["length"] - 1], kv


CONFIGS = [("rope", "simnorm"), ("absolute", "layernorm"), ("rope", "layernorm")]


@pytest.mark.parametrize("position,norm", CONFIGS)
@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_step_matches_search_step_at_every_depth(kv_cache, position, norm):
    # Depth 3+ crosses the context limit (max_blocks=5): the slide and its rebuild are covered.
    model = _model(kv_cache, position, norm)
    state = _root(model, 6).state
    g = torch.Generator().manual_seed(1)
    for depth in range(7):
        action = torch.randint(A, (6,), generator=g)
        ref = model.search_step(state, action)
        out = fused_search_step(model, state, action)
        for key in ref.state.keys():
            if key in ("actions", "length"):
                assert torch.equal(out.state[key], ref.state[key]), (depth, key)
            else:
                _close(out.state[key], ref.state[key], (depth, key))
        _close(out.reward, ref.reward, (depth, "reward"), atol=5e-4)
        _close(out.value, ref.value, (depth, "value"), atol=5e-4)
        _close(out.policy_logits, ref.policy_logits, (depth, "logits"))
        state = ref.state


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_cached_inference_equals_a_full_forward(kv_cache):
    # Chained fused steps (each from the previous fused state): the outputs at the new action and
    # latent tokens are those of one full forward over the node's token sequence (the slid window
    # after the context limit), and the cached keys/values are that forward's.
    model = _model(kv_cache)
    state = _root(model, 5).state
    g = torch.Generator().manual_seed(2)
    for depth in range(7):
        out = fused_search_step(model, state, torch.randint(A, (5,), generator=g))
        h_action, h_latent, kv = _full_reference(model, out.state)
        policy_logits, value_logits = model._latent_heads(h_latent)
        reward_logits, next_latent = model._action_heads(h_action)
        reward, value = model._decode(reward_logits, value_logits)
        _close(model.node_latent(out.state), next_latent, (depth, "latent"))
        _close(out.policy_logits, policy_logits, (depth, "logits"))
        _close(out.value, value, (depth, "value"), atol=5e-4)
        _close(out.reward, reward, (depth, "reward"), atol=5e-4)
        if kv_cache:
            used = torch.arange(kv.shape[1])[None] < out.state["length"][:, None]
            cached = out.state["kv"][:, : kv.shape[1]]
            _close(cached * used[..., None, None, None, None], kv * used[..., None, None, None, None],
                   (depth, "kv"))
            assert out.state["kv"][:, kv.shape[1]:].eq(0).all()
        state = out.state


def test_vector_widths_agree_bitwise():
    model = _model(True, "absolute", "simnorm")
    state = _root(model, 9).state
    action = torch.randint(A, (9,), generator=torch.Generator().manual_seed(3))
    wide, narrow = fused_search_step(model, state, action), fused_search_step(model, state, action, baseline=True)
    assert torch.equal(wide.state["kv"], narrow.state["kv"]) and torch.equal(wide.value, narrow.value)
    assert torch.equal(wide.policy_logits, narrow.policy_logits)


def _search(model, root, backend, sims=30, seed=0, add_noise=True):
    cfg = MCTSConfig(num_simulations=sims, backend=backend)
    return muzero_search(model, root, cfg, add_noise=add_noise, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_search_matches_torch_path(kv_cache):
    same = total = 0
    for seed in range(3):
        model = _model(kv_cache, seed=seed)
        root = _root(model, 8, seed)
        ref, fused = _search(model, root, "torch", seed=seed), _search(model, root, "cpp", seed=seed)
        assert fused.visit_counts.sum(-1).eq(30).all()
        equal = ref.visit_counts.eq(fused.visit_counts).all(-1)
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        v_ref, v_fused = ref.root_value[trees].double(), fused.root_value[trees].double()
        assert ((v_ref - v_fused).abs() <= 1e-3 + 1e-4 * v_ref.abs()).all()
        same += int(equal.sum())
        total += 8
    assert same >= 0.9 * total, (same, total)  # near-ties may go the other way (float rounding)


def test_search_node_states_equal_search_step():
    # The fused cached search keeps each node's own K/V slots only; completed on demand, every
    # node's state (latents, actions, length and the K/V buffer) is what search_step gives from its
    # parent's state (slides included: max_blocks=5, 40 simulations).
    model = _model(True)
    result = _search(model, _root(model, 4), "cpp", sims=40)
    tree = result.tree
    complete_node_states(tree)
    n = torch.arange(1, tree.num_nodes)
    for b in range(4):
        parents, actions = tree.parent[b, n].long(), tree.action_from_parent[b, n].long()
        ref = model.search_step(tree.embeddings[b][parents], actions)
        got = tree.embeddings[b][n]
        assert torch.equal(got["length"], ref.state["length"]) and torch.equal(got["actions"], ref.state["actions"])
        _close(got["latents"], ref.state["latents"], "latents")
        _close(got["kv"], ref.state["kv"], "kv")
        _close(tree.raw_value[b, n], ref.value, "value", atol=5e-4)


def test_completing_node_states_is_idempotent_and_keeps_complete_states():
    # A torch-step search's node states are complete already: completing them changes no bit; a
    # fused tree completed twice is the tree completed once.
    model = _model(True)
    root = _root(model, 3)
    torch_tree = _search(model, root, "torch", sims=20).tree
    before = torch_tree.embeddings["kv"].clone()
    complete_node_states(torch_tree)
    assert torch.equal(torch_tree.embeddings["kv"], before)
    fused_tree = _search(model, root, "cpp", sims=20).tree
    complete_node_states(fused_tree)
    once = fused_tree.embeddings["kv"].clone()
    complete_node_states(fused_tree)
    assert torch.equal(fused_tree.embeddings["kv"], once)
    recompute = _model(False)
    complete_node_states(_search(recompute, _root(recompute, 2), "cpp", sims=5).tree)  # no kv: nothing to do


def test_fused_search_is_batch_invariant():
    model = _model(True)
    root = _root(model, 7)
    batch = _search(model, root, "cpp", add_noise=False)
    complete_node_states(batch.tree)  # the K/V slots a node does not own are left unwritten by the search
    for i in (0, 3, 6):
        one = _search(model, type(root)(root.state[i : i + 1], root.reward[i : i + 1],
                                        root.policy_logits[i : i + 1], root.value[i : i + 1]),
                      "cpp", add_noise=False)
        complete_node_states(one.tree)
        for name, t in one.tree.tensors().items():
            assert bool((t[0] == getattr(batch.tree, name)[i]).all()), name


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_fused_search_gives_the_same_trees_on_any_number_of_threads(kv_cache, monkeypatch):
    """The search splits its trees over torch's threads (csrc/fused_loop.h's for_row_chunks): 40
    trees are 20 + 20 on two threads, 12 + 12 + 16 on three; only the kernel runs on them (torch's
    own root ops stay on one thread: MKL rounds differently per thread count)."""
    model = _model(kv_cache)
    root = _root(model, 40)
    assert torch.get_num_threads() == 1  # test/conftest.py
    one = _search(model, root, "cpp")
    complete_node_states(one.tree)  # slots a node does not own are left unwritten by the search
    for threads in (2, 3):
        with monkeypatch.context() as patch:
            calls = kernel_on_threads(patch, _ops, "unizero_search", threads)
            split = _search(model, root, "cpp")
        assert calls == [threads]
        complete_node_states(split.tree)
        for name, t in one.tree.tensors().items():
            other = getattr(split.tree, name)
            same = torch.equal(t, other) if isinstance(t, torch.Tensor) else all(
                torch.equal(t[k], other[k]) for k in t.keys(True, True))
            assert same, (threads, name)


def test_unsupported_models_fall_back_to_the_torch_step():
    assert fused_unizero_weights(_model(True)) is not None
    unsupported = [_model(True, on_overflow="error", max_blocks=10), _model(True, num_heads=8)]  # head_dim 4
    double = _model(True).double()
    unsupported.append(double)
    for model in unsupported:
        assert fused_unizero_weights(model) is None
    model = unsupported[0]
    root = _root(model, 2)
    out = _search(model, root, "cpp", sims=6)
    ref = _search(model, root, "torch", sims=6)
    assert torch.equal(out.visit_counts, ref.visit_counts)  # the torch step on the C++ tree: same math
    with pytest.raises(RuntimeError, match="does not support"):
        fused_search_step(model, root.state, torch.zeros(2, dtype=torch.long))


def test_run_rules_reports_the_fused_search():
    from torchrl_muzero.mcts.loop import start_tree
    from torchrl_muzero.mcts.rules import PUCT
    from torchrl_muzero.mcts.search import run_rules

    cases = ((_model(True), True), (_model(False), True), (_model(True, on_overflow="error", max_blocks=10), False))
    for model, fused in cases:
        root = _root(model, 2)
        tree = start_tree(root, 5, torch.ones(2, A, dtype=torch.bool), 0.997)
        assert run_rules(model, tree, MCTSConfig(num_simulations=5, backend="cpp"), PUCT(), PUCT(), 0.997) is fused


def test_algo_unizero_acts_through_the_fused_search(tmp_path, monkeypatch):
    from tensordict import TensorDict

    from pipeline_utils import tiny_config
    from torchrl_muzero.trainers import load_config
    from torchrl_muzero.trainers.builders import build_model, build_policy

    calls = []
    fused = _cpp.cpp_unizero_search
    monkeypatch.setattr(_cpp, "cpp_unizero_search", lambda *a, **k: calls.append(1) or fused(*a, **k))
    cfg = load_config(tiny_config(tmp_path, **{"algo.name": "unizero", "algo.embed_dim": 16,
                                               "algo.context_length": 0}))
    model = build_model(cfg, (4,), 2)
    policy = build_policy(cfg, model, None, generator=torch.Generator().manual_seed(0))
    out = policy(TensorDict({"observation": torch.randn(3, 4)}, [3]))
    assert calls and out["search_policy"].sum(-1).allclose(torch.ones(3))


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_fused_root_equals_the_torch_root(kv_cache, monkeypatch):
    import torchrl_muzero.modules.unizero.model as model_module

    model = _model(kv_cache, "absolute", "layernorm")
    fused = _root(model, 5)
    monkeypatch.setattr(model_module, "fused_root_from_leaves", lambda *args: None)
    ref = _root(model, 5)
    for key in ref.state.keys():
        _close(fused.state[key], ref.state[key], key)
    _close(fused.policy_logits, ref.policy_logits, "logits")
    _close(fused.value, ref.value, "value", atol=5e-4)


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_full_window_root_in_one_call_equals_the_packed_one(kv_cache, monkeypatch):
    # Full windows take fused_root_window (the state made in C++); the same bits as the packing
    # path with the kernel's root forward, for K = context_length and K = 0.
    import torchrl_muzero.modules.unizero.model as model_module

    model = _model(kv_cache)
    g = torch.Generator().manual_seed(5)
    for K in (model.context_length, 0):
        obs, actions = torch.randn(4, K + 1, 4, generator=g), torch.randint(A, (4, K), generator=g)
        fast = model.search_root(obs, actions)
        with monkeypatch.context() as m:
            m.setattr(model_module, "fused_root_window", lambda *args: None)
            ref = model.search_root(obs, actions)
        assert set(fast.state.keys()) == set(ref.state.keys())
        for key in ref.state.keys():
            assert torch.equal(fast.state[key], ref.state[key]) and fast.state[key].dtype == ref.state[key].dtype, key
        assert torch.equal(fast.policy_logits, ref.policy_logits) and torch.equal(fast.value, ref.value)


def _write_from_another_process(model, other) -> None:
    import multiprocessing as mp

    def write():  # a bumped version counter in the child is the child's own
        with torch.no_grad():
            for p, q in zip(model.parameters(), other.parameters()):
                p.copy_(q)

    child = mp.get_context("fork").Process(target=write)
    child.start()
    child.join(60)
    assert child.exitcode == 0


@pytest.mark.parametrize("write", ["data", "numpy", "other_process"])
def test_weights_written_without_a_version_bump_are_used_by_the_next_search(write):
    """The kernel keeps its packed weights between searches; a reuse must follow the weights' values.

    The writes here change no version counter in this process, as a publish into a collector's
    shared-memory parameters does (the driver writes them from another process). A key on the
    version counter kept the collectors of ``muzero_async.py algo=unizero`` acting on their first
    weights for the whole run (their returns stayed at random play's while the evaluator improved).
    """
    model, other = _model(seed=0), _model(seed=1)
    if write == "other_process":  # as a collector's parameters: shared memory the driver publishes into
        model.share_memory()
    root = _root(model, 4)
    before = _search(model, root, "cpp", add_noise=False)
    versions = [p._version for p in model.parameters()]
    if write == "other_process":
        _write_from_another_process(model, other)
    for p, q in zip(model.parameters(), other.parameters()):
        if write == "numpy":
            p.detach().numpy()[...] = q.detach().numpy()
        elif write == "data":  # ``.data`` aliases the storage with a version counter of its own
            p.data.copy_(q.data)
        assert torch.equal(p, q)
    assert [p._version for p in model.parameters()] == versions  # no bump: the case under test
    root = _root(model, 4)
    after, ref = _search(model, root, "cpp", add_noise=False), _search(model, root, "torch", add_noise=False)
    assert not torch.equal(after.root_value, before.root_value)
    _close(after.root_value, ref.root_value, "root value after the write", atol=1e-3, rtol=1e-4)


def test_cached_fused_weights_follow_changes_to_the_model():
    """fused_unizero_weights keeps its answer between calls; any change the kernel must see drops it.

    (A swapped parameter-free module went unseen while the cache was keyed on storages alone.)
    """
    import gc
    import weakref

    from torch import nn

    from torchrl_muzero.modules.unizero import fused as fused_module

    def changed(model, change):
        first = fused_unizero_weights(model)
        assert fused_unizero_weights(model) is first  # unchanged model: the cached tensors
        change(model)
        return fused_unizero_weights(model) is not first

    def data(m):  # a new storage behind the same Parameter object
        m.value_head[2].weight.data = m.value_head[2].weight.data.clone()

    def parameter(m):
        m.policy_head[0].bias = nn.Parameter(m.policy_head[0].bias.detach().clone())

    def module(m):
        m.reward_head = nn.Sequential(*(nn.Linear(l.in_features, l.out_features) if type(l) is nn.Linear
                                        else l for l in m.reward_head))

    def no_params(m):  # a parameter-free module (GELU) swapped: the kernel would compute another head
        m.latent_head[1] = nn.ReLU()

    def overflow(m):
        m.on_overflow = "error"

    for change in (data, parameter, module, no_params, overflow):
        assert changed(_model(True), change), change.__name__
    model = _model(True)
    assert changed(model, no_params) and fused_unizero_weights(model) is None  # no longer the mirrored model
    model = _model(True)
    with torch.no_grad():  # in place: the same storages, whose values the kernel compares itself
        assert not changed(model, lambda m: m.value_head[2].weight.add_(1.0))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None  # the cache does not keep a model alive
    assert not any(k is None for k in fused_module._CACHE.keys())


def _windows(model, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    K = model.context_length
    obs, actions = torch.randn(B, K + 1, 4, generator=g), torch.randint(A, (B, K), generator=g)
    valid = torch.ones(B, K + 1, dtype=torch.bool)
    for b in range(B):  # ragged windows of every length
        valid[b, : b % (K + 1)] = False
    return obs, actions, valid


@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_roots_sharing_a_pass_equal_each_root_alone(kv_cache):
    # The kernel runs many roots per pass through the layers (up to 128 token rows each): each root's
    # logits, value and K/V must be a pass of its own, bit for bit, across pass boundaries (60 roots
    # of 1-5 tokens: several passes) and for both root entries (ragged: unizero_root; a full window
    # alone: unizero_root_window).
    # (The latents are encoded once: torch's encoder GEMM is not batch-invariant, the kernel is.)
    model = _model(kv_cache)
    obs, actions, valid = _windows(model, 60)
    latents = model.encode(obs).detach()
    together = model.root_from_latents(latents, actions, valid)
    for i in range(60):
        alone = model.root_from_latents(latents[i : i + 1], actions[i : i + 1], valid[i : i + 1])
        for key in alone.state.keys():
            assert torch.equal(alone.state[key][0], together.state[key][i]), (i, key)
        assert torch.equal(alone.policy_logits[0], together.policy_logits[i]), i
        assert torch.equal(alone.value[0], together.value[i]), i


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_root_value_is_the_roots_value_without_its_cache(kv_cache, backend, monkeypatch):
    import torchrl_muzero.modules.unizero.model as model_module

    model = _model(kv_cache)
    if backend == "torch":
        monkeypatch.setattr(model_module, "fused_root_from_leaves", lambda *args: None)
        monkeypatch.setattr(model_module, "fused_root_window", lambda *args: None)
    obs, actions, valid = _windows(model, 9)
    for v in (valid, None):  # ragged windows, full windows
        root = model.search_root(obs, actions, v)
        assert ("kv" in root.state.keys()) == kv_cache
        assert torch.equal(model.root_value(obs, actions, v), root.value)
        assert "kv" not in model.search_root(obs, actions, v, _keep_cache=False).state.keys()


def test_roots_agree_bitwise_across_vector_widths():
    # The 4-wide baseline build and the AVX2 one give the same roots (grouped passes included).
    model = _model(True)
    obs, actions, valid = _windows(model, 40)
    state = model.search_root(obs, actions, valid).state
    tensors, ints, floats = fused_unizero_weights(model)
    out = {}
    for baseline in (True, False):
        kv = torch.zeros_like(state["kv"])
        logits, value = _ops.unizero_root(tensors, ints, floats, state["latents"], state["actions"], state["length"],
                                          kv, baseline)
        out[baseline] = (logits, value, kv)
    for a, b in zip(out[True], out[False]):
        assert torch.equal(a, b)
    assert torch.equal(out[False][2], state["kv"])  # and the search root's own K/V
