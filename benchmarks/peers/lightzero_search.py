"""Time LightZero 0.2.0's C++ trees on the exported benchmark case (runs in the LightZero venv).

    $TORCHRL_MUZERO_PEERS_DIR/lz/bin/python benchmarks/peers/lightzero_search.py --case /tmp/torchrl_muzero_peer_case.npz

The network of ``export_case.py`` is rebuilt in torch (LightZero's own
dependency) with the interface LightZero's search drivers call:
``model.recurrent_inference(latent, action)`` returning an object with
``latent_state``, ``reward`` / ``value`` (logits, decoded by LightZero's
``InverseScalarTransform``) and ``policy_logits``. The searches are LightZero's
own drivers (``lzero.mcts.tree_search.mcts_ctree``), set up the way its
policies' ``_forward_collect`` sets them up: Dirichlet noise from
``np.random.dirichlet`` per root, ``roots.prepare(...)``, ``search(...)``,
then ``roots.get_distributions()``. One timed search = noise + roots +
search + reading the visit counts, from the exported root latents and logits.

Each variant is one small function (``VARIANTS``): ``muzero``,
``gumbel_muzero``, ``stochastic_muzero`` and ``efficientzero`` (on the
exported Stochastic and EfficientZero networks).
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402

pc.single_thread()
pc.pin_to_one_core()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

torch.set_num_threads(1)
IMPL = "lightzero"


class LZMuZeroMLP(torch.nn.Module):
    """Our exported MLP with LightZero's model interface (outputs are logits, decoded by the search)."""

    def __init__(self, case: dict) -> None:
        super().__init__()
        self.A = int(case["num_actions"])
        self.eps = float(case["scale_eps"])
        for k, v in case.items():
            if k[:4] in ("repr", "dyn_", "rew_", "pred"):
                self.register_buffer(k, torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)))

    def _scale(self, x):
        low, high = torch.aminmax(x, dim=-1, keepdim=True)
        return (x - low) / (high - low).clamp_min(self.eps)

    def _two(self, name, x):
        h = torch.relu(F.linear(x, getattr(self, f"{name}_w1"), getattr(self, f"{name}_b1")))
        return F.linear(h, getattr(self, f"{name}_w2"), getattr(self, f"{name}_b2"))

    def initial_inference(self, obs):
        latent = self._scale(self._two("repr", obs))
        out = self._two("pred", latent)
        return SimpleNamespace(latent_state=latent, policy_logits=out[:, : self.A], value=out[:, self.A:],
                               reward=torch.zeros(obs.shape[0], 1))

    def recurrent_inference(self, latent, action):
        one_hot = F.one_hot(action.reshape(-1).long(), self.A).to(latent.dtype)
        nxt = self._scale(self._two("dyn", torch.cat([latent, one_hot], -1)))
        out = self._two("pred", nxt)
        return SimpleNamespace(latent_state=nxt, reward=self._two("rew", nxt), policy_logits=out[:, : self.A],
                               value=out[:, self.A:])


class LZStochasticMLP(torch.nn.Module):
    """The exported Stochastic MuZero MLP with the interface of LightZero's ``StochasticMuZeroModel``.

    ``recurrent_inference(state, action, afterstate=False)``: from a decision
    state and an action, the afterstate (``latent_state``), zero reward,
    chance logits sigma (``policy_logits``) and Q logits (``value``);
    ``afterstate=True``: from an afterstate and a chance code, the next state,
    reward logits, policy logits and value logits.
    """

    def __init__(self, case: dict) -> None:
        super().__init__()
        self.A, self.C = int(case["num_actions"]), int(case["num_chance"])
        self.eps = float(case["scale_eps"])
        self.bins = 2 * int(case["reward_support_size"]) + 1
        for k in pc.stochastic_weight_keys(case):
            self.register_buffer(k[4:], torch.from_numpy(np.ascontiguousarray(case[k], dtype=np.float32)))

    _scale = LZMuZeroMLP._scale
    _two = LZMuZeroMLP._two

    def recurrent_inference(self, state, action, afterstate=False):
        action = action.reshape(-1).long()
        if not afterstate:  # decision node -> chance node
            aft = self._scale(self._two("as", torch.cat([state, F.one_hot(action, self.A).to(state.dtype)], -1)))
            h = torch.relu(F.linear(aft, self.astrunk_w, self.astrunk_b))
            return SimpleNamespace(latent_state=aft, reward=torch.zeros(state.shape[0], self.bins),
                                   policy_logits=F.linear(h, self.chance_w, self.chance_b),
                                   value=F.linear(h, self.asvalue_w, self.asvalue_b))
        nxt = self._scale(self._two("dyn", torch.cat([state, F.one_hot(action, self.C).to(state.dtype)], -1)))
        out = self._two("pred", nxt)
        return SimpleNamespace(latent_state=nxt, reward=self._two("rew", nxt), policy_logits=out[:, : self.A],
                               value=out[:, self.A:])


