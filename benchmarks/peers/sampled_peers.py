"""Sampled search side by side: ours against LightZero 0.2.0's sampled EfficientZero C++ tree, same network.

Run from the repository's venv (LightZero in its own venv, see DEVELOPERS.md):

    OMP_NUM_THREADS=1 python benchmarks/peers/sampled_peers.py [--batches 1,8,64] [--ks 5,20] [--rounds 5]
                                                                [--profile] [--json-out results.jsonl]

The case: a 1-D continuous action (Pendulum: observation 3, action in
``[-2, 2]``), 50 simulations, ``K`` actions sampled per node. The network is
our ``EfficientZeroMLPModel((3,), 2, action_dim=1)`` (a tanh-normal policy
head of 2 outputs) with the widths of LightZero's Pendulum sampled
EfficientZero MLP config (``latent_state_dim=128``, ``lstm_hidden_size=128``,
256-unit heads, 601-bin supports): ``latent_dim=128, hidden_dim=256,
lstm_hidden_size=128, value/reward_support_size=300``, random weights after
``torch.manual_seed(0)`` (``zero_init_heads=False``). Both sides search the
same weights from the same observations ``obs_B{B}`` (``[cos th, sin th,
th_dot]`` of random Pendulum states).

Ours, in this process: ``sampled_search(SampledModel(base, BoxActionSpace(-2,
2, (1,)), SampledProposal(num_samples=K)), obs, MCTSConfig(num_simulations=50,
backend=...))`` then ``root_candidates``; ``ours-auto`` is the default
(the fused sampled search: the network, the K draws per node and the tree in
one C++ call, ``csrc/sampled_search.cpp``), ``ours-cpp-loop`` the C++ tree
bookkeeping with the torch model called per simulation (the fused spec
switched off: what ``auto`` ran before the fused kernel), ``ours-torch`` the
tree in tensor ops.
LightZero: ``lightzero_sampled_search.py --serve`` in its venv
(``$TORCHRL_MUZERO_LZ_PYTHON``, default ``$TORCHRL_MUZERO_PEERS_DIR/lz/bin/python``,
the folder defaulting to ``torchrl_muzero_peers`` under the temp folder), which
rebuilds the network from the exported ``state_dict`` (checked against our
outputs: exit 3 above 1e-3) and runs ``SampledEfficientZeroMCTSCtree`` as its
``_forward_collect`` does. One search = one root, from the observation
(representation included) to the root's visit counts and candidates.

The two processes alternate search by search (``(K, B)`` by ``(K, B)``, each
round ours then LightZero's), pinned to the same core with one thread
(``peer_common.single_thread`` / ``pin_to_one_core``), so that both see the
same load. The table is the median of the rounds (wall clock, and per
CPU-second of the searching process). ``--profile`` adds a cProfile of our
B = 8, K = 20 search (and LightZero's) and a breakdown of our simulation loop.
"""
from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import math
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_common as pc  # noqa: E402

pc.single_thread()

import numpy as np  # noqa: E402
import torch  # noqa: E402

PEERS_DIR = os.environ.get("TORCHRL_MUZERO_PEERS_DIR", os.path.join(tempfile.gettempdir(), "torchrl_muzero_peers"))
LZ_PYTHON = os.environ.get("TORCHRL_MUZERO_LZ_PYTHON", os.path.join(PEERS_DIR, "lz", "bin", "python"))
LZ_PROBE = "from lzero.mcts.ctree.ctree_sampled_efficientzero import ezs_tree"
BATCHES = (1, 8, 64)
OBS_DIM, ACTION_LOW, ACTION_HIGH = 3, -2.0, 2.0
#: LightZero 0.2.0's Pendulum sampled EfficientZero MLP widths (lzero/agent/config/sampled_efficientzero/
#: gym_pendulum_v1.py: latent_state_dim=128, lstm_hidden_size=128; the model's 256-unit heads, 601-bin supports)
SIZES = dict(latent_dim=128, hidden_dim=256, lstm_hidden_size=128, support=300)


