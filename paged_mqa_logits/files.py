"""Writing the package's output files all or nothing.

Every file the tables, the tuner (tables, reports, re-checks, untuned key lists), ``compile``
and the backends' compile records write goes through :func:`atomic_write`: a reader (another
process, a crashed run's successor) sees the old file or the new one, never a torn one. (The
kernel cache's manifest has its own writer in ``triton_internals/cache_overlay.py``, which
imports nothing of the rest of the package.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


def write_target(path: str) -> str:
    """Where writing ``path`` lands: ``path`` itself, or for a symbolic link the file it points
    to (followed to the end), so the link stays a link."""
    return os.path.realpath(path) if os.path.islink(path) else path


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", *, newline: str | None = None, permissions: int = 0o644) -> Iterator[IO]:
    """A file object whose content replaces ``path`` when the block ends without an error: an
    unpredictable temporary file (``mkstemp``, ``O_EXCL``: nobody can plant or pre-link it in a
    shared directory) beside the target, flushed and fsynced, then ``os.replace``. On an error
    the temporary file is removed and ``path`` is left as it was. A symbolic link is written
    through to its target (:func:`write_target`). Missing parent directories are created."""
    target = write_target(path)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        os.chmod(tmp, permissions)
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
