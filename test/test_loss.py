"""Tests of torchrl_muzero.objectives.MuZeroLoss."""
from __future__ import annotations

import doctest

import pytest
import torch
from tensordict import TensorDict

import torchrl_muzero.objectives.muzero as muzero_module
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.objectives import MuZeroLoss, scale_gradient

OBS, A = (4,), 3


def make_model(seed: int = 0, zero_init_heads: bool = False) -> MuZeroMLPModel:
    torch.manual_seed(seed)
    return MuZeroMLPModel(
        OBS,
        A,
        latent_dim=16,
        hidden_dim=32,
        value_support_size=5,
        reward_support_size=5,
        zero_init_heads=zero_init_heads,
    )


def make_loss(model, **kwargs) -> MuZeroLoss:
    if kwargs.get("consistency_loss_weight", 0) > 0:
        kwargs.setdefault("projection_dim", 16)
        kwargs.setdefault("projection_hidden_dim", 16)
        kwargs.setdefault("prediction_hidden_dim", 8)
    return MuZeroLoss(model, **kwargs)


def make_batch(B: int = 4, K: int = 3, seed: int = 0, random_masks: bool = False) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    if random_masks:
        mask = torch.rand(B, K + 1, generator=g) < 0.7
        policy_mask = torch.rand(B, K + 1, generator=g) < 0.7
        mask[:, 0] = True
    else:
        mask = torch.ones(B, K + 1, dtype=torch.bool)
        policy_mask = torch.ones(B, K + 1, dtype=torch.bool)
    return TensorDict(
        {
            "observation": torch.randn(B, K + 1, *OBS, generator=g),
            "action": torch.randint(A, (B, K + 1), generator=g),
            "target_reward": torch.randn(B, K + 1, generator=g),
            "target_value": 3 * torch.randn(B, K + 1, generator=g),
            "target_policy": torch.softmax(2 * torch.randn(B, K + 1, A, generator=g), -1),
            "mask": mask,
            "policy_mask": policy_mask,
        },
        batch_size=[B, K + 1],
    )


def total(out: TensorDict) -> torch.Tensor:
    return sum(v for k, v in out.items() if k.startswith("loss_"))


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }


def loss_and_grads(loss: MuZeroLoss, batch: TensorDict):
    loss.zero_grad(set_to_none=True)
    out = loss(batch.clone())
    total(out).backward()
    return out.detach(), grads(loss)


def reference_loss(model, batch, K, weight=None, w_v=0.25, w_r=1.0, w_p=1.0):
    """Straightforward per-sample, per-step loop (no masking tricks)."""
    B = batch.shape[0]
    value_l, reward_l, policy_l = [], [], []
    for b in range(B):
        lv = lr = lp = torch.zeros(())
        latent, p, v = model.initial_inference(batch["observation"][b, 0][None])
        for k in range(K + 1):
            scale = 1.0 if k == 0 else 1.0 / K
            if k > 0:
                latent, r, p, v = model.recurrent_inference(latent, batch["action"][b, k - 1][None])
                if batch["mask"][b, k]:
                    lr = lr + scale * model.reward_support.cross_entropy(r, batch["target_reward"][b, k][None])[0]
            if batch["mask"][b, k]:
                lv = lv + scale * model.value_support.cross_entropy(v, batch["target_value"][b, k][None])[0]
            if batch["policy_mask"][b, k]:
                lp = lp - scale * (batch["target_policy"][b, k] * torch.log_softmax(p[0], -1)).sum()
        wb = 1.0 if weight is None else weight[b]
        value_l.append(wb * lv)
        reward_l.append(wb * lr)
        policy_l.append(wb * lp)
    return (
        w_v * torch.stack(value_l).mean(),
        w_r * torch.stack(reward_l).mean(),
        w_p * torch.stack(policy_l).mean(),
    )