# -- the case -------------------------------------------------------------------------------------
def build_base(latent_dim: int, hidden_dim: int, lstm_hidden_size: int, support: int):
    from torchrl_muzero.modules import EfficientZeroMLPModel

    torch.manual_seed(0)
    return EfficientZeroMLPModel((OBS_DIM,), 2, latent_dim=latent_dim, hidden_dim=hidden_dim,
                                 value_support_size=support, reward_support_size=support, zero_init_heads=False,
                                 lstm_hidden_size=lstm_hidden_size, lstm_horizon_len=5, action_dim=1).eval()


def sampled_model(base, K: int):
    from torchrl_muzero.envs.action_spaces import BoxActionSpace
    from torchrl_muzero.modules.sampled import SampledModel
    from torchrl_muzero.modules.sampled_proposal import SampledProposal

    return SampledModel(base, BoxActionSpace(ACTION_LOW, ACTION_HIGH, (1,)), SampledProposal(num_samples=K)).eval()


def pendulum_observations(n: int, seed: int = 0) -> np.ndarray:
    """``[cos th, sin th, th_dot]`` of ``n`` random Pendulum states (th in [-pi, pi], th_dot in [-8, 8])."""
    rng = np.random.default_rng(seed)
    theta, speed = rng.uniform(-math.pi, math.pi, n), rng.uniform(-8.0, 8.0, n)
    return np.stack([np.cos(theta), np.sin(theta), speed], -1).astype(np.float32)


@torch.no_grad()
def export_sampled_case(path: Path, base, num_simulations: int = 50) -> Path:
    """Write the case that ``lightzero_sampled_search.py`` reads (layout: the keys below)."""
    from torchrl_muzero.mcts import MCTSConfig
    from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy

    cfg = MCTSConfig(num_simulations=num_simulations)
    model = sampled_model(base, 1)
    case: dict[str, np.ndarray] = {f"w.{k}": v.detach().cpu().numpy().copy() for k, v in base.state_dict().items()}
    H = base.prediction_trunk[0].out_features
    case.update(
        obs_dim=np.int64(OBS_DIM), latent_dim=np.int64(base.latent_dim), hidden_dim=np.int64(H),
        action_dim=np.int64(1), lstm_hidden_size=np.int64(base.lstm_hidden_size),
        lstm_horizon_len=np.int64(base.lstm_horizon_len),
        value_support_size=np.int64(base.value_support.support_size),
        reward_support_size=np.int64(base.reward_support.support_size),
        scale_eps=np.float64(1e-5),
        min_scale=np.float64(inspect.signature(TanhNormalPolicy.from_params).parameters["min_scale"].default),
        action_low=np.array([ACTION_LOW], np.float32), action_high=np.array([ACTION_HIGH], np.float32),
        num_simulations=np.int64(cfg.num_simulations), discount=np.float64(cfg.discount),
        pb_c_base=np.float64(cfg.pb_c_base), pb_c_init=np.float64(cfg.pb_c_init),
        dirichlet_alpha=np.float64(cfg.dirichlet_alpha), dirichlet_fraction=np.float64(cfg.dirichlet_fraction),
        batches=np.array(BATCHES, np.int64), torch_version=np.array(torch.__version__),
    )
    obs = pendulum_observations(max(BATCHES))
    for B in BATCHES:
        case[f"obs_B{B}"] = obs[:B]
    # reference outputs (our code): the root of obs_B64, then one step with zero LSTM state
    root = base.search_root(torch.from_numpy(obs))
    dist = model.policy_distribution(root.policy_logits.float())
    actions = torch.from_numpy(np.random.default_rng(1).uniform(-1.9, 1.9, (len(obs), 1)).astype(np.float32))
    latent = root.state["latent"]
    h, c = base.initial_lstm_state(len(obs))
    nxt, (h, c), prefix_logits = base.dynamics_prefix(latent, (h, c), actions)
    policy_logits, value_logits = base.predict(nxt)
    nxt_dist = model.policy_distribution(policy_logits.float())
    case.update(
        check_latent=latent.numpy(), check_policy=torch.cat([dist.loc, dist.scale], -1).numpy(),
        check_value=root.value.numpy(), check_actions=actions.numpy(), check_next=nxt.numpy(),
        check_h=h.numpy(), check_c=c.numpy(), check_prefix=base.reward_support.decode(prefix_logits).numpy(),
        check_next_policy=torch.cat([nxt_dist.loc, nxt_dist.scale], -1).numpy(),
        check_next_value=base.value_support.decode(value_logits).numpy(),
    )
    np.savez(path, **case)
    return path


