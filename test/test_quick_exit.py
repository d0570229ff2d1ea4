"""freeze_heap_at_exit: the collector workers and evaluators skip the collector's last passes at exit.

The time it saves is a benchmark (benchmarks/process_exit.py); these tests check what it does
(the heap is frozen when the exit handlers run; what still lands and what does not) and that the
worker processes register it.
"""
import queue
import subprocess
import sys
import threading

import pytest
import torch

from pipeline_utils import tiny_config
from torchrl_muzero.trainers import evaluator, local_backend
from torchrl_muzero.trainers.shared_control import SharedControl
from torchrl_muzero.trainers.worker_env import action_spec_of
from torchrl_muzero.trainers.config import config_to_dict, load_config

# An exit handler registered before the module's (so it runs after it: atexit is last in, first out)
# reports whether the heap was frozen by then. A file written in a `with` block lands either way; one
# that a module global's __del__ would flush lands only without the freeze (module globals sit in a
# cycle through their functions' __globals__): why the driver and the scripts do not freeze.
_CHILD = """
import atexit, gc, sys
atexit.register(lambda: print("frozen" if gc.get_freeze_count() > 0 else "not frozen", flush=True))
import torch
from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit
if sys.argv[1] == "freeze":
    assert freeze_heap_at_exit() is True and freeze_heap_at_exit() is False
with open(sys.argv[2] + ".with", "w") as f:
    f.write("with")
class Flushes:
    def __init__(self, path):
        self.f = open(path, "w")
        self.f.write("del")
    def __del__(self):
        self.f.close()
keep = Flushes(sys.argv[2] + ".del")
"""


@pytest.mark.parametrize("mode", ["freeze", "plain"])
def test_the_heap_is_frozen_when_the_exit_handlers_run_and_files_still_land(tmp_path, mode):
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(tmp_path / "f")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("frozen" if mode == "freeze" else "not frozen")
    assert (tmp_path / "f.with").read_text() == "with"
    assert (tmp_path / "f.del").read_text() == ("" if mode == "freeze" else "del")


@pytest.fixture
def registrations(monkeypatch):
    calls = []
    for module in (local_backend, evaluator):
        monkeypatch.setattr(module, "freeze_heap_at_exit", lambda: calls.append(True) or True)
    return calls


def _cfg_dict(tmp_path) -> dict:
    # niceness 0: these entry functions run here, in the test process, which they must not renice
    return config_to_dict(load_config(tiny_config(tmp_path, **{"async_pipeline.actor_niceness": 0})))


def test_a_collector_worker_registers_it(tmp_path, registrations):
    cfg_dict = _cfg_dict(tmp_path)
    control = SharedControl(5)
    try:
        policy = local_backend.make_worker_policy(cfg_dict, (4,), 2, action_spec_of(
            load_config(cfg_dict)), control, "cpu", seed=0)
    finally:
        control.close()
    assert policy is not None and registrations == [True]


def test_an_evaluator_registers_it(tmp_path, registrations):
    stop = threading.Event()
    stop.set()  # the evaluator builds its model and env, then returns at once
    threads = torch.get_num_threads()
    try:
        evaluator._evaluator_main(_cfg_dict(tmp_path), (4,), 2, queue.Queue(), queue.Queue(), 0, 0, stop)
    finally:
        torch.set_num_threads(threads)
    assert registrations == [True]
