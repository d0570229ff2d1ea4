"""Freeze today's MuZero search results as fixtures (test/fixtures/golden_search.json).

Run once before restructuring the search; test_golden_search.py compares every
later search against them. Regenerate only for an intended change of the
MuZero rule: ``python test/make_golden_search.py``.
"""
from __future__ import annotations

import json
import os

import torch

from torchrl_muzero.mcts import MCTSConfig, search
from torchrl_muzero.modules import MuZeroMLPModel

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "fixtures", "golden_search.json")

# (name, batch, actions, simulations, root noise, two-player, action mask)
CASES = [
    ("single_4a_16s", 3, 4, 16, False, False, False),
    ("noise_6a_50s", 4, 6, 50, True, False, False),
    ("masked_5a_20s", 4, 5, 20, False, False, True),
    ("two_player_3a_24s", 3, 3, 24, False, True, False),
    ("two_player_masked_noise_9a_30s", 2, 9, 30, True, True, True),
]


def case_inputs(B, A, masked, two_player):
    g = torch.Generator().manual_seed(1234 + 7 * A + B)
    obs = torch.randn(B, 6, generator=g)
    mask = None
    if masked:
        mask = torch.rand(B, A, generator=g) > 0.4
        mask[:, 0] = True
    to_play = torch.zeros(B, dtype=torch.long) if two_player else None
    return obs, mask, to_play


def case_model(A, num_layers=2):
    torch.manual_seed(100 + A)
    return MuZeroMLPModel((6,), A, latent_dim=16, hidden_dim=32, value_support_size=10,
                          reward_support_size=10, num_layers=num_layers, zero_init_heads=False).eval()


def run_case(case, backend, num_layers=2):
    """Two hidden layers: the per-simulation loop (torch or C++ bookkeeping); one: the fused C++ search."""
    name, B, A, S, noise, two_player, masked = case
    model = case_model(A, num_layers)
    obs, mask, to_play = case_inputs(B, A, masked, two_player)
    cfg = MCTSConfig(num_simulations=S, backend=backend, temperature=1.0)
    gen = torch.Generator().manual_seed(99)
    out = search(model, obs, cfg, action_mask=mask, to_play=to_play, add_noise=noise, generator=gen)
    return {
        "visit_counts": out.visit_counts.tolist(),
        "root_value": [round(float(v), 5) for v in out.root_value],
        "action": out.action.tolist(),
    }


if __name__ == "__main__":
    golden = {case[0]: run_case(case, "torch") for case in CASES}
    golden["fused"] = {case[0]: run_case(case, "cpp", num_layers=1) for case in CASES}
    with open(PATH, "w") as f:
        json.dump(golden, f, indent=1)
    print(f"wrote {PATH}")