# -- ours ---------------------------------------------------------------------------------------
def our_runs(base, ks, backends, batches):
    """``{(impl, K): run(B)}``: one sampled search of the first ``B`` observations, root candidates read."""
    from torchrl_muzero.mcts import MCTSConfig
    from torchrl_muzero.mcts.sampled import root_candidates, sampled_search

    obs = {B: torch.from_numpy(pendulum_observations(max(BATCHES))[:B]) for B in batches}
    gen = torch.Generator().manual_seed(0)
    runs = {}
    for K in ks:
        for backend in backends:
            model = sampled_model(base, K)
            if backend == "cpp-loop":  # the C++ bookkeeping, the model per simulation: no fused spec
                model.fused_kernel_spec = lambda: None
            cfg = MCTSConfig(num_simulations=50, backend="cpp" if backend == "cpp-loop" else backend)

            def run(B, model=model, cfg=cfg):
                out = sampled_search(model, obs[B], cfg, generator=gen)
                return out, root_candidates(model, out)

            runs[(f"ours-{backend}", K)] = run
    return runs


def time_ours(impl: str, run, B: int, K: int, r: int) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    out, candidates = run(B)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    rec = {"impl": impl, "variant": "sampled_efficientzero", "B": B, "K": K, "round": r, "seconds": seconds,
           "cpu_seconds": cpu_s, "searches_per_s": B / seconds, "cpu_per_wall": round(cpu_s / seconds, 3),
           "engine": getattr(out, "engine", None), "torch": torch.__version__}
    visits = out.visit_counts
    if visits.shape != (B, K) or bool((visits.sum(-1) != 50).any()) or candidates.shape != (B, K, 1):
        rec["warning"] = f"root visits {tuple(visits.shape)} summing to {sorted(set(visits.sum(-1).tolist()))}"
    return rec


# -- LightZero in its venv ----------------------------------------------------------------------
class LightZeroServer:
    """``lightzero_sampled_search.py --serve`` in the LightZero venv: one JSON command, one JSON answer."""

    def __init__(self, case_path: Path, python: str = LZ_PYTHON) -> None:
        self.proc = None
        self.check = None
        self.reason = None
        if not Path(python).exists():
            self.reason = f"no python at {python} (set $TORCHRL_MUZERO_LZ_PYTHON; see DEVELOPERS.md)"
            return
        env = {**os.environ, **pc.ONE_THREAD_ENV, "PYTHONWARNINGS": "ignore"}
        probe = subprocess.run([python, "-c", LZ_PROBE], env=env, capture_output=True, text=True, timeout=300)
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            self.reason = f"{python} cannot `{LZ_PROBE}`: {last}"
            return
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, "-W", "ignore", str(HERE / "lightzero_sampled_search.py"), "--case",
                                      str(case_path), "--serve"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1)
        while True:
            rec = self._read()
            if rec is None:
                self.reason = f"the runner exited before it was ready: {self._stderr_tail()}"
                self.proc = None
                return
            if rec.get("check"):
                self.check = rec
            if rec.get("ready"):
                return

    def _read(self) -> dict | None:
        for line in self.proc.stdout:  # LightZero's imports log to stdout too: JSON lines only
            if line.startswith("{"):
                return json.loads(line)
        return None

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return " | ".join(self.stderr.read().strip().splitlines()[-5:])

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        rec = self._read()
        if rec is None:
            raise RuntimeError(f"lightzero runner died: {self._stderr_tail()}")
        return rec

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


# -- profile ------------------------------------------------------------------------------------
def _callees(stats: pstats.Stats, caller_name: str, caller_file: str) -> list[tuple[float, str]]:
    """``(seconds, function)`` of every function called by ``caller_name`` (in a file ending ``caller_file``),
    with the cumulative time spent under it from that caller."""
    rows = []
    for (file, line, name), (_, _, _, _, callers) in stats.stats.items():
        for (cfile, _, cname), edge in callers.items():
            if cname == caller_name and cfile.endswith(caller_file):
                rows.append((edge[3], f"{name} ({Path(file).name}:{line})"))
    return sorted(rows, reverse=True)


