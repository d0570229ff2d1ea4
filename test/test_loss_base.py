"""Tests of the unrolled-loss base class and MuZeroLoss's frozen numbers.

``test/fixtures/muzero_loss_golden.pt`` holds MuZeroLoss outputs and parameter
gradients on fixed seeded batches, computed by the implementation before it was
split into ``UnrolledModelLoss`` + ``MuZeroLoss``. The restructured loss must
reproduce them bit for bit (on one thread, as test/conftest.py sets).

torch's CPU kernels differ in their last bits between vector widths, so the file
keeps one set of numbers per ATen CPU capability (``AVX2``: the original, made
before the split; ``AVX512``: the same code's numbers on an AVX-512 machine, frozen
after checking that the code still gave the AVX2 numbers bit for bit under
``ATEN_CPU_CAPABILITY=avx2``). A CPU whose capability has no entry is compared
with the AVX2 numbers within float tolerance, and every capability's numbers must
stay that close to the AVX2 ones. Regenerate only for an intended change of the
MuZero loss: ``python test/test_loss_base.py`` (once per capability, e.g. with
``ATEN_CPU_CAPABILITY=avx2`` and again without it on an AVX-512 machine).
"""
from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.objectives import LossTerm, MuZeroLoss, UnrolledModelLoss

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "fixtures", "muzero_loss_golden.pt")
OBS, A = (4,), 3

CASES = {
    "default": dict(K=3, loss={}, batch={}),
    "weights_masks": dict(
        K=3,
        loss=dict(value_loss_weight=0.3, reward_loss_weight=0.7, policy_loss_weight=1.5),
        batch=dict(random_masks=True, weight=True),
    ),
    "consistency": dict(
        K=4,
        loss=dict(consistency_loss_weight=2.0, projection_dim=16, projection_hidden_dim=16,
                  prediction_hidden_dim=8),
        batch=dict(random_masks=True, weight=True),
    ),
    "none_reduction_k1": dict(K=1, loss=dict(reduction="none", latent_grad_scale=0.25), batch={}),
    "sum_k5_onehot": dict(K=5, loss=dict(reduction="sum"), batch=dict(one_hot=True, random_masks=True)),
}


