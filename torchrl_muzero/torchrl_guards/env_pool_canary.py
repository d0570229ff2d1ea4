"""The canary of the ``AsyncEnvPool`` guards: which of bugs 6a-6d the installed torchrl still has.

:func:`asyncenvpool_bugs` reproduces each bug of ``env_pools.py``'s docstring
with plain torchrl (no guard) in a throw-away process group and reports, per
bug, whether torchrl's own fix is in; :func:`asyncenvpool_is_fixed` says
whether all of them are. When a bug reads fixed, its guard in
``env_pools.py`` can go. Kept apart from the guards because it is a test
harness that starts processes, not part of any pool.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
from torchrl.envs import AsyncEnvPool

from torchrl_muzero.torchrl_guards.env_pools import ASYNCENVPOOL_BUGS

__all__ = ["asyncenvpool_bugs", "asyncenvpool_is_fixed"]


def _probe_cases() -> dict[str, bool]:  # runs in a throw-away child process; True: torchrl's own fix is in
    import threading
    from functools import partial

    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    make = partial(GymEnv, "CartPole-v1")
    fixed: dict[str, bool] = {}
    durations: dict[str, float] = {}

    def case(name, fn):
        start = time.monotonic()
        try:
            fixed[name] = bool(fn())
        except Exception:  # the bug (or anything else) shows as "not fixed"
            fixed[name] = False
        durations[name] = round(time.monotonic() - start, 2)

    def env_index():
        env = AsyncEnvPool([make, make], backend="threading")
        collector = Collector(env, policy=None, frames_per_batch=8, total_frames=16)
        try:
            return sum(batch.numel() for batch in collector) >= 16
        finally:
            collector.shutdown()
            env.close()

    def shm_exchange():
        # one pool for both shm bugs (a pool start costs seconds): the outer
        # key fails in the parent before anything is sent, the private _step
        # then fails in the worker
        pool = AsyncEnvPool([make], backend="multiprocessing", exchange="shm")
        try:
            td = pool.reset()
            td.set("outer_extra", torch.ones(1, 1))
            td.set("action", pool.full_action_spec["action"].rand())
            try:
                fixed["shm_outer_keys"] = "outer_extra" in pool.step(td).keys()
            except Exception:
                fixed["shm_outer_keys"] = False
                pool._busy.clear()  # the failed send left env 0 marked busy
            td = pool.reset().exclude("env_index")
            td.set("action", pool.full_action_spec["action"].rand())
            fixed["shm_private_step_reward"] = "reward" in pool._step(td).keys()
        finally:
            pool.close()
        return fixed["shm_private_step_reward"]

    def partial_reset():
        # threading: the shm exchange would fail on the outer key first
        env = TransformedEnv(AsyncEnvPool([make, make], backend="threading"), StepCounter())
        try:
            td = env.reset()
            for _ in range(3):
                td = env.rand_step(td)["next"].exclude("env_index")
            td.set("_reset", torch.tensor([[True], [False]]))
            out = env.reset(td)
            return out["step_count"].flatten().tolist() == [0, 3]
        finally:
            env.close()

    def shutdown_closed_queue():
        pool = AsyncEnvPool([make], backend="multiprocessing", exchange="queue")
        pool.step_queue._reader.close()
        thread = threading.Thread(target=pool.shutdown, daemon=True)
        thread.start()
        thread.join(5)  # a clean shutdown of one idle worker takes well under a second; a spinning shutdown is left behind; the process group is killed
        return not thread.is_alive()

    def is_closed():
        env = AsyncEnvPool([make], backend="threading")
        try:
            return not env.is_closed
        finally:
            env.close()

    for name, fn in (
        ("is_closed", is_closed),
        ("env_index", env_index),
        ("shm_private_step_reward", shm_exchange),  # sets shm_outer_keys too
        ("partial_reset", partial_reset),
        ("shutdown_closed_queue", shutdown_closed_queue),
    ):
        case(name, fn)
    if os.environ.get("TORCHRL_GUARDS_PROBE_TIMES"):
        sys.stderr.write(f"asyncenvpool probe durations: {durations}\n")
    return fixed


def _asyncenvpool_probe() -> None:  # entry point of the child process
    result = _probe_cases()
    sys.stdout.write("ASYNCENVPOOL_PROBE " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # a spinning shutdown thread must not keep the process alive


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _run_probe(timeout_s: float) -> dict[str, bool]:
    code = "from torchrl_muzero.torchrl_guards.env_pool_canary import _asyncenvpool_probe; _asyncenvpool_probe()"
    env = dict(os.environ)
    env.setdefault("RL_WARNINGS", "False")
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # output to a file, not a pipe: the pools' workers inherit a pipe and would keep it open
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=out,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # the group may still hold grandchildren (env workers) even after a clean exit
            _kill_group(proc)
        out.seek(0)
        text = out.read()
    found = {}
    for line in text.splitlines():
        if line.startswith("ASYNCENVPOOL_PROBE "):
            found = json.loads(line.split(" ", 1)[1])
    return {name: bool(found.get(name, False)) for name in ASYNCENVPOOL_BUGS}


@functools.lru_cache(maxsize=None)
def asyncenvpool_bugs(timeout_s: float = 120.0) -> dict[str, bool]:
    """For each AsyncEnvPool bug of PR 4701, whether the installed torchrl has its own fix (``True``: fixed).

    Keys are :data:`ASYNCENVPOOL_BUGS`. Each bug is reproduced with plain
    torchrl (``AsyncEnvPool`` over CartPole, no guard) in a separate process
    group, killed with all its children after ``timeout_s``; a bug whose
    probe fails, hangs or does not finish in time counts as not fixed. The
    result is cached per process (``asyncenvpool_bugs.__wrapped__`` probes
    again). Once a bug reads ``True``, its guard in this module can go.
    """
    return _run_probe(timeout_s)


def asyncenvpool_is_fixed(timeout_s: float = 120.0) -> bool:
    """Whether the installed torchrl's own ``AsyncEnvPool`` has every PR 4701 fix (no guard needed).

    ``True`` only when every probe of :func:`asyncenvpool_bugs` passes:
    ``Collector(AsyncEnvPool(...))`` runs, the shm exchange carries outer
    keys, private-step rewards and partial resets, and shutdown returns with
    a closed result queue. ``False`` on any failure or timeout. Shares the
    per-process cache of :func:`asyncenvpool_bugs`.
    """
    return all(asyncenvpool_bugs(timeout_s).values())
