"""Export the canonical search-benchmark case to an .npz that the peer runners read.

Run from the repository's venv:

    python benchmarks/peers/export_case.py [--out /tmp/peer_case.npz]

The case is the one of ``benchmarks/test_search_bench.py``: ``MuZeroMLPModel((8,),
6, latent_dim=64, hidden_dim=64, value_support_size=300, reward_support_size=300,
zero_init_heads=False)`` built after ``torch.manual_seed(0)``, 50 simulations,
6 actions. Every implementation (ours, LightZero's C++ trees, mctx) rebuilds this
network from the file and searches from the same root latents, so the trees
they grow have the same shape.

Layout (all float32 unless said; weights in torch's ``nn.Linear`` convention,
``y = x @ W.T + b``, ``W`` of shape ``[out, in]``):

* network, one hidden layer each (ReLU between the two layers):
  ``repr_w1 [H, 8]  repr_b1 [H]  repr_w2 [L, H]  repr_b2 [L]``  representation, then min-max ``scale_latent``;
  ``dyn_w1 [H, L + A]  dyn_b1  dyn_w2 [L, H]  dyn_b2``  dynamics on ``cat(latent, one_hot(action))``, then ``scale_latent``;
  ``rew_w1 [H, L]  rew_b1  rew_w2 [R, H]  rew_b2``  reward head on the *next* latent (``R = 2 * 300 + 1`` bins);
  ``pred_w1 [H, L]  pred_b1  pred_w2 [A + V, H]  pred_b2``  prediction: the first ``A`` outputs are the policy
  logits, the other ``V = 601`` the value logits.
  ``scale_latent(x) = (x - min(x)) / max(max(x) - min(x), 1e-5)`` per row.
  A scalar is decoded from logits as ``h^-1(softmax(logits) @ bins)``, ``bins = -300..300``,
  ``h^-1(y) = sign(y) * (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)``, ``eps = 0.001``.
* scalars (0-d arrays): ``num_actions``, ``latent_dim``, ``hidden_dim``, ``obs_dim``, ``value_support_size``,
  ``reward_support_size`` (int64); ``epsilon``, ``scale_eps`` (1e-5), ``num_simulations`` (int64),
  ``discount``, ``pb_c_base``, ``pb_c_init``, ``dirichlet_alpha``, ``dirichlet_fraction`` (float64), the
  settings of ``MCTSConfig()`` that the benchmark uses.
* ``batches`` (int64): 1, 8, 64, 256; for each ``B``: ``obs_B{B} [B, 8]`` (standard normal, seed 0),
  ``latent_B{B} [B, L]``, ``policy_logits_B{B} [B, A]``, ``value_B{B} [B]`` (decoded root value): our
  ``initial_inference`` of those observations. The smaller batches are the first rows of ``obs_B256``.
* reference outputs to check a re-implementation: ``check_actions [256]`` (int64), then two recurrent steps
  from ``latent_B256`` with those actions: ``check_latent1 [256, L]``, ``check_reward1``, ``check_policy1``,
  ``check_value1``, and ``check_latent2`` ... ``check_value2`` (second step with ``(check_actions + 1) % A``).
* Stochastic MuZero (keys prefixed ``sto_``): ``StochasticMuZeroMLPModel((8,), 6, chance_space_size=32,
  latent_dim=64, hidden_dim=64, value_support_size=300, reward_support_size=300, zero_init_heads=False)``
  built after ``torch.manual_seed(0)`` (``num_chance`` = C = 32, 2048's 16 cells x 2 tiles):
  ``sto_repr_*``, ``sto_pred_*`` as above; afterstate dynamics ``sto_as_w1 [H, L + A] .. sto_as_b2`` on
  ``cat(latent, one_hot(action))`` then ``scale_latent``; afterstate prediction: trunk ``sto_astrunk_w [H, L]``,
  ``sto_astrunk_b`` (ReLU), then ``sto_chance_w [C, H]`` / ``sto_chance_b`` (chance logits sigma) and
  ``sto_asvalue_w [V, H]`` / ``sto_asvalue_b`` (Q logits); chance dynamics ``sto_dyn_w1 [H, L + C] .. sto_dyn_b2``
  on ``cat(afterstate, one_hot(code))`` then ``scale_latent``; reward head ``sto_rew_*`` on the next latent.
  Edges: decision -> chance reward 0, discount 1; chance -> decision the reward head's reward, ``discount``.
  Roots ``sto_latent_B{B}``, ``sto_policy_logits_B{B}`` (``[B, A]``), ``sto_value_B{B}``; checks from
  ``sto_latent_B256`` with ``check_actions``: ``sto_check_afterstate``, ``sto_check_chance_logits``,
  ``sto_check_q`` (decoded), then codes ``sto_check_codes [256]``: ``sto_check_next``, ``sto_check_reward``,
  ``sto_check_policy``, ``sto_check_value``.
* EfficientZero (keys prefixed ``ez_``): ``EfficientZeroMLPModel((8,), 6, latent_dim=64, hidden_dim=64,
  value_support_size=300, reward_support_size=300, zero_init_heads=False, lstm_hidden_size=64,
  lstm_horizon_len=5)`` built after ``torch.manual_seed(0)``: ``ez_repr_*``, ``ez_dyn_*`` (the transition, no
  reward), ``ez_pred_*`` as above; the value-prefix LSTM cell on the next latent ``ez_lstm_w_ih [4K, L]``,
  ``ez_lstm_w_hh [4K, K]``, ``ez_lstm_b_ih``, ``ez_lstm_b_hh`` (torch ``LSTMCell``, gates i, f, g, o; K =
  ``lstm_hidden_size``), then the head on ``h``: LayerNorm ``ez_vp_ln_w``, ``ez_vp_ln_b`` (eps 1e-5), ReLU,
  ``ez_vp_w1 [H, K]``, ``ez_vp_b1``, ReLU, ``ez_vp_w2 [R, H]``, ``ez_vp_b2``: value-prefix logits.
  ``lstm_hidden_size``, ``lstm_horizon_len`` (int64). Roots ``ez_latent_B{B}``, ``ez_policy_logits_B{B}``,
  ``ez_value_B{B}`` (LSTM state zeros, prefix 0); checks from ``ez_latent_B256``, zero ``(h, c)`` and
  ``check_actions``: ``ez_check_next``, ``ez_check_h``, ``ez_check_c``, ``ez_check_prefix`` (decoded),
  ``ez_check_policy``, ``ez_check_value``.
* ``torch_version``, ``layout_version`` (1) for the record.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.modules import MuZeroMLPModel

SIMS, ACTIONS, OBS_DIM = 50, 6, 8
BATCHES = (1, 8, 64, 256)
DEFAULT_OUT = Path("/tmp/torchrl_muzero_peer_case.npz")


def canonical_model() -> MuZeroMLPModel:
    """The model of ``benchmarks/test_search_bench.py`` (same seed, same constructor)."""
    torch.manual_seed(0)
    return MuZeroMLPModel((OBS_DIM,), ACTIONS, latent_dim=64, hidden_dim=64, value_support_size=300,
                          reward_support_size=300, zero_init_heads=False).eval()


def canonical_stochastic_model(chance_space_size: int = 32):
    """The Stochastic MuZero counterpart: same sizes, ``C`` chance codes (32 = 2048's spawns)."""
    from torchrl_muzero.modules import StochasticMuZeroMLPModel

    torch.manual_seed(0)
    return StochasticMuZeroMLPModel((OBS_DIM,), ACTIONS, chance_space_size=chance_space_size, latent_dim=64,
                                    hidden_dim=64, value_support_size=300, reward_support_size=300,
                                    zero_init_heads=False).eval()


def canonical_efficientzero_model():
    """The EfficientZero counterpart: same sizes, a 64-unit value-prefix LSTM reset every 5 steps."""
    from torchrl_muzero.modules import EfficientZeroMLPModel

    torch.manual_seed(0)
    return EfficientZeroMLPModel((OBS_DIM,), ACTIONS, latent_dim=64, hidden_dim=64, value_support_size=300,
                                 reward_support_size=300, zero_init_heads=False, lstm_hidden_size=64,
                                 lstm_horizon_len=5).eval()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


@torch.no_grad()
def build_case(model: MuZeroMLPModel | None = None) -> dict[str, np.ndarray]:
    model = canonical_model() if model is None else model
    if len(model.representation_net) != 3 or len(model.dynamics_net) != 3 or len(model.reward_head) != 3:
        raise ValueError("the exported layout is for one hidden layer per network (num_layers=1).")
    cfg = MCTSConfig(num_simulations=SIMS)
    rep1, _, rep2 = model.representation_net
    dyn1, _, dyn2 = model.dynamics_net
    rew1, _, rew2 = model.reward_head
    pred1 = model.prediction_trunk[0]
    case: dict[str, np.ndarray] = {
        "repr_w1": _np(rep1.weight), "repr_b1": _np(rep1.bias), "repr_w2": _np(rep2.weight), "repr_b2": _np(rep2.bias),
        "dyn_w1": _np(dyn1.weight), "dyn_b1": _np(dyn1.bias), "dyn_w2": _np(dyn2.weight), "dyn_b2": _np(dyn2.bias),
        "rew_w1": _np(rew1.weight), "rew_b1": _np(rew1.bias), "rew_w2": _np(rew2.weight), "rew_b2": _np(rew2.bias),
        "pred_w1": _np(pred1.weight), "pred_b1": _np(pred1.bias),
        "pred_w2": _np(model.prediction_head.weight), "pred_b2": _np(model.prediction_head.bias),
        "num_actions": np.int64(model.num_actions), "latent_dim": np.int64(model.latent_dim),
        "hidden_dim": np.int64(rep1.out_features), "obs_dim": np.int64(OBS_DIM),
        "value_support_size": np.int64(model.value_support.support_size),
        "reward_support_size": np.int64(model.reward_support.support_size),
        "epsilon": np.float64(model.value_support.epsilon), "scale_eps": np.float64(1e-5),
        "num_simulations": np.int64(cfg.num_simulations), "discount": np.float64(cfg.discount),
        "pb_c_base": np.float64(cfg.pb_c_base), "pb_c_init": np.float64(cfg.pb_c_init),
        "dirichlet_alpha": np.float64(cfg.dirichlet_alpha), "dirichlet_fraction": np.float64(cfg.dirichlet_fraction),
        "batches": np.array(BATCHES, dtype=np.int64),
        "torch_version": np.array(torch.__version__), "layout_version": np.int64(1),
    }
    if model.reward_support.epsilon != model.value_support.epsilon:
        raise ValueError("the exported layout has one epsilon for both supports.")
    obs = torch.randn(max(BATCHES), OBS_DIM, generator=torch.Generator().manual_seed(0))
    latent, logits, value_logits = model.initial_inference(obs)
    value = model.value_support.decode(value_logits)
    for B in BATCHES:
        case[f"obs_B{B}"] = _np(obs[:B])
        case[f"latent_B{B}"] = _np(latent[:B])
        case[f"policy_logits_B{B}"] = _np(logits[:B])
        case[f"value_B{B}"] = _np(value[:B])
    actions = torch.randint(ACTIONS, (max(BATCHES),), generator=torch.Generator().manual_seed(1))
    case["check_actions"] = _np(actions)
    state = latent
    for step, a in ((1, actions), (2, (actions + 1) % ACTIONS)):
        state, reward, policy, value = model.recurrent_inference_scalar(state, a)
        case[f"check_latent{step}"], case[f"check_reward{step}"] = _np(state), _np(reward)
        case[f"check_policy{step}"], case[f"check_value{step}"] = _np(policy), _np(value)
    try:
        case.update(build_stochastic_case(case["obs_B256"], actions))
    except ImportError:  # a checkout without the Stochastic MuZero model: MuZero / Gumbel cases only
        pass
    try:
        case.update(build_efficientzero_case(case["obs_B256"], actions))
    except ImportError:
        pass
    return case


@torch.no_grad()
def build_efficientzero_case(obs: np.ndarray, actions: torch.Tensor, model=None) -> dict[str, np.ndarray]:
    model = canonical_efficientzero_model() if model is None else model
    case: dict[str, np.ndarray] = {"lstm_hidden_size": np.int64(model.lstm_hidden_size),
                                   "lstm_horizon_len": np.int64(model.lstm_horizon_len)}
    for name, net in (("repr", model.representation_net), ("dyn", model.dynamics_net)):
        if len(net) != 3:
            raise ValueError("the exported layout is for one hidden layer per network (num_layers=1).")
        first, _, last = net
        case.update({f"ez_{name}_w1": _np(first.weight), f"ez_{name}_b1": _np(first.bias),
                     f"ez_{name}_w2": _np(last.weight), f"ez_{name}_b2": _np(last.bias)})
    p1 = model.prediction_trunk[0]
    lstm = model.value_prefix_lstm
    head = model.value_prefix_head
    if len(head) != 5:
        raise ValueError("the exported layout is for a value-prefix head of one hidden layer (num_layers=1).")
    ln, _, l1, _, l2 = head
    case.update({
        "ez_pred_w1": _np(p1.weight), "ez_pred_b1": _np(p1.bias),
        "ez_pred_w2": _np(model.prediction_head.weight), "ez_pred_b2": _np(model.prediction_head.bias),
        "ez_lstm_w_ih": _np(lstm.weight_ih), "ez_lstm_w_hh": _np(lstm.weight_hh),
        "ez_lstm_b_ih": _np(lstm.bias_ih), "ez_lstm_b_hh": _np(lstm.bias_hh),
        "ez_vp_ln_w": _np(ln.weight), "ez_vp_ln_b": _np(ln.bias),
        "ez_vp_w1": _np(l1.weight), "ez_vp_b1": _np(l1.bias), "ez_vp_w2": _np(l2.weight), "ez_vp_b2": _np(l2.bias),
    })
    latent, logits, value_logits = model.initial_inference(torch.from_numpy(obs))
    value = model.value_support.decode(value_logits)
    for B in BATCHES:
        case[f"ez_latent_B{B}"], case[f"ez_policy_logits_B{B}"] = _np(latent[:B]), _np(logits[:B])
        case[f"ez_value_B{B}"] = _np(value[:B])
    nxt, (h, c), prefix_logits, policy, value_logits = model.recurrent_inference_prefix(
        latent, model.initial_lstm_state(latent.shape[0]), actions)
    prefix, value = model.decode_reward_and_value(prefix_logits, value_logits)
    case.update({"ez_check_next": _np(nxt), "ez_check_h": _np(h), "ez_check_c": _np(c),
                 "ez_check_prefix": _np(prefix), "ez_check_policy": _np(policy), "ez_check_value": _np(value)})
    return case


@torch.no_grad()
def build_stochastic_case(obs: np.ndarray, actions: torch.Tensor, model=None) -> dict[str, np.ndarray]:
    model = canonical_stochastic_model() if model is None else model
    layers = {"repr": model.representation_net, "as": model.afterstate_net, "dyn": model.dynamics_net,
              "rew": model.reward_head}
    case: dict[str, np.ndarray] = {"num_chance": np.int64(model.chance_space_size)}
    for name, net in layers.items():
        if len(net) != 3:
            raise ValueError("the exported layout is for one hidden layer per network (num_layers=1).")
        first, _, last = net
        case.update({f"sto_{name}_w1": _np(first.weight), f"sto_{name}_b1": _np(first.bias),
                     f"sto_{name}_w2": _np(last.weight), f"sto_{name}_b2": _np(last.bias)})
    p1, t1 = model.prediction_trunk[0], model.afterstate_trunk[0]
    case.update({
        "sto_pred_w1": _np(p1.weight), "sto_pred_b1": _np(p1.bias),
        "sto_pred_w2": _np(model.prediction_head.weight), "sto_pred_b2": _np(model.prediction_head.bias),
        "sto_astrunk_w": _np(t1.weight), "sto_astrunk_b": _np(t1.bias),
        "sto_chance_w": _np(model.chance_head.weight), "sto_chance_b": _np(model.chance_head.bias),
        "sto_asvalue_w": _np(model.afterstate_value_head.weight), "sto_asvalue_b": _np(model.afterstate_value_head.bias),
    })
    latent, logits, value_logits = model.initial_inference(torch.from_numpy(obs))
    value = model.decode_value(value_logits)
    for B in BATCHES:
        case[f"sto_latent_B{B}"], case[f"sto_policy_logits_B{B}"] = _np(latent[:B]), _np(logits[:B])
        case[f"sto_value_B{B}"] = _np(value[:B])
    afterstate, chance_logits, q_logits = model.afterstate_inference(latent, actions)
    codes = torch.randint(model.chance_space_size, (latent.shape[0],), generator=torch.Generator().manual_seed(2))
    one_hot = torch.nn.functional.one_hot(codes, model.chance_space_size).float()
    nxt, reward_logits, policy, value_logits = model.chance_inference(afterstate, one_hot)
    reward, value = model.decode_reward_and_value(reward_logits, value_logits)
    case.update({
        "sto_check_afterstate": _np(afterstate), "sto_check_chance_logits": _np(chance_logits),
        "sto_check_q": _np(model.decode_value(q_logits)), "sto_check_codes": _np(codes),
        "sto_check_next": _np(nxt), "sto_check_reward": _np(reward), "sto_check_policy": _np(policy),
        "sto_check_value": _np(value),
    })
    return case


def export(out: Path = DEFAULT_OUT) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **build_case())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    print(export(args.out))


if __name__ == "__main__":
    main()
