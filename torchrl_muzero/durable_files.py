"""Files a run reads back: written to survive a crash or a power cut, read without running code.

Writing: a temporary file, fsync it, rename it, fsync the folder.

A plain ``os.replace(tmp, path)`` is atomic for other processes, but not for
the disk: after a power cut the rename may have reached the disk before the
file's data did (an empty or truncated ``last.pt``), or the rename itself may
be lost (the old file, or none, where the new one was expected). The order
that makes a file durable on POSIX file systems is: write the temporary
file, ``fsync`` it (its bytes are on disk), rename it over the target (other
processes see the old or the new file, never a mix), ``fsync`` the folder
(the rename is on disk). When :func:`atomic_write` returns, the new file is
what a reader finds, even after a crash; if the process dies before, the
previous file is still there, whole.

Reading (:func:`read_tensors_file`): ``torch.load(weights_only=True)``, which
builds tensors and plain containers only; a file holding any other pickled
object (which could run code while it is read) is refused before anything of
it is built, with one line that says so.

This module is a leaf (no torchrl_muzero import), so the data layer
(``buffer.pt``) and the trainers (checkpoints, ``config.json``,
``summary.json``) share it.
"""
from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable

__all__ = ["atomic_write", "atomic_write_json", "atomic_torch_save", "fsync_folder", "read_tensors_file",
           "UnreadableFile", "RefusedPickle"]


class UnreadableFile(ValueError):
    """A file :func:`read_tensors_file` cannot read: truncated, not a torch file, ... (one line)."""


class RefusedPickle(UnreadableFile):
    """A file holding a pickled object other than tensors and plain containers: reading it could run code."""


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make the entries of ``folder`` (a rename or a new file in it) durable.

    A no-op where a folder cannot be opened for fsync (Windows).
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows: folders cannot be opened; its renames are journaled by NTFS
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> Path:
    """Write ``path`` durably and atomically: ``write(f)`` fills a temporary file beside it.

    Readers see the previous file or the complete new one, never a part; after
    this returns the new file survives a crash or a power cut (see the module
    docstring). An exception in ``write`` removes the temporary file and leaves
    ``path`` as it was.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from torchrl_muzero.durable_files import atomic_write
        >>> target = Path(tempfile.mkdtemp()) / "hello.txt"
        >>> atomic_write(target, lambda f: f.write(b"hello")).read_bytes()
        b'hello'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fixed name: a write cut short by SIGKILL leaves one such file, which the next write replaces
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a failed or interrupted write leaves the previous file as it was
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """:func:`atomic_write` of ``obj`` as indented JSON (``config.json``, ``summary.json``)."""
    data = (json.dumps(obj, indent=2) + "\n").encode()
    return atomic_write(path, lambda f: f.write(data))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """:func:`atomic_write` of ``torch.save(obj)`` (checkpoints, ``buffer.pt``)."""
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f))


def read_tensors_file(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors.

    Raises :class:`RefusedPickle` when the file holds a pickled object other
    than tensors and plain containers (nothing of it is built, so no code of
    it runs), :class:`UnreadableFile` when it is truncated or not a torch
    file; the message names neither the file nor its role: the caller adds
    those.

    Examples:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> from torchrl_muzero.durable_files import atomic_torch_save, read_tensors_file
        >>> path = atomic_torch_save({"w": torch.zeros(2)}, Path(tempfile.mkdtemp()) / "w.pt")
        >>> read_tensors_file(path)
        {'w': tensor([0., 0.])}
    """
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        refused = re.search(r"Unsupported global:\s*(GLOBAL\s+\S+)", str(err))
        if isinstance(err, pickle.UnpicklingError) and refused:
            raise RefusedPickle(f"it holds pickled objects other than tensors and plain containers "
                                f"({refused.group(1)}), which could run code while read") from None
        raise UnreadableFile(_reason(err)) from err


def _reason(err: Exception) -> str:
    """One line of a failed load's error: torch's weights-only refusals run to a page of advice, and
    the line that says what was wrong follows ``WeightsUnpickler error:``."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
