"""Time LightZero 0.2.0's sampled EfficientZero C++ tree on the exported sampled case (runs in the LightZero venv).

    $TORCHRL_MUZERO_PEERS_DIR/lz/bin/python -W ignore benchmarks/peers/lightzero_sampled_search.py \
        --case /tmp/sampled_case.npz [--batches 1,8,64] [--ks 5,20] [--rounds 5]

The case is written by ``sampled_peers.py`` (``export_sampled_case``): our
``EfficientZeroMLPModel`` with a continuous action (``action_dim=D``, a
``2 * D`` tanh-normal policy head), its ``state_dict`` under ``w.*`` keys. The
network is rebuilt here in torch with the same submodules (so the same
``load_state_dict``, strict) and LightZero's sampled EfficientZero model
interface:

* ``initial_inference(obs)`` -> ``latent_state``, ``policy_logits`` = ``[mu,
  sigma]`` (our head's location and its scale ``softplus(raw) + min_scale``:
  LightZero's C++ tree reads the second half as the Gaussian's standard
  deviation), ``value`` logits, ``value_prefix`` zeros, zero LSTM state;
* ``recurrent_inference(latent, (h, c), action)`` with LightZero's action
  ``tanh(u)`` in ``[-1, 1]^D``, mapped to our env action ``low + (a + 1) / 2 *
  (high - low)`` (what our ``TanhNormalPolicy`` draws for the same ``u``),
  then our step: dynamics on ``cat(latent, action)``, min-max scaling, the
  value-prefix LSTM cell, LayerNorm head, prediction.

The search is LightZero's own driver, ``SampledEfficientZeroMCTSCtree.search``
(``ctree_sampled_efficientzero``), set up as ``sampled_efficientzero.py::
_forward_collect`` sets it up with ``continuous_action_space=True``: legal
actions ``[-1] * K`` per root, ``Roots(B, legal, D, K, True)``, per-root
``np.random.dirichlet([alpha] * K)`` noise, ``roots.prepare(...)``, ``search``,
then ``get_distributions()``, ``get_values()``, ``get_sampled_actions()``. One
timed search = all of that from the observations (``initial_inference``
included), as ours is timed (``sampled_search`` from the observations).

Modes: without ``--serve`` it times ``--rounds`` searches per ``(K, B)`` and
prints JSON lines like the other runners. With ``--serve`` it reads one JSON
command per line on stdin (``{"cmd": "time" | "warm" | "profile" | "quit",
"B": .., "K": .., "round": ..}``) and answers one JSON line each, so
``sampled_peers.py`` can alternate ours and LightZero's searches round by round.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402

pc.single_thread()
pc.pin_to_one_core()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

torch.set_num_threads(1)
IMPL = "lightzero"


class LZSampledEZMLP(nn.Module):
    """Our exported sampled EfficientZero MLP with LightZero's sampled EfficientZero model interface."""

    def __init__(self, case: dict) -> None:
        super().__init__()
        obs, L, H = int(case["obs_dim"]), int(case["latent_dim"]), int(case["hidden_dim"])
        D, KL = int(case["action_dim"]), int(case["lstm_hidden_size"])
        V, R = 2 * int(case["value_support_size"]) + 1, 2 * int(case["reward_support_size"]) + 1
        self.D, self.KL = D, KL
        self.scale_eps = float(case["scale_eps"])
        self.min_scale = float(case["min_scale"])
        self.low = torch.from_numpy(case["action_low"].astype(np.float32))  # plain tensors: not in the state_dict
        self.high = torch.from_numpy(case["action_high"].astype(np.float32))
        # the submodules of our EfficientZeroMLPModel (num_layers=1), by name: load_state_dict is strict
        self.representation_net = nn.Sequential(nn.Linear(obs, H), nn.ReLU(), nn.Linear(H, L))
        self.dynamics_net = nn.Sequential(nn.Linear(L + D, H), nn.ReLU(), nn.Linear(H, L))
        self.prediction_trunk = nn.Sequential(nn.Linear(L, H), nn.ReLU())
        self.prediction_head = nn.Linear(H, 2 * D + V)
        self.value_prefix_lstm = nn.LSTMCell(L, KL)
        self.value_prefix_head = nn.Sequential(nn.LayerNorm(KL), nn.ReLU(), nn.Linear(KL, H), nn.ReLU(),
                                               nn.Linear(H, R))
        weights = {k[2:]: torch.from_numpy(np.ascontiguousarray(v)) for k, v in case.items() if k.startswith("w.")}
        self.load_state_dict(weights, strict=True)  # every tensor of ours, nothing else

    def _scale(self, x):
        low, high = torch.aminmax(x, dim=-1, keepdim=True)
        return (x - low) / (high - low).clamp_min(self.scale_eps)

    def _predict(self, latent):
        out = self.prediction_head(self.prediction_trunk(latent))
        D = self.D
        # LightZero's tree samples N(mu, sigma) with sigma = policy_logits[D:] as it is: hand it our scale
        policy = torch.cat([out[:, :D], F.softplus(out[:, D: 2 * D]) + self.min_scale], -1)
        return policy, out[:, 2 * D:]

    def env_action(self, action):
        """LightZero's ``tanh(u)`` in ``[-1, 1]`` -> our env action in ``[low, high]``."""
        return self.low + (action.reshape(-1, self.D).float() + 1.0) / 2.0 * (self.high - self.low)

    def step(self, latent, h, c, env_action):
        nxt = self._scale(self.dynamics_net(torch.cat([latent, env_action], -1)))
        h, c = self.value_prefix_lstm(nxt, (h, c))
        prefix = self.value_prefix_head(h)
        policy, value = self._predict(nxt)
        return nxt, h, c, prefix, policy, value

    def initial_inference(self, obs):
        latent = self._scale(self.representation_net(obs))
        policy, value = self._predict(latent)
        B = obs.shape[0]
        zeros = torch.zeros(1, B, self.KL)
        return SimpleNamespace(latent_state=latent, policy_logits=policy, value=value, value_prefix=[0.0] * B,
                               reward_hidden_state=(zeros, zeros.clone()))

    def recurrent_inference(self, latent, hidden, action):
        h, c = hidden
        nxt, h, c, prefix, policy, value = self.step(latent, h[0], c[0], self.env_action(action))
        return SimpleNamespace(latent_state=nxt, reward_hidden_state=(h.unsqueeze(0), c.unsqueeze(0)),
                               value_prefix=prefix, policy_logits=policy, value=value)