def _total(stats: pstats.Stats, name: str, file: str = "") -> float:
    """The cumulative time of ``name`` (in a file ending ``file``), over all its calls."""
    return sum(ct for (f, _, n), (_, _, _, ct, _) in stats.stats.items() if n == name and f.endswith(file))


def profile_ours(run, B: int, n: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        run(B)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    total = _total(stats, "sampled_search", "mcts/sampled.py")
    loop = _total(stats, "run_search", "mcts/loop.py")
    callees = _callees(stats, "run_search", "mcts/loop.py")
    parts = [
        ("network step (EfficientZeroModel.search_step: dynamics, LSTM cell, heads, decode, the child's TensorDict)",
         _total(stats, "search_step", "modules/efficientzero.py")),
        ("K draws per node (SampledModel.sample_node: tanh-normal params, K samples, slot logits; root included)",
         _total(stats, "sample_node", "modules/sampled.py")),
        ("node states in and out of the tree (TensorDict __getitem__ / __setitem__ on tree.embeddings)",
         sum(s for s, fn in callees if fn.startswith(("__getitem__", "__setitem__")))),
        ("slot -> env action (SampledModel.slot_actions)", sum(s for s, fn in callees if fn.startswith("slot_actions"))),
        ("C++ expand + backup (the C++ select runs through functools.partial: cProfile counts it in the rest)",
         sum(s for s, fn in callees if fn.startswith("expand_and_backup"))),
    ]
    parts.append(("the rest (C++ select, the loop's own Python, prior softmax; the root: representation, noise, "
                  "start_tree; readout)",
                  total - sum(s for _, s in parts)))
    lines = [buf.getvalue().rstrip(), "",
             f"where the time goes: sampled_search, {n} searches, {total:.3f} s (the simulation loop "
             f"{100 * loop / total:.0f}%)"]
    lines += [f"  {100 * s / total:5.1f}%  {what}" for what, s in parts]
    lines.append("run_search's callees (decorate_context: the model's step under torch.no_grad):")
    lines += [f"  {s:8.3f} s {100 * s / total:5.1f}%  {fn}" for s, fn in callees[:8]]
    return "\n".join(lines)


# -- table --------------------------------------------------------------------------------------
def table(records: list[dict], impls: list[str]) -> str:
    timed = [r for r in records if "searches_per_s" in r]
    keys = list(dict.fromkeys((r["K"], r["B"]) for r in timed))
    peer = "lightzero"
    ours = [i for i in impls if i != peer]

    def med(K, B, impl, rate):
        vals = [rate(r) for r in timed if (r["K"], r["B"], r["impl"]) == (K, B, impl)]
        return statistics.median(vals) if vals else None

    def paired_ratio(K, B, impl, rate):
        """The median over the rounds of ours / LightZero's in the same round (searched one after the other,
        so under the same load); the ratio of the medians for records without rounds."""
        mine = {r.get("round"): rate(r) for r in timed if (r["K"], r["B"], r["impl"]) == (K, B, impl)}
        theirs = {r.get("round"): rate(r) for r in timed if (r["K"], r["B"], r["impl"]) == (K, B, peer)}
        both = [mine[k] / theirs[k] for k in mine if k is not None and k in theirs]
        return statistics.median(both) if both else med(K, B, impl, rate) / med(K, B, peer, rate)

    out = ["ratios: the median over the rounds of ours / LightZero's in the same round"]
    for title, rate in (("searches/s (wall clock), median of the rounds", lambda r: r["searches_per_s"]),
                        ("searches per CPU-second of the searching process, median of the rounds",
                         lambda r: r["B"] / max(r["cpu_seconds"], 1e-9))):
        head = (f"{'B':>3} {'K':>3} " + " ".join(f"{i:>13}" for i in impls)
                + "".join(f" {i.removeprefix('ours-') + '/LZ':>10}" for i in ours))
        out += [title, head, "-" * len(head)]
        for K, B in sorted(keys, key=lambda kb: (kb[1], kb[0])):
            vals = {i: med(K, B, i, rate) for i in impls}
            row = f"{B:>3} {K:>3} " + " ".join(f"{vals[i]:13.1f}" if vals[i] else f"{'-':>13}" for i in impls)
            for i in ours:
                ratio = paired_ratio(K, B, i, rate) if vals[i] and vals.get(peer) else None
                row += f" {ratio:10.2f}" if ratio else f" {'-':>10}"
            out.append(row)
        out.append("")
    multi = sorted({r["impl"] for r in timed if r.get("cpu_per_wall", 1.0) > 1.15})
    if multi:
        out.append(f"WARNING: {', '.join(multi)} used more than one core in some rounds (CPU time / wall > 1.15)")
    return "\n".join(out).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--ks", default="5,20", help="sampled actions per node")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ours", default="auto,cpp-loop,torch",
                        help="our backends to time (MCTSConfig.backend; cpp-loop: the C++ tree, model per simulation)")
    parser.add_argument("--no-peer", action="store_true", help="time ours only")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile ours (the per-simulation loop, cpp-loop; and LightZero) at B = 8, K = 20")
    parser.add_argument("--profile-searches", type=int, default=10)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    if any(b not in BATCHES for b in batches):
        parser.error(f"--batches: the case holds observations for B in {BATCHES} only")
    torch.set_num_threads(1)
    core = pc.pin_to_one_core()  # the LightZero runner inherits the mask: the same core, one after the other
    base = build_base(**SIZES)
    runs = our_runs(base, ks, [b for b in args.ours.split(",") if b], batches)
    impls = list(dict.fromkeys(impl for impl, _ in runs))
    load = {"loadavg_start": os.getloadavg()}
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        case_path = export_sampled_case(Path(tmp) / "sampled_case.npz", base)
        lz = None
        if not args.no_peer:
            lz = LightZeroServer(case_path)
            if lz.proc is None:
                print(f"lightzero: skipped, {lz.reason}", file=sys.stderr)
                lz = None
            else:
                pc.emit(lz.check)
                records.append(lz.check)
                impls.append("lightzero")
        try:
            for K in ks:
                for B in batches:
                    for impl in impls:  # warm-up: one search each
                        lz.ask(cmd="warm", B=B, K=K) if impl == "lightzero" else runs[(impl, K)](B)
                    for r in range(args.rounds):
                        for impl in impls:
                            rec = (lz.ask(cmd="time", B=B, K=K, round=r) if impl == "lightzero"
                                   else time_ours(impl, runs[(impl, K)], B, K, r))
                            pc.emit(rec)
                            records.append(rec)
            profiles = []
            if args.profile:
                profiles.append(f"ours-cpp-loop, B = 8, K = 20, cProfile (top by own time):\n"
                                + profile_ours(our_runs(base, [20], ["cpp-loop"], [8])[("ours-cpp-loop", 20)], 8,
                                               args.profile_searches, 25))
                if lz is not None:
                    profiles.append("lightzero, B = 8, K = 20, cProfile (top by own time):\n"
                                    + lz.ask(cmd="profile", B=8, K=20, n=args.profile_searches, top=20)["profile"])
        finally:
            if lz is not None:
                lz.close()
    load["loadavg_end"] = os.getloadavg()
    print()
    print(table(records, impls))
    for r in records:
        if r.get("check"):
            print(f"network check (LightZero's rebuilt network vs ours, max abs diff): {r['max_abs_diff']:.2g}")
    warnings = [r for r in records if r.get("warning")]
    for r in warnings[:5]:
        print(f"WARNING {r['impl']} B={r['B']} K={r['K']}: {r['warning']}")
    print(f"load average (1, 5, 15 min) at start {tuple(round(x, 2) for x in load['loadavg_start'])}, at end "
          f"{tuple(round(x, 2) for x in load['loadavg_end'])}; {os.cpu_count()} cores, all timed on core {core}; "
          f"torch {torch.__version__}, python {platform.python_version()}")
    for p in profiles:
        print()
        print(p)
    if args.json_out:
        with open(args.json_out, "w") as f:
            for r in records + [load]:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
