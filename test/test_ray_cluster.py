"""A two-node Ray cluster on this machine: the run joins it (async_pipeline.address) and its collectors use both nodes.

``ray start --address=127.0.0.1:PORT`` cannot add a second node here: with the loopback settings
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) the CLI refuses a multi-node cluster, and with =1 the nodes bind the
machine's interface address and 0.0.0.0 (docs/multi-node.md). ``ray.cluster_utils.Cluster`` starts the
same head and worker node processes from this test, each a raylet of its own, all on 127.0.0.1, and
stops exactly those (never ``ray stop``, which would stop every Ray of the user).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchrl_muzero[ray]): the Ray backend's tests skip")

from pipeline_utils import live_descendants, tiny_config  # noqa: E402

from torchrl_muzero.trainers import AsyncTrainer  # noqa: E402
from torchrl_muzero.trainers.ray_backend import import_ray  # noqa: E402


@pytest.fixture(scope="module")
def two_nodes():
    ray = import_ray()  # the loopback variables first
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="trm_rc_", dir="/tmp")
    os.makedirs(os.path.join(temp, "ray"))
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # the cluster's address file stays in our folder, not /tmp/ray
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": os.path.join(temp, "ray"),
                                                             "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        time.sleep(1.0)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_collectors_run_on_both_nodes_of_a_cluster(tmp_path, two_nodes):
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 384, "async_pipeline.backend": "ray",
                                   "async_pipeline.address": two_nodes.address,
                                   "async_pipeline.num_collector_actors": 2, "async_pipeline.num_evaluator_actors": 0})
    trainer = AsyncTrainer(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    nodes = {where["node_id"] for where in trainer.backend.actor_where}
    assert len(nodes) == 2, f"both collectors ran on one node: {trainer.backend.actor_where}"
    assert len(trainer.buffer) == summary["env_steps"] == 384
    # the run only left the cluster it joined: both nodes' raylets still run (the fixture stops them)
    raylets = [p for p in live_descendants() if b"raylet" in _cmdline(p)]
    assert len(raylets) == 2, raylets


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
