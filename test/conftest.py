import contextlib
import os

# Ray (used only for multi-node runs) must stay on loopback in CI: without these, ray.init()
# binds the machine's interface address and probes a cloud metadata address at start.
# Set before anything imports ray.
from torchrl_muzero.trainers.ray_env import LOOPBACK_ENV  # noqa: E402 (a module that imports nothing)

for _k, _v in LOOPBACK_ENV.items():
    os.environ.setdefault(_k, _v)

# One torch (OpenMP) thread in every process the tests start, as in this one (set_num_threads below):
# the scripts run in subprocesses, and with torch's default (one thread per core) a few of them at
# once on 2 busy cores spin in OpenMP barriers on these tiny models: three tiny muzero_sync.py runs
# side by side took 355 s each instead of 16 s with one thread each (test_algorithms' both-scripts
# tests then hit their 300 s timeout). No test checks a subprocess's thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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
#  - the learning tests bounded by wall time (train.max_wall_time_s): one after the other, never
#    next to a Ray session;
#  - test_bad_inputs.py: its module-scoped fixture runs every case once (split over two workers,
#    both would run all of them).
# (xdist's own --dist loadgroup does not group under pytest 9: it renames Item._nodeid, which
# pytest 9 no longer reads.)
ONE_AT_A_TIME = "one_at_a_time"
GROUPS = {
    "test_ray_backend.py": ONE_AT_A_TIME,
    "test_ray_cluster.py": ONE_AT_A_TIME,
    "test_learning.py": ONE_AT_A_TIME,
    "test_bad_inputs.py": "bad_inputs",
}

# Tests whose pass mark depends on a fixed number of seconds of CPU run alone: the other worker waits
# before its next test (it finishes the one it runs), so they see the machine as a one-process run did.
# A killed worker must stop the run within 10 s. The CartPole learning tests (test_learning.py)
# only stop at 150 s and stop early once past the bar (63 s at most on a quiet machine): they run one
# after the other in their group, next to the other worker's tests. Tic-tac-toe's self-play test is
# neither: it trains for a number of env steps, and the sync trainer is deterministic given its seed.
# A fixture whose work has such a pass mark takes the machine for that work only, through the
# `machine_alone` fixture: every bad command line must be rejected within 20 s, and test_bad_inputs.py
# runs all its cases in one module fixture; its 39 tests then only read the results. (Listing those
# tests here made each one wait for the other worker's current test: minutes of one test at a time.)
ALONE = {
    # a killed worker or actor must stop the run within 10 s (10.1 s and 10.8 s seen next to another test)
    "test_algorithms.py::test_async_dead_collector_stops_the_run",
    "test_trainers.py::test_dead_worker_stops_the_run_within_10s",
    "test_ray_backend.py::test_dead_evaluator_actor_stops_the_run_within_10s",
    "test_ray_backend.py::test_dead_collector_actor_stops_the_run_or_is_restarted",
}


def _lookup(table, nodeid: str):
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    key = f"{module}::{name.split('[', 1)[0]}"
    if isinstance(table, dict):
        return table.get(key) or table.get(module)
    return key in table or module in table


def group_of(nodeid: str) -> str | None:
    """The group of a test (``GROUPS``), from its node id, or None."""
    return _lookup(GROUPS, nodeid)


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


class _MachineLock:
    """The run's lock, shared by every test of both workers, exclusive for a test of ``ALONE``.

    A gate (a second lock, held while taking the first) keeps a waiting exclusive holder from being
    overtaken by the other worker's next tests.
    """

    def __init__(self, base: str) -> None:
        self._gate = open(f"{base}.gate", "a")
        self._lock = open(f"{base}.lock", "a")
        self.exclusive = False

    def take(self, exclusive: bool) -> None:
        import fcntl

        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.exclusive = exclusive

    def release(self) -> None:
        import fcntl

        fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        """Within a test's shared hold: the block holds the lock exclusively, then the shared hold is back."""
        if self.exclusive:  # a test of ``ALONE`` has the machine already
            yield
            return
        self.release()
        self.take(exclusive=True)
        try:
            yield
        finally:
            self.release()
            self.take(exclusive=False)  # the protocol's release at the test's end matches this hold


_machine_lock: _MachineLock | None = None  # this worker's; None outside xdist


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """In an xdist worker: a test of ``ALONE`` holds the run's lock exclusively, any other test shares it."""
    global _machine_lock
    if not hasattr(item.config, "workerinput") or not item.config.option.basetemp:
        yield
        return
    if _machine_lock is None:
        # the workers' temporary folders are <the run's folder>/popen-gwN; pytest removes old runs' folders
        _machine_lock = _MachineLock(os.path.join(
            os.path.dirname(os.path.abspath(item.config.option.basetemp)), "torchrl_muzero_alone"))
    _machine_lock.take(exclusive=bool(_lookup(ALONE, item.nodeid)))
    try:
        yield
    finally:
        _machine_lock.release()


@pytest.fixture(scope="session")
def machine_alone():
    """A context manager: its block runs with the other xdist worker idle (it finishes its current test first).

    For a fixture whose work has a pass mark in seconds (test_bad_inputs.py runs every case in one
    module fixture): only that work takes the machine, not each test that reads its results. Inside
    a test of ``ALONE``, or outside xdist, the block just runs.
    """
    return lambda: contextlib.nullcontext() if _machine_lock is None else _machine_lock.alone()


# -- a test leaves the test process as it found it ----------------------------------------------
# Each xdist worker runs hundreds of tests in one process: a test that changes a process-wide setting
# and does not put it back changes every later test on that worker (a docstring example that built
# a collector actor in-process reniced its worker to 19, and every later test there ran at nice 19
# against the other worker at 0; an actor entry function that set SIGINT to SIG_IGN made every later
# Ctrl-C test on the worker hang). This fixture fails the test that does it, and puts the setting back.
def _process_settings() -> dict:
    import signal

    return {
        "nice value (this thread's)": os.getpriority(os.PRIO_PROCESS, 0),
        "torch thread count": torch.get_num_threads(),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
        "SIGTERM handler": signal.getsignal(signal.SIGTERM),
        "blocked signals (this thread's)": signal.pthread_sigmask(signal.SIG_BLOCK, []),
    }


def _restore_process_settings(before: dict) -> None:
    import signal

    for setter in (lambda: os.setpriority(os.PRIO_PROCESS, 0, before["nice value (this thread's)"]),
                   lambda: torch.set_num_threads(before["torch thread count"]),
                   lambda: signal.signal(signal.SIGINT, before["SIGINT handler"]),
                   lambda: signal.signal(signal.SIGTERM, before["SIGTERM handler"]),
                   lambda: signal.pthread_sigmask(signal.SIG_SETMASK, before["blocked signals (this thread's)"])):
        try:
            setter()
        except (OSError, ValueError, TypeError):  # e.g. a nice value only root may lower again
            pass


@pytest.fixture(autouse=True)
def leaves_the_process_as_it_found_it():
    before = _process_settings()
    yield
    after = _process_settings()
    changed = {key: (before[key], after[key]) for key in before if after[key] != before[key]}
    if changed:
        _restore_process_settings(before)
        pytest.fail("the test changed the test process's " + "; ".join(
            f"{key} from {old!r} to {new!r}" for key, (old, new) in changed.items())
            + " (every later test in this worker would inherit it): put it back in the test", pytrace=False)