class LZEfficientZeroMLP(torch.nn.Module):
    """The exported EfficientZero MLP (``ez_*``) with LightZero's EfficientZero model interface.

    ``recurrent_inference(latent, (h, c), action)`` -> ``latent_state``,
    ``reward_hidden_state`` (``(h, c)``, each ``[1, B, K]`` as LightZero
    stores them), ``value_prefix`` / ``value`` logits and ``policy_logits``.
    """

    def __init__(self, case: dict) -> None:
        super().__init__()
        self.A = int(case["num_actions"])
        self.eps = float(case["scale_eps"])
        for k in pc.prefixed_weight_keys(case, "ez_"):
            self.register_buffer(k[3:], torch.from_numpy(np.ascontiguousarray(case[k], dtype=np.float32)))
        K = int(case["lstm_hidden_size"])
        self.lstm = torch.nn.LSTMCell(int(case["latent_dim"]), K)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(self.lstm, name).copy_(getattr(self, "lstm_" + name.replace("weight", "w").replace("bias", "b")))
        self.K = K

    _scale = LZMuZeroMLP._scale
    _two = LZMuZeroMLP._two

    def step(self, latent, h, c, action):
        nxt = self._scale(self._two("dyn", torch.cat([latent, F.one_hot(action.reshape(-1).long(), self.A)
                                                          .to(latent.dtype)], -1)))
        h, c = self.lstm(nxt, (h, c))
        x = torch.relu(F.layer_norm(h, (self.K,), self.vp_ln_w, self.vp_ln_b, 1e-5))
        prefix = F.linear(torch.relu(F.linear(x, self.vp_w1, self.vp_b1)), self.vp_w2, self.vp_b2)
        out = self._two("pred", nxt)
        return nxt, h, c, prefix, out[:, : self.A], out[:, self.A:]

    def recurrent_inference(self, latent, hidden, action):
        h, c = hidden
        nxt, h, c, prefix, policy, value = self.step(latent, h[0], c[0], action)
        return SimpleNamespace(latent_state=nxt, reward_hidden_state=(h.unsqueeze(0), c.unsqueeze(0)),
                               value_prefix=prefix, policy_logits=policy, value=value)


def _cfg(case: dict, **extra):
    from easydict import EasyDict

    return EasyDict(dict(
        num_simulations=int(case["num_simulations"]), discount_factor=float(case["discount"]),
        pb_c_base=float(case["pb_c_base"]), pb_c_init=float(case["pb_c_init"]),
        root_dirichlet_alpha=float(case["dirichlet_alpha"]), root_noise_weight=float(case["dirichlet_fraction"]),
        value_delta_max=0.01, env_type="not_board_games", device="cpu",
        model=dict(support_scale=int(case["value_support_size"]), categorical_distribution=True), **extra,
    ))


def _roots_inputs(case: dict, B: int):
    A = int(case["num_actions"])
    return ([list(range(A)) for _ in range(B)], case[f"latent_B{B}"], case[f"policy_logits_B{B}"].tolist(),
            [0.0] * B, [-1] * B)