def test_docstring_examples_run():
    result = doctest.testmod(muzero_module, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0


def test_scale_gradient():
    x = torch.randn(5, requires_grad=True)
    y = scale_gradient(x, 0.25)
    assert torch.equal(y, x)
    (y * torch.arange(5.0)).sum().backward()
    assert torch.allclose(x.grad, 0.25 * torch.arange(5.0))


def test_output_keys_shapes_and_priority():
    B, K = 5, 3
    model = make_model()
    loss = make_loss(model, consistency_loss_weight=2.0)
    batch = make_batch(B, K)
    batch["mask"][2, 0] = False
    out = loss(batch)
    assert set(out.keys()) == set(loss.out_keys)
    for key in ("loss_value", "loss_reward", "loss_policy", "loss_consistency",
                "value_prediction", "value_error", "policy_entropy"):
        assert out[key].shape == ()
    assert out["loss_value"].requires_grad and not out["priority"].requires_grad
    with torch.no_grad():
        root_value = model.value_support.decode(model.initial_inference(batch["observation"][:, 0])[2])
    expected = (root_value - batch["target_value"][:, 0]).abs()
    expected[2] = 0.0  # no value target at this root
    torch.testing.assert_close(out["priority"], expected)
    # written back into the input, broadcast over the unroll dimension
    assert batch["priority"].shape == (B, K + 1)
    torch.testing.assert_close(batch["priority"], expected[:, None].expand(B, K + 1))
    # a tensordict with batch size [B] gets a [B] priority
    flat = TensorDict(batch.exclude("priority").to_dict(), batch_size=[B])
    loss(flat)
    torch.testing.assert_close(flat["priority"], expected)
    torch.testing.assert_close(out["value_prediction"], root_value.mean())
    # initial policy of a zero-initialised head is uniform: entropy log(A)
    zero = make_loss(make_model(zero_init_heads=True))
    torch.testing.assert_close(zero(make_batch(B, K))["policy_entropy"], torch.log(torch.tensor(float(A))))


def test_consistency_off_by_default():
    loss = make_loss(make_model())
    assert loss.projector is None and loss.predictor is None
    out = loss(make_batch())
    assert "loss_consistency" not in out.keys()


@pytest.mark.parametrize("K", [1, 3])
def test_matches_reference_loop(K):
    model = make_model()
    loss = make_loss(model, value_loss_weight=0.3, reward_loss_weight=0.7, policy_loss_weight=1.5)
    batch = make_batch(B=4, K=K, seed=3, random_masks=True)
    weight = torch.tensor([0.5, 1.0, 2.0, 0.1])
    batch_w = batch.clone()
    batch_w["weight"] = weight[:, None].expand(4, K + 1)  # a [B, K+1] weight is read at column 0
    out = loss(batch_w)
    ref_v, ref_r, ref_p = reference_loss(model, batch, K, weight, 0.3, 0.7, 1.5)
    torch.testing.assert_close(out["loss_value"], ref_v)
    torch.testing.assert_close(out["loss_reward"], ref_r)
    torch.testing.assert_close(out["loss_policy"], ref_p)


def test_gradients_reach_every_part():
    model = make_model()
    loss = make_loss(model, consistency_loss_weight=2.0)
    total(loss(make_batch())).backward()
    for name, p in loss.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    names = {n for n, _ in loss.named_parameters()}
    for part in ("representation_net", "dynamics_net", "reward_head", "prediction_trunk",
                 "prediction_head", "projector", "predictor"):
        assert any(part in n for n in names), part
    # the consistency target is under stop-gradient: its loss alone trains the
    # projector's online branch only through the unrolled latents
    loss.zero_grad(set_to_none=True)
    loss(make_batch())["loss_consistency"].backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.prediction_head.parameters())
    assert model.dynamics_net[0].weight.grad.abs().sum() > 0
    # with the latent gradient cut, the consistency loss could only reach the
    # representation through its (stop-gradient) target branch
    cut = make_loss(model, consistency_loss_weight=2.0, latent_grad_scale=0.0)
    cut.load_state_dict(loss.state_dict())
    cut.zero_grad(set_to_none=True)
    cut(make_batch())["loss_consistency"].backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.representation_net.parameters())
    assert model.dynamics_net[0].weight.grad.abs().sum() > 0


def test_each_loss_term_trains_its_heads():
    model = make_model()
    loss = make_loss(model)
    out = loss(make_batch())
    out["loss_reward"].backward()
    assert model.reward_head[0].weight.grad.abs().sum() > 0
    assert model.dynamics_net[0].weight.grad.abs().sum() > 0
    assert model.representation_net[0].weight.grad.abs().sum() > 0
    assert model.prediction_head.weight.grad is None


