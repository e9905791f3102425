"""Reading a file someone else named, safely: a run config, a task or a model folder can name a FIFO (an open
for reading waits for a writer for ever), ``/dev/zero`` (a read never ends) or a file of many gigabytes. Every file
the validator's checks read goes through here: opened without blocking, checked to be a regular file of at most
``max_bytes`` before a byte is read, and read no further than that.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Bound of the small files checks read (config.json, task.toml, a Dockerfile, a run config).
SMALL_FILE_BYTES = 4 * 1024 * 1024


class UnsafeFile(OSError):
    """A path that is not a regular file, or one larger than the reader allows; the message names which."""


def check_regular(path: str | Path, max_bytes: int, what: str = "file") -> int:
    """The size of ``path`` (links followed) when it is a regular file of at most ``max_bytes``.

    Raises:
        UnsafeFile: it is a FIFO, a device, a socket or a folder, or larger than ``max_bytes``.
        OSError: it cannot be reached.
    """
    return _checked(os.stat(path), path, max_bytes, what)


def read_regular(path: str | Path, max_bytes: int = SMALL_FILE_BYTES, what: str = "file") -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``max_bytes`` (checked on the open file itself, so
    nothing swapped in between is read).

    Raises:
        UnsafeFile: not a regular file, or too large (nothing was read from it).
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _checked(os.fstat(fd), path, max_bytes, what)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{what} {path} grew past {max_bytes} bytes while it was read; it is not read")
    return data


def read_regular_text(path: str | Path, max_bytes: int = SMALL_FILE_BYTES, what: str = "file") -> str:
    """:func:`read_regular` as UTF-8 text (a byte-order mark dropped).

    Raises:
        UnsafeFile, OSError: as :func:`read_regular`.
        UnicodeDecodeError: it is not UTF-8.
    """
    return read_regular(path, max_bytes, what).decode("utf-8-sig")


def _checked(st: os.stat_result, path: str | Path, max_bytes: int, what: str) -> int:
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise UnsafeFile(f"{what} {path} is {kind}, not a regular file; it is not read")
    if st.st_size > max_bytes:
        raise UnsafeFile(f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} read here; it is not read")
    return st.st_size