def muzero(case: dict, model) -> callable:
    """``ctree_muzero`` through ``MuZeroMCTSCtree`` (LightZero's ``muzero.py::_forward_collect``)."""
    from lzero.mcts.tree_search.mcts_ctree import MuZeroMCTSCtree

    cfg = _cfg(case)
    mcts = MuZeroMCTSCtree(cfg)
    A = int(case["num_actions"])

    def run(B):
        legal, latent, logits, rewards, to_play = _roots_inputs(case, B)
        noises = [np.random.dirichlet([cfg.root_dirichlet_alpha] * A).astype(np.float32).tolist() for _ in range(B)]
        roots = MuZeroMCTSCtree.roots(B, legal)
        roots.prepare(cfg.root_noise_weight, noises, rewards, logits, to_play)
        mcts.search(roots, model, latent, to_play)
        return roots.get_distributions()

    return run


def gumbel_muzero(case: dict, model) -> callable:
    """``ctree_gumbel_muzero`` through ``GumbelMuZeroMCTSCtree`` (``gumbel_muzero.py::_forward_collect``).

    LightZero's Gumbel defaults: ``max_num_considered_actions`` 4 in its
    configs; here 16 like mctx's default (``min(16, A)`` = all 6 actions).
    """
    from lzero.mcts.tree_search.mcts_ctree import GumbelMuZeroMCTSCtree

    cfg = _cfg(case, max_num_considered_actions=16)
    mcts = GumbelMuZeroMCTSCtree(cfg)
    A = int(case["num_actions"])

    def run(B):
        legal, latent, logits, rewards, to_play = _roots_inputs(case, B)
        values = case[f"value_B{B}"].tolist()
        noises = [np.random.dirichlet([cfg.root_dirichlet_alpha] * A).astype(np.float32).tolist() for _ in range(B)]
        roots = GumbelMuZeroMCTSCtree.roots(B, legal)
        roots.prepare(cfg.root_noise_weight, noises, rewards, values, logits, to_play)
        mcts.search(roots, model, latent, to_play)
        return roots.get_distributions()

    return run


def stochastic_muzero(case: dict, model) -> callable:
    """``ctree_stochastic_muzero`` through ``StochasticMuZeroMCTSCtree`` (``stochastic_muzero.py::_forward_collect``).

    The exported Stochastic network (``sto_*``, C = ``num_chance`` codes).
    LightZero samples the chance code at chance nodes from sigma with an
    unseeded C++ generator (mctx and ours take ``argmax sigma / (N + 1)``).
    """
    from lzero.mcts.tree_search.mcts_ctree_stochastic import StochasticMuZeroMCTSCtree

    cfg = _cfg(case)
    mcts = StochasticMuZeroMCTSCtree(cfg)
    sto = LZStochasticMLP(case).eval()
    A, C = int(case["num_actions"]), int(case["num_chance"])

    def run(B):
        legal = [list(range(A)) for _ in range(B)]
        latent, logits = case[f"sto_latent_B{B}"], case[f"sto_policy_logits_B{B}"].tolist()
        noises = [np.random.dirichlet([cfg.root_dirichlet_alpha] * A).astype(np.float32).tolist() for _ in range(B)]
        roots = StochasticMuZeroMCTSCtree.roots(B, legal, C)
        roots.prepare(cfg.root_noise_weight, noises, [0.0] * B, logits, [-1] * B)
        mcts.search(roots, sto, latent, [-1] * B)
        return roots.get_distributions()

    return run