def test_overfits_a_fixed_batch():
    torch.manual_seed(0)
    B, K = 8, 3
    model = make_model(zero_init_heads=True)
    loss = make_loss(model)
    batch = make_batch(B, K, seed=1)
    batch["target_value"] = torch.empty(B, K + 1).uniform_(-4, 4)
    batch["target_policy"] = torch.nn.functional.one_hot(torch.randint(A, (B, K + 1)), A).float()

    def floor() -> float:
        # the cross-entropies cannot go below the entropy of the two-hot targets
        def entropy(p):
            return -(p * p.clamp_min(1e-12).log()).sum(-1)

        scale = torch.tensor([1.0] + [1.0 / K] * K)
        h_value = entropy(model.value_support.encode(batch["target_value"]))
        h_reward = entropy(model.reward_support.encode(batch["target_reward"][:, 1:]))
        return float(0.25 * (h_value * scale).sum(1).mean() + (h_reward / K).sum(1).mean())

    optim = torch.optim.Adam(loss.parameters(), lr=3e-3)
    initial = total(loss(batch.clone())).item() - floor()
    for _ in range(400):
        optim.zero_grad()
        total(loss(batch.clone())).backward()
        optim.step()
    out = loss(batch.clone())
    final = total(out).item() - floor()
    print(f"excess loss {initial:.3f} -> {final:.4f}")
    assert final < initial / 20, (initial, final)
    root_value = model.value_support.decode(model.initial_inference(batch["observation"][:, 0])[2])
    assert (root_value - batch["target_value"][:, 0]).abs().max() < 0.3
    assert out["priority"].max() < 0.3


@pytest.mark.parametrize(
    "key,index",
    [
        ("target_value", (1, 2)),
        ("target_value", (0, 0)),
        ("target_reward", (2, 3)),
        ("target_reward", (3, 0)),  # index 0 is never a reward target
        ("target_policy", (1, 1)),
        ("observation", (2, 2)),  # consistency target
    ],
)
def test_masked_positions_are_excluded(key, index):
    model = make_model()
    loss = make_loss(model, consistency_loss_weight=1.0)
    batch = make_batch(seed=2)
    b, k = index
    mask_key = "policy_mask" if key == "target_policy" else "mask"
    if key != "target_reward" or k > 0:
        batch[mask_key][b, k] = False
    base_out, base_grads = loss_and_grads(loss, batch)

    changed = batch.clone()
    changed[key][b, k] = float("nan") if key != "observation" else 100.0
    out, g = loss_and_grads(loss, changed)
    for name in base_out.keys():
        torch.testing.assert_close(out[name], base_out[name], rtol=0, atol=0)
    for name in g:
        torch.testing.assert_close(g[name], base_grads[name], rtol=0, atol=0)

    if key == "target_reward" and k == 0:
        return
    unmasked = changed.clone()
    unmasked[mask_key][b, k] = True
    unmasked[key][b, k] = batch[key][b, k] + 1.0 if key != "target_policy" else torch.eye(A)[0]
    if key == "observation":
        unmasked[key][b, k] = 100.0
    out = loss(unmasked)
    term = {"target_value": "loss_value", "target_policy": "loss_policy",
            "target_reward": "loss_reward", "observation": "loss_consistency"}[key]
    assert not torch.allclose(out[term], base_out[term])


def test_importance_weights_scale_per_sample_losses():
    model = make_model()
    loss = make_loss(model, reduction="none", consistency_loss_weight=1.0)
    batch = make_batch(B=4, seed=4)
    plain = loss(batch.clone())
    weight = torch.tensor([0.0, 0.5, 1.0, 3.0])
    batch["weight"] = weight[:, None].expand(4, 4).clone()
    weighted = loss(batch.clone())
    for key in ("loss_value", "loss_reward", "loss_policy", "loss_consistency"):
        assert plain[key].shape == (4,)
        torch.testing.assert_close(weighted[key], plain[key] * weight)
    # the reductions over the batch
    mean_loss = make_loss(model, consistency_loss_weight=1.0)
    sum_loss = make_loss(model, reduction="sum", consistency_loss_weight=1.0)
    sum_loss.load_state_dict(loss.state_dict())
    mean_loss.load_state_dict(loss.state_dict())
    torch.testing.assert_close(mean_loss(batch.clone())["loss_value"], (plain["loss_value"] * weight).mean())
    torch.testing.assert_close(sum_loss(batch.clone())["loss_policy"], (plain["loss_policy"] * weight).sum())
    # a sample of weight 0 sends no gradient
    loss.zero_grad(set_to_none=True)
    only_first = batch.clone()
    only_first["weight"] = torch.tensor([[0.0], [0.0], [0.0], [1.0]])[:, :1].expand(4, 4).clone()
    total(loss(only_first)).sum().backward()
    g1 = grads(loss)
    loss.zero_grad(set_to_none=True)
    perturbed = only_first.clone()
    perturbed["target_value"][0] += 5.0
    total(loss(perturbed)).sum().backward()
    g2 = grads(loss)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name])


