import os

# Ray (used only for multi-node runs) must stay on loopback in CI: without these, ray.init()
# binds the machine's interface address and probes a cloud metadata address at start.
# Set before anything imports ray.
from torchrl_muzero.trainers.ray_env import LOOPBACK_ENV  # noqa: E402 (a module that imports nothing)

for _k, _v in LOOPBACK_ENV.items():
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# -- two test processes (pytest-xdist) -----------------------------------------------------------
# Most of the suite's time is spent starting processes (each imports torch and torchrl for seconds)
# and waiting on them: one pytest process keeps about one of two cores busy. So the tests run in two
# pytest-xdist workers unless the command line chose otherwise (-n N, --dist, -p no:xdist, --pdb, -s).
# Set here, not in pytest.ini's addopts, so that it applies to test/ only: pytest-benchmark switches
# itself off under xdist, and `python -m pytest benchmarks --benchmark-only` reads the same pytest.ini.
WORKERS = 2

# Tests that must not run at the same time as each other: each group runs in one worker, one test
# after the other (every other test is handed out on its own). Bigger groups are handed out first,
# so a group does not become the run's tail.
#  - the Ray modules: one Ray session per module, and they count Ray processes and temp folders;
#  - the learning tests bounded by wall time (train.max_wall_time_s, a fixed number of seconds):
#    they must not compete with each other or with a Ray session for the cores, only with the
#    other worker's short tests;
#  - test_bad_inputs.py: its module-scoped fixture runs every case once (split over two workers,
#    both would run all of them).
# (xdist's own --dist loadgroup does not group under pytest 9: it renames Item._nodeid, which
# pytest 9 no longer reads.)
ONE_AT_A_TIME = "one_at_a_time"
GROUPS = {
    "test_ray_backend.py": ONE_AT_A_TIME,
    "test_ray_cluster.py": ONE_AT_A_TIME,
    "test_learning.py": ONE_AT_A_TIME,
    "test_tictactoe.py::test_self_play_learns_to_beat_the_random_player": ONE_AT_A_TIME,
    "test_docs.py::test_compose_your_own_script_learns": ONE_AT_A_TIME,
    "test_bad_inputs.py": "bad_inputs",
}


def group_of(nodeid: str) -> str | None:
    """The group of a test (``GROUPS``), from its node id, or None."""
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    return GROUPS.get(f"{module}::{name.split('[', 1)[0]}") or GROUPS.get(module)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # no pytest-xdist, or this is already one of its workers
    opt = config.option
    if (opt.numprocesses is None and opt.dist == "no" and not getattr(opt, "tx", None) and not opt.usepdb
            and opt.capture != "no" and not opt.collectonly):
        opt.numprocesses = WORKERS


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None  # the command line chose a --dist mode: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's load scheduling, with the tests of each group in ``GROUPS`` as one unit."""

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(nodeid)
            return nodeid if group is None else f"group:{group}"

    return GroupScheduling(config, log)