def check_network(case: dict, model: LZSampledEZMLP, decode, tol: float = 1e-3) -> float:
    """Max abs difference of the rebuilt network to our exported outputs; exit 3 above ``tol``."""
    with torch.no_grad():
        out = model.initial_inference(torch.from_numpy(case["obs_B64"]))
        # the check actions go in as LightZero hands them to the model (tanh(u) in [-1, 1])
        low, high = case["action_low"], case["action_high"]
        lz_action = (case["check_actions"] - low) / (high - low) * 2.0 - 1.0
        KL = int(case["lstm_hidden_size"])
        zeros = torch.zeros(1, 64, KL)
        step = model.recurrent_inference(torch.from_numpy(case["check_latent"]), (zeros, zeros.clone()),
                                         torch.from_numpy(lz_action.astype(np.float32)))
        got = {
            "latent": out.latent_state, "policy": out.policy_logits, "value": decode(out.value),
            "next": step.latent_state, "h": step.reward_hidden_state[0][0], "c": step.reward_hidden_state[1][0],
            "prefix": decode(step.value_prefix), "next_policy": step.policy_logits, "next_value": decode(step.value),
        }
    diffs = {k: float(np.abs(v.numpy().reshape(case[f"check_{k}"].shape) - case[f"check_{k}"]).max())
             for k, v in got.items()}
    worst = max(diffs.values())
    pc.emit({"impl": IMPL, "check": "sampled_efficientzero_network", "max_abs_diff": worst, "diffs": diffs,
             "ok": worst <= tol})
    if worst > tol:
        print(f"{IMPL}: the rebuilt network differs from ours by {worst:g} > {tol:g}", file=sys.stderr)
        sys.exit(3)
    return worst


def make_runs(case: dict, model: LZSampledEZMLP):
    """``run(B, K)``: one ``_forward_collect``-style search of the case's first ``B`` observations."""
    from easydict import EasyDict
    from lzero.mcts.tree_search.mcts_ctree_sampled import SampledEfficientZeroMCTSCtree
    from lzero.policy import InverseScalarTransform

    cfg = EasyDict(dict(
        num_simulations=int(case["num_simulations"]), discount_factor=float(case["discount"]),
        pb_c_base=float(case["pb_c_base"]), pb_c_init=float(case["pb_c_init"]),
        root_dirichlet_alpha=float(case["dirichlet_alpha"]), root_noise_weight=float(case["dirichlet_fraction"]),
        value_delta_max=0.01, env_type="not_board_games", device="cpu",
        lstm_horizon_len=int(case["lstm_horizon_len"]),
        model=dict(support_scale=int(case["value_support_size"]), categorical_distribution=True,
                   continuous_action_space=True),
    ))
    mcts = SampledEfficientZeroMCTSCtree(cfg)
    decode = InverseScalarTransform(int(case["value_support_size"]), "cpu", True)
    D = int(case["action_dim"])
    obs_t = {int(B): torch.from_numpy(case[f"obs_B{B}"]) for B in case["batches"]}

    @torch.no_grad()
    def run(B: int, K: int):
        out = model.initial_inference(obs_t[B])
        _pred_values = decode(out.value).numpy()  # as _forward_collect does (it returns them)
        latent = out.latent_state.numpy()
        hidden = (out.reward_hidden_state[0].numpy(), out.reward_hidden_state[1].numpy())
        logits = out.policy_logits.numpy().tolist()
        legal = [[-1 for _ in range(K)] for _ in range(B)]  # continuous: "all legal", K slots
        roots = SampledEfficientZeroMCTSCtree.roots(B, legal, D, K, True)
        noises = [np.random.dirichlet([cfg.root_dirichlet_alpha] * K).astype(np.float32).tolist() for _ in range(B)]
        roots.prepare(cfg.root_noise_weight, noises, out.value_prefix, logits, [-1] * B)
        mcts.search(roots, model, latent, hidden, [-1] * B)
        return roots.get_distributions(), roots.get_values(), roots.get_sampled_actions()

    return run, decode


