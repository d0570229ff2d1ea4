"""The environment that keeps Ray on loopback (shared/notes/ray-on-this-machine.md), in a module that imports nothing.

Why its own module: the variables must be set before ray is imported, and
torchrl imports ray as soon as ``torchrl.data`` is imported (its Ray replay
buffer) when ray is installed; test/conftest.py sets them first from here,
and :mod:`torchrl_muzero.trainers.ray_backend` before its own ``import ray``.
"""
from __future__ import annotations

__all__ = ["LOOPBACK_ENV"]

#: Keeps every Ray socket on 127.0.0.1 and stops Ray's phone-home (shared/notes/ray-on-this-machine.md).
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "127.0.0.1,localhost",
    "NO_PROXY": "127.0.0.1,localhost",
    "GLOO_SOCKET_IFNAME": "lo",
    "RAY_AUTH_MODE": "disabled",
}
