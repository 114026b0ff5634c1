"""A file written whole under a name nobody else chose, then renamed over its destination: the one way
kvforensics replaces a file it owns (the deployment files, the Prometheus textfile). The temporary is made
with O_EXCL and O_NOFOLLOW (a link or another user's file planted under its name fails it, never receives
the bytes), gets its mode whatever the umask, is synced before the rename, and is removed if anything fails.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def replace(temp: str, dest: str, data: bytes, mode: int, dir_fd: Optional[int] = None,
            before_rename: Callable[[], None] = lambda: None) -> None:
    """Write ``data`` into the new file ``temp`` and rename it over ``dest`` (both relative to ``dir_fd`` when
    given); ``before_rename`` may refuse at the last moment (raise), leaving ``dest`` as it was."""
    fd = os.open(temp, _FLAGS, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        before_rename()
        os.rename(temp, dest, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
