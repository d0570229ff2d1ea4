"""The local backend's shared control values: a few float64s the driver writes and its workers read.

:class:`SharedControl` is a file mapping in /dev/shm (it survives torchrl's pickling of the policy
factory); :func:`remove_stale_control_files` removes the files of drivers that died without closing
theirs. Which value sits at which index: :mod:`~torchrl_muzero.trainers.worker_backend`.
"""
from __future__ import annotations

import os
import re

import torch

__all__ = ["SharedControl", "remove_stale_control_files"]


#: name of the driver's control file (:class:`SharedControl`): ``<prefix><pid>_<pid namespace>_<random>``
_CONTROL_PREFIX = "torchrl_muzero_control_"
_CONTROL_NAME = re.compile(re.escape(_CONTROL_PREFIX) + r"(\d+)_(\d+)_.+")


def _pid_namespace() -> int:
    """This process's pid namespace (an inode number), 0 where /proc does not say.

    A pid means something only inside its namespace: containers started with
    ``--ipc=host`` (as PyTorch's docs advise for shared memory) share one
    /dev/shm but each has its own pids, so another container's live driver
    can carry a pid that is free here.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def remove_stale_control_files(folder: str) -> list[str]:
    """Remove the :class:`SharedControl` files in ``folder`` whose driver process is gone; returns their paths.

    Why: a driver ended by SIGKILL (the OOM killer, a scheduler's hard stop)
    never runs :meth:`SharedControl.close`, and its file would stay in
    /dev/shm until the machine reboots. A file is removed only when its name
    says which process created it, in this pid namespace, and that process no
    longer exists: a live run's file is never touched (a reused pid only keeps
    a stale file a while longer). Names without a pid (written before the pid
    was part of the name) are left alone: nothing tells whether their run is
    still going. Never raises: a cleanup must not stop a run.
    """
    removed: list[str] = []
    namespace = _pid_namespace()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _CONTROL_NAME.fullmatch(name)
        if match is None or int(match.group(2)) != namespace or _process_alive(int(match.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            os.unlink(path)
        except OSError:  # gone already (another run cleaned up first), or another user's file
            continue
        removed.append(path)
    return removed


class SharedControl:
    """A few float64 values the driver writes and every worker reads, in a shared file mapping.

    A shared-memory tensor handed to ``policy_factory`` does not stay shared:
    torchrl copies the factory on its way to the workers (measured: workers
    kept reading 0). A file mapping survives any pickling: only the path
    travels, and each process maps the same pages.

    The file is named after the creating process (:data:`_CONTROL_PREFIX`
    ``<pid>_<pid namespace>_<random>``), and creating one first removes the
    files of drivers that died without :meth:`close`
    (:func:`remove_stale_control_files`).

    Examples:
        >>> import pickle
        >>> control = SharedControl(2)
        >>> control[1] = 0.5
        >>> pickle.loads(pickle.dumps(control))[1]  # a worker's copy maps the same pages
        0.5
        >>> control.close()
    """

    def __init__(self, size: int, path: str | None = None) -> None:
        import tempfile

        if path is None:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            remove_stale_control_files(folder)
            # the owner is in the name from the file's first instant: no window in which another run's
            # cleanup could take a just-created file for a dead run's
            fd, path = tempfile.mkstemp(prefix=f"{_CONTROL_PREFIX}{os.getpid()}_{_pid_namespace()}_", dir=folder)
            os.close(fd)
            with open(path, "wb") as f:
                f.write(b"\0" * 8 * size)
            self.owner = True
        else:
            self.owner = False
        self.path, self.size = path, size
        self.values = torch.from_file(path, shared=True, size=size, dtype=torch.float64)

    def __getstate__(self):
        return {"path": self.path, "size": self.size}

    def __setstate__(self, state):
        self.__init__(state["size"], state["path"])

    def __getitem__(self, i: int) -> float:
        return float(self.values[i])

    def __setitem__(self, i: int, value: float) -> None:
        self.values[i] = value

    def close(self) -> None:
        if self.owner and os.path.exists(self.path):
            os.unlink(self.path)