def build_case(name: str, **loss_kwargs) -> tuple[MuZeroLoss, TensorDict]:
    """The seeded model, loss and batch of one golden case."""
    case = CASES[name]
    K = case["K"]
    torch.manual_seed(0)
    model = MuZeroMLPModel(OBS, A, latent_dim=16, hidden_dim=32, value_support_size=5,
                           reward_support_size=5, zero_init_heads=False)
    loss = MuZeroLoss(model, **case["loss"], **loss_kwargs)
    g = torch.Generator().manual_seed(7)
    B = 6
    opts = case["batch"]
    if opts.get("random_masks"):
        mask = torch.rand(B, K + 1, generator=g) < 0.7
        policy_mask = torch.rand(B, K + 1, generator=g) < 0.7
        mask[:, 0] = True
    else:
        mask = torch.ones(B, K + 1, dtype=torch.bool)
        policy_mask = torch.ones(B, K + 1, dtype=torch.bool)
    batch = TensorDict(
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
    if opts.get("weight"):
        batch["weight"] = torch.rand(B, generator=g)[:, None].expand(B, K + 1).clone()
    if opts.get("one_hot"):
        batch["action"] = torch.nn.functional.one_hot(batch["action"], A).float()
    return loss, batch


def run_case(name: str, **loss_kwargs) -> dict[str, torch.Tensor]:
    """Loss outputs, the written priority and every parameter gradient of one case."""
    loss, batch = build_case(name, **loss_kwargs)
    out = loss(batch)
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    total.sum().backward()
    result = {f"out/{k}": v.detach().clone() for k, v in out.items()}
    result["out/written_priority"] = batch["priority"].clone()
    for n, p in loss.named_parameters():
        result[f"grad/{n}"] = p.grad.clone()
    return result


def _goldens() -> dict[str, dict]:
    """``{capability: {case: {key: tensor}}}``."""
    return torch.load(GOLDEN)["by_capability"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_muzero_loss_matches_golden_bit_for_bit(name):
    goldens = _goldens()
    capability = torch.backends.cpu.get_cpu_capability()
    exact = capability in goldens
    golden = goldens[capability if exact else "AVX2"][name]
    now = run_case(name)
    assert sorted(now) == sorted(golden)
    for key, expected in golden.items():
        assert now[key].dtype == expected.dtype and now[key].shape == expected.shape, key
        if exact:
            assert torch.equal(now[key], expected), (capability, key, now[key], expected)
        else:  # no frozen numbers for this vector width: the AVX2 ones up to the last bits
            torch.testing.assert_close(now[key], expected, rtol=1e-5, atol=1e-6, msg=f"{capability}: {key}")


def test_the_goldens_of_every_cpu_capability_agree_up_to_the_last_bits():
    goldens = _goldens()
    assert "AVX2" in goldens
    for capability, cases in goldens.items():
        assert sorted(cases) == sorted(CASES), capability
        for name, values in cases.items():
            for key, value in values.items():
                torch.testing.assert_close(value, goldens["AVX2"][name][key], rtol=1e-5, atol=1e-6,
                                           msg=f"{capability}/{name}: {key}")



def test_policy_loss_kl_is_cross_entropy_minus_target_entropy_with_the_same_gradient():
    results = {}
    for kind in ("cross_entropy", "kl"):
        loss, batch = build_case("weights_masks", policy_loss=kind, reduction="none")
        out = loss(batch)
        out["loss_policy"].sum().backward()
        results[kind] = (out, {n: p.grad for n, p in loss.named_parameters() if p.grad is not None}, batch)
    (ce, ce_grads, batch), (kl, kl_grads, _) = results["cross_entropy"], results["kl"]
    target = batch["target_policy"] * batch["policy_mask"][..., None]
    entropy = -torch.xlogy(target, target).sum(-1)  # [B, K+1]
    K = batch.shape[1] - 1
    scale = torch.tensor([1.0] + [1.0 / K] * K)
    weight = batch["weight"][:, 0]
    expected = ce["loss_policy"] - 1.5 * weight * (entropy * scale).sum(1)
    torch.testing.assert_close(kl["loss_policy"], expected)
    assert (kl["loss_policy"] >= -1e-6).all()
    for key in ("loss_value", "loss_reward"):
        assert torch.equal(kl[key], ce[key])
    for name in ce_grads:
        torch.testing.assert_close(kl_grads[name], ce_grads[name])


def test_policy_loss_kl_is_zero_at_a_perfect_fit():
    torch.manual_seed(0)
    model = MuZeroMLPModel(OBS, A, latent_dim=8, hidden_dim=8, zero_init_heads=True)  # uniform policy
    _, batch = build_case("default")
    batch["target_policy"] = torch.full_like(batch["target_policy"], 1.0 / A)
    out = MuZeroLoss(model, policy_loss="kl")(batch)
    assert abs(out["loss_policy"].item()) < 1e-6
    ce = MuZeroLoss(model)(batch)["loss_policy"]
    torch.testing.assert_close(ce, torch.log(torch.tensor(float(A))) * 2.0)  # root 1 + K * 1/K


class _LatentNormLoss(MuZeroLoss):
    """A toy variant: MuZero plus a mean-square penalty on the unrolled latents."""

    def __init__(self, model, latent_loss_weight=0.5, **kwargs):
        super().__init__(model, **kwargs)
        self.latent_loss_weight = latent_loss_weight

    def term_names(self):
        return super().term_names() + ["latent"]

    def _step_terms(self, inputs, unrolled):
        terms = super()._step_terms(inputs, unrolled)
        values = torch.stack(unrolled["latents"], 1).pow(2).mean(-1)  # [B, K]
        terms["latent"] = LossTerm(values, inputs["mask"][:, 1:])
        return terms


def test_a_variant_adds_a_term_and_the_base_scales_weights_and_reduces_it():
    loss, batch = build_case("weights_masks")
    plain = loss(batch.clone())
    variant = _LatentNormLoss(loss.model, latent_loss_weight=0.5, value_loss_weight=0.3,
                              reward_loss_weight=0.7, policy_loss_weight=1.5)
    assert variant.out_keys[:4] == ["loss_value", "loss_reward", "loss_policy", "loss_latent"]
    out = variant(batch.clone())
    assert set(out.keys()) == set(variant.out_keys)
    for key in plain.keys():
        assert torch.equal(out[key], plain[key]), key
    with torch.no_grad():
        latent, K = loss.model.initial_inference(batch["observation"][:, 0])[0], batch.shape[1] - 1
        values = []
        for k in range(K):
            latent = loss.model.recurrent_inference(latent, batch["action"][:, k])[0]
            values.append(latent.pow(2).mean(-1))
        per_sample = (torch.stack(values, 1) * batch["mask"][:, 1:]).sum(1) / K
    expected = 0.5 * (per_sample * batch["weight"][:, 0]).mean()
    torch.testing.assert_close(out["loss_latent"], expected)


def test_terms_must_match_term_names():
    class Broken(MuZeroLoss):
        def term_names(self):
            return ["value", "policy"]

    loss, batch = build_case("default")
    broken = Broken(loss.model)
    with pytest.raises(RuntimeError, match="term_names"):
        broken(batch)


def test_each_variant_keeps_its_own_accepted_keys():
    base_fields = set(UnrolledModelLoss._AcceptedKeys.__dataclass_fields__)
    muzero_fields = set(MuZeroLoss._AcceptedKeys.__dataclass_fields__)
    assert muzero_fields == base_fields | {"target_reward"}
    loss, batch = build_case("default")
    loss.set_keys(target_reward="r")
    assert loss.tensor_keys.target_reward == "r" and "r" in loss.in_keys
    assert UnrolledModelLoss._AcceptedKeys().target_value == "target_value"
    with pytest.raises(ValueError, match="'r'"):
        loss(batch)


@pytest.mark.parametrize("kwargs,match", [(dict(policy_loss="mse"), "policy_loss"),
                                          (dict(reward_loss_weight=-1.0), "reward_loss_weight")])
def test_bad_base_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_case("default", **kwargs)

if __name__ == "__main__":
    torch.set_num_threads(1)  # as in test/conftest.py: the summation order depends on it
    goldens = _goldens() if os.path.exists(GOLDEN) else {}
    capability = torch.backends.cpu.get_cpu_capability()
    goldens[capability] = {name: run_case(name) for name in CASES}
    torch.save({"by_capability": goldens}, GOLDEN)
    print(f"wrote {GOLDEN} ({capability}; it holds {sorted(goldens)})")
