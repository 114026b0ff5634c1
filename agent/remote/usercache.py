"""The user's cache folder for what a run can reuse from the last one (the packed probe, the ssh client's
version): ``$XDG_CACHE_HOME/kvforensics``, else ``~/.cache/kvforensics``. Best effort: a file is written whole
(a temporary file, then a rename) or not at all, and a cache that cannot be read or written is skipped, never an
error.

Paths are strings, not pathlib's: a one-host inspect reads the ssh client's version here before its ssh starts,
and pathlib (with urllib.parse, ipaddress) costs ~10 ms to import."""

from __future__ import annotations

import os
from typing import Union

__all__ = ["folder", "keep"]


def folder() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "kvforensics")


def keep(path: "Union[str, os.PathLike[str]]", data: bytes) -> None:
    import tempfile  # here: most runs only read the cache, and tempfile (with random) is ~1 ms before ssh starts

    parent = os.path.dirname(os.fspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.fspath(path))
    except OSError:
        pass
