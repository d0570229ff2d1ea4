"""The exit watchdog: a finished run's process ends even when the interpreter's exit blocks.

Each case runs a small script in a subprocess whose exit blocks the way a
training run's can (a non-daemon ``multiprocessing`` child that never ends,
which ``multiprocessing``'s exit handler joins forever; an ``atexit`` handler
that waits forever) and checks the process still ends, with the status the
run earned, the thread stacks, and no child left behind.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline_utils import _is_zombie
from torchrl_muzero.trainers.exit_watchdog import ENV_VAR, REPORT_NAME, arm_exit_watchdog, disarm_exit_watchdog

BLOCKED_BY_A_CHILD = """
import multiprocessing as mp, sys, time
from torchrl_muzero.trainers.hydra_entry import run_script
import torchrl_muzero.trainers.hydra_entry as entry

def forever():
    time.sleep(3600)

def main():
    child = mp.get_context("spawn").Process(target=forever)  # not a daemon: exit joins it
    child.start()
    print("child", child.pid, flush=True)
    entry._last_run_dir = sys.argv[1]
    sys.exit(130)

if __name__ == "__main__":
    run_script(main)
"""

BLOCKED_BY_AN_EXIT_HANDLER = """
import atexit, sys, threading
from torchrl_muzero.trainers.hydra_entry import run_script

def waits_forever_in_an_exit_handler():
    threading.Event().wait()

def main():
    atexit.register(waits_forever_in_an_exit_handler)

if __name__ == "__main__":
    run_script(main)
"""


def _run(tmp_path, source: str, *args: str, watchdog_s: str = "2") -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    start = time.monotonic()
    env = {**os.environ, ENV_VAR: watchdog_s}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    return proc, time.monotonic() - start


def test_a_child_that_never_ends_cannot_keep_the_process_alive(tmp_path):
    proc, took = _run(tmp_path, BLOCKED_BY_A_CHILD, str(tmp_path))
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert took < 40, took
    assert "had not exited 2 s after the run ended" in proc.stderr
    assert "forcing exit status 130" in proc.stderr
    assert "_exit_function" in proc.stderr  # the stacks name what blocked: multiprocessing's exit joining the child
    assert "forcing exit status 130" in (tmp_path / REPORT_NAME).read_text()
    child = int(proc.stdout.split("child", 1)[1].split()[0])
    deadline = time.monotonic() + 5
    while not _is_zombie(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _is_zombie(child), "the watchdog left the blocking child alive"


def test_a_blocked_exit_handler_ends_with_the_status_main_returned(tmp_path):
    proc, took = _run(tmp_path, BLOCKED_BY_AN_EXIT_HANDLER, watchdog_s="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "waits_forever_in_an_exit_handler" in proc.stderr
    assert took < 40


def test_a_process_that_exits_in_time_is_left_alone(tmp_path):
    proc, took = _run(tmp_path, """
        import sys
        from torchrl_muzero.trainers.hydra_entry import run_script
        def main():
            print("done", flush=True)
            sys.exit(3)
        run_script(main)
    """, watchdog_s="")  # the default, 20 s
    assert proc.returncode == 3 and proc.stdout.strip() == "done"
    assert "forcing exit" not in proc.stderr
    assert took < 15  # it exits at once, not after the watchdog's 20 s


def test_disarm_and_bad_timeout():
    watchdog = arm_exit_watchdog(0, timeout_s=0.2)
    disarm_exit_watchdog(watchdog)
    watchdog.join(2.0)
    assert not watchdog.is_alive()  # cancelled: this test process is still here
    with pytest.raises(ValueError, match="timeout_s=0.*positive"):
        arm_exit_watchdog(0, timeout_s=0)


def test_a_bad_timeout_in_the_environment_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "soon")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='soon'; allowed: a positive number of seconds"):
        arm_exit_watchdog(0)
