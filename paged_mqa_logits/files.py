"""Reading the package's input files with errors that name them; writing its output files all
or nothing.

:func:`read_text` reads every CSV the package takes (tuned tables, the tuner's untuned key
lists): a file that cannot be opened or is not UTF-8 text is an error naming the file (and the
line), of the caller's error type.

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


def read_text(path: str, error: type[Exception] = ValueError) -> str:
    """The UTF-8 text of ``path`` (a leading byte order mark, as spreadsheets export, dropped).
    Raises ``error`` naming ``path`` when it cannot be read (missing, a directory, no permission)
    or is not UTF-8 text (with the line of the first bad byte)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not a text (UTF-8) CSV file ({exc.reason})") from None


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