def timed(run, B: int, K: int, r: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    visits, _, actions = run(B, K)
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    visits = np.asarray(visits)
    rec = {"impl": IMPL, "variant": "sampled_efficientzero", "B": B, "K": K, "round": r, "seconds": seconds,
           "cpu_seconds": cpu_s, "searches_per_s": B / seconds, "cpu_per_wall": round(cpu_s / seconds, 3),
           "torch": torch.__version__}
    sims = int(CASE["num_simulations"])
    if visits.shape != (B, K) or int(visits.sum(-1).min()) != sims or int(visits.sum(-1).max()) != sims:
        rec["warning"] = f"root visits of shape {visits.shape}, sums {sorted(set(visits.sum(-1).tolist()))}"
    if np.asarray(actions).shape != (B, K, int(CASE["action_dim"])):
        rec["warning"] = f"root candidates of shape {np.asarray(actions).shape}"
    return rec


def profile(run, B: int, K: int, n: int, top: int) -> str:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        run(B, K)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)

    def total(name: str, file: str) -> tuple[float, float]:
        rows = [(tt, ct) for (f, _, n), (_, _, tt, ct, _) in stats.stats.items() if n == name and f.endswith(file)]
        return sum(r[0] for r in rows), sum(r[1] for r in rows)

    everything = total("run", "lightzero_sampled_search.py")[1]
    search_own, search = total("search", "mcts_ctree_sampled.py")
    parts = [
        ("the network (recurrent_inference: our step, rebuilt in torch)",
         total("recurrent_inference", "lightzero_sampled_search.py")[1]),
        ("value / value-prefix decode (InverseScalarTransform, a torch.allclose per call)",
         total("__call__", "scaling_transform.py")[1]),
        ("search()'s own time: the Cython/C++ traverse and backpropagate (not seen by cProfile) and the "
         "Python glue (gathering leaf states, tolist())", search_own),
        ("the root: initial_inference, noise, Roots + prepare (C++ expand of the roots), readouts",
         everything - search),
    ]
    lines = [buf.getvalue().rstrip(), "", f"where the time goes: {n} searches, {everything:.3f} s"]
    lines += [f"  {100 * s / max(everything, 1e-12):5.1f}%  {what}" for what, s in parts]
    return "\n".join(lines)


def serve(run) -> None:
    """One JSON command per stdin line, one JSON answer per stdout line."""
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return
        B, K = int(cmd["B"]), int(cmd["K"])
        if cmd["cmd"] == "warm":
            run(B, K)
            pc.emit({"impl": IMPL, "warm": True, "B": B, "K": K})
        elif cmd["cmd"] == "time":
            pc.emit(timed(run, B, K, int(cmd.get("round", 0))))
        elif cmd["cmd"] == "profile":
            pc.emit({"impl": IMPL, "profile": profile(run, B, K, int(cmd.get("n", 10)), int(cmd.get("top", 25))),
                     "B": B, "K": K})
        else:
            pc.emit({"impl": IMPL, "error": f"unknown command {cmd['cmd']!r}"})


CASE: dict = {}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True, help="the .npz written by sampled_peers.py")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default: the case's)")
    parser.add_argument("--ks", default="5,20", help="comma-separated sampled actions per node")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--serve", action="store_true", help="answer JSON commands on stdin (sampled_peers.py)")
    args = parser.parse_args()
    CASE.update(pc.load_case(args.case))
    model = LZSampledEZMLP(CASE).eval()
    run, decode = make_runs(CASE, model)
    check_network(CASE, model, decode)
    if args.check_only:
        return
    np.random.seed(0)  # the root noise; the C++ tree's own draws are seeded from the clock
    if args.serve:
        pc.emit({"impl": IMPL, "ready": True})
        serve(run)
        return
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [int(b) for b in CASE["batches"]]
    for K in (int(k) for k in args.ks.split(",")):
        for B in batches:
            run(B, K)
            for r in range(args.rounds):
                pc.emit(timed(run, B, K, r))


if __name__ == "__main__":
    main()