def efficientzero(case: dict, model) -> callable:
    """``ctree_efficientzero`` through ``EfficientZeroMCTSCtree`` (``efficientzero.py::_forward_collect``).

    The exported EfficientZero network (``ez_*``); LightZero zeroes the LSTM
    state of leaves whose search length is a multiple of ``lstm_horizon_len``.
    """
    from lzero.mcts.tree_search.mcts_ctree import EfficientZeroMCTSCtree

    cfg = _cfg(case, lstm_horizon_len=int(case["lstm_horizon_len"]))
    mcts = EfficientZeroMCTSCtree(cfg)
    ez = LZEfficientZeroMLP(case).eval()
    A, K = int(case["num_actions"]), int(case["lstm_hidden_size"])

    def run(B):
        legal = [list(range(A)) for _ in range(B)]
        latent, logits = case[f"ez_latent_B{B}"], case[f"ez_policy_logits_B{B}"].tolist()
        hidden = (np.zeros((1, B, K), dtype=np.float32), np.zeros((1, B, K), dtype=np.float32))
        noises = [np.random.dirichlet([cfg.root_dirichlet_alpha] * A).astype(np.float32).tolist() for _ in range(B)]
        roots = EfficientZeroMCTSCtree.roots(B, legal)
        roots.prepare(cfg.root_noise_weight, noises, [0.0] * B, logits, [-1] * B)
        mcts.search(roots, ez, latent, hidden, [-1] * B)
        return roots.get_distributions()

    return run


VARIANTS = {"muzero": muzero, "gumbel_muzero": gumbel_muzero, "stochastic_muzero": stochastic_muzero,
            "efficientzero": efficientzero}


def main() -> None:
    args = pc.common_args(__doc__.split("\n")[0]).parse_args()
    case = pc.load_case(args.case)
    model = LZMuZeroMLP(case).eval()
    from lzero.policy import InverseScalarTransform

    decode = InverseScalarTransform(int(case["value_support_size"]), "cpu", True)

    @torch.no_grad()
    def recurrent(latent, action):
        out = model.recurrent_inference(torch.from_numpy(latent), torch.from_numpy(action))
        return (out.latent_state.numpy(), decode(out.reward).numpy(), out.policy_logits.numpy(),
                decode(out.value).numpy())

    @torch.no_grad()
    def initial(obs):
        out = model.initial_inference(torch.from_numpy(obs))
        return out.latent_state.numpy(), out.policy_logits.numpy(), decode(out.value).numpy()

    pc.check_forward(IMPL, case, recurrent, initial)
    if "num_chance" in case:
        sto = LZStochasticMLP(case).eval()

        @torch.no_grad()
        def afterstate(latent, action):
            out = sto.recurrent_inference(torch.from_numpy(latent), torch.from_numpy(action), afterstate=False)
            return out.latent_state.numpy(), out.policy_logits.numpy(), decode(out.value).numpy()

        @torch.no_grad()
        def chance(aft, code):
            out = sto.recurrent_inference(torch.from_numpy(aft), torch.from_numpy(code), afterstate=True)
            return (out.latent_state.numpy(), decode(out.reward).numpy(), out.policy_logits.numpy(),
                    decode(out.value).numpy())

        pc.check_stochastic(IMPL, case, afterstate, chance)
    if "lstm_hidden_size" in case:
        ez = LZEfficientZeroMLP(case).eval()

        @torch.no_grad()
        def ez_step(latent, h, c, action):
            nxt, h, c, prefix, policy, value = ez.step(*(torch.from_numpy(x) for x in (latent, h, c, action)))
            return nxt.numpy(), h.numpy(), c.numpy(), decode(prefix).numpy(), policy.numpy(), decode(value).numpy()

        pc.check_efficientzero(IMPL, case, ez_step)
    if args.check_only:
        return
    np.random.seed(0)
    sims = int(case["num_simulations"])
    for name in args.variants.split(","):
        if name not in VARIANTS:
            pc.emit({"impl": IMPL, "variant": name, "skipped": "not implemented for LightZero here"})
            continue
        run = VARIANTS[name](case, model)
        visits = np.asarray(run(1))
        if int(visits.sum()) != sims:
            pc.emit({"impl": IMPL, "variant": name, "warning": f"root visits sum to {int(visits.sum())}"})
        pc.time_search(IMPL, name, run, pc.batches_of(args, case), rounds=args.rounds)


if __name__ == "__main__":
    main()
