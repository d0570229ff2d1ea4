"""Time mctx's search policies on the exported benchmark case (runs in the mctx venv: jax[cpu] + mctx).

    $TORCHRL_MUZERO_PEERS_DIR/mctx/bin/python benchmarks/peers/mctx_search.py --case /tmp/torchrl_muzero_peer_case.npz

The network of ``export_case.py`` is rebuilt in jax.numpy and checked against
ours. Each policy is jitted whole (``jax.jit`` of ``mctx.<policy>`` with the
recurrent function and 50 simulations closed over), compiled once per batch
size in the warm-up call, and timed from the exported root latents and
logits to ``block_until_ready`` of the action weights. ``muzero_policy`` runs
with its defaults, which are ours: Dirichlet noise (alpha 0.3, fraction
0.25), pUCT 1.25 / 19652; the reward's discount is the case's 0.997.

Each variant is one small function (``VARIANTS``): ``muzero``,
``gumbel_muzero``, ``stochastic_muzero`` (on the exported Stochastic network,
with ``muzero_policy``'s noise and pUCT settings).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402

pc.single_thread()
pc.pin_to_one_core()

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mctx  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_platforms", "cpu")
IMPL = "mctx"


def make_network(case: dict):
    """``(params, recurrent_fn, initial_fn)`` of the exported MLP in jax."""
    params = {k: jnp.asarray(v, dtype=jnp.float32) for k, v in case.items() if k[:4] in ("repr", "dyn_", "rew_", "pred")}
    A = int(case["num_actions"])
    eps = float(case["epsilon"])
    scale_eps = float(case["scale_eps"])
    discount = float(case["discount"])
    value_bins = jnp.arange(-int(case["value_support_size"]), int(case["value_support_size"]) + 1, dtype=jnp.float32)
    reward_bins = jnp.arange(-int(case["reward_support_size"]), int(case["reward_support_size"]) + 1,
                             dtype=jnp.float32)

    def two(p, name, x):
        h = jax.nn.relu(x @ p[f"{name}_w1"].T + p[f"{name}_b1"])
        return h @ p[f"{name}_w2"].T + p[f"{name}_b2"]

    def scale(x):
        low = x.min(-1, keepdims=True)
        high = x.max(-1, keepdims=True)
        return (x - low) / jnp.maximum(high - low, scale_eps)

    def decode(logits, bins):
        y = jax.nn.softmax(logits, -1) @ bins
        root = (jnp.sqrt(1 + 4 * eps * (jnp.abs(y) + 1 + eps)) - 1) / (2 * eps)
        return jnp.sign(y) * (root * root - 1)

    def recurrent_step(p, latent, action):
        nxt = scale(two(p, "dyn", jnp.concatenate([latent, jax.nn.one_hot(action, A, dtype=latent.dtype)], -1)))
        reward = decode(two(p, "rew", nxt), reward_bins)
        out = two(p, "pred", nxt)
        return nxt, reward, out[:, :A], decode(out[:, A:], value_bins)

    def recurrent_fn(p, rng_key, action, embedding):
        del rng_key
        nxt, reward, logits, value = recurrent_step(p, embedding, action)
        out = mctx.RecurrentFnOutput(reward=reward, discount=jnp.full_like(reward, discount), prior_logits=logits,
                                     value=value)
        return out, nxt

    def initial_fn(p, obs):
        latent = scale(two(p, "repr", obs))
        out = two(p, "pred", latent)
        return latent, out[:, :A], decode(out[:, A:], value_bins)

    return params, recurrent_fn, jax.jit(recurrent_step), jax.jit(initial_fn)


def make_stochastic_network(case: dict):
    """``(params, decision_recurrent_fn, chance_recurrent_fn, afterstate_step, chance_step)`` in jax."""
    params = {k[4:]: jnp.asarray(case[k], dtype=jnp.float32) for k in pc.stochastic_weight_keys(case)}
    A, C = int(case["num_actions"]), int(case["num_chance"])
    eps, scale_eps, discount = float(case["epsilon"]), float(case["scale_eps"]), float(case["discount"])
    bins = jnp.arange(-int(case["value_support_size"]), int(case["value_support_size"]) + 1, dtype=jnp.float32)
    rbins = jnp.arange(-int(case["reward_support_size"]), int(case["reward_support_size"]) + 1, dtype=jnp.float32)

    def two(p, name, x):
        return jax.nn.relu(x @ p[f"{name}_w1"].T + p[f"{name}_b1"]) @ p[f"{name}_w2"].T + p[f"{name}_b2"]

    def scale(x):
        low, high = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
        return (x - low) / jnp.maximum(high - low, scale_eps)

    def decode(logits, b):
        y = jax.nn.softmax(logits, -1) @ b
        root = (jnp.sqrt(1 + 4 * eps * (jnp.abs(y) + 1 + eps)) - 1) / (2 * eps)
        return jnp.sign(y) * (root * root - 1)

    def afterstate_step(p, latent, action):
        aft = scale(two(p, "as", jnp.concatenate([latent, jax.nn.one_hot(action, A, dtype=latent.dtype)], -1)))
        h = jax.nn.relu(aft @ p["astrunk_w"].T + p["astrunk_b"])
        return aft, h @ p["chance_w"].T + p["chance_b"], decode(h @ p["asvalue_w"].T + p["asvalue_b"], bins)

    def chance_step(p, aft, code):
        nxt = scale(two(p, "dyn", jnp.concatenate([aft, jax.nn.one_hot(code, C, dtype=aft.dtype)], -1)))
        out = two(p, "pred", nxt)
        return nxt, decode(two(p, "rew", nxt), rbins), out[:, :A], decode(out[:, A:], bins)

    def decision_recurrent_fn(p, rng_key, action, embedding):
        del rng_key
        aft, sigma, q = afterstate_step(p, embedding, action)
        return mctx.DecisionRecurrentFnOutput(chance_logits=sigma, afterstate_value=q), aft

    def chance_recurrent_fn(p, rng_key, code, embedding):
        del rng_key
        nxt, reward, logits, value = chance_step(p, embedding, code)
        out = mctx.ChanceRecurrentFnOutput(action_logits=logits, value=value, reward=reward,
                                           discount=jnp.full_like(reward, discount))
        return out, nxt

    return params, decision_recurrent_fn, chance_recurrent_fn, jax.jit(afterstate_step), jax.jit(chance_step)


def _roots(case: dict, B: int, prefix: str = ""):
    return mctx.RootFnOutput(prior_logits=jnp.asarray(case[f"{prefix}policy_logits_B{B}"]),
                             value=jnp.asarray(case[f"{prefix}value_B{B}"]),
                             embedding=jnp.asarray(case[f"{prefix}latent_B{B}"]))


def _timed(case, params, policy, prefix: str = ""):
    """``run(B)``: one jitted search of the case's ``B`` roots, a fresh rng key per call."""
    roots = {}
    key = [jax.random.PRNGKey(0)]

    def run(B):
        if B not in roots:
            roots[B] = _roots(case, B, prefix)
        key[0], sub = jax.random.split(key[0])
        out = policy(params, sub, roots[B])
        return jax.block_until_ready(out.action_weights)

    return run


