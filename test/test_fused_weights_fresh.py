"""Every fused C++ search sees the model's current weights, whatever their memory layout (issue 37).

The fused searches take the network's tensors as contiguous float32 arrays; a
parameter that is not (a non-contiguous view, as ``load_state_dict(assign=True)``
leaves from a transposed checkpoint tensor) is handed over as a copy. A cache
of those arrays (UniZero's, ``modules/unizero/fused.py``) must then notice an
in-place update of the parameter, or the search keeps the old weights while
the model has new ones. Each test below warms whatever cache there is, makes
one parameter non-contiguous (same values), updates it in place, and asks for
the search of a freshly built model holding the updated weights: the same
kernel on the same values, so the same visit counts and root values, bit for
bit.
"""
from __future__ import annotations

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, _cpp, search
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel, StochasticMuZeroMLPModel
from torchrl_muzero.modules.unizero import UniZeroModel

_OPS = _cpp.load_tree_ops()


def _need(kernel_function: str) -> None:
    if _OPS is None or not hasattr(_OPS, kernel_function):
        pytest.skip(f"the C++ kernel with {kernel_function} is not built: "
                    f"{_cpp.tree_ops_unavailable_reason() or 'a build without it'}")


def _widened(model):
    with torch.no_grad():  # values and priors of a few units, so a weight change moves the search
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    return model.eval()


def _muzero(seed=0):
    torch.manual_seed(seed)
    return _widened(MuZeroMLPModel((5,), 4, latent_dim=16, hidden_dim=24, num_layers=1, value_support_size=10,
                                   reward_support_size=10))


def _efficientzero(seed=0):
    torch.manual_seed(seed)
    return _widened(EfficientZeroMLPModel((5,), 4, latent_dim=16, hidden_dim=24, num_layers=1, value_support_size=10,
                                          reward_support_size=10, lstm_hidden_size=16, lstm_horizon_len=3))


def _stochastic(seed=0):
    torch.manual_seed(seed)
    return _widened(StochasticMuZeroMLPModel((5,), 4, chance_space_size=3, latent_dim=16, hidden_dim=24,
                                             num_layers=1, value_support_size=10, reward_support_size=10))


def _unizero(seed=0):
    torch.manual_seed(seed)
    return _widened(UniZeroModel((5,), 4, embed_dim=16, num_layers=2, num_heads=2, context_length=2, max_blocks=5,
                                 value_support_size=10, reward_support_size=10))


_CONFIG = MCTSConfig(num_simulations=24, backend="cpp", temperature=0.0)


def _observations(shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _mlp_search(model):
    return search(model, _observations((6, 5)), _CONFIG, add_noise=False, generator=torch.Generator().manual_seed(0))


def _stochastic_search(model):
    return stochastic_search(model, _observations((6, 5)), _CONFIG, add_noise=False,
                             generator=torch.Generator().manual_seed(0))


def _unizero_search(model):
    window = _observations((6, 3, 5))  # full windows: the root's forward runs in the kernel too
    actions = torch.randint(4, (6, 2), generator=torch.Generator().manual_seed(2))
    root = model.search_root(window, actions)
    return muzero_search(model, root, _CONFIG, add_noise=False, generator=torch.Generator().manual_seed(0))


def _fresh_like(build, model):
    """A newly built model holding ``model``'s current weights in contiguous parameters."""
    fresh = build(seed=123)
    fresh.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    assert all(p.is_contiguous() for p in fresh.parameters())
    return fresh


def _same(result, reference, what):
    assert torch.equal(result.visit_counts, reference.visit_counts), what
    assert torch.equal(result.root_value, reference.root_value), (what, result.root_value - reference.root_value)


def _check(build, run, name):
    model = build()
    run(model)  # warm every cache the fused path keeps
    # the same values in a non-contiguous parameter (a transposed checkpoint tensor loaded with assign=True)
    live = model.state_dict()[name]
    model.load_state_dict({name: live.t().contiguous().t()}, strict=False, assign=True)
    param = model.get_parameter(name)
    assert not param.is_contiguous() and torch.equal(param, live)
    before = run(model)
    _same(before, run(_fresh_like(build, model)), "non-contiguous, same values")

    with torch.no_grad():
        param.add_(0.5 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
    after = run(model)
    expected = run(_fresh_like(build, model))
    assert not torch.equal(expected.root_value, before.root_value)  # the update matters to the search
    _same(after, expected, "after an in-place update")
    # and a copy_ (what a weight sync does) is seen as well
    with torch.no_grad():
        param.copy_(param * 0.5)
    _same(run(model), run(_fresh_like(build, model)), "after copy_")


def test_muzero_fused_search_sees_updates_of_non_contiguous_weights():
    _need("mlp_search")
    assert _muzero().fused_search_weights() is not None
    _check(_muzero, _mlp_search, "dynamics_net.0.weight")


def test_efficientzero_fused_search_sees_updates_of_non_contiguous_weights():
    _need("ez_search")
    assert _efficientzero().fused_value_prefix_weights() is not None
    _check(_efficientzero, _mlp_search, "dynamics_net.0.weight")


def test_stochastic_fused_search_sees_updates_of_non_contiguous_weights():
    _need("stochastic_search")
    assert _stochastic().fused_search_weights() is not None
    _check(_stochastic, _stochastic_search, "dynamics_net.0.weight")


@pytest.mark.parametrize("name", ["transformer.blocks.0.attn.qkv.weight", "value_head.2.weight"])
def test_unizero_fused_search_sees_updates_of_non_contiguous_weights(name):
    _need("unizero_search")
    assert _unizero().fused_unizero_weights() is not None
    _check(_unizero, _unizero_search, name)
