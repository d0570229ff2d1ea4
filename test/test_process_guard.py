"""The conftest guard that fails a test which leaves the test process changed (nice value, torch threads,
signal handlers, blocked signals) and puts the setting back."""
import os
import signal

import torch

from conftest import _process_settings, _restore_process_settings


def test_the_guard_sees_each_setting_change_and_puts_it_back():
    before = _process_settings()
    torch.set_num_threads(before["torch thread count"] + 1)
    os.setpriority(os.PRIO_PROCESS, 0, before["nice value (this thread's)"] + 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    changed = _process_settings()
    assert all(changed[key] != before[key] for key in before), (before, changed)
    _restore_process_settings(before)
    assert _process_settings() == before
