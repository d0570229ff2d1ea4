"""Search speed side by side: ours, LightZero 0.2.0's C++ trees and mctx, same network, same roots.

Run from the repository's venv (the peers run in their own venvs, see DEVELOPERS.md):

    python benchmarks/peers/run_peers.py [--variants muzero,gumbel_muzero] [--batches 1,8,64,256]
                                         [--rounds 3] [--passes 1] [--json-out results.jsonl]

It exports the case (``export_case.py``), times our search on it in this
process, then runs ``lightzero_search.py`` with ``$TORCHRL_MUZERO_LZ_PYTHON``
(default ``$TORCHRL_MUZERO_PEERS_DIR/lz/bin/python``) and ``mctx_search.py`` with
``$TORCHRL_MUZERO_MCTX_PYTHON`` (default ``$TORCHRL_MUZERO_PEERS_DIR/mctx/bin/python``; the folder
defaults to ``torchrl_muzero_peers`` under the temp folder) as
subprocesses, and prints one table of searches/s (the median of the rounds;
one search = one root; 50 simulations, 6 actions, root noise on, one thread).
A peer whose python is missing or cannot import its package is skipped with a
message. ``--passes N`` repeats the whole sequence (ours, then each peer) N
times and adds a table of ours / best peer per pass: each pass's ratio is
taken within minutes, so a load that drifts over the run (mctx's figures
move by up to 2x between runs here) moves both sides of a ratio together.
Every implementation first checks its re-built network against ours
(max abs diff printed); the timings start from the exported root latents and
logits (no representation call).

Ours: ``cpp`` is the fused C++ search (network in the kernel; ``cpp-fma``
the same with ``kernel_precision="fma"``, where the CPU has AVX2 + FMA), ``cpp-loop``
the C++ tree with the model called from Python per simulation, ``torch`` the
tree in tensor ops. Gumbel MuZero's ``cpp`` is the fused search too (its
rules ``gumbel_root`` / ``gumbel_interior`` in the kernel, the result read by
the kernel's ``gumbel_readout``). Stochastic MuZero's ``cpp`` is its own fused
search (``csrc/stochastic_search.cpp``: the afterstate and chance steps in the
kernel), ``cpp-loop`` its C++ chance / pUCT rules around the torch model
called per simulation; it uses its own exported network (``export_case.py``:
C = 32 chance codes), and so does EfficientZero (a 64-unit value-prefix LSTM
reset every 5 steps), searched by MuZero's policy (``muzero_search``):
``cpp`` is its fused C++ search (the LSTM step in the kernel,
``csrc/ez_net.h``), ``cpp-loop`` the C++ tree with the model's
``search_step`` called per simulation, ``torch`` the tensor ops.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_common as pc  # noqa: E402

pc.single_thread()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import export_case  # noqa: E402

#: where DEVELOPERS.md installs the peers' venvs (no path of one machine: a variable, a temp-folder default)
PEERS_DIR = os.environ.get("TORCHRL_MUZERO_PEERS_DIR", os.path.join(tempfile.gettempdir(), "torchrl_muzero_peers"))
PEERS = {
    "lightzero": ("TORCHRL_MUZERO_LZ_PYTHON", os.path.join(PEERS_DIR, "lz", "bin", "python"), "lightzero_search.py",
                  "from lzero.mcts.ctree.ctree_muzero import mz_tree"),
    "mctx": ("TORCHRL_MUZERO_MCTX_PYTHON", os.path.join(PEERS_DIR, "mctx", "bin", "python"), "mctx_search.py",
             "import mctx, jax"),
}


# -- ours ---------------------------------------------------------------------
def _our_runs(case: dict, variants: list[str]):
    """``{(impl, variant): run(B)}`` for our searches on the case."""
    from torchrl_muzero.mcts import MCTSConfig, _cpp, search_from_root

    def config(backend: str, cls=MCTSConfig, **kw):
        """The search settings of one of our implementations ("cpp-fma": the fused search's FMA path)."""
        return cls(backend=backend.split("-")[0], kernel_precision="fma" if backend == "cpp-fma" else "exact", **kw)

    model = export_case.canonical_model()
    sims = int(case["num_simulations"])
    gen = torch.Generator().manual_seed(0)
    tensors = {k: torch.from_numpy(v) for k, v in case.items() if k.startswith(("latent_B", "policy_logits_B",
                                                                               "value_B"))}
    has_cpp = _cpp.load_tree_ops() is not None
    fused = ["cpp"] + (["cpp-fma"] if has_cpp and _cpp.fma_available() else [])
    runs = {}

    if "muzero" in variants:
        for backend in (fused + ["cpp-loop"] if has_cpp else []) + ["torch"]:
            cfg = config(backend, num_simulations=sims)
            m = export_case.canonical_model()
            if backend == "cpp-loop":
                m.fused_search_weights = lambda: None

            def run(B, m=m, cfg=cfg):
                out = search_from_root(m, tensors[f"latent_B{B}"], tensors[f"policy_logits_B{B}"], cfg, generator=gen)
                return out.visit_counts

            runs[(f"ours-{backend}", "muzero")] = run

    if "gumbel_muzero" in variants:
        try:
            from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_muzero_search
            from torchrl_muzero.modules.step import ModelStep
        except ImportError as err:
            print(f"ours: no Gumbel search here ({err})", file=sys.stderr)
        else:
            for backend in (fused if has_cpp else []) + ["torch"]:
                cfg = config(backend, GumbelMCTSConfig, num_simulations=sims, max_num_considered_actions=16)

                @torch.no_grad()
                def run(B, cfg=cfg):
                    value = tensors[f"value_B{B}"]
                    root = ModelStep(tensors[f"latent_B{B}"], torch.zeros_like(value), tensors[f"policy_logits_B{B}"],
                                     value)
                    return gumbel_muzero_search(model, root, cfg, generator=gen).visit_counts

                runs[(f"ours-{backend}", "gumbel_muzero")] = run
    if "stochastic_muzero" in variants and "num_chance" in case:
        try:
            from tensordict import TensorDict

            from torchrl_muzero.mcts.stochastic import stochastic_muzero_search
            from torchrl_muzero.modules.step import ModelStep
        except ImportError as err:
            print(f"ours: no Stochastic MuZero search here ({err})", file=sys.stderr)
        else:
            sto_t = {k: torch.from_numpy(v) for k, v in case.items() if k.startswith("sto_") and "_B" in k}
            C = int(case["num_chance"])
            for backend in (fused + ["cpp-loop"] if has_cpp else []) + ["torch"]:
                # cpp: the fused search (network in the kernel); cpp-loop: the C++ chance / pUCT rules
                # around the torch model called per simulation.
                cfg = config(backend, num_simulations=sims)
                sto = export_case.canonical_stochastic_model()
                if backend == "cpp-loop":
                    sto.fused_search_weights = lambda: None

                @torch.no_grad()
                def run(B, cfg=cfg, sto=sto):
                    latent, value = sto_t[f"sto_latent_B{B}"], sto_t[f"sto_value_B{B}"]
                    logits = torch.cat([sto_t[f"sto_policy_logits_B{B}"], torch.full((B, C), -float("inf"))], -1)
                    state = TensorDict({"latent": latent, "is_chance": torch.zeros(B, dtype=torch.bool)}, [B])
                    root = ModelStep(state, torch.zeros_like(value), logits, value)
                    return stochastic_muzero_search(sto, root, cfg, generator=gen).visit_counts

                runs[(f"ours-{backend}", "stochastic_muzero")] = run

    if "efficientzero" in variants and "lstm_hidden_size" in case:
        try:
            from tensordict import TensorDict

            from torchrl_muzero.mcts.search import muzero_search
            from torchrl_muzero.modules.step import ModelStep
        except ImportError as err:
            print(f"ours: no EfficientZero search here ({err})", file=sys.stderr)
        else:
            ez = export_case.canonical_efficientzero_model()
            ez_t = {k: torch.from_numpy(v) for k, v in case.items() if k.startswith("ez_") and "_B" in k}
            K = int(case["lstm_hidden_size"])
            ez_fused = has_cpp and getattr(ez, "fused_value_prefix_weights", lambda: None)() is not None
            for backend in (fused if ez_fused else []) + (["cpp-loop"] if has_cpp else []) + ["torch"]:
                cfg = config(backend, num_simulations=sims)
                m = ez
                if backend == "cpp-loop":  # the C++ tree with the model called per simulation
                    m = export_case.canonical_efficientzero_model()
                    m.fused_value_prefix_weights = lambda: None

                @torch.no_grad()
                def run(B, cfg=cfg, m=m):
                    latent, value = ez_t[f"ez_latent_B{B}"], ez_t[f"ez_value_B{B}"]
                    state = TensorDict({"latent": latent, "lstm_h": torch.zeros(B, K), "lstm_c": torch.zeros(B, K),
                                        "value_prefix": torch.zeros(B), "steps": torch.zeros(B, dtype=torch.long)},
                                       [B])
                    root = ModelStep(state, torch.zeros_like(value), ez_t[f"ez_policy_logits_B{B}"], value)
                    return muzero_search(m, root, cfg, generator=gen).visit_counts

                runs[(f"ours-{backend}", "efficientzero")] = run
    return model, runs


def run_ours(case: dict, variants: list[str], batches: list[int], rounds: int,
             impls: list[str] | None = None, threads: int = 1) -> list[dict]:
    torch.set_num_threads(threads)  # the fused searches split their trees over these (csrc/fused_loop.h)
    model, runs = _our_runs(case, variants)
    if impls is not None:
        runs = {key: run for key, run in runs.items() if key[0].removeprefix("ours-") in impls}
    with torch.no_grad():  # our network against the exported outputs (the same code: a sanity check)
        def recurrent(latent, action):
            out = model.recurrent_inference_scalar(torch.from_numpy(latent), torch.from_numpy(action).long())
            return tuple(x.numpy() for x in out)

        def initial(obs):
            latent, logits, value_logits = model.initial_inference(torch.from_numpy(obs))
            return latent.numpy(), logits.numpy(), model.value_support.decode(value_logits).numpy()

        worst = pc.check_forward("ours", case, recurrent, initial)
    records = [{"impl": "ours", "check": "network", "max_abs_diff": worst}]
    sims = int(case["num_simulations"])
    for (impl, variant), run in runs.items():
        visits = run(1)
        if int(visits.sum()) != sims:
            pc.emit({"impl": impl, "variant": variant, "warning": f"root visits sum to {int(visits.sum())}"})
    for variant in dict.fromkeys(v for _, v in runs):
        # our implementations of a variant round-robin, so their ratios (cpp-fma / cpp) share one load
        records += pc.time_searches({i: r for (i, v), r in runs.items() if v == variant}, variant, batches,
                                    rounds=rounds, torch=torch.__version__)
    return records


# -- peers --------------------------------------------------------------------
def run_peer(name: str, case_path: Path, variants: list[str], batches: list[int], rounds: int,
             timeout: float, one_thread: bool = True) -> list[dict]:
    env_var, default, script, probe = PEERS[name]
    python = os.environ.get(env_var, default)
    if not Path(python).exists():
        print(f"{name}: skipped, no python at {python} (set ${env_var}; see DEVELOPERS.md)", file=sys.stderr)
        return []
    # --threads > 1: the peer keeps its own threading (XLA's, LightZero's), as a user would run it
    base = {k: v for k, v in os.environ.items() if one_thread or k not in pc.ONE_THREAD_ENV}
    env = {**base, **(pc.ONE_THREAD_ENV if one_thread else {}), "PYTHONWARNINGS": "ignore"}
    ok = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    if ok.returncode != 0:
        last = (ok.stderr.strip().splitlines() or ["?"])[-1]
        print(f"{name}: skipped, {python} cannot `{probe}`: {last}", file=sys.stderr)
        return []
    cmd = [python, str(HERE / script), "--case", str(case_path), "--variants", ",".join(variants),
           "--batches", ",".join(map(str, batches)), "--rounds", str(rounds)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{name}: timed out after {timeout:.0f} s", file=sys.stderr)
        return []
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            print(line, flush=True)
            records.append(rec)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        print(f"{name}: exited with {proc.returncode}:\n{tail}", file=sys.stderr)
    return records


# -- table --------------------------------------------------------------------
def table(records: list[dict]) -> str:
    timed = [r for r in records if "searches_per_s" in r]
    impls = list(dict.fromkeys(r["impl"] for r in timed))
    keys = list(dict.fromkeys((r["variant"], r["B"]) for r in timed))
    head = f"{'variant':<17} {'B':>4} " + " ".join(f"{i:>15}" for i in impls)
    lines = []

    def grid(title: str, rate) -> None:
        cells = {}
        for r in timed:
            cells.setdefault((r["variant"], r["B"], r["impl"]), []).append(rate(r))
        lines.extend([title, head, "-" * len(head)])
        for variant, B in keys:
            row = [f"{statistics.median(cells[(variant, B, i)]):15.1f}" if (variant, B, i) in cells
                   else f"{'-':>15}" for i in impls]
            lines.append(f"{variant:<17} {B:>4} " + " ".join(row))

    grid("searches/s (wall clock), median of the rounds", lambda r: r["searches_per_s"])
    if all("cpu_per_wall" in r for r in timed):
        # on a shared machine the pinned core is shared too: the wall clock then counts the other jobs'
        # time slices, the process's CPU time does not (cache sharing still does; quote the load)
        grid("searches per CPU-second (process CPU time), median of the rounds",
             lambda r: r["searches_per_s"] / max(r["cpu_per_wall"], 1e-9))
    # an implementation that used more than one core is not timed like the others (see single_thread)
    multi = {}
    for r in timed:
        if r.get("cpu_per_wall", 1.0) > 1.15:
            multi.setdefault(r["impl"], []).append(r["cpu_per_wall"])
    for impl, ratios in multi.items():
        lines.append(f"WARNING: {impl} used more than one core in {len(ratios)} rounds "
                     f"(CPU time / wall clock up to {max(ratios):.2f}): its figures are not one-core figures")
    for kind in ("network", "stochastic_network", "efficientzero_network"):
        checks = [r for r in records if r.get("check") == kind]
        if checks:
            lines.append(f"{kind} check (max abs diff vs ours): "
                         + ", ".join(f"{r['impl']} {r['max_abs_diff']:.2g}" for r in checks))
    return "\n".join(lines)


def ratio_table(records: list[dict]) -> str:
    """Ours / the best peer, pass by pass (the median of each pass's rounds; wall clock).

    One row per (variant, B) and one column per implementation of ours: the
    ratios of every pass, then their median and minimum. A pass without a
    peer's figure for that row (the peer skipped it) is left out.
    """
    timed = [r for r in records if "searches_per_s" in r]
    med: dict = {}
    for r in timed:
        med.setdefault((r.get("pass", 0), r["variant"], r["B"], r["impl"]), []).append(r["searches_per_s"])
    med = {k: statistics.median(v) for k, v in med.items()}
    ours = list(dict.fromkeys(r["impl"] for r in timed if r["impl"].startswith("ours-")))
    rows = list(dict.fromkeys((r["variant"], r["B"]) for r in timed))
    passes = sorted({k[0] for k in med})
    lines = ["ours / best peer, per pass (median of each pass's rounds, wall clock); then median, min"]
    for variant, B in rows:
        cells = []
        for impl in ours:
            ratios = []
            for p in passes:
                peers = [v for (pp, vv, bb, i), v in med.items() if (pp, vv, bb) == (p, variant, B)
                         and not i.startswith("ours-")]
                mine = med.get((p, variant, B, impl))
                if peers and mine is not None:
                    ratios.append(mine / max(peers))
            if ratios:
                cells.append(f"{impl.removeprefix('ours-')}: " + " ".join(f"{x:.2f}" for x in ratios)
                             + f" | median {statistics.median(ratios):.2f} min {min(ratios):.2f}")
        if cells:
            lines.append(f"{variant:<17} {B:>4}  " + "; ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="muzero,gumbel_muzero,stochastic_muzero,efficientzero")
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="lightzero,mctx", help="comma-separated; empty for ours only")
    parser.add_argument("--no-ours", action="store_true")
    parser.add_argument("--ours", default="cpp,cpp-fma,cpp-loop,torch",
                        help="comma-separated: which of our implementations to time (cpp-fma where the CPU has FMA)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per peer")
    parser.add_argument("--passes", type=int, default=1,
                        help="repeat ours-then-peers this many times; adds ours / best peer per pass")
    parser.add_argument("--threads", type=int, default=1,
                        help="1 (default): every implementation pinned to one core, one thread; N > 1: nothing "
                             "pinned, ours on N torch threads, each peer with its own default threading")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    batches = [int(b) for b in args.batches.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    if any(b not in export_case.BATCHES for b in batches):
        parser.error(f"--batches={args.batches!r}: the exported case holds roots for B in "
                     f"{', '.join(map(str, export_case.BATCHES))} only")
    unknown = [p for p in peers if p not in PEERS]
    if unknown:  # before the case is exported: one line, not a KeyError after our timings
        parser.error(f"--peers={args.peers!r}: unknown peer {unknown[0]!r}; known: {', '.join(PEERS)} "
                     "(an empty --peers= times ours only)")
    # ours in this process, each peer's runner after it: the same core (or, with --threads N, every core)
    if args.threads > 1:
        os.environ["TORCHRL_MUZERO_BENCH_THREADS"] = str(args.threads)  # the peers' runners read it
    core = pc.pin_to_one_core() if args.threads == 1 else "any"
    load = {"loadavg_start": os.getloadavg()}
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        case_path = export_case.export(Path(tmp) / "case.npz")
        case = pc.load_case(str(case_path))
        for n in range(max(1, args.passes)):
            done = []
            if not args.no_ours:
                done += run_ours(case, variants, batches, args.rounds, [i for i in args.ours.split(",") if i],
                                 threads=args.threads)
            for name in peers:
                done += run_peer(name, case_path, variants, batches, args.rounds, args.timeout,
                                 one_thread=args.threads == 1)
            for r in done:
                r["pass"] = n
            records += done
    load["loadavg_end"] = os.getloadavg()
    print()
    print(table(records))
    if args.passes > 1:
        print()
        print(ratio_table(records))
    print(f"load average (1, 5, 15 min) at start {tuple(round(x, 2) for x in load['loadavg_start'])}, "
          f"at end {tuple(round(x, 2) for x in load['loadavg_end'])}; {os.cpu_count()} cores, all timed on core {core}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            for r in records + [load]:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
