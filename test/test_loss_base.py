"""Tests of the unrolled-loss base class and MuZeroLoss's frozen numbers.

``test/fixtures/muzero_loss_golden.pt`` holds MuZeroLoss outputs and parameter
gradients on fixed seeded batches, computed by the implementation before it was
split into ``UnrolledModelLoss`` + ``MuZeroLoss``. The restructured loss must
reproduce them bit for bit (on one thread, as test/conftest.py sets; the CPU's
vector width can change the last bits elsewhere). Regenerate only for an intended change of the
MuZero loss: ``python test/test_loss_base.py``.
"""
from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.objectives import MuZeroLoss

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_muzero_loss_matches_golden_bit_for_bit(name):
    golden = torch.load(GOLDEN)[name]
    now = run_case(name)
    assert sorted(now) == sorted(golden)
    for key, expected in golden.items():
        assert now[key].dtype == expected.dtype and now[key].shape == expected.shape, key
        assert torch.equal(now[key], expected), (key, now[key], expected)


if __name__ == "__main__":
    torch.set_num_threads(1)  # as in test/conftest.py: the summation order depends on it
    torch.save({name: run_case(name) for name in CASES}, GOLDEN)
    print(f"wrote {GOLDEN}")