def test_set_keys_renames_inputs_and_priority():
    model = make_model()
    loss = make_loss(model)
    batch = make_batch()
    reference = loss(batch.clone())
    names = {
        "observation": ("obs", "pixels"),
        "action": "act",
        "target_reward": "tr",
        "target_value": "tv",
        "target_policy": "tp",
        "mask": "m",
        "policy_mask": "pm",
        "weight": "is_w",
        "priority": "td_error",
    }
    loss.set_keys(**names)
    assert loss.tensor_keys.target_value == "tv"
    assert ("obs", "pixels") in loss.in_keys and "is_w" in loss.in_keys
    renamed = TensorDict(
        {names[k] if k in names else k: v for k, v in batch.items()}, batch_size=batch.batch_size
    )
    out = loss(renamed)
    torch.testing.assert_close(out["loss_value"], reference["loss_value"])
    torch.testing.assert_close(out["loss_policy"], reference["loss_policy"])
    assert "td_error" in renamed.keys() and "priority" not in renamed.keys()
    renamed["is_w"] = torch.full((4, 4), 2.0)
    torch.testing.assert_close(loss(renamed)["loss_value"], 2 * reference["loss_value"])
    # the old names are no longer read
    with pytest.raises(ValueError, match="tv"):
        loss(batch.clone())
    with pytest.raises(ValueError, match="not an accepted tensordict key"):
        loss.set_keys(not_a_key="x")


def test_one_hot_and_trailing_singleton_inputs():
    model = make_model()
    loss = make_loss(model)
    batch = make_batch()
    reference = loss(batch.clone())
    alt = batch.clone()
    alt["action"] = torch.nn.functional.one_hot(batch["action"], A).float()
    alt["target_value"] = batch["target_value"].unsqueeze(-1)
    alt["mask"] = batch["mask"].unsqueeze(-1)
    out = loss(alt)
    for key in ("loss_value", "loss_reward", "loss_policy"):
        torch.testing.assert_close(out[key], reference[key])


@pytest.mark.parametrize("scale", [0.0, 0.5])
def test_latent_gradient_scale(scale):
    """Only position 2 of a K=2 unroll is trained: its gradient reaches the
    representation through two dynamics steps, each scaling it by ``scale``."""
    model = make_model()
    batch = make_batch(B=3, K=2, seed=5)
    batch["mask"][:, :2] = False
    batch["policy_mask"][:, :2] = False
    result = {}
    for s in (scale, 1.0):
        loss = make_loss(model, latent_grad_scale=s)
        _, result[s] = loss_and_grads(loss, batch)
    for name, g in result[1.0].items():
        if name.startswith("model.representation_net"):
            assert g.abs().sum() > 0
            torch.testing.assert_close(result[scale][name], scale**2 * g)
        elif name.startswith(("model.prediction", "model.reward_head")):
            torch.testing.assert_close(result[scale][name], g)

    # the gradient arriving at latent_0 from step 1 is scaled by `scale` exactly
    captured = {}

    def hook(module, args, output):
        output.register_hook(lambda grad: captured.__setitem__("grad", grad))

    batch1 = make_batch(B=3, K=1, seed=6)
    batch1["mask"][:, 0] = False
    batch1["policy_mask"][:, 0] = False
    handle = model.representation_net.register_forward_hook(hook)
    try:
        seen = {}
        for s in (scale, 1.0):
            loss = make_loss(model, latent_grad_scale=s)
            loss_and_grads(loss, batch1)
            seen[s] = captured.pop("grad")
    finally:
        handle.remove()
    assert seen[1.0].abs().sum() > 0
    torch.testing.assert_close(seen[scale], scale * seen[1.0])


