"""AsyncEnvPool guards for torchrl 0.14.1 (PR 4701)."""
from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys

__all__ = ["asyncenvpool_is_fixed"]


# --------------------------------------------------------------------------- #
# AsyncEnvPool probe (bug 6)
# --------------------------------------------------------------------------- #
# Bugs (PR 4701): Collector(AsyncEnvPool(...)) crashes on its first batch
# (env_index written as a tensor, stacked as a NonTensorStack); the shm
# exchange raises KeyError on keys added by outer transforms / the collector;
# ProcessorAsyncEnvPool shutdown can spin on a closed result queue.
# Remove (use AsyncEnvPool for Atari) when: asyncenvpool_is_fixed() is True.
def _asyncenvpool_probe() -> None:  # runs in a throw-away child process
    from functools import partial

    from torchrl.collectors import Collector
    from torchrl.envs import AsyncEnvPool, GymEnv, StepCounter, TransformedEnv

    make = partial(GymEnv, "CartPole-v1")
    cases = (
        # (backend, exchange, outer transform): first-batch crash, then shm keys
        ("threading", None, False),
        ("multiprocessing", None, False),
        ("multiprocessing", "shm", True),
    )
    for backend, exchange, transformed in cases:
        kwargs = {"backend": backend}
        if exchange is not None:
            kwargs["exchange"] = exchange
        env = AsyncEnvPool([make, make], **kwargs)
        if transformed:
            env = TransformedEnv(env, StepCounter())
        collector = Collector(env, policy=None, frames_per_batch=8, total_frames=16)
        try:
            frames = sum(batch.numel() for batch in collector)
        finally:
            collector.shutdown()
            env.close()
        if frames < 16:
            raise RuntimeError(f"AsyncEnvPool({backend}) collected {frames} of 16 frames")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


@functools.lru_cache(maxsize=None)
def asyncenvpool_is_fixed(timeout_s: float = 120.0) -> bool:
    """Whether ``Collector(AsyncEnvPool(...))`` works on the installed torchrl.

    Runs 16-frame CartPole collections through ``AsyncEnvPool`` (threading
    and multiprocessing backends, then the shm exchange under an outer
    ``StepCounter`` transform) in a separate process group, killed with all its
    children after ``timeout_s``. ``False`` on any failure or timeout. The
    result is cached per process.
    """
    code = "from torchrl_muzero.trainers.torchrl_guards.env_pools import _asyncenvpool_probe; _asyncenvpool_probe()"
    env = dict(os.environ)
    env.setdefault("RL_WARNINGS", "False")
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    finally:
        # the group may still hold grandchildren (env workers) even after a clean exit
        _kill_group(proc)
    return proc.returncode == 0
