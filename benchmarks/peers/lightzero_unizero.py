"""LightZero 0.2.0's UniZero search timed on our CartPole UniZero sizes (runs in the LightZero venv).

    $TORCHRL_MUZERO_PEERS_DIR/lz/bin/python -W ignore benchmarks/peers/lightzero_unizero.py 1 8 64

LightZero's own CartPole UniZero config (embed 64, 2 layers, 2 heads, RoPE,
context 4 steps, max_blocks 10, 101-bin supports: the sizes of
benchmarks/test_unizero_search_bench.py) with 50 simulations, on the CPU, one
thread, built through DI-engine's ``compile_config`` / ``create_policy`` and
searched through the collect mode's ``_forward_collect`` (root inference over
LightZero's own history, Dirichlet noise, ``roots.prepare``, the ctree search
with its world model's latent-hash KV cache, the readout), timed on the
process's CPU time like benchmarks/unizero_cache_ratio.py. The weights are
LightZero's random init (the speed does not depend on them).

Beyond DEVELOPERS.md's LightZero venv this needs ``pip install einops xxhash``
and ``pip install --no-deps gymnasium farama-notifications`` there; the
training-side imports the search never calls (wandb, hickle, psutil, ...) are
stubbed below.
"""
from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import sys
import time
import types

# Optional dependencies of DI-engine / LightZero's training side, imported at module level but never
# called by a collect-mode search: empty modules whose attributes are empty classes.
_STUB = {"wandb", "hickle", "pyecharts", "tensorboardX", "h5py", "lpips", "transformers", "matplotlib", "seaborn",
         "pympler", "trueskill", "mpire", "readerwriterlock", "redis", "rediscluster", "pynng", "responses", "psutil",
         "pynvml", "GPUtil"}


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUB:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None})

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
from ding.config import compile_config  # noqa: E402
from ding.policy import create_policy  # noqa: E402
from zoo.classic_control.cartpole.config.cartpole_unizero_config import create_config, main_config  # noqa: E402

SIMS = 50
ROUNDS = {1: 12, 8: 5, 64: 2}


def build(B: int):
    mc, cc = copy.deepcopy(main_config), copy.deepcopy(create_config)
    mc.policy.cuda, mc.policy.device, mc.policy.num_simulations = False, "cpu", SIMS
    mc.policy.collector_env_num = mc.env.collector_env_num = B
    wm = mc.policy.model.world_model_cfg
    wm.device, wm.env_num, wm.collector_env_num, wm.evaluator_env_num = "cpu", B, B, B
    cfg = compile_config(mc, seed=0, env=None, auto=True, create_cfg=cc, save_cfg=False)
    return create_policy(cfg.policy, enable_field=["learn", "collect"])  # learn: the value transform handles


def main(batches: list[int]) -> None:
    for B in batches:
        policy = build(B)
        obs, mask = torch.randn(B, 4), np.ones((B, 2))

        def search(step: int):
            return policy.collect_mode.forward(obs, action_mask=mask, temperature=1.0, to_play=[-1] * B,
                                               epsilon=0.0, ready_env_id=np.arange(B), timestep=[step] * B)

        for step in range(6):  # warm-up, filling LightZero's own context of the last steps
            search(step)
        times = []
        for step in range(6, 6 + ROUNDS.get(B, 2)):
            t0 = time.process_time()
            search(step)
            times.append(time.process_time() - t0)
        wm = policy._cfg.model.world_model_cfg
        print(f"lightzero unizero B={B}: {B / float(np.median(times)):.1f} searches/s (process CPU time, median of "
              f"{len(times)}; embed {wm.embed_dim}, {wm.num_layers} layers, {wm.num_heads} heads, context "
              f"{wm.context_length} tokens, max_blocks {wm.max_blocks}, {policy._cfg.num_simulations} simulations)",
              flush=True)


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [1, 8, 64])
