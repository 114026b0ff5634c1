"""What a path holds, in words: the files kvforensics replaces or writes (the history, the Prometheus textfile)
refuse anything but a regular file, and a refusal says what was found there."""

from __future__ import annotations

import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """'a directory', 'a FIFO', …, for a mode that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")