def muzero(case: dict, params, recurrent_fn):
    policy = jax.jit(functools.partial(
        mctx.muzero_policy, recurrent_fn=recurrent_fn, num_simulations=int(case["num_simulations"]),
        dirichlet_fraction=float(case["dirichlet_fraction"]), dirichlet_alpha=float(case["dirichlet_alpha"]),
        pb_c_init=float(case["pb_c_init"]), pb_c_base=float(case["pb_c_base"]), temperature=1.0))
    return _timed(case, params, policy)


def gumbel_muzero(case: dict, params, recurrent_fn):
    """mctx's defaults: 16 considered actions (all 6 here), gumbel_scale 1, completed-Q by mixed value."""
    policy = jax.jit(functools.partial(
        mctx.gumbel_muzero_policy, recurrent_fn=recurrent_fn, num_simulations=int(case["num_simulations"]),
        max_num_considered_actions=16, gumbel_scale=1.0))
    return _timed(case, params, policy)


def stochastic_muzero(case: dict, params, recurrent_fn):
    """``mctx.stochastic_muzero_policy`` on the exported Stochastic network (``sto_*``), muzero_policy's settings."""
    del params, recurrent_fn
    sto_params, decision_fn, chance_fn, _, _ = make_stochastic_network(case)
    policy = jax.jit(functools.partial(
        mctx.stochastic_muzero_policy, decision_recurrent_fn=decision_fn, chance_recurrent_fn=chance_fn,
        num_simulations=int(case["num_simulations"]), dirichlet_fraction=float(case["dirichlet_fraction"]),
        dirichlet_alpha=float(case["dirichlet_alpha"]), pb_c_init=float(case["pb_c_init"]),
        pb_c_base=float(case["pb_c_base"]), temperature=1.0))
    return _timed(case, sto_params, policy, prefix="sto_")


VARIANTS = {"muzero": muzero, "gumbel_muzero": gumbel_muzero, "stochastic_muzero": stochastic_muzero}


def main() -> None:
    args = pc.common_args(__doc__.split("\n")[0]).parse_args()
    case = pc.load_case(args.case)
    params, recurrent_fn, recurrent_step, initial_fn = make_network(case)

    def recurrent(latent, action):
        return tuple(np.asarray(x) for x in recurrent_step(params, jnp.asarray(latent), jnp.asarray(action)))

    def initial(obs):
        return tuple(np.asarray(x) for x in initial_fn(params, jnp.asarray(obs)))

    pc.check_forward(IMPL, case, recurrent, initial)
    if "num_chance" in case:
        sto_params, _, _, afterstate_step, chance_step = make_stochastic_network(case)
        pc.check_stochastic(
            IMPL, case,
            lambda lat, a: tuple(np.asarray(x) for x in afterstate_step(sto_params, jnp.asarray(lat), jnp.asarray(a))),
            lambda aft, c: tuple(np.asarray(x) for x in chance_step(sto_params, jnp.asarray(aft), jnp.asarray(c))))
    if args.check_only:
        return
    sims = int(case["num_simulations"])
    for name in args.variants.split(","):
        if name not in VARIANTS:
            pc.emit({"impl": IMPL, "variant": name, "skipped": "not implemented for mctx here"})
            continue
        run = VARIANTS[name](case, params, recurrent_fn)
        weights = np.asarray(run(1))
        if weights.shape != (1, int(case["num_actions"])) or not np.isclose(weights.sum(), 1.0, atol=1e-4):
            pc.emit({"impl": IMPL, "variant": name, "warning": f"action weights {weights.tolist()}"})
        pc.time_search(IMPL, name, run, pc.batches_of(args, case), rounds=args.rounds, jax=jax.__version__,
                       simulations=sims)


if __name__ == "__main__":
    main()