def test_custom_projector_and_predictor_are_trained():
    model = make_model()
    projector = torch.nn.Sequential(torch.nn.Linear(16, 8))
    predictor = torch.nn.Linear(8, 8)
    loss = MuZeroLoss(model, consistency_loss_weight=2.0, projector=projector, predictor=predictor)
    assert loss.projector is projector and loss.predictor is predictor
    params = set(map(id, loss.parameters()))
    assert all(id(p) in params for p in [*projector.parameters(), *predictor.parameters()])
    out = loss(make_batch())
    assert -2.0 <= out["loss_consistency"].item() <= 2.0
    out["loss_consistency"].backward()
    assert predictor.weight.grad.abs().sum() > 0 and projector[0].weight.grad.abs().sum() > 0


def test_default_projector_does_not_touch_model_modes():
    model = make_model()
    model.train()
    model.prediction_trunk.eval()
    loss = make_loss(model, consistency_loss_weight=1.0)
    assert model.training and not model.prediction_trunk.training
    assert loss.projector[1].in_features == 16


def _bad(fn):
    def make():
        batch = make_batch()
        fn(batch)
        return batch

    return make


@pytest.mark.parametrize(
    "make,match",
    [
        (_bad(lambda b: b.del_("target_policy")), "target_policy"),
        (_bad(lambda b: b.del_("mask")), "'mask'"),
        (_bad(lambda b: b.set("target_policy", torch.full((4, 4, A + 1), 1.0 / (A + 1)))),
         "num_actions = 3"),
        (lambda: make_batch(K=0), "K\\+1 >= 2"),
        (_bad(lambda b: b["target_value"].__setitem__((1, 2), float("nan"))), "target_value"),
        (_bad(lambda b: b["target_reward"].__setitem__((1, 2), float("inf"))), "target_reward"),
        (_bad(lambda b: b["target_policy"].__setitem__((0, 1), torch.tensor([1.0, 1.0, 0.0]))),
         "sum to 1"),
        (_bad(lambda b: b["target_policy"].__setitem__((0, 1), torch.tensor([1.5, -0.5, 0.0]))),
         "negative"),
        (_bad(lambda b: b.set("weight", torch.full((4, 4), -1.0))), "weight"),
        (_bad(lambda b: b.set("action", b["action"].float())), "integer"),
        (_bad(lambda b: b["action"].__setitem__((0, 0), A)), "actions must lie in"),
        (_bad(lambda b: b.set("observation", torch.randn(4, 4, 5))), "observation"),
    ],
)
def test_bad_inputs_raise_clear_errors(make, match):
    loss = make_loss(make_model())
    with pytest.raises(ValueError, match=match):
        loss(make())


def test_bad_shapes_outside_tensordict_batch():
    loss = make_loss(make_model())
    batch = make_batch()
    plain = TensorDict(batch.to_dict(), batch_size=[4])
    plain["target_value"] = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"'target_value' must have shape \[B, K\+1\] = \[4, 4\]"):
        loss(plain)
    plain = TensorDict(batch.to_dict(), batch_size=[])
    plain["weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="'weight' must have shape"):
        loss(plain)
    plain = TensorDict(batch.to_dict(), batch_size=[])
    plain["observation"] = torch.randn(4, *OBS)
    with pytest.raises(ValueError, match=r"\[B, K\+1, 4\]"):
        loss(plain)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(value_loss_weight=-1.0), "value_loss_weight"),
        (dict(consistency_loss_weight=float("nan")), "consistency_loss_weight"),
        (dict(latent_grad_scale=1.5), "latent_grad_scale"),
        (dict(reduction="max"), "reduction"),
        (dict(projection_dim=0, consistency_loss_weight=1.0), "projection_dim"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MuZeroLoss(make_model(), **kwargs)
    with pytest.raises(ValueError, match="MuZeroModel"):
        MuZeroLoss(torch.nn.Linear(2, 2))


def test_check_inputs_off_skips_value_checks():
    loss = make_loss(make_model(), check_inputs=False)
    batch = make_batch()
    batch["target_policy"][0, 1] = torch.tensor([1.0, 1.0, 0.0])
    loss(batch)  # not normalised, but no check requested
    with pytest.raises(ValueError, match="num_actions"):
        batch["target_policy"] = torch.zeros(4, 4, A + 1)
        loss(batch)
